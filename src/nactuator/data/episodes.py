"""The episodes of a split: one loader for the DataModule, ``eval``, ``infer`` and ``bench-bam``.

Every reader of recorded episodes asks the same question: *which* episodes (a split of one
or more datasets, or of one cross-validation fold, :mod:`nactuator.data.folds`), with the
channels derived at load time (:mod:`nactuator.data.commands`: the next command, the gain,
the held start conditions) and, for what the model sees, through the input filters
(:mod:`nactuator.input_filters`). This module answers it once:

- :func:`dataset_paths`: ``"a,b"`` or a list -> dataset folders (the one parser of the
  comma-separated ``--data``);
- :func:`open_datasets`: read them, all of one platform and its channels;
- :func:`episode_splits`: each episode's split, the fold's when ``cv`` is given;
- :func:`load_split`: the (dataset, episode) pairs of a split, channels derived;
- :func:`filter_episode`: an episode through the input filters (what the model reads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from nactuator.data.commands import with_command_channels
from nactuator.data.folds import fold_splits
from nactuator.data.reader import read_dataset
from nactuator.data.schema import DataFormatError, Dataset, Episode
from nactuator.input_filters import filter_inputs
from nactuator.platforms import Platform

__all__ = ["dataset_paths", "episode_splits", "filter_episode", "load_split", "open_datasets"]

PathsLike = str | Path | Sequence[str | Path]


def dataset_paths(data: PathsLike, error: type[Exception] = DataFormatError) -> list[Path]:
    """``"a,b"`` (spaces around commas ignored) or a list of dataset folders -> paths
    (``~`` expanded). Raises ``error`` when none is given; existence is checked on reading."""
    items = str(data).split(",") if isinstance(data, str | Path) else [str(p) for p in data]
    paths = [Path(p.strip()).expanduser() for p in items if p.strip()]
    if not paths:
        raise error("no dataset path given")
    return paths


def open_datasets(data: PathsLike, platform: Platform, owner: str = "the model",
                  error: type[Exception] = DataFormatError) -> list[Dataset]:
    """The datasets ``data`` names, each checked to be recorded on ``platform`` with its
    channels. ``owner`` names who asks, for the message (e.g. "the checkpoint")."""
    datasets = []
    for path in dataset_paths(data, error):
        if not path.exists():
            raise error(f"dataset path {path} does not exist")
        ds = read_dataset(path)
        if ds.platform != platform.name:
            raise error(
                f"{path}: dataset is for platform {ds.platform!r} but {owner} is for "
                f"{platform.name!r}; use data of one platform")
        if ds.info["nactuator"]["channels"] != platform.channel_names:
            raise error(f"{path}: channels {ds.info['nactuator']['channels']} differ from "
                        f"platform {platform.name!r} channels {platform.channel_names}")
        datasets.append(ds)
    return datasets


def episode_splits(datasets: Sequence[Dataset],
                   cv: tuple[int, int] | None = None) -> dict[tuple[int, int], str]:
    """``{(dataset position, episode index): split}``: the recorded split, or with ``cv =
    (folds, fold)`` that fold's (``excluded`` for episodes the fold leaves out)."""
    if cv is not None:
        return fold_splits([(pos, e.index, e.task, e.split) for pos, ds in enumerate(datasets)
                            for e in ds.episodes], *cv)
    return {(pos, e.index): e.split for pos, ds in enumerate(datasets) for e in ds.episodes}


def load_split(data: PathsLike | Sequence[Dataset], platform: Platform, split: str | None,
               cv: tuple[int, int] | None = None, owner: str = "the model",
               error: type[Exception] = DataFormatError) -> list[tuple[Dataset, Episode]]:
    """Every episode of ``split`` (None = all but those a fold excludes) with its dataset,
    in dataset order, the command channels derived (:func:`with_command_channels`, as the
    DataModule serves them). ``data`` may be datasets already opened."""
    if isinstance(data, Sequence) and data and isinstance(data[0], Dataset):
        datasets = list(data)
    else:
        datasets = open_datasets(data, platform, owner, error)
    splits = episode_splits(datasets, cv)
    out = []
    for pos, ds in enumerate(datasets):
        for ep in ds.episodes:
            chosen = splits[(pos, ep.index)]
            if chosen == "excluded" or (split is not None and chosen != split):
                continue
            out.append((ds, with_command_channels(ep, f"{ds.root}: episode {ep.index}")))
    return out


def filter_episode(ep: Episode, filters: Mapping[str, object]) -> Episode:
    """A copy of ``ep`` as the model sees it: its telemetry through the input filters (the
    bundle's spec; the one causal function training, ``infer`` and the live loop run)."""
    frames, _ = filter_inputs(ep.frames, filters)
    return Episode(index=ep.index, task=ep.task, split=ep.split, length=ep.length,
                   payload_mass=ep.payload_mass, meta=ep.meta, frames=frames)
