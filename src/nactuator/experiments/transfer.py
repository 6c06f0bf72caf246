"""``nactuator transfer``: a joint-wise checkpoint moved to another arm (issue 22, SO-101 -> OMX).

The bundle it writes is a model of the target platform (``models.transfer``: the shared
weights copied, the joint-id embedding mapped joint by joint, the inputs normalised per
target motor), so ``eval`` scores it zero-shot and ``adapt`` fine-tunes it like any
checkpoint of that arm. ``scratch=True`` writes the same architecture untrained (the
from-scratch reference for ``adapt``, same recipe and data).
"""

from __future__ import annotations

import os

import torch

from nactuator.errors import UserError
from nactuator.models import NeuralActuator, bundle_to_dict, load_actuator, save_bundle
from nactuator.models.transfer import TransferError, source_stats, transfer_jointwise
from nactuator.platforms import Platform, load_platform

__all__ = ["default_joint_map", "transfer"]


class TransferUserError(UserError, TransferError):
    pass


def default_joint_map(source: Platform, target: Platform) -> list[int | None]:
    """Target joint -> source joint: the arm joints in order (base yaw to the wrist), the
    gripper to the gripper; a target joint past the source's count gets none."""
    src_arm = [i for i, c in enumerate(source.channels) if not c.is_gripper]
    src_grip = [i for i, c in enumerate(source.channels) if c.is_gripper]
    out: list[int | None] = []
    k = 0
    for c in target.channels:
        if c.is_gripper:
            out.append(src_grip[0] if src_grip else None)
        else:
            out.append(src_arm[k] if k < len(src_arm) else None)
            k += 1
    return out


def parse_joint_map(text: str, source: Platform, target: Platform) -> list[int | None]:
    """``"shoulder_pan,shoulder_lift,elbow_flex,wrist_flex,gripper"``: per target joint a
    source joint name (or index), ``-`` for none."""
    items = [x.strip() for x in text.split(",")]
    out: list[int | None] = []
    for item in items:
        if item == "-":
            out.append(None)
        elif item in source.channel_names:
            out.append(source.channel_names.index(item))
        elif item.isdigit():
            out.append(int(item))
        else:
            raise TransferUserError(f"--joint-map: {item!r} is not a joint of {source.name} "
                                    f"{source.channel_names} (or an index, or '-')")
    if len(out) != target.n:
        raise TransferUserError(f"--joint-map names {len(out)} joints; {target.name} has "
                                f"{target.n} ({target.channel_names})")
    return out


def transfer(ckpt: str | os.PathLike, platform: str, out: str | os.PathLike,
             data: str | None = None, joint_map: str | None = None, stats: str = "data",
             scratch: bool = False, seed: int = 0) -> str:
    """Write ``out``: the joint-wise ``ckpt`` as a model of ``platform``. ``stats``:
    ``data`` (normalise with the train split of ``data``, the target's own recordings:
    inputs only, no label is read) or ``source`` (the source's statistics of the mapped
    joints: no target data at all). Returns a one-line summary."""
    from nactuator.data.datamodule import NADDataModule

    src, meta = load_actuator(ckpt)
    source, target = load_platform(meta["platform"]), load_platform(platform)
    if stats not in ("data", "source"):
        raise TransferUserError(f"--stats must be 'data' or 'source', got {stats!r}")
    mapping = (parse_joint_map(joint_map, source, target) if joint_map
               else default_joint_map(source, target))
    dm = None
    if stats == "data" or src.dynamics == "next_state" or scratch:
        if data is None:
            raise TransferUserError("--data (the target arm's recordings) is needed for "
                                    "--stats data, a next-state model and --scratch")
        spec = meta["input_filters"]  # the source's input filters, for the target's inputs
        dm = NADDataModule(data, target, window_length=src.window_length,
                           temperature_median=int(spec["median"].get("temperature", 1)),
                           missing_telemetry=spec["missing"])
    norm = dm.norm_stats if stats == "data" else source_stats(src, mapping)
    step = dm.state_step if dm is not None else None
    try:
        if scratch:
            config = dict(src.model_config)
            if config.get("dynamics") == "next_state":
                config["state_step"] = step
            torch.manual_seed(seed)
            model = NeuralActuator(src.features, target.n, dm.norm_stats, config).eval()
        else:
            model = transfer_jointwise(src, target.n, norm, mapping, step)
    except TransferError as err:
        raise TransferUserError(str(err)) from err
    names = [None if j is None else source.channel_names[j] for j in mapping]
    origin = {"transferred_from": str(ckpt), "source_platform": source.name,
              "joint_map": dict(zip(target.channel_names, names, strict=True)),
              "stats": "data" if scratch else stats, "data": data, "scratch": scratch}
    bundle = bundle_to_dict(model, target.name, extra={
        "training_config": {"model_config": dict(model.model_config), "transfer": origin},
        "input_filters": meta["input_filters"]})
    path = save_bundle(bundle, out)
    what = ("an untrained model of the same architecture" if scratch
            else f"{ckpt} ({source.name}, {src.n_motors} joints)")
    pairs = ", ".join(f"{t}<-{s or 'mean'}" for t, s in origin["joint_map"].items())
    by = "target data" if scratch or stats == "data" else "source"
    return (f"wrote {path}: {what} as a {target.name} model ({target.n} joints; {pairs}; "
            f"inputs normalised with the {by} statistics)")
