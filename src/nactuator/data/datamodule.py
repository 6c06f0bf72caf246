"""``NADDataModule``: rollout segments and whole episodes (Contract 2) from nactuator datasets.

All datasets are loaded once into one packed float32 table (rows = frames, columns = every
channel the batch needs). Each episode is preceded by ``window_length - 1`` all-zero rows
flagged as padding, so the window ending at an episode's first frame is zero-padded and no
window can ever reach into the previous episode. A batch is then a single vectorised gather::

    rows = first_row_of_segment[:, None] + arange(T)     # (B, T)
    batch = packed[rows]                                 # (B, T, C) -> split into keys

so serving costs one ``take`` per batch, with no per-sample Python.

Training batches are segments of H + 1 frames after L - 1 frames of context; H (the
rollout horizon) follows the curriculum ``horizon`` ({first epoch: H}), read once per epoch
when Lightning asks for the train loader: the DataModule is the one owner of H. Validation
and test batches are whole episodes from frame 0 to their end, for the evaluation protocol.
With ``condition_frames`` K every training batch also carries K single frames drawn at
random from every condition-labelled frame of the train split (``batch["condition_frames"]``),
for the pooled condition head to learn from more, less correlated frames than the segments
hold (docs/results.md §6.3.4).
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

from nactuator.data.commands import COMMAND_KEYS, EXOGENOUS_KEYS, with_command_channels
from nactuator.data.curriculum import HorizonCurriculum
from nactuator.data.episodes import dataset_paths, episode_splits, open_datasets
from nactuator.data.normalization import norm_stats, state_step_stats
from nactuator.data.references import LinearForceReference
from nactuator.data.schema import REQUIRED_KEYS, SPLITS, DataFormatError
from nactuator.input_filters import MISSING_RULES, filter_inputs, input_filter_spec, pooled_keys
from nactuator.platforms import Platform, load_platform
from nactuator.rollout import WINDOW_LENGTH

__all__ = ["EpisodeInfo", "NADDataModule", "batch_mask_keys", "masks_camera_names"]

# Channels in the batch, in packed-column order: (key, width kind). "n" = per motor.
_CHANNELS = (
    ("q_cmd", "n"),
    ("q", "n"),
    ("qd", "n"),
    ("effort", "n"),
    ("voltage", "n"),
    ("temperature", "n"),
    # Commands and exogenous conditions known before execution (nactuator.data.commands):
    # what a counterfactual model reads instead of the recorded telemetry.
    ("torque_enable", "n"),
    ("q_cmd_next", "n"),
    ("kp", "n"),
    ("supply_voltage", "n"),
    ("initial_temperature", "n"),
    ("force", "3"),
    ("force_valid", "1"),
    # The linear force reference's estimate (nactuator.data.references, fit on the train
    # split): validation scores the model's force against it (val/score).
    ("force_linear", "3"),
    ("condition", "n"),
    ("condition_valid", "n"),
    ("payload_mass", "1"),
    # Labelled contacts anywhere on the arm (issue 23; NaN-free: body -1 = none): the
    # robot-MJCF body index, the point in its frame [m] and the force [N, base frame], for a
    # model trained with the contact's joint torque in the simulator step
    # (``model.external_torque``).
    ("contact_link", "1"),
    ("contact_point", "3"),
    ("contact_force", "3"),
    ("pad", "1"),
)
_CONTACT_KEYS = ("contact_link", "contact_point", "contact_force")
_BOOL_KEYS = ("force_valid", "condition_valid", "pad")
_MODEL_INPUTS = (*REQUIRED_KEYS, *COMMAND_KEYS,
                 *EXOGENOUS_KEYS)


def masks_camera_names(masks_camera: str | Sequence[str] | None) -> list[str]:
    """The cameras ``data.masks_camera`` serves, in order: none, one name, or a list."""
    if masks_camera is None:
        return []
    names = [masks_camera] if isinstance(masks_camera, str) else list(masks_camera)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"data.masks_camera must be a camera name or a non-empty list of "
                         f"names, got {masks_camera!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"data.masks_camera names a camera twice: {names}")
    return names


def batch_mask_keys(camera: str | None = None) -> tuple[str, str, str]:
    """The batch keys of one camera's ``masks``, ``mask_index`` and ``mask_valid``: the
    plain names when one camera is served (``camera`` None), else suffixed with the
    camera's name (``masks.so101_side``, ...), so several cameras share a batch."""
    suffix = "" if camera is None else f".{camera}"
    return f"masks{suffix}", f"mask_index{suffix}", f"mask_valid{suffix}"


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


