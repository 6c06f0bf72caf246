"""The journal of an episode still being recorded: a crash loses seconds, not the episode.

A recording can last minutes, and until it ends its frames live only in memory. The journal
keeps a durable copy on disk while it grows: every ``chunk_frames`` frames the caller hands
over a block, and a background thread writes it as one small parquet file (atomically,
fsync'd), so the recording loop never waits on the disk. When the episode is committed to
the dataset the journal is deleted; if the process dies first, the next
:class:`~nactuator.data.writer.DatasetWriter` opened on the dataset finds the journal and
commits what it holds as an interrupted episode.

Layout (inside the dataset's private folder ``.nactuator/``)::

    journal/<id>/episode.json          task, split, episode_meta, fps (written first)
    journal/<id>/chunk-000000.parquet  frames 0 .. chunk_frames - 1 (canonical keys)
    journal/<id>/chunk-000001.parquet  ...

Only pyarrow/numpy/atomic here: validation and committing belong to the writer.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nactuator import atomic

__all__ = ["EpisodeJournal", "JournalError", "read_journal"]

log = logging.getLogger(__name__)

CHUNK_GLOB = "chunk-*.parquet"


class JournalError(Exception):
    """A journal folder that cannot be read back (no episode.json, unreadable chunk)."""


def _block_table(frames: dict[str, np.ndarray]) -> pa.Table:
    """A block of frames as a table: a (T, w) array becomes a fixed-size-list column."""
    arrays, names = [], []
    for key, value in frames.items():
        a = np.asarray(value, dtype=np.float64)
        if a.ndim == 1:
            arrays.append(pa.array(a))
        else:
            flat = pa.array(a.reshape(-1), type=pa.float64())
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, a.shape[1]))
        names.append(key)
    return pa.Table.from_arrays(arrays, names=names)


def _table_block(table: pa.Table) -> dict[str, np.ndarray]:
    out = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            values = col.flatten().to_numpy(zero_copy_only=False)
            out[name] = values.reshape(len(col), col.type.list_size)
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


class EpisodeJournal:
    """Durable chunks of one episode in progress. Made by ``DatasetWriter.begin_episode``."""

    def __init__(self, folder: Path, task: str, split: str, episode_meta: dict, fps: float,
                 chunk_frames: int) -> None:
        self.id = folder.name
        self.folder = folder
        self.chunk_frames = max(1, int(chunk_frames))
        self._chunks = 0
        self._durable = 0  # frames on disk
        self._queued: list[dict[str, np.ndarray]] = []
        self._queued_frames = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._warned = False
        self._pending: list[Future] = []
        folder.mkdir(parents=True, exist_ok=True)
        header = {"task": task, "split": split, "episode_meta": episode_meta, "fps": fps}
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"journal-{self.id}")
        # Even the header is written in the background (before any chunk: one worker, in
        # order), so starting an episode costs the recording loop no disk wait.
        self._pending.append(self._pool.submit(self._write_header, header))

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(8)

    @property
    def durable_frames(self) -> int:
        """Frames already on disk (a crash now keeps exactly these)."""
        with self._lock:
            return self._durable

    def extend(self, frames: dict[str, np.ndarray]) -> None:
        """Hand over the next block of frames; written in the background once a chunk's
        worth is queued. Never blocks on the disk, never raises for a failed write (the
        episode is still in the caller's memory): it logs one warning and stops journaling."""
        if self._pool is None:
            return
        if self._error is not None:
            self._warn()
            return
        self._queued.append({k: np.array(v, copy=True) for k, v in frames.items()})
        self._queued_frames += len(next(iter(frames.values())))
        if self._queued_frames >= self.chunk_frames:
            self._submit()

    def sync(self) -> int:
        """Write whatever is queued now and wait until every chunk is on disk."""
        if self._pool is not None and self._queued:
            self._submit()
        for f in self._pending:
            f.result()  # _write_chunk records its errors instead of raising
        self._pending = []
        if self._error is not None:
            self._warn()
        return self.durable_frames

    def close(self) -> None:
        """Stop the background writer (waiting for chunks already handed to it)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def discard(self) -> None:
        """The episode was committed (or is not wanted): delete the journal."""
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- internals --------------------------------------------------------------------

    def _submit(self) -> None:
        blocks, self._queued, self._queued_frames = self._queued, [], 0
        block = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
        index = self._chunks
        self._chunks += 1
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(self._write_chunk, index, block))

    def _write_header(self, header: dict) -> None:
        try:
            atomic.fsync_dir(self.folder.parent)
            atomic.write_text(self.folder / "episode.json", json.dumps(header, indent=2) + "\n")
        except BaseException as e:
            self._error = e

    def _write_chunk(self, index: int, block: dict[str, np.ndarray]) -> None:
        if self._error is not None:
            return
        try:
            sink = pa.BufferOutputStream()
            pq.write_table(_block_table(block), sink)
            atomic.write_bytes(self.folder / f"chunk-{index:06d}.parquet",
                               sink.getvalue().to_pybytes())
        except BaseException as e:  # keep recording; the caller still has the frames
            self._error = e
            return
        with self._lock:
            self._durable += len(next(iter(block.values())))

    def _warn(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning("episode journal %s: could not write a chunk (%s); the episode is kept "
                        "in memory and saved when it ends, but a crash before then loses it",
                        self.folder, self._error)


def read_journal(folder: Path) -> tuple[dict, dict[str, np.ndarray] | None]:
    """``(header, frames)`` of a journal left by a crash; frames None if no chunk was written.

    Chunks are read in order up to the first gap (a chunk still being written when the
    process died is a temporary file and does not count).
    """
    try:
        header = json.loads((folder / "episode.json").read_text())
    except (OSError, ValueError) as e:
        raise JournalError(f"{folder}: no readable episode.json ({e})") from e
    blocks = []
    for i, path in enumerate(sorted(folder.glob(CHUNK_GLOB))):
        if path.name != f"chunk-{i:06d}.parquet":
            break
        try:
            blocks.append(_table_block(pq.read_table(path)))
        except (pa.ArrowException, OSError) as e:
            raise JournalError(f"{path}: unreadable journal chunk ({e})") from e
    if not blocks:
        return header, None
    return header, {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
