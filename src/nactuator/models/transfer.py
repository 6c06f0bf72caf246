"""Move a joint-wise actuator to an arm with another joint count (issue 22: SO-101 -> OMX).

Every weight of the joint-wise model is shared by all joints (``models.jointwise``) except
the joint-id embedding, one row per joint, and the normalisation statistics, one entry per
motor. A model trained on arm A therefore runs on arm B (n_B joints) once

- each of B's joints is given an embedding: the row of the A joint it corresponds to
  (``joint_map[j]``, e.g. the OMX's joint2 -> the SO-101's shoulder_lift), or the mean of A's
  rows for a joint with no counterpart (``None``);
- its inputs are normalised per motor of B: with statistics of B's own recordings
  (``norm_stats``: the channels' mean and std only, no label: what a user has after
  recording a few minutes on the new arm), or with A's statistics of the mapped joints.

The feature groups (hence the per-joint channel count) must be the same, and so must what each
channel means; the effort telemetry does not (SO-101 ``load``, a fraction of maximum torque;
OMX ``current``, amperes): per-motor normalisation takes out scale and offset, not the
servo's own relation between current and torque. Nothing here is trained: the zero-shot model
is this, ``nactuator adapt`` fine-tunes it on B's data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nactuator.models.actuator import NeuralActuator

__all__ = ["TransferError", "source_stats", "transfer_jointwise"]


class TransferError(ValueError):
    """The model cannot be moved to the other arm; the message says why."""


def _check_map(joint_map: Sequence[int | None], n_source: int, n_target: int) -> list:
    if len(joint_map) != n_target:
        raise TransferError(f"joint_map has {len(joint_map)} entries; the target arm has "
                            f"{n_target} joints")
    for j in joint_map:
        if j is not None and not 0 <= int(j) < n_source:
            raise TransferError(f"joint_map entry {j} is not a joint of the source arm "
                                f"(0..{n_source - 1})")
    return [None if j is None else int(j) for j in joint_map]


def source_stats(actuator: NeuralActuator, joint_map: Sequence[int | None]) -> dict:
    """The source model's normalisation statistics of the mapped joints (a joint with no
    counterpart: the mean over the source's joints), in the target's joint order."""
    joint_map = _check_map(joint_map, actuator.n_motors, len(joint_map))
    out: dict[str, dict[str, list[float]]] = {}
    for key, stats in actuator.feature_builder.norm_stats().items():
        out[key] = {}
        for field in ("mean", "std"):
            values = [float(v) for v in stats[field]]
            fill = sum(values) / len(values)
            out[key][field] = [fill if j is None else values[j] for j in joint_map]
    return out


def transfer_jointwise(actuator: NeuralActuator, n_motors: int, norm_stats: Mapping,
                       joint_map: Sequence[int | None],
                       state_step: Mapping[str, Any] | None = None) -> NeuralActuator:
    """A joint-wise ``actuator`` rebuilt for ``n_motors`` joints (see the module docstring):
    every shared weight copied, the joint-id embedding of target joint j taken from source
    joint ``joint_map[j]`` (mean of all rows for ``None``), inputs normalised with
    ``norm_stats`` (the target's, or :func:`source_stats`). A next-state model also needs
    the target's per-step ``state_step``. Returns an eval-mode actuator."""
    config = dict(actuator.model_config)
    if config.get("arch") != "jointwise":
        raise TransferError(f"only a joint-wise model moves between joint counts (its weights "
                            f"are shared by all joints); this one is {config.get('arch')!r}")
    for key in ("physics", "firmware"):
        if key in config:
            raise TransferError(f"the model has per-motor '{key}' constants of the source "
                                "arm's servos; transfer supports models without them")
    joint_map = _check_map(joint_map, actuator.n_motors, n_motors)
    if config.get("dynamics") == "next_state":
        if state_step is None:
            raise TransferError("a next-state model predicts in the target's per-step std: "
                                "pass its state_step")
        config["state_step"] = dict(state_step)
    target = NeuralActuator(actuator.features, n_motors, norm_stats, config)
    state = actuator.state_dict()
    source_rows = state["net.encoder.joint_embedding"]
    mean_row = source_rows.mean(dim=0)
    state["net.encoder.joint_embedding"] = torch.stack(
        [mean_row if j is None else source_rows[j] for j in joint_map])
    # The feature builder's normalisation buffers are the target's (built from norm_stats).
    for name, value in target.state_dict().items():
        if name.startswith("feature_builder."):
            state[name] = value
    missing, unexpected = target.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise TransferError(f"the weights do not fit the target model: missing {missing}, "
                            f"unexpected {unexpected}")
    return target.eval()
