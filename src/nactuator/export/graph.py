"""The deployable forward: window tensors in (positional), four outputs out (a tuple).

Exported graphs cannot take a dict of optional channels, so the inputs are the raw
window keys the actuator's feature groups need, in ``actuator.inputs`` order, each
(B, L, n_motors) float32; the outputs are those a consumer of the actuator uses.
"""

from __future__ import annotations

import torch
from torch import nn

from nactuator.models import NeuralActuator

EXPORT_FORMAT = "nactuator-export/1"
EXPORT_OUTPUTS = ("tau", "force", "gate", "condition")


class ExportableActuator(nn.Module):
    def __init__(self, actuator: NeuralActuator) -> None:
        super().__init__()
        self.actuator = actuator
        self.input_names = actuator.inputs

    def forward(self, *channels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.actuator(dict(zip(self.input_names, channels, strict=True)))
        return tuple(out[k] for k in EXPORT_OUTPUTS)

    def example_inputs(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Plausible inputs: each channel's train-set mean plus std-sized noise, so the
        trace runs on ordinary values (seeded; the traced graph does not depend on them)."""
        generator = torch.Generator().manual_seed(0)
        stats = self.actuator.feature_builder.norm_stats()
        shape = (batch, self.actuator.window_length, self.actuator.n_motors)
        inputs = []
        for key in self.input_names:
            noise = torch.randn(shape, generator=generator)
            if key in stats:  # e.g. ``q`` has no stats of its own when only ``error`` uses it
                noise = torch.tensor(stats[key]["mean"]) + noise * torch.tensor(stats[key]["std"])
            inputs.append(noise)
        return tuple(inputs)
