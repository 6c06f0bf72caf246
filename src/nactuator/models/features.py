"""``FeatureBuilder``: a window of per-frame channels -> normalised tokens (B, L, n_in).

Feature groups (Contract 4) name which channels go into a token, in this order inside
each group; groups appear in the order they are listed. The tracking error is computed
here from ``q_cmd`` and ``q`` rather than read from the window, so that when a rollout
overwrites ``q`` with the simulated state the error follows automatically (nad-format §7.3).
The commanded duty (``duty``: the firmware's position law applied to the goal, the gain and
the simulated angle, :mod:`nactuator.models.firmware`) is derived the same way.

Two modes follow from the groups (docs/counterfactual.md): a model whose groups read recorded
telemetry (``telemetry``: effort, voltage, temperature traces) is *telemetry-conditioned*;
one that reads only what exists before execution (commands, the simulated state, the gain,
the supply and temperature at the start) is *counterfactual* and can predict the response to
commands that were never executed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from nactuator.input_filters import POOLED_KEYS
from nactuator.models.firmware import FirmwareLaw

FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "command": ("q_cmd",),
    "state": ("q", "qd"),
    "telemetry": ("effort", "voltage", "temperature"),
    "error": ("error",),
    # Counterfactual inputs (nactuator.data.commands): known before execution.
    "enable": ("torque_enable",),
    "duty": ("duty",),
    "supply": ("supply_voltage",),
    "thermal": ("initial_temperature",),
    # Causal statistics of effort and command over a longer horizon than the window (the
    # input filters' ``pool``, nactuator.input_filters): what the condition head needs.
    "pooled": POOLED_KEYS,
}
DEFAULT_FEATURES = ("command", "state", "telemetry", "error")
COUNTERFACTUAL_FEATURES = ("state", "duty", "enable", "supply")
# Channels computed from others, never read from the window, and what each needs.
DERIVED: dict[str, tuple[str, ...]] = {
    "error": ("q_cmd", "q"),
    "duty": ("q_cmd", "q", "kp", "torque_enable"),
}
# Recorded during the motion itself: a model reading any of them replays its telemetry.
TELEMETRY_CHANNELS = ("effort", "voltage", "temperature", "pwm", "current", *POOLED_KEYS)
# Channels with a natural scale: normalised with these (mean, std) when the statistics lack
# them (the DataModule does not compute statistics of derived or binary channels).
FIXED_STATS = {"duty": (0.0, 1.0), "torque_enable": (0.0, 1.0)}
MODES = ("counterfactual", "telemetry")


def feature_channels(features: Sequence[str]) -> list[str]:
    """The channel names of the given groups, in token order; checks the group names."""
    if isinstance(features, str) or not features:
        raise ValueError(f"features must be a non-empty list of groups from "
                         f"{sorted(FEATURE_GROUPS)}, got {features!r}")
    unknown = [g for g in features if g not in FEATURE_GROUPS]
    if unknown:
        raise ValueError(f"unknown feature group(s) {unknown}; expected some of "
                         f"{list(FEATURE_GROUPS)}")
    if len(set(features)) != len(features):
        raise ValueError(f"feature groups listed twice: {list(features)}")
    return [key for group in features for key in FEATURE_GROUPS[group]]


def window_channels(features: Sequence[str]) -> list[str]:
    """The raw window keys the groups need (``error`` needs ``q_cmd`` and ``q``)."""
    needed: list[str] = []
    for key in feature_channels(features):
        for raw in DERIVED.get(key, (key,)):
            if raw not in needed:
                needed.append(raw)
    return needed


def actuator_mode(inputs: Sequence[str]) -> str:
    """``"telemetry"`` if the window keys ``inputs`` include recorded telemetry, else
    ``"counterfactual"`` (only what exists before execution)."""
    return "telemetry" if any(k in TELEMETRY_CHANNELS for k in inputs) else "counterfactual"


def _stats_vector(norm_stats: Mapping, key: str, field: str, n_motors: int) -> torch.Tensor:
    try:
        if key in FIXED_STATS and key not in norm_stats:
            values = [FIXED_STATS[key][field == "std"]] * n_motors
        else:
            values = norm_stats[key][field]
    except (KeyError, TypeError) as err:
        raise ValueError(f"norm_stats is missing {key!r}.{field!r}; expected "
                         f"{{key: {{'mean': [n], 'std': [n]}}}} for every feature channel"
                         ) from err
    vector = torch.as_tensor(values, dtype=torch.float32).flatten()
    if vector.numel() != n_motors or not torch.isfinite(vector).all():
        raise ValueError(f"norm_stats[{key!r}][{field!r}] must be {n_motors} finite numbers "
                         f"(one per motor), got {values!r}")
    return vector


class FeatureBuilder(nn.Module):
    """Normalise each channel with train-set statistics, clip to ±``clip``, concatenate.

    The statistics live in buffers so that they are saved and loaded with the weights;
    ``std`` is floored at ``eps`` so a constant channel (e.g. a steady supply voltage)
    does not divide by zero.
    """

    def __init__(self, features: Sequence[str], n_motors: int, norm_stats: Mapping,
                 eps: float = 1e-6, clip: float = 10.0,
                 firmware: FirmwareLaw | None = None) -> None:
        super().__init__()
        self.features = list(features)
        self.channels = feature_channels(self.features)
        self.inputs = window_channels(self.features)
        if "duty" in self.channels and firmware is None:
            raise ValueError("feature group 'duty' needs the servo firmware law (model_config "
                             "'firmware', from the platform's hardware.firmware)")
        self.firmware = firmware
        self.n_motors = n_motors
        self.n_in = n_motors * len(self.channels)
        self.clip = clip
        mean = [_stats_vector(norm_stats, k, "mean", n_motors) for k in self.channels]
        std = [_stats_vector(norm_stats, k, "std", n_motors) for k in self.channels]
        self.register_buffer("mean", torch.cat(mean))
        self.register_buffer("std", torch.cat(std).abs().clamp_min(eps))

    def norm_stats(self) -> dict[str, dict[str, list[float]]]:
        """The statistics as plain lists (floored std), keyed like Contract 2."""
        mean = self.mean.view(len(self.channels), self.n_motors).tolist()
        std = self.std.view(len(self.channels), self.n_motors).tolist()
        return {k: {"mean": m, "std": s} for k, m, s in zip(self.channels, mean, std,
                                                            strict=True)}

    def _check(self, window: Mapping[str, torch.Tensor]) -> None:
        missing = [k for k in self.inputs if k not in window]
        if missing:
            raise KeyError(f"window is missing channel(s) {missing}; features "
                           f"{self.features} need {self.inputs}")
        shape = window[self.inputs[0]].shape
        for key in self.inputs:
            s = window[key].shape
            if len(s) != 3 or s[2] != self.n_motors or s[:2] != shape[:2]:
                raise ValueError(f"window[{key!r}] must have shape (B, L, {self.n_motors}) "
                                 f"like the other channels {tuple(shape)}, got {tuple(s)}")
        pad = window.get("pad")
        if pad is not None and tuple(pad.shape) != tuple(shape[:2]):
            raise ValueError(f"window['pad'] must have shape (B, L) = {tuple(shape[:2])}, "
                             f"got {tuple(pad.shape)}")

    def forward(self, window: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """window: dict of (B, L, n_motors) tensors; optional ``pad`` (B, L) bool marks
        zero-padded frames before an episode start, whose features are set to 0 (the
        train-set mean) instead of the outliers that normalised zeros would be."""
        if not torch.jit.is_tracing():  # a trace records the shapes it was given
            self._check(window)
        columns = [self._column(window, k) for k in self.channels]
        tokens = ((torch.cat(columns, dim=-1) - self.mean) / self.std).clamp(
            -self.clip, self.clip)
        pad = window.get("pad")
        if pad is not None:
            tokens = tokens.masked_fill(pad.to(torch.bool).unsqueeze(-1), 0.0)
        return tokens

    def _column(self, window: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
        if key == "error":
            return window["q_cmd"] - window["q"]
        if key == "duty":
            return self.firmware.duty(window["q_cmd"], window["q"], window["kp"],
                                      window["torque_enable"])
        return window[key]
