"""The deployable forward: window tensors and the padding mask in (positional), four
outputs out (a tuple), seven for a model with the uncertainty head (+ ``force_lo``,
``force_hi``, ``force_sigma``).

Exported graphs cannot take a dict of optional channels, so the inputs are the raw
window keys the actuator's feature groups need, in ``actuator.inputs`` order, each
(B, L, n_motors) float32, then ``pad`` (B, L) bool: True on the zero-padded frames before
a stream's first frame, which the model sees as neutral tokens exactly as in training
(``infer`` and ``live`` pass it; all False once L frames exist). The outputs are those a
consumer of the actuator uses. The file contract (format tag, output and input names)
lives in ``nactuator.models.exported``, which runs these files.
"""

from __future__ import annotations

import torch
from torch import nn

from nactuator.models import NeuralActuator
from nactuator.models.exported import EXPORT_FORMAT, EXPORT_OUTPUTS, PAD_INPUT, export_outputs

__all__ = ["EXPORT_FORMAT", "EXPORT_OUTPUTS", "PAD_INPUT", "ExportableActuator"]


class ExportableActuator(nn.Module):
    def __init__(self, actuator: NeuralActuator) -> None:
        super().__init__()
        self.actuator = actuator
        self.channel_names = actuator.inputs
        self.input_names = [*actuator.inputs, PAD_INPUT]
        self.output_names = list(export_outputs(actuator.has_uncertainty))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        *channels, pad = inputs
        window = dict(zip(self.channel_names, channels, strict=True))
        out = self.actuator({**window, PAD_INPUT: pad})
        return tuple(out[k] for k in self.output_names)

    def example_inputs(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Plausible inputs: each channel's train-set mean plus std-sized noise, so the
        trace runs on ordinary values (seeded; the traced graph does not depend on them).
        Row r < L has its first r frames flagged as padding (the start of a stream), so
        the export checks cover the mask; the other rows are whole windows."""
        generator = torch.Generator().manual_seed(0)
        stats = self.actuator.feature_builder.norm_stats()
        length = self.actuator.window_length
        shape = (batch, length, self.actuator.n_motors)
        inputs = []
        for key in self.channel_names:
            noise = torch.randn(shape, generator=generator)
            if key in stats:  # e.g. ``q`` has no stats of its own when only ``error`` uses it
                noise = torch.tensor(stats[key]["mean"]) + noise * torch.tensor(stats[key]["std"])
            inputs.append(noise)
        padded_frames = torch.arange(batch).clamp(max=length).unsqueeze(1)
        inputs.append(torch.arange(length).unsqueeze(0) < padded_frames)
        return tuple(inputs)
