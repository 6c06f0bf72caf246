"""Writing datasets: :class:`DatasetWriter` creates a dataset or opens one to append whole
episodes, validates them against the schema (:mod:`nactuator.data.validation`), and commits
each flush atomically (the tables' bytes: :mod:`nactuator.data.commit`). An append
writes its new data and episodes files in ``.nactuator/staging``, moves them to their numbered
places, rewrites ``tasks.parquet`` (it only ever grows) and ``stats.json``, and replaces
``info.json`` last, the commit point (:mod:`nactuator.data.committed`). On opening, the writer
takes the dataset's lock, deletes whatever an interrupted append left, recomputes stale
statistics (:mod:`nactuator.data.recovery`), and commits the episodes of recordings whose
process died (their journals, :mod:`nactuator.data.journal`).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from nactuator import atomic
from nactuator.atomic import json_safe
from nactuator.data.commit import episodes_table, parquet_bytes, ranges, tasks_table
from nactuator.data.committed import (
    WriterLock,
    committed_state,
    json_bytes,
    load_info,
    load_json,
    mkdir_durable,
    recorded_fps,
    sha256,
    stray_files,
)
from nactuator.data.dataset_stats import (
    add_frames,
    stats_bytes,
    stats_from_json,
)
from nactuator.data.journal import EpisodeJournal
from nactuator.data.recovery import (
    discard_journal,
    foreign_files,
    interrupted_recordings,
    roll_back,
)
from nactuator.data.schema import (
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_FILE_SIZE_IN_MB,
    DATA_PATH,
    DECLARED_KEYS,
    EPISODES_PATH,
    FEATURES,
    FORMAT_TAG,
    PRIVATE_DIR,
    SPLITS,
    DataFormatError,
    declared_keys,
    feature_schema,
    nominal_fps,
)
from nactuator.data.validation import check_compatible, check_labels, validate_frames
from nactuator.platforms import Platform

__all__ = ["JOURNAL_CHUNK_S", "DatasetWriter"]

log = logging.getLogger(__name__)

JOURNAL_CHUNK_S = 2.0  # a recording in progress reaches the disk every this many seconds
_INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


# Every file the writer puts into a dataset goes through these two (the crash tests hook them).
def _atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic.write_bytes(path, data)


def _publish(src: Path, dst: Path) -> None:
    """Move a staged file to its place in the dataset (atomic rename, flushed)."""
    atomic.replace(src, dst)


@dataclass
class _PendingEpisode:
    index: int
    task: str
    split: str
    frames: dict[str, np.ndarray]  # canonical key -> float32 (T, w); timestamp (T,)
    meta: dict
    journal: EpisodeJournal | Path | None = None  # deleted once the episode is committed


class DatasetWriter:
    """Create a dataset, or open one for appending, and add whole episodes to it.

    Episodes are buffered and written on :meth:`flush`/:meth:`close` (or whenever the
    buffer passes ``DATA_FILE_SIZE_IN_MB``) as new files; each flush is one atomic commit
    (see the module docstring). Used as a context manager, an exception inside the block
    discards the buffered episodes and leaves the dataset exactly as it was.

    Opening an existing dataset takes its writer lock at once (a second writer is refused
    before it starts any work), removes what an interrupted append left, and commits
    episodes whose recording was interrupted (:attr:`recovered`); :meth:`close` or
    :meth:`abort` releases the lock. A new dataset's folder is created at the first write
    (:meth:`add_episode`, :meth:`begin_episode`, :meth:`flush`), committed empty before
    anything else, so a crash can never leave a folder that later runs refuse, and a
    writer that never writes leaves nothing behind.
    """

    def __init__(
        self,
        root: str | Path,
        platform: Platform,
        fps: float,
        metadata: dict | None = None,
        declared: tuple[str, ...] = (),
    ) -> None:
        self.root = Path(root)
        self.platform = platform
        self.fps = float(fps)
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise DataFormatError(f"{self.root}: fps must be a positive number, got {fps!r}")
        self.recovered: list[tuple[int, int]] = []  # (episode_index, frames) from journals
        self._metadata = metadata
        self._declared = tuple(declared)
        self._features = feature_schema(platform, self._declared)
        self._pending: list[_PendingEpisode] = []
        self._pending_bytes = 0
        self._journals: list[EpisodeJournal] = []  # begun, not yet added
        self._lock: WriterLock | None = None
        self._metas: list[dict] | None = []  # episode_meta of committed episodes (lazy)
        self._closed = False
        if (self.root / "meta" / "info.json").exists():
            info = load_info(self.root)
            self._check_compatible(info)  # before locking: refuse cheaply
            theirs = declared_keys(info)
            missing = sorted(set(self._declared) - set(theirs))
            if missing:
                raise DataFormatError(
                    f"{self.root}: the dataset does not declare {missing} "
                    f"(it declares {list(theirs)}); write these episodes to a new dataset")
            self._declared = theirs  # appended episodes without them get the default
            self._features = feature_schema(platform, theirs)
            self._exists = True
            self._acquire()
        else:
            if self.root.exists() and not self.root.is_dir():
                raise DataFormatError(f"{self.root}: exists and is not a folder; expected a "
                                      "dataset folder")
            if self.root.exists() and foreign_files(self.root):
                raise DataFormatError(
                    f"{self.root}: folder exists and is not empty but has no meta/info.json; "
                    "expected an empty folder or an existing nactuator dataset"
                )
            self._exists = False
            self._next_episode = 0

    # -- public API -------------------------------------------------------------------

    def add_episode(
        self,
        frames: dict[str, np.ndarray],
        task: str,
        split: str,
        episode_meta: dict | None = None,
        journal: EpisodeJournal | None = None,
    ) -> int:
        """Validate and buffer one episode; returns its dataset-wide ``episode_index``.

        ``journal``: the :meth:`begin_episode` journal these frames were recorded into; it
        is deleted once the episode is committed (its id is kept in the episode's meta).
        """
        clean, meta = self.check_episode(frames, task, split, episode_meta)
        self._acquire()
        if journal is not None:
            journal.close()  # every chunk handed over is on disk before the commit
            if journal in self._journals:
                self._journals.remove(journal)
            meta["journal"] = journal.id
        return self._buffer(clean, task, split, meta, journal)

    def begin_episode(
        self,
        task: str,
        split: str,
        episode_meta: dict | None = None,
        chunk_seconds: float = JOURNAL_CHUNK_S,
    ) -> EpisodeJournal:
        """Start journaling an episode being recorded: hand its frames to
        ``journal.extend`` as they come (a chunk reaches the disk every ``chunk_seconds``),
        then pass the journal to :meth:`add_episode` with the whole episode. If the process
        dies first, the next writer on this dataset commits the journaled frames as an
        interrupted episode (meta ``interrupted``/``recovered`` true)."""
        meta = check_labels(task, split, episode_meta, self._where())
        self._acquire()
        folder = self.root / PRIVATE_DIR / "journal" / EpisodeJournal.new_id()
        mkdir_durable(folder.parent)  # once per dataset; the journal fsyncs its own folder
        journal = EpisodeJournal(folder, task, split, meta, self.fps,
                                 chunk_frames=round(chunk_seconds * self.fps))
        self._journals.append(journal)
        return journal

    def check_episode(
        self,
        frames: dict[str, np.ndarray],
        task: str,
        split: str,
        episode_meta: dict | None = None,
    ) -> tuple[dict[str, np.ndarray], dict]:
        """Validate an episode without adding it (importers check every file first).

        Returns the frames as stored (float32, optional keys filled) and the meta dict.
        """
        where = self._where()
        meta = check_labels(task, split, episode_meta, where)
        # values, not the key: a journal hands back every key, NaN where nothing was given
        undeclared = sorted(k for k in frames if k in DECLARED_KEYS and k not in self._declared
                            and not np.isnan(np.asarray(frames[k], dtype=np.float64)).all())
        if undeclared:
            raise DataFormatError(f"{where}: frame keys {undeclared} are not declared by this "
                                  "dataset; create it with DatasetWriter(declared=...)")
        return validate_frames(frames, self.platform, self.fps, where), meta

    def _where(self) -> str:
        """The next episode, for messages; refuses a closed writer."""
        if self._closed:
            raise DataFormatError(f"{self.root}: writer is closed")
        return f"{self.root}: episode {self._next_episode}"

    def episode_metas(self) -> list[dict]:
        """The ``episode_meta`` of every committed and buffered episode, in index order
        (importers look up source hashes here)."""
        if self._metas is None:
            rows = committed_state(self.root, self._info).rows
            self._metas = [json.loads(r["meta"]) if r["meta"] else {} for r in rows]
        return list(self._metas) + [ep.meta for ep in self._pending]

    def flush(self) -> None:
        """Commit the buffered episodes: one new data file + one new episodes file."""
        self._acquire()
        if not self._pending:
            return
        undo = self._undo_point()
        try:
            self._write_pending()
        except BaseException:
            if not self._committed_on_disk():
                self._roll_back_to(undo)
                raise
            log.warning("%s: an error followed the commit of episodes %d..%d; they are saved",
                        self.root, self._pending[0].index, self._pending[-1].index,
                        exc_info=True)
        self._after_commit()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        for journal in self._journals:  # begun but never added: keep them for recovery
            journal.close()
        self._closed = True
        self._release()

    def abort(self) -> None:
        """Drop buffered episodes; the dataset on disk stays as it was."""
        for ep in self._pending:
            discard_journal(ep.journal)
        for journal in self._journals:
            journal.close()
        self._pending = []
        self._pending_bytes = 0
        self._closed = True
        self._release()

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- opening: the lock, roll back, recovery ----------------------------------------

    def _check_compatible(self, info: dict) -> None:
        check_compatible(info, self.platform, self.fps, str(self.root / "meta" / "info.json"))

    def _acquire(self) -> None:
        """Take the writer lock and bring the dataset to its last commit (once)."""
        if self._closed:
            raise DataFormatError(f"{self.root}: writer is closed")
        if self._lock is not None:
            return
        if not self._exists:
            self._create()
            return
        self._lock = WriterLock(self.root)
        try:
            self._open_existing()
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _create(self) -> None:
        """Commit an empty dataset (``info.json`` first), so every later state is one that
        opens: a crash from here on leaves a dataset, never a folder that is refused."""
        mkdir_durable(self.root)
        self._lock = WriterLock(self.root)
        try:
            if (self.root / "meta" / "info.json").exists():
                raise DataFormatError(f"{self.root}: another process created a dataset here "
                                      "meanwhile; run again to append to it")
            if foreign_files(self.root):
                raise DataFormatError(f"{self.root}: files appeared in the folder meanwhile")
            for p in stray_files(self.root):
                p.unlink(missing_ok=True)
            self._info = self._new_info(self._metadata or {})
            self._tasks, self._stats, self._metas = {}, {}, []
            self._next_episode = self._next_frame = 0
            self._next_data_file = self._next_episodes_file = 0
            self._write_meta(info_first=True)
            self._exists = True
        except BaseException:
            self._release()
            raise

    def _open_existing(self) -> None:
        info = load_info(self.root)
        self._check_compatible(info)
        state, self._tasks = roll_back(self.root, info, _atomic_write_bytes)
        if self._metadata:
            info["nactuator"].setdefault("metadata", {}).update(self._metadata)
        # A dataset from before nactuator.fps: its next commit moves the recorded rate there
        # and gives LeRobot its integer fps.
        info["nactuator"]["fps"] = recorded_fps(info)
        info["fps"] = nominal_fps(info["nactuator"]["fps"])
        self._info = info
        stored = load_json(self.root / "meta" / "stats.json")
        self._stats = {name: stats_from_json(s) for name, s in stored.items()}
        self._metas = None  # read from meta/episodes when first needed
        self._next_episode = int(info["total_episodes"])
        self._next_frame = int(info["total_frames"])
        self._next_data_file = state.data_files
        self._next_episodes_file = state.episodes_files
        self._recover_journals()

    def _recover_journals(self) -> None:
        """Commit the frames of recordings whose process died (see EpisodeJournal)."""
        if not (self.root / PRIVATE_DIR / "journal").is_dir():
            return
        committed = {m.get("journal") for m in self.episode_metas()}
        for journal, header, frames in interrupted_recordings(self.root, committed):
            meta = {**header.get("episode_meta", {}), "interrupted": True, "recovered": True,
                    "journal": journal.name}
            try:
                clean, meta = self.check_episode(frames, header["task"], header["split"], meta)
            except (DataFormatError, KeyError) as e:
                log.warning("%s: cannot recover the interrupted recording in %s: %s",
                            self.root, journal, e)
                continue
            index = self._buffer(clean, header["task"], header["split"], meta, journal)
            self.flush()
            self.recovered.append((index, len(clean["timestamp"])))
            log.warning("%s: recovered episode %d (%d frames, %.1f s) from a recording that "
                        "was interrupted", self.root, index, len(clean["timestamp"]),
                        len(clean["timestamp"]) / self.fps)

    # -- committing --------------------------------------------------------------------

    def _buffer(self, clean: dict, task: str, split: str, meta: dict,
                journal: EpisodeJournal | Path | None) -> int:
        ep = _PendingEpisode(self._next_episode, task, split, clean, meta, journal)
        self._pending.append(ep)
        self._pending_bytes += sum(a.nbytes for a in clean.values())
        self._next_episode += 1
        if self._pending_bytes > DATA_FILE_SIZE_IN_MB * 2**20:
            self.flush()
        return ep.index

    def _undo_point(self) -> dict:
        meta = self.root / "meta"
        return {
            "files": {p: p.read_bytes() for p in (meta / "tasks.parquet", meta / "stats.json")
                      if p.exists()},
            "info": json.loads(json.dumps(self._info)),
            "state": (dict(self._tasks), dict(self._stats), self._next_frame,
                      self._next_data_file, self._next_episodes_file),
        }

    def _committed_on_disk(self) -> bool:
        """Did the failed flush get as far as replacing info.json?"""
        try:
            on_disk = json.loads((self.root / "meta" / "info.json").read_text())
        except (OSError, ValueError):
            return False
        return on_disk.get("total_episodes") == self._pending[-1].index + 1

    def _roll_back_to(self, undo: dict) -> None:
        """In-process undo of a failed flush: delete its new files, put the meta files back
        byte for byte, restore the writer's state (the episodes stay buffered)."""
        self._info = undo["info"]
        (self._tasks, self._stats, self._next_frame, self._next_data_file,
         self._next_episodes_file) = undo["state"]
        try:
            for p in committed_state(self.root, self._info).leftovers:
                p.unlink(missing_ok=True)
            for p, data in undo["files"].items():
                if not p.exists() or p.read_bytes() != data:
                    _atomic_write_bytes(p, data)
        except Exception:  # the next writer to open the dataset rolls back instead
            log.warning("%s: could not undo a failed write now; the next writer will",
                        self.root, exc_info=True)

    def _after_commit(self) -> None:
        for ep in self._pending:
            if self._metas is not None:
                self._metas.append(ep.meta)
            discard_journal(ep.journal)
        self._pending = []
        self._pending_bytes = 0

    # -- writing ---------------------------------------------------------------------

    def _new_info(self, metadata: dict) -> dict:
        p = self.platform
        return {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": p.robot_type,
            "total_episodes": 0,
            "total_frames": 0,
            "total_tasks": 0,
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILE_SIZE_IN_MB,
            "video_files_size_in_mb": 200,
            "fps": nominal_fps(self.fps),  # LeRobot's: an int; the recorded rate is nactuator.fps
            "splits": {},
            "data_path": DATA_PATH,
            "video_path": None,
            "features": self._features,
            "nactuator": {
                "format": FORMAT_TAG,
                "platform": p.name,
                "fps": self.fps,
                "channels": p.channel_names,
                "effort_signal": p.effort_signal,
                "metadata": metadata,
                "commit": {"total_episodes": 0, "data_files": 0, "episodes_files": 0,
                           "stats_sha256": None},
            },
        }

    def _write_pending(self) -> None:
        """Stage the new files, move them into place, then the meta files, info.json last."""
        n = self.platform.n
        file_no = self._next_data_file
        chunk, fidx = divmod(file_no, CHUNKS_SIZE)
        data_rel = DATA_PATH.format(chunk_index=chunk, file_index=fidx)
        e_chunk, e_fidx = divmod(self._next_episodes_file, CHUNKS_SIZE)

        task_index = dict(self._tasks)
        columns: dict[str, list[np.ndarray]] = {c: [] for c in _INDEX_COLUMNS}
        stored = {k: spec for k, spec in FEATURES.items() if spec.name in self._features}
        columns.update({spec.name: [] for spec in stored.values()})
        rows: list[dict] = []
        frame = self._next_frame
        for ep in self._pending:
            length = ep.frames["timestamp"].shape[0]
            tidx = task_index.setdefault(ep.task, len(task_index))
            columns["timestamp"].append(ep.frames["timestamp"])
            columns["frame_index"].append(np.arange(length, dtype=np.int64))
            columns["episode_index"].append(np.full(length, ep.index, dtype=np.int64))
            columns["index"].append(np.arange(frame, frame + length, dtype=np.int64))
            columns["task_index"].append(np.full(length, tidx, dtype=np.int64))
            for key, spec in stored.items():
                columns[spec.name].append(ep.frames[key])
            rows.append(self._episode_row(ep, length, frame, chunk, fidx, e_chunk, e_fidx))
            frame += length

        vector_columns = {s.name for s in FEATURES.values() if s.width != "1"}
        arrays, names = [], []
        for name, parts in columns.items():
            values = np.concatenate(parts)
            if name in vector_columns:
                flat = pa.array(values.reshape(-1), type=pa.float32())
                arrays.append(pa.FixedSizeListArray.from_arrays(flat, values.shape[1]))
            else:
                arrays.append(pa.array(values.reshape(-1)))
            names.append(name)
        data_table = pa.Table.from_arrays(arrays, names=names)

        data_path = self.root / data_rel
        ep_path = self.root / EPISODES_PATH.format(chunk_index=e_chunk, file_index=e_fidx)
        for path in (data_path, ep_path):
            if path.exists():
                raise DataFormatError(f"{path}: refusing to overwrite an existing file")
        # Staged first: until they are moved into place, LeRobot readers (which read every
        # parquet file under data/ and meta/episodes/) cannot see a half-done append.
        staging = self.root / PRIVATE_DIR / "staging"
        staged_data, staged_eps = staging / "data.parquet", staging / "episodes.parquet"
        mkdir_durable(staging)
        _atomic_write_bytes(staged_data, parquet_bytes(data_table))
        _atomic_write_bytes(staged_eps, parquet_bytes(episodes_table(rows, n)))
        mkdir_durable(data_path.parent)
        mkdir_durable(ep_path.parent)
        _publish(staged_data, data_path)
        _publish(staged_eps, ep_path)

        new_frames = {key: np.concatenate([ep.frames[key] for ep in self._pending])
                      for key in self._pending[0].frames
                      if key not in FEATURES or key in stored}
        self._tasks, self._stats = task_index, add_frames(self._stats, new_frames)
        self._next_frame = frame
        self._next_data_file += 1
        self._next_episodes_file += 1
        self._info["total_episodes"] = self._pending[-1].index + 1
        self._info["total_frames"] = frame
        self._info["total_tasks"] = len(task_index)
        self._info["splits"] = self._splits_after(rows)
        self._write_meta()

    def _episode_row(self, ep, length, frame, chunk, fidx, e_chunk, e_fidx) -> dict:
        payload = ep.meta.get("payload_mass")
        if payload is None:
            pm = ep.frames["payload_mass"][:, 0]
            payload = float(np.nanmax(pm)) if np.isfinite(pm).any() else math.nan
        cond = ep.frames["condition"]
        with np.errstate(invalid="ignore"):
            labelled = np.isfinite(cond).any(axis=0)
            means = np.nanmean(np.where(labelled, cond, 0.0), axis=0)
            condition = np.where(labelled, means, np.nan)
        return {
            "episode_index": ep.index,
            "tasks": [ep.task],
            "length": length,
            "split": ep.split,
            "task": ep.task,
            "payload_mass": float(payload),
            "condition": condition.astype(np.float32),
            "data/chunk_index": chunk,
            "data/file_index": fidx,
            "dataset_from_index": frame,
            "dataset_to_index": frame + length,
            "meta/episodes/chunk_index": e_chunk,
            "meta/episodes/file_index": e_fidx,
            "meta": json.dumps(ep.meta, sort_keys=True),
        }

    def _splits_after(self, rows: list[dict]) -> dict[str, str]:
        """info.json ``splits``: episode index ranges per split, e.g. ``"0:8,9:12"``."""
        per: dict[str, list[int]] = {s: [] for s in SPLITS}
        for s, spans in self._info.get("splits", {}).items():
            for r in spans.split(","):
                if r:
                    a, b = (int(x) for x in r.split(":"))
                    per.setdefault(s, []).extend(range(a, b))
        for r in rows:
            per[r["split"]].append(r["episode_index"])
        return {s: ranges(sorted(v)) for s, v in per.items() if v}

    def _write_meta(self, info_first: bool = False) -> None:
        """tasks.parquet and stats.json, then info.json: the commit. A new dataset writes
        info.json first (an empty commit), then the other two."""
        meta = self.root / "meta"
        stats = stats_bytes(self._stats)
        self._info["nactuator"]["commit"] = {
            "total_episodes": self._info["total_episodes"],
            "data_files": self._next_data_file,
            "episodes_files": self._next_episodes_file,
            "stats_sha256": sha256(stats),
        }
        info = (meta / "info.json", json_bytes(json_safe(self._info)))
        others = [(meta / "tasks.parquet", parquet_bytes(tasks_table(self._tasks))),
                  (meta / "stats.json", stats)]
        mkdir_durable(meta)
        for path, data in [info, *others] if info_first else [*others, info]:
            _atomic_write_bytes(path, data)
