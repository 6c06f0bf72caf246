"""The episodes an evaluation runs on: a split of one or more nactuator datasets.

Episodes are the data room's :class:`nactuator.data.Episode` (``frames[key]`` is (T, n)
per motor, (T, 3) for force, NaN where unlabelled). This module picks a split, checks the
platform and the channels, and answers the label questions the metrics ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nactuator.data import Episode, read_dataset
from nactuator.data.commands import with_command_channels
from nactuator.data.folds import fold_splits
from nactuator.data.references import force_labels
from nactuator.errors import UserError
from nactuator.eval.metrics import CONTACT_THRESHOLD_N
from nactuator.input_filters import filter_inputs
from nactuator.platforms import Platform

__all__ = [
    "EvalDataError",
    "check_inputs",
    "condition_labels",
    "filter_episode",
    "force_labels",
    "is_no_contact",
    "load_episodes",
    "load_with_sources",
    "split_paths",
]


class EvalDataError(UserError, ValueError):
    """The data given to the evaluation cannot be evaluated; the message says why."""


def condition_labels(ep: Episode, n: int) -> np.ndarray:
    c = ep.frames.get("condition")
    return np.full((ep.length, n), np.nan) if c is None else np.asarray(c, np.float64)


def is_no_contact(ep: Episode) -> bool:
    """No labelled contact anywhere: a free-motion run or a matched no-contact reference."""
    f = np.nan_to_num(force_labels(ep), nan=0.0)
    return not bool((np.linalg.norm(f, axis=1) > CONTACT_THRESHOLD_N).any())


def split_paths(data: str | Path | Sequence[str | Path]) -> list[Path]:
    """``"a,b"`` or a list of dataset folders -> paths; each must exist."""
    if isinstance(data, str | Path):
        items = [p.strip() for p in str(data).split(",") if p.strip()]
    else:
        items = [str(p).strip() for p in data]
    if not items:
        raise EvalDataError("no dataset path given")
    paths = [Path(p) for p in items]
    for p in paths:
        if not p.exists():
            raise EvalDataError(f"dataset path {p} does not exist")
    return paths


def load_episodes(data, platform: Platform, split: str | None,
                  cv: tuple[int, int] | None = None) -> list[Episode]:
    """Every episode of ``split`` (None = all) in the dataset(s) ``data``; with ``cv =
    (folds, fold)`` the splits of that cross-validation fold (:mod:`nactuator.data.folds`).

    Raises :class:`EvalDataError` if a dataset was recorded on another platform or an
    episode is unusable; returns [] when the split is simply empty.
    """
    return [ep for _, ep in load_with_sources(data, platform, split, cv)]


def load_with_sources(data, platform: Platform, split: str | None,
                      cv: tuple[int, int] | None = None) -> list[tuple[Path, Episode]]:
    """Like :func:`load_episodes`, each episode paired with the dataset it came from
    (episode indices are only unique within one dataset)."""
    datasets = []
    for path in split_paths(data):
        ds = read_dataset(path)
        if ds.platform != platform.name:
            raise EvalDataError(
                f"{path}: dataset is for platform {ds.platform!r} but the checkpoint is for "
                f"{platform.name!r}; evaluate a checkpoint on data of its own platform")
        datasets.append((path, ds))
    splits = {(pos, ep.index): ep.split for pos, (_, ds) in enumerate(datasets)
              for ep in ds.episodes}
    if cv is not None:
        splits = fold_splits([(pos, ep.index, ep.task, ep.split)
                              for pos, (_, ds) in enumerate(datasets) for ep in ds.episodes],
                             *cv)
    out: list[tuple[Path, Episode]] = []
    for pos, (path, ds) in enumerate(datasets):
        for ep in ds.episodes:
            if split is None or splits[(pos, ep.index)] == split:
                check_episode(ep, platform.n, path)
                # Commands and exogenous conditions (gain, supply at the start), exactly
                # as the DataModule derives them for training.
                out.append((path, with_command_channels(ep, f"{path}: episode {ep.index}")))
    return out


def check_episode(ep: Episode, n: int, source: Path | str = "dataset") -> None:
    where = f"{source}: episode {ep.index} ({ep.task})"
    for key in ("q_cmd", "q"):
        if key not in ep.frames:
            raise EvalDataError(f"{where}: missing channel '{key}'")
        if ep.frames[key].shape != (ep.length, n):
            raise EvalDataError(f"{where}: channel '{key}' has shape {ep.frames[key].shape}, "
                                f"expected ({ep.length}, {n})")
    if not np.isfinite(ep.frames["q"][0]).all():
        raise EvalDataError(f"{where}: q at frame 0 is not finite; the rollout starts there")
    if ep.length < 2:
        raise EvalDataError(f"{where}: {ep.length} frame(s); a rollout needs at least 2")


def check_inputs(episodes: Sequence[Episode], keys: Sequence[str],
                 simulated: Sequence[str] = ()) -> None:
    """A clear error when the data lacks (or never recorded) a channel the model needs.

    ``simulated`` channels are filled in by the rollout and need not be recorded.
    """
    for ep in episodes:
        for key in keys:
            if key in simulated:
                continue
            arr = ep.frames.get(key)
            if arr is None or not np.isfinite(arr).any():
                what = "lacks it" if arr is None else "never recorded it (all NaN)"
                raise EvalDataError(f"episode {ep.index} ({ep.task}): the model needs channel "
                                    f"'{key}' but the data {what}")


def filter_episode(ep: Episode, spec: dict) -> Episode:
    """A copy of ``ep`` as the model sees it: its telemetry through the checkpoint's input
    filters (``meta["input_filters"]`` from ``load_actuator``; the one causal function
    training and the live loop run, :func:`nactuator.input_filters.filter_inputs`)."""
    frames, _ = filter_inputs(ep.frames, spec)
    return Episode(index=ep.index, task=ep.task, split=ep.split, length=ep.length,
                   payload_mass=ep.payload_mass, meta=ep.meta, frames=frames)
