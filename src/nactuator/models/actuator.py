"""``NeuralActuator``: FeatureBuilder + network, the module every other room uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from nactuator.models.features import DEFAULT_FEATURES, FeatureBuilder
from nactuator.models.networks import build_model


def upgrade_model_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A model config in today's names: checkpoints before 0.2 called the window length
    ``history`` (it was 9, the window, not the 8 frames before the current one)."""
    config = dict(config)
    if "history" in config and "window_length" not in config:
        config["window_length"] = config.pop("history")
    return config


class NeuralActuator(nn.Module):
    """Window of raw channels (Contract 1 keys, each (B, L, n)) -> head outputs.

    ``features`` lists feature groups (``models.FEATURE_GROUPS``; ``DEFAULT_FEATURES`` is
    all four), ``norm_stats`` is the DataModule's ``{key: {"mean": [n], "std": [n]}}``,
    ``model_config`` is ``{"arch": ..., "window_length": 9, **sizes}`` (``conf/model/*.yaml``;
    default: the transformer). The resolved config (every size filled in) is kept in
    ``self.model_config``.
    """

    def __init__(self, features: Sequence[str] = DEFAULT_FEATURES, n_motors: int | None = None,
                 norm_stats: Mapping | None = None,
                 model_config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if not isinstance(n_motors, int) or n_motors < 1:
            raise ValueError(f"NeuralActuator needs n_motors >= 1 (the platform's channel "
                             f"count), got {n_motors!r}")
        if not isinstance(norm_stats, Mapping):
            raise ValueError("NeuralActuator needs norm_stats (the DataModule's train-split "
                             "statistics, {key: {'mean': [n], 'std': [n]}}), got "
                             f"{type(norm_stats).__name__}")
        config = upgrade_model_config(model_config or {"arch": "transformer"})
        if "arch" not in config:
            raise ValueError(f"model_config needs an 'arch' key, got keys {sorted(config)}")
        self.feature_builder = FeatureBuilder(features, n_motors, norm_stats)
        self.n_motors = n_motors
        self.net = build_model(n_in=self.feature_builder.n_in, n_motors=n_motors, **config)
        self.model_config = dict(self.net.config)

    @property
    def window_length(self) -> int:
        """Frames per input window (L: the current frame and the L - 1 before it)."""
        return self.net.window_length

    @property
    def features(self) -> list[str]:
        """The feature groups, e.g. ``["command", "state", "telemetry", "error"]``."""
        return list(self.feature_builder.features)

    @property
    def inputs(self) -> list[str]:
        """The window keys this actuator reads."""
        return list(self.feature_builder.inputs)

    def forward(self, window: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.net(self.feature_builder(window))
