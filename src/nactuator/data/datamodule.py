"""``NADDataModule``: rollout segments (Contract 2) and 9-frame windows from NAD shards.

All datasets are loaded once into one packed float32 table (rows = frames, columns = every
channel the batch needs). Each episode is preceded by ``history`` all-zero rows flagged as
padding, so the window ending at an episode's first frame is zero-padded and no window can
ever reach into the previous episode. A batch is then a single vectorised gather::

    rows = first_row_of_segment[:, None] + arange(T)     # (B, T)
    batch = packed[rows]                                 # (B, T, C) -> split into keys

so serving costs one ``index_select`` per batch, with no per-sample Python.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from nactuator.data.format import SPLITS, DataFormatError, read_dataset
from nactuator.data.stats import median_within_episodes, norm_stats
from nactuator.platforms import Platform, load_platform

__all__ = ["EpisodeInfo", "NADDataModule"]

# Channels in the batch, in packed-column order: (key, width kind). "n" = per motor.
_CHANNELS = (
    ("q_cmd", "n"),
    ("q", "n"),
    ("qd", "n"),
    ("effort", "n"),
    ("voltage", "n"),
    ("temperature", "n"),
    ("force", "3"),
    ("force_valid", "1"),
    ("condition", "n"),
    ("condition_valid", "n"),
    ("payload_mass", "1"),
    ("pad", "1"),
)
_BOOL_KEYS = ("force_valid", "condition_valid", "pad")


@dataclass(frozen=True)
class EpisodeInfo:
    """One episode as the DataModule numbers it (``episode_index`` in batches)."""

    index: int  # DataModule-wide index (what batches carry)
    dataset: str  # dataset root it came from
    dataset_episode: int  # episode_index inside that dataset
    task: str
    split: str
    length: int
    payload_mass: float


def _as_paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    if isinstance(paths, str | Path):
        paths = [p for p in str(paths).split(",") if p.strip()]
    out = [Path(p).expanduser() for p in paths]
    if not out:
        raise DataFormatError("NADDataModule: no dataset paths given")
    return out


class _Batches(IterableDataset):
    """Yields whole batches; draws a fresh seeded permutation every pass (epoch)."""

    def __init__(self, dm: NADDataModule, split: str, shuffle: bool) -> None:
        self.dm, self.split, self.shuffle = dm, split, shuffle
        self.epoch = 0

    @property
    def batch_size(self) -> int:
        return self.dm.batch_size if self.shuffle else self.dm.eval_batch_size

    def __len__(self) -> int:
        n = self.dm._num_samples(self.split, self.shuffle)
        return math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        dm = self.dm
        rng = np.random.default_rng([dm.seed, self.epoch])
        self.epoch += 1
        served, pos, horizon = 0, 0, None
        while True:
            if dm.horizon != horizon:  # first batch, or the curriculum moved on: re-plan
                horizon = dm.horizon
                starts = dm._segment_rows(self.split, self.shuffle)
                order = self._order(rng, len(starts))
                total = dm._num_samples(self.split, self.shuffle)
                order = order[served:] if not self.shuffle else order[: max(total - served, 0)]
                pos = 0
            if pos >= len(order):
                return
            take = order[pos : pos + self.batch_size]
            pos += len(take)
            served += len(take)
            yield dm._gather(starts[take], horizon)

    def _order(self, rng: np.random.Generator, n_starts: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(n_starts)
        if self.dm.samples_per_epoch is None:
            return rng.permutation(n_starts)
        if n_starts == 0:
            return np.zeros(0, np.int64)
        return rng.integers(0, n_starts, size=self.dm.samples_per_epoch)


class NADDataModule(L.LightningDataModule):
    """Rollout batches (Contract 2) from one or more NAD datasets of one platform.

    Args:
        paths: dataset folder(s): a list, or one string with comma-separated paths.
        platform: platform name (``conf/platform/<name>.yaml``) or a :class:`Platform`.
        history: frames of history before each window's current frame (8 -> 9-frame window).
        horizon: rollout steps H per segment; a segment has ``history + H + 1`` frames.
        batch_size: segments per batch.
        samples_per_epoch: training segments drawn (with replacement) per epoch; ``None``
            draws every valid start once, in a seeded random order.
        seed: seeds the training order (epoch e uses ``default_rng([seed, e])``).
        temperature_median: odd window (frames) of the running median applied to
            temperature before use; removes telemetry glitches (single frames and bursts of
            up to window // 2 frames). 1 serves the raw values.
        eval_batch_size: segments per validation/test batch (default: ``batch_size``).
    """

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        platform: str | Platform,
        history: int = 8,
        horizon: int = 128,
        batch_size: int = 16,
        samples_per_epoch: int | None = None,
        seed: int = 0,
        temperature_median: int = 11,
        eval_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.paths = _as_paths(paths)
        self.platform = platform if isinstance(platform, Platform) else load_platform(platform)
        # Plain-data hparams: they go into checkpoints (the training config of a bundle).
        self.save_hyperparameters(ignore=["paths", "platform"])
        self.hparams["paths"] = [str(p) for p in self.paths]
        self.hparams["platform"] = self.platform.name
        if history < 0:
            raise ValueError(f"history must be >= 0, got {history}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if samples_per_epoch is not None and samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be >= 1 or None, got {samples_per_epoch}")
        self.history = int(history)
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.samples_per_epoch = samples_per_epoch
        self.seed = int(seed)
        if temperature_median < 1 or temperature_median % 2 == 0:
            raise ValueError(f"temperature_median must be a positive odd number of frames, "
                             f"got {temperature_median}")
        self.temperature_median = int(temperature_median)
        self.horizon = self._check_horizon(horizon)
        self._loaded = False
        self._warned: set[tuple[str, int]] = set()
        self._segments: dict[tuple[str, int, bool], np.ndarray] = {}
        self._frame_rows: dict[str, np.ndarray] = {}
        self._train_batches: _Batches | None = None

    # -- public API ------------------------------------------------------------------

    def set_horizon(self, horizon: int) -> None:
        """Change the rollout length H (curriculum). Takes effect from the next batch drawn."""
        self.horizon = self._check_horizon(horizon)
        if self._loaded:
            self._segment_rows("train", True)  # fail now, not mid-epoch, if nothing fits

    @property
    def norm_stats(self) -> dict[str, dict[str, list]]:
        """Contract 2 normalisation statistics, from the train split only."""
        self._load()
        return self._norm_stats

    @property
    def episodes(self) -> list[EpisodeInfo]:
        self._load()
        return self._episodes

    @property
    def channels(self) -> list[str]:
        return self.platform.channel_names

    def setup(self, stage: str | None = None) -> None:
        self._load()

    def train_dataloader(self) -> DataLoader:
        self._load()
        self._segment_rows("train", True)
        if self._train_batches is None:
            self._train_batches = _Batches(self, "train", shuffle=True)
        return DataLoader(self._train_batches, batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def windows(self, split: str) -> dict[str, torch.Tensor]:
        """Every 9-frame window (``history + 1`` frames) ending at every frame of ``split``.

        Returns the batch keys with shape (N, history + 1, ...) plus ``episode_index`` and
        ``frame`` (N,): window i ends at frame ``frame[i]`` of that episode. Built with one
        gather, for force-only training/inference.
        """
        self._load()
        self._check_split(split)
        ends = self._split_frame_rows(split)
        rows = ends[:, None] - self.history + np.arange(self.history + 1)
        out = self._take(rows)
        out["episode_index"] = torch.from_numpy(self._row_episode[ends])
        out["frame"] = torch.from_numpy(ends - self._row_first[ends])
        return out

    def window_batch(self, split: str, index: np.ndarray) -> dict[str, torch.Tensor]:
        """Windows ending at the given positions of :meth:`windows`' order (a fast batch)."""
        self._load()
        ends = self._split_frame_rows(split)[np.asarray(index)]
        rows = ends[:, None] - self.history + np.arange(self.history + 1)
        return self._take(rows)

    def state_dict(self) -> dict:
        epoch = self._train_batches.epoch if self._train_batches else 0
        return {"horizon": self.horizon, "epoch": epoch, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.horizon = self._check_horizon(state.get("horizon", self.horizon))
        self.seed = int(state.get("seed", self.seed))
        if self._train_batches is None:
            self._train_batches = _Batches(self, "train", shuffle=True)
        self._train_batches.epoch = int(state.get("epoch", 0))

    # -- loading ---------------------------------------------------------------------

    def _check_horizon(self, horizon: int) -> int:
        if not isinstance(horizon, int | np.integer) or horizon < 1:
            raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
        return int(horizon)

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")

    def _load(self) -> None:
        if self._loaded:
            return
        p = self.platform
        n, hist = p.n, self.history
        datasets = []
        for path in self.paths:
            ds = read_dataset(path)
            if ds.platform != p.name:
                raise DataFormatError(
                    f"{path}: dataset platform is {ds.platform!r}, but the DataModule was "
                    f"built for {p.name!r} (all datasets must share one platform)"
                )
            if ds.info["nactuator"]["channels"] != p.channel_names:
                raise DataFormatError(
                    f"{path}: channels {ds.info['nactuator']['channels']} differ from "
                    f"platform {p.name!r} channels {p.channel_names}"
                )
            datasets.append(ds)
        episodes, parts = [], []
        for ds in datasets:
            for e in ds.episodes:
                episodes.append(
                    EpisodeInfo(len(episodes), str(ds.root), e.index, e.task, e.split,
                                e.length, e.payload_mass)
                )
                parts.append(e.frames)
        if not episodes:
            raise DataFormatError(f"no episodes in {[str(x) for x in self.paths]}")

        lengths = np.array([e.length for e in episodes], dtype=np.int64)
        frames = {k: np.concatenate([f[k] for f in parts]) for k in
                  ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "force",
                   "condition", "payload_mass")}
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        frames["temperature"] = median_within_episodes(
            frames["temperature"], starts, lengths, self.temperature_median
        )

        train_rows = np.concatenate(
            [np.arange(s, s + ln) for s, ln, e in zip(starts, lengths, episodes, strict=True)
             if e.split == "train"] or [np.zeros(0, np.int64)]
        )
        if len(train_rows) == 0:
            warnings.warn("NADDataModule: no train episodes; norm_stats are mean 0, std 1",
                          stacklevel=2)
        self._norm_stats = norm_stats(frames, train_rows)

        # Packed table: each episode preceded by `history` zero rows with pad = 1.
        widths = {"n": n, "3": 3, "1": 1}
        self._slices: dict[str, slice] = {}
        col = 0
        for key, kind in _CHANNELS:
            self._slices[key] = slice(col, col + widths[kind])
            col += widths[kind]
        total = int(lengths.sum()) + hist * len(episodes)
        packed = np.zeros((total, col), dtype=np.float32)
        # Where each episode's frame 0 lands in the packed table.
        first = starts + hist * (np.arange(len(episodes)) + 1)
        real = np.concatenate([np.arange(f, f + ln) for f, ln in zip(first, lengths, strict=True)])
        pad_rows = np.setdiff1d(np.arange(total), real, assume_unique=True)

        # A frame is force-labelled if any axis is; unlabelled axes of a labelled frame are
        # 0 N (NAD payload labels store only z: the weight, with x and y = -999).
        force = frames["force"]
        force_valid = np.isfinite(force).any(axis=1, keepdims=True)
        cond = frames["condition"]
        cond_valid = np.isfinite(cond)
        payload = frames["payload_mass"].reshape(-1, 1)
        values = {
            **{k: np.nan_to_num(frames[k], nan=0.0) for k in
               ("q_cmd", "q", "qd", "effort", "voltage", "temperature")},
            "force": np.where(force_valid, np.nan_to_num(force, nan=0.0), 0.0),
            "force_valid": force_valid.astype(np.float32),
            "condition": np.nan_to_num(cond, nan=0.0),
            "condition_valid": cond_valid.astype(np.float32),
            "payload_mass": np.nan_to_num(payload, nan=0.0),
        }
        for key, v in values.items():
            packed[real, self._slices[key]] = v
        packed[pad_rows, self._slices["pad"]] = 1.0

        row_episode = np.full(total, -1, dtype=np.int64)
        row_first = np.zeros(total, dtype=np.int64)
        ep_of_real = np.repeat(np.arange(len(episodes)), lengths)
        row_episode[real] = ep_of_real
        row_first[real] = first[ep_of_real]

        self._packed = packed
        self._first = first
        self._lengths = lengths
        self._episodes = episodes
        self._split_of = np.array([e.split for e in episodes])
        self._row_episode = row_episode
        self._row_first = row_first
        self._loaded = True

    # -- segments and gathering ------------------------------------------------------

    def _usable(self, split: str) -> np.ndarray:
        """Episode ids of ``split`` long enough for the current horizon (warns on the rest)."""
        H = self.horizon
        in_split = np.flatnonzero(self._split_of == split)
        short = in_split[self._lengths[in_split] < H + 1]
        if len(short) and (split, H) not in self._warned:
            self._warned.add((split, H))
            names = ", ".join(
                f"{self._episodes[i].task}#{self._episodes[i].dataset_episode}"
                f" ({self._lengths[i]} frames)" for i in short[:5]
            )
            warnings.warn(
                f"NADDataModule: skipping {len(short)} {split} episode(s) shorter than "
                f"horizon + 1 = {H + 1} frames: {names}{' ...' if len(short) > 5 else ''}",
                stacklevel=3,
            )
        usable = in_split[self._lengths[in_split] >= H + 1]
        if len(usable) == 0 and split == "train":
            longest = int(self._lengths[in_split].max()) if len(in_split) else 0
            raise DataFormatError(
                f"NADDataModule: no train episode has horizon + 1 = {H + 1} frames "
                f"({len(in_split)} train episodes, longest {longest} frames); "
                "lower the horizon or add longer episodes"
            )
        return usable

    def _segment_rows(self, split: str, random_starts: bool) -> np.ndarray:
        """Packed row of frame 0 of each segment, i.e. of frame ``s - history``.

        Training: every start s in [0, L - H - 1]. Validation/test: starts 0, H, 2H, ...
        (segments tiling the episode; a tail shorter than H + 1 frames is not scored).
        """
        self._load()
        H = self.horizon
        cached = self._segments.get((split, H, random_starts))
        if cached is not None:
            return cached
        rows = []
        for e in self._usable(split):
            n_starts = int(self._lengths[e]) - H
            step = 1 if random_starts else H
            s = np.arange(0, n_starts, step)
            rows.append(self._first[e] + s - self.history)
        out = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        self._segments[(split, H, random_starts)] = out
        return out

    def _num_samples(self, split: str, shuffle: bool) -> int:
        if shuffle and self.samples_per_epoch is not None:
            return self.samples_per_epoch
        return len(self._segment_rows(split, shuffle))

    def _split_frame_rows(self, split: str) -> np.ndarray:
        """Packed rows of every real frame of ``split``, in episode order (cached)."""
        rows = self._frame_rows.get(split)
        if rows is None:
            ids = np.flatnonzero(self._split_of == split)
            parts = [np.arange(self._first[e], self._first[e] + self._lengths[e]) for e in ids]
            rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            self._frame_rows[split] = rows
        return rows

    def _take(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        # numpy's take is single-threaded and ~2x faster here than torch.index_select,
        # whose intra-op threads collapse when the CPU cores are shared.
        block = torch.from_numpy(self._packed.take(rows.reshape(-1), axis=0)).view(
            *rows.shape, -1
        )
        out: dict[str, torch.Tensor] = {}
        for key, _ in _CHANNELS:
            v = block[..., self._slices[key]]
            if key in ("force_valid", "payload_mass", "pad"):
                v = v[..., 0]
            out[key] = v > 0.5 if key in _BOOL_KEYS else v
        return out

    def _gather(self, seg_rows: np.ndarray, horizon: int) -> dict[str, torch.Tensor]:
        T = self.history + horizon + 1
        rows = seg_rows[:, None] + np.arange(T)
        batch = self._take(rows)
        current = seg_rows + self.history  # packed row of frame s
        batch["episode_index"] = torch.from_numpy(self._row_episode[current])
        batch["start"] = torch.from_numpy(current - self._row_first[current])
        return batch

    def _eval_loader(self, split: str) -> DataLoader:
        self._load()
        self._usable(split)  # warn about short episodes once
        return DataLoader(_Batches(self, split, shuffle=False), batch_size=None)
