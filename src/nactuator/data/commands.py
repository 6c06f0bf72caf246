"""What is known about an episode *before* it runs: the command channels a counterfactual
actuator model reads, derived once from a recorded episode (docs/counterfactual.md).

A telemetry-conditioned model replays the recorded effort, voltage and temperature of the
motion it predicts; a counterfactual model may only read what exists before execution:

- ``q_cmd`` and ``torque_enable`` (recorded per frame: they are the commands);
- ``q_cmd_next``: the command of the next frame (the whole command sequence is the plan, so
  it is known in advance; a logger that writes the goal a few ms before it samples the
  state makes part of it act within the current step);
- ``kp``: the servo's Position P gain register (per episode: the episode meta ``kp``, one
  number or one per motor; NaN when the dataset does not say);
- ``supply_voltage`` and ``initial_temperature``: the supply voltage and motor temperature
  measured at the episode's first frame, held constant: exogenous conditions read before
  the motion starts, never the recorded traces that the motion itself shapes (the supply
  sags under load, the motor warms).

:func:`with_command_channels` adds these keys to an episode's frames; the DataModule and the
evaluation both call it, so training and evaluation see the same channels.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from nactuator.data.schema import DataFormatError, Episode

__all__ = ["COMMAND_KEYS", "EXOGENOUS_KEYS", "command_channels", "with_command_channels"]

COMMAND_KEYS = ("torque_enable", "q_cmd_next", "kp")
EXOGENOUS_KEYS = ("supply_voltage", "initial_temperature")


def _first_finite(values: np.ndarray) -> np.ndarray:
    """Per column, the first finite value (NaN if a column has none)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    first = np.argmax(finite, axis=0)
    out = values[first, np.arange(values.shape[1])]
    return np.where(finite.any(axis=0), out, np.nan)


def episode_gain(meta: Mapping, n: int, where: str = "episode") -> np.ndarray:
    """The episode's Position P gain per motor (n,), from ``meta["kp"]``; NaN if absent."""
    kp = meta.get("kp")
    if kp is None:
        return np.full(n, np.nan)
    values = np.asarray(kp, dtype=np.float64).reshape(-1)
    if values.size == 1:
        values = np.full(n, float(values[0]))
    if values.size != n or not np.isfinite(values).all() or (values < 0).any():
        raise DataFormatError(f"{where}: meta 'kp' must be one non-negative number or {n} "
                              f"(one per motor), got {kp!r}")
    return values


def command_channels(frames: Mapping[str, np.ndarray], meta: Mapping,
                     where: str = "episode") -> dict[str, np.ndarray]:
    """The channels of :data:`COMMAND_KEYS` and :data:`EXOGENOUS_KEYS`, (T, n) float32 each."""
    q_cmd = np.asarray(frames["q_cmd"], dtype=np.float64)
    length, n = q_cmd.shape
    enable = frames.get("torque_enable")
    enable = np.ones((length, n)) if enable is None else np.nan_to_num(
        np.asarray(enable, dtype=np.float64).reshape(length, n), nan=1.0)
    nxt = np.concatenate([q_cmd[1:], q_cmd[-1:]]) if length else q_cmd
    hold = lambda row: np.broadcast_to(row, (length, n))  # noqa: E731
    out = {
        "torque_enable": enable,
        "q_cmd_next": nxt,
        "kp": hold(episode_gain(meta, n, where)),
        "supply_voltage": hold(_first_finite(frames["voltage"])) if length else q_cmd * np.nan,
        "initial_temperature": (hold(_first_finite(frames["temperature"])) if length
                                else q_cmd * np.nan),
    }
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def with_command_channels(ep: Episode, where: str = "") -> Episode:
    """A copy of ``ep`` whose frames also hold the command and exogenous channels."""
    label = where or f"episode {ep.index} ({ep.task})"
    frames = {**ep.frames, **command_channels(ep.frames, ep.meta, label)}
    return Episode(index=ep.index, task=ep.task, split=ep.split, length=ep.length,
                   payload_mass=ep.payload_mass, meta=ep.meta, frames=frames)