class _Segments(IterableDataset):
    """One epoch of training segments at that epoch's horizon, in a seeded random order."""

    def __init__(self, dm: NADDataModule) -> None:
        self.dm = dm

    def __len__(self) -> int:
        return math.ceil(self.dm._num_train_samples() / self.dm.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        dm = self.dm
        horizon = dm.horizon  # fixed for the whole epoch
        starts = dm._segment_rows(horizon)
        rng = np.random.default_rng([dm.seed + dm._rank(), dm._epoch()])
        if dm.samples_per_epoch is None:
            order = rng.permutation(len(starts))
        else:
            order = rng.integers(0, len(starts), size=dm.samples_per_epoch)
        # the condition frames from a stream of their own: the segments' order is the same
        # with and without them
        frames_rng = np.random.default_rng([dm.seed + dm._rank(), dm._epoch(), 1])
        for pos in range(0, len(order), dm.batch_size):
            batch = dm._gather(starts[order[pos : pos + dm.batch_size]], horizon)
            if dm.condition_frames is not None:
                batch["condition_frames"] = dm._condition_frames(frames_rng)
            yield batch


class _Episodes(IterableDataset):
    """Whole episodes of a split, longest first, ``eval_batch_size`` episodes per batch."""

    def __init__(self, dm: NADDataModule, split: str) -> None:
        self.dm, self.split = dm, split
        ids = np.flatnonzero(dm._split_of == split)
        self.ids = ids[np.argsort(-dm._lengths[ids], kind="stable")]
        self.size = dm.eval_batch_size or max(len(self.ids), 1)

    def __len__(self) -> int:
        return math.ceil(len(self.ids) / self.size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for pos in range(0, len(self.ids), self.size):
            yield self.dm._whole_episodes(self.ids[pos : pos + self.size])


class NADDataModule(L.LightningDataModule):
    """Rollout batches (Contract 2) from one or more nactuator datasets of one platform.

    Args:
        paths: dataset folder(s): a list, or one string with comma-separated paths.
        platform: platform name (``conf/platform/<name>.yaml``) or a :class:`Platform`.
        window_length: frames per model input window (L = 9: the current frame and the
            L - 1 before it); must match the model's.
        horizon: rollout steps H per training segment (a segment has L + H frames), or a
            curriculum ``{first_epoch: H}`` (e.g. ``{0: 16, 5: 64}``).
        batch_size: training segments per batch.
        samples_per_epoch: training segments drawn (with replacement) per epoch; ``None``
            draws every valid start once, in a seeded random order.
        seed: seeds the training order (epoch e uses ``default_rng([seed + rank, e])``).
        temperature_median: odd window (frames) of the causal running median applied to
            temperature before use (the current frame and the window - 1 before it);
            removes telemetry glitches (single frames and bursts of up to window // 2
            frames). 1 serves the raw values.
        missing_telemetry: what a motor's telemetry reads as on a frame where it was not
            read (``telemetry_valid`` = 0): ``hold_last_valid`` (its last valid reading, what
            the live loop can serve causally) or ``zero``. With ``temperature_median`` this
            makes the input filter spec (:attr:`input_filters`,
            :mod:`nactuator.input_filters`) the checkpoint carries to eval, infer and live.
        pool_frames: horizon (frames) of the input filters' causal pooled statistics of
            effort and command (the ``pool_*`` channels the feature group ``pooled`` reads,
            served in every batch); ``None`` (default): none are computed or served.
        condition_frames: K: every training batch also carries ``condition_frames``, K
            single frames (windows of length 1: every channel of the segments, (K, 1, ...),
            plus ``episode_index`` and ``frame`` (K,)) drawn uniformly, with replacement, from
            the condition-labelled frames of every train episode, each with its filtered
            inputs and pooled statistics as the whole episode gives them (what ``infer``
            and ``live`` compute at that frame) and its condition labels: what the pooled
            condition head learns from (``model.loss.w_cond_frames``;
            conf/train/condition_frames.yaml). ``None`` (default): not served.
        eval_batch_size: whole episodes per validation/test batch (default: all of them).
        cv_folds, cv_fold: serve fold ``cv_fold`` of a ``cv_folds``-fold cross-validation
            by trajectory instead of the stored splits (:mod:`nactuator.data.folds`: the
            held-out runs become the test split, the next group validates).
        masks_camera: serve the silhouette masks of this camera (:mod:`nactuator.data.masks`;
            every dataset must have masks of it, with one camera file): each batch then
            carries ``masks`` (K, H, W) bool, the K masks of its frames, ``mask_index`` (B, T)
            int64, the row of ``masks`` holding frame t's mask (-1 where the frame has none)
            and ``mask_valid`` (B, T) = ``mask_index >= 0``. A list of cameras serves each
            camera's three under its own keys, :func:`batch_mask_keys` (``masks.NAME``, ...); a
            list of one is served like the plain name. :attr:`masks_camera_files` maps each
            camera to its camera file. ``None`` (default): no masks are read or served.
    """

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        platform: str | Platform,
        window_length: int = WINDOW_LENGTH,
        horizon: int | dict[int, int] = 128,
        batch_size: int = 16,
        samples_per_epoch: int | None = None,
        seed: int = 0,
        temperature_median: int = 11,
        missing_telemetry: str = "hold_last_valid",
        pool_frames: int | None = None,
        condition_frames: int | None = None,
        eval_batch_size: int | None = None,
        cv_folds: int | None = None,
        cv_fold: int = 0,
        masks_camera: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.paths = dataset_paths(paths)
        self.platform = platform if isinstance(platform, Platform) else load_platform(platform)
        # Plain-data hparams: they go into checkpoints (the training config of a bundle).
        self.save_hyperparameters(ignore=["paths", "platform"])
        self.hparams["paths"] = [str(p) for p in self.paths]
        self.hparams["platform"] = self.platform.name
        if not isinstance(window_length, int) or window_length < 1:
            raise ValueError(f"window_length must be an integer >= 1, got {window_length!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if samples_per_epoch is not None and samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be >= 1 or None, got {samples_per_epoch}")
        if eval_batch_size is not None and eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1 or None, got {eval_batch_size}")
        if condition_frames is not None and (not isinstance(condition_frames, int)
                                             or isinstance(condition_frames, bool)
                                             or condition_frames < 1):
            raise ValueError(f"condition_frames must be an integer >= 1 or None, got "
                             f"{condition_frames!r}")
        self.condition_frames = condition_frames
        self.window_length = int(window_length)
        self._before = self.window_length - 1  # context frames before a segment's start
        self.curriculum = HorizonCurriculum(horizon if isinstance(horizon, dict) else {0: horizon})
        self.batch_size = int(batch_size)
        self.eval_batch_size = eval_batch_size
        self.samples_per_epoch = samples_per_epoch
        self.seed = int(seed)
        if temperature_median < 1 or temperature_median % 2 == 0:
            raise ValueError(f"temperature_median must be a positive odd number of frames, "
                             f"got {temperature_median}")
        self.temperature_median = int(temperature_median)
        if missing_telemetry not in MISSING_RULES:
            raise ValueError(f"missing_telemetry must be one of {list(MISSING_RULES)}, got "
                             f"{missing_telemetry!r}")
        self.input_filters = input_filter_spec(self.temperature_median, missing_telemetry,
                                               pool_frames)
        # The batch's channels: the fixed ones, then the pooled statistics if computed.
        self._channels = (*_CHANNELS, *((k, "n") for k in pooled_keys(self.input_filters)))
        self.cv = None if cv_folds is None else (int(cv_folds), int(cv_fold))
        self.masks_camera = masks_camera
        self.masks_cameras = masks_camera_names(masks_camera)
        # camera -> its camera file, set when loaded (one entry per served camera)
        self.masks_camera_files: dict[str, Path] = {}
        self.epoch = 0  # the epoch used when no Trainer is attached
        self.force_reference: LinearForceReference | None = None  # set when loaded
        self._loaded = False
        self._warned: set[int] = set()
        self._segments: dict[int, np.ndarray] = {}
        # per served camera: packed row -> row of self._masks[camera] (-1: no mask)
        self._row_mask: dict[str, np.ndarray] = {}
        self._masks: dict[str, torch.Tensor] = {}

    # -- public API ------------------------------------------------------------------

    @property
    def horizon(self) -> int:
        """The rollout horizon H of the current epoch's training segments."""
        return self.curriculum.horizon_at(self._epoch())

    @property
    def norm_stats(self) -> dict[str, dict[str, list]]:
        """Contract 2 normalisation statistics, from the train split only."""
        self._load()
        return self._norm_stats

    @property
    def state_step(self) -> dict[str, list]:
        """Per-channel std of one step's change of q and qd over the train split
        (``{"dq": [n], "dqd": [n]}``): a next-state model's output scale."""
        self._load()
        return self._state_step

    @property
    def episodes(self) -> list[EpisodeInfo]:
        self._load()
        return self._episodes

    @property
    def channels(self) -> list[str]:
        return self.platform.channel_names

    def setup(self, stage: str | None = None) -> None:
        self._load()
        if stage == "fit" and self._trainer_attached():
            # The segment count, hence the loader's length, can change with the horizon and
            # the sampling order changes every epoch: rebuild the train loader each epoch.
            self.trainer.reload_dataloaders_every_n_epochs = 1
            for epoch, _ in self.curriculum.stages:  # fail now, not at epoch `epoch`
                self._segment_rows(self.curriculum.horizon_at(epoch))

    def train_dataloader(self) -> DataLoader:
        self._load()
        self._segment_rows(self.horizon)
        return DataLoader(_Segments(self), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self._episode_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._episode_loader("test")

    def unrecorded_channels(self) -> dict[str, dict[str, list[str]]]:
        """Per dataset path: ``{key: [channel, ...]}`` of model inputs that dataset never
        recorded (stored as NaN, served as 0), e.g. Franka's voltage."""
        self._load()
        return self._unrecorded

    def split_episodes(self, split: str) -> dict[str, torch.Tensor]:
        """Every episode of ``split`` as one whole-episode batch (what validation serves)."""
        self._load()
        self._check_split(split)
        return self._whole_episodes(np.flatnonzero(self._split_of == split))

    # -- loading ---------------------------------------------------------------------

    def _trainer_attached(self) -> bool:
        try:
            return self.trainer is not None
        except RuntimeError:
            return False

    def _epoch(self) -> int:
        return int(self.trainer.current_epoch) if self._trainer_attached() else self.epoch

    def _rank(self) -> int:
        # The train loader is an IterableDataset, which Lightning cannot shard with a
        # DistributedSampler: each DDP rank draws its own stream (samples_per_epoch each).
        return int(self.trainer.global_rank) if self._trainer_attached() else 0

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")

    def _load(self) -> None:
        if self._loaded:
            return
        p = self.platform
        n, hist = p.n, self._before
        datasets = open_datasets(self.paths, p, owner="the DataModule")
        splits = episode_splits(datasets, self.cv)
        episodes, parts = [], []
        self._unrecorded: dict[str, dict[str, list[str]]] = {}
        for pos, ds in enumerate(datasets):
            recorded = {k: np.zeros(n, bool) for k in _MODEL_INPUTS}
            # A per-episode value (the gain, the initial supply) must be known for every
            # episode: one episode without it would be served 0 without a word.
            complete = {k: np.ones(n, bool) for k in (*COMMAND_KEYS, *EXOGENOUS_KEYS)}
            for e in ds.episodes:
                if splits[(pos, e.index)] == "excluded":
                    continue
                episodes.append(
                    EpisodeInfo(len(episodes), str(ds.root), e.index, e.task,
                                splits[(pos, e.index)], e.length, e.payload_mass)
                )
                frames = with_command_channels(e, f"{ds.root}: episode {e.index}").frames
                for key in _MODEL_INPUTS:
                    recorded[key] |= np.isfinite(frames[key]).any(axis=0)
                for key in complete:
                    complete[key] &= np.isfinite(frames[key]).all(axis=0)
                # What the model sees, by the function eval, infer and live also run.
                parts.append(filter_inputs(frames, self.input_filters)[0])
            for key, ok in complete.items():
                recorded[key] &= ok
            self._unrecorded[str(ds.root)] = {
                key: [c for c, ok in zip(p.channel_names, seen, strict=True) if not ok]
                for key, seen in recorded.items() if not seen.all()}
        if not episodes:
            raise DataFormatError(f"no episodes in {[str(x) for x in self.paths]}")

        lengths = np.array([e.length for e in episodes], dtype=np.int64)
        pooled = pooled_keys(self.input_filters)
        frames = {k: np.concatenate([f[k] for f in parts]) for k in
                  (*REQUIRED_KEYS, "force", "condition", "payload_mass", *COMMAND_KEYS,
                   *EXOGENOUS_KEYS, *pooled)}
        widths_of = {"contact_link": (), "contact_point": (3,), "contact_force": (3,)}
        for k in _CONTACT_KEYS:  # optional: unlabelled files have none (NaN: no contact)
            frames[k] = np.concatenate([
                np.asarray(f[k], np.float64).reshape(len(f["q"]), *widths_of[k]) if k in f
                else np.full((len(f["q"]), *widths_of[k]), np.nan) for f in parts])
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])

        force_linear = self._linear_force(episodes, parts, frames, starts, lengths)

        train_rows = np.concatenate(
            [np.arange(s, s + ln) for s, ln, e in zip(starts, lengths, episodes, strict=True)
             if e.split == "train"] or [np.zeros(0, np.int64)]
        )
        if len(train_rows) == 0:
            warnings.warn("NADDataModule: no train episodes; norm_stats are mean 0, std 1",
                          stacklevel=2)
        self._norm_stats = norm_stats(frames, train_rows)
        step_rows = np.concatenate(
            [np.arange(s, s + ln - 1) for s, ln, e in zip(starts, lengths, episodes, strict=True)
             if e.split == "train"] or [np.zeros(0, np.int64)]
        )
        self._state_step = state_step_stats(frames, step_rows)

        # Packed table: each episode preceded by `window_length - 1` zero rows with pad = 1.
        widths = {"n": n, "3": 3, "1": 1}
        self._slices: dict[str, slice] = {}
        col = 0
        for key, kind in self._channels:
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
            **{k: np.nan_to_num(frames[k], nan=0.0) for k in (*_MODEL_INPUTS, *pooled)},
            "force": np.where(force_valid, np.nan_to_num(force, nan=0.0), 0.0),
            "force_valid": force_valid.astype(np.float32),
            "force_linear": force_linear,
            "condition": np.nan_to_num(cond, nan=0.0),
            "condition_valid": cond_valid.astype(np.float32),
            "payload_mass": np.nan_to_num(payload, nan=0.0),
            "contact_link": np.nan_to_num(frames["contact_link"], nan=-1.0).reshape(-1, 1),
            "contact_point": np.nan_to_num(frames["contact_point"], nan=0.0),
            "contact_force": np.nan_to_num(frames["contact_force"], nan=0.0),
        }
        for key, v in values.items():
            packed[real, self._slices[key]] = v
        packed[pad_rows, self._slices["pad"]] = 1.0
        packed[pad_rows, self._slices["contact_link"]] = -1.0  # no body

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
        # packed rows of the train frames with a condition label (condition_frames' pool)
        train_real = real[self._split_of[ep_of_real] == "train"]
        self._condition_rows = train_real[
            packed[train_real, self._slices["condition_valid"]].any(axis=1)]
        if self.condition_frames is not None and len(self._condition_rows) == 0:
            raise DataFormatError(
                f"data.condition_frames is set but no train frame of "
                f"{[str(x) for x in self.paths]} has a condition label")
        self._row_mask = self._load_masks(episodes, real, total)
        self._loaded = True

    def _load_masks(self, episodes: list[EpisodeInfo], real: np.ndarray,
                    total: int) -> dict[str, np.ndarray]:
        """Per served camera (``masks_camera``): every mask of every served episode in one
        bool array (``self._masks[camera]`` (K, H, W)) and, per packed row, the index of its
        frame's mask (-1: none; padding rows never have one). Empty without cameras."""
        return {camera: self._load_camera_masks(camera, episodes, real, total)
                for camera in self.masks_cameras}

    def _load_camera_masks(self, camera: str, episodes: list[EpisodeInfo], real: np.ndarray,
                           total: int) -> np.ndarray:
        from nactuator.data.masks import (
            _load_index,
            mask_cameras,
            mask_folder,
            read_episode_masks,
        )

        camera_text = None
        for root in self.paths:
            if camera not in mask_cameras(root):
                raise DataFormatError(
                    f"{root}: no masks of camera {camera!r} (data.masks_camera; it has: "
                    f"{', '.join(mask_cameras(root)) or 'none'}); render or import them "
                    "first (docs/vision.md)")
            cam_file = mask_folder(root, camera) / "camera.yaml"
            text = cam_file.read_text()
            if camera_text is None:
                camera_text, self.masks_camera_files[camera] = text, cam_file
            elif text != camera_text:
                raise DataFormatError(
                    f"{cam_file}: masks of camera {camera!r} were taken with another camera "
                    f"file than {self.masks_camera_files[camera]}; one run renders each "
                    "camera with one camera file")
        with_masks = {root: set(_load_index(mask_folder(root, camera))["episodes"])
                      for root in {e.dataset for e in episodes}}
        row_mask = np.full(total, -1, dtype=np.int64)
        stored, count, offset = [], 0, 0
        for e in episodes:
            frames = real[offset : offset + e.length]  # packed rows of this episode
            offset += e.length
            if str(e.dataset_episode) not in with_masks[e.dataset]:
                continue  # an episode without masks is served without them
            m = read_episode_masks(e.dataset, e.dataset_episode, camera)
            if m.masks.shape[0] != e.length:
                raise DataFormatError(
                    f"{mask_folder(e.dataset, camera)}: episode {e.dataset_episode} has masks "
                    f"for {m.masks.shape[0]} frames but {e.length} frames in the dataset")
            idx = np.asarray(m.frame_index, dtype=np.int64)
            row_mask[frames[idx]] = count + np.arange(len(idx))
            stored.append(m.masks[torch.as_tensor(idx)])
            count += len(idx)
        if not stored:
            raise DataFormatError(f"{', '.join(str(p) for p in self.paths)}: no episode has "
                                  f"masks of camera {camera!r}")
        self._masks[camera] = torch.cat(stored)
        return row_mask

    def _linear_force(self, episodes: list[EpisodeInfo], parts: list[dict],
                      frames: dict[str, np.ndarray], starts: np.ndarray,
                      lengths: np.ndarray) -> np.ndarray:
        """(frames, 3) the linear force reference's estimate of every frame, fit on the
        train episodes' served inputs (0 where the dataset has no force labels to fit)."""
        from nactuator.data.schema import Episode

        served = []
        for e, part, s, ln in zip(episodes, parts, starts, lengths, strict=True):
            own = dict(part)
            own["temperature"] = frames["temperature"][s : s + ln]
            served.append(Episode(e.dataset_episode, e.task, e.split, e.length,
                                  e.payload_mass, {}, own))
        train = [ep for ep in served if ep.split == "train"]
        labelled = any(np.isfinite(ep.frames["force"]).any() for ep in train)
        self.force_reference = LinearForceReference.fit(train) if labelled else None
        if self.force_reference is None:
            return np.zeros((int(lengths.sum()), 3), np.float32)
        return np.concatenate([self.force_reference.predict(ep) for ep in served]).astype(
            np.float32)

    # -- segments and gathering ------------------------------------------------------

    def _segment_rows(self, horizon: int) -> np.ndarray:
        """Packed row of the first context frame (frame ``s - (L - 1)``) of every training
        segment: each start ``s`` in ``[0, length - H - 1]`` of each train episode long
        enough for ``horizon`` (cached per horizon; warns once about the short ones)."""
        self._load()
        cached = self._segments.get(horizon)
        if cached is not None:
            return cached
        train = np.flatnonzero(self._split_of == "train")
        short = train[self._lengths[train] < horizon + 1]
        usable = train[self._lengths[train] >= horizon + 1]
        if len(usable) == 0:
            longest = int(self._lengths[train].max()) if len(train) else 0
            raise DataFormatError(
                f"NADDataModule: no train episode has horizon + 1 = {horizon + 1} frames "
                f"({len(train)} train episodes, longest {longest} frames); "
                "lower the horizon or add longer episodes")
        if len(short) and horizon not in self._warned:
            self._warned.add(horizon)
            names = ", ".join(f"{self._episodes[i].task}#{self._episodes[i].dataset_episode}"
                              f" ({self._lengths[i]} frames)" for i in short[:5])
            warnings.warn(
                f"NADDataModule: skipping {len(short)} train episode(s) shorter than "
                f"horizon + 1 = {horizon + 1} frames: {names}{' ...' if len(short) > 5 else ''}",
                stacklevel=3)
        out = np.concatenate([self._first[e] + np.arange(self._lengths[e] - horizon) - self._before
                              for e in usable])
        self._segments[horizon] = out
        return out

    def _num_train_samples(self) -> int:
        if self.samples_per_epoch is not None:
            return self.samples_per_epoch
        return len(self._segment_rows(self.horizon))

    def _take(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        # numpy's take is single-threaded and ~2x faster here than torch.index_select,
        # whose intra-op threads collapse when the CPU cores are shared.
        block = torch.from_numpy(self._packed.take(rows.reshape(-1), axis=0)).view(
            *rows.shape, -1
        )
        out: dict[str, torch.Tensor] = {}
        for key, _ in self._channels:
            v = block[..., self._slices[key]]
            if key in ("force_valid", "payload_mass", "pad", "contact_link"):
                v = v[..., 0]
            out[key] = v > 0.5 if key in _BOOL_KEYS else v
        keyed = len(self.masks_cameras) > 1
        for camera, row_mask in self._row_mask.items():
            # The batch's masks in row-major (B, T) order; mask_index points into them.
            index = row_mask[rows]
            have = index >= 0
            local = np.full(index.shape, -1, dtype=np.int64)
            local[have] = np.arange(int(have.sum()))
            masks, mask_index, mask_valid = batch_mask_keys(camera if keyed else None)
            out[masks] = self._masks[camera][torch.from_numpy(index[have])]
            out[mask_index] = torch.from_numpy(local)
            out[mask_valid] = torch.from_numpy(have)
        return out

    def _gather(self, seg_rows: np.ndarray, horizon: int) -> dict[str, torch.Tensor]:
        rows = seg_rows[:, None] + np.arange(self.window_length + horizon)
        batch = self._take(rows)
        current = seg_rows + self._before  # packed row of frame s
        batch["episode_index"] = torch.from_numpy(self._row_episode[current])
        batch["start"] = torch.from_numpy(current - self._row_first[current])
        return batch

    def _condition_frames(self, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """``condition_frames`` frames drawn from the condition-labelled train frames: every
        channel as a window of length 1, (K, 1, ...), with ``episode_index`` and ``frame``
        (its index in the episode), (K,)."""
        rows = self._condition_rows[rng.integers(0, len(self._condition_rows),
                                                 size=self.condition_frames)]
        frames = self._take(rows[:, None])
        frames["episode_index"] = torch.from_numpy(self._row_episode[rows])
        frames["frame"] = torch.from_numpy(rows - self._row_first[rows])
        return frames

    def _whole_episodes(self, ids: np.ndarray) -> dict[str, torch.Tensor]:
        """Episodes ``ids`` from frame 0 to their end: the L - 1 padding rows, then every
        frame; shorter episodes repeat their last frame (``length`` says where each ends)."""
        lengths = self._lengths[ids]
        span = self._before + int(lengths.max(initial=1))
        offsets = np.arange(span)
        first = self._first[ids] - self._before
        last = self._first[ids] + lengths - 1
        rows = np.minimum(first[:, None] + offsets, last[:, None])
        batch = self._take(rows)
        batch["episode_index"] = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        batch["start"] = torch.zeros(len(ids), dtype=torch.int64)
        batch["length"] = torch.from_numpy(lengths.astype(np.int64))
        return batch

    def _episode_loader(self, split: str) -> DataLoader:
        self._load()
        if not (self._split_of == split).any():
            counts = {s: int((self._split_of == s).sum()) for s in SPLITS}
            where = ", ".join(str(p) for p in self.paths)
            hint = ("validation picks the best checkpoint (val/score)" if split == "validation"
                    else "evaluate another split, e.g. `nactuator validate` or "
                         "`nactuator eval --split validation`")
            raise DataFormatError(
                f"{where}: no {split} episodes (episodes per split: {counts}); {hint}")
        return DataLoader(_Episodes(self, split), batch_size=None)
