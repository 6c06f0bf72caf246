"""The episodes an evaluation runs on: a split of one or more nactuator datasets.

Episodes are the data room's :class:`nactuator.data.Episode` (``frames[key]`` is (T, n)
per motor, (T, 3) for force, NaN where unlabelled), selected by the one loader
:mod:`nactuator.data.episodes` (as the DataModule selects them). This module adds what an
evaluation needs on top: an episode the rollout can start from, the channels the model
reads, and the label questions the metrics ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nactuator.constants import CONTACT_THRESHOLD_N
from nactuator.data import Episode
from nactuator.data.episodes import load_split
from nactuator.data.references import force_labels
from nactuator.errors import UserError
from nactuator.platforms import Platform, load_platform
from nactuator.rollout import causal_outputs

__all__ = [
    "BATCH_SIZE",
    "EvalDataError",
    "check_inputs",
    "condition_labels",
    "force_labels",
    "is_no_contact",
    "load_episodes",
    "load_filtered",
    "load_with_sources",
    "predict_episodes",
]

BATCH_SIZE = 4096  # windows per forward pass; ~1-2 MB of input, fast on any CPU


class EvalDataError(UserError, ValueError):
    """The data given to the evaluation cannot be evaluated; the message says why."""


def condition_labels(ep: Episode, n: int) -> np.ndarray:
    c = ep.frames.get("condition")
    return np.full((ep.length, n), np.nan) if c is None else np.asarray(c, np.float64)


def is_no_contact(ep: Episode) -> bool:
    """No labelled contact anywhere: a free-motion run or a matched no-contact reference
    (neither an end-effector force nor a contact on any link, ``contact_force``, above the
    contact threshold)."""
    for f in (force_labels(ep), ep.frames.get("contact_force")):
        if f is not None and (np.linalg.norm(np.nan_to_num(np.asarray(f, np.float64), nan=0.0),
                                             axis=1) > CONTACT_THRESHOLD_N).any():
            return False
    return True


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
    """Like :func:`load_episodes`, each episode paired with the dataset folder it came from
    (episode indices are only unique within one dataset). The selection, the derived
    channels and the platform check are :func:`nactuator.data.episodes.load_split`'s."""
    out = []
    for ds, ep in load_split(data, platform, split, cv, owner="the checkpoint",
                             error=EvalDataError):
        check_episode(ep, platform.n, ds.root)
        out.append((ds.root, ep))
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


def predict_episodes(actuator, episodes: Sequence[Episode],
                     batch_size: int = BATCH_SIZE) -> list[dict[str, np.ndarray]]:
    """Per episode: ``tau`` (T, n), ``force`` (T, 3), ``gate`` (T,), ``condition`` (T, n)
    for every frame; a model with the uncertainty head adds ``force_sigma``, ``force_lo``
    and ``force_hi`` (T, 3) (:func:`nactuator.rollout.causal_outputs`).

    Runs in eval mode (no dropout) without autograd; the actuator's mode is restored.
    """
    check_inputs(episodes, list(actuator.inputs))
    return causal_outputs(actuator, [ep.frames for ep in episodes], batch_size)


def load_filtered(ckpt, data, split: str | None):
    """The model of ``ckpt`` (checkpoint, bundle or exported file), its metadata and
    platform, and ``split`` of ``data`` through the model's causal input filters, as
    training and ``live`` see them: what ``infer`` and the contact calibration run on."""
    from nactuator.data.episodes import dataset_paths, filter_episode
    from nactuator.models import load_model

    actuator, meta = load_model(ckpt)
    platform = load_platform(meta["platform"])
    episodes = load_episodes(data, platform, split)
    if not episodes:
        where = ", ".join(str(p) for p in dataset_paths(data))
        raise EvalDataError(f"{where}: no episodes in split {split!r}")
    episodes = [filter_episode(ep, meta["input_filters"]) for ep in episodes]
    return actuator, meta, platform, episodes
