"""What a dataset on disk has committed, for its reader and its writer alike. ``meta/info.json``
is the one commit point: its ``nactuator.commit`` block names how many data and episodes files
are committed and the hash of ``stats.json``, so an append that dies before replacing it
commits nothing. This module reads exactly what is committed (:func:`committed_state` for the
episode rows and what an interrupted append left beside them, :func:`read_frames` for the
frames), and owns what both sides need to keep that promise: durable folders, the exact bytes
and hash of the JSON files, and the writer lock (one writer per dataset; readers only ask
whether it is held).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nactuator import atomic
from nactuator.data.schema import (
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_PATH,
    DECLARED_KEYS,
    EPISODES_PATH,
    FEATURES,
    FORMAT_TAG,
    LATER_OPTIONAL_KEYS,
    PRIVATE_DIR,
    DataFormatError,
    feature_width,
)

__all__ = [
    "CommittedState",
    "WriterLock",
    "committed_state",
    "json_bytes",
    "load_info",
    "load_json",
    "mkdir_durable",
    "read_frames",
    "read_parquet",
    "recorded_fps",
    "sha256",
    "stray_files",
    "writer_active",
]


# --------------------------------------------------------------------------- durable files


def json_bytes(obj: Any) -> bytes:
    """The bytes of a dataset JSON file (``stats.json``'s are hashed into the commit)."""
    return (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mkdir_durable(folder: Path) -> None:
    """Create ``folder`` (and parents) so that a power cut cannot lose the new entry."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    for p in reversed(missing):
        atomic.fsync_dir(p.parent)


# --------------------------------------------------------------------------- the writer lock


class WriterLock:
    """One writer per dataset at a time (``flock`` on ``.nactuator/lock``): the writer may
    then delete what an interrupted append left without racing a live one. The kernel drops
    the lock when its process dies, however it dies."""

    def __init__(self, root: Path) -> None:
        path = root / PRIVATE_DIR / "lock"
        mkdir_durable(path.parent)
        self._file = open(path, "a+")  # noqa: SIM115 (held for the writer's lifetime)
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "?"
            self._file.close()
            raise DataFormatError(
                f"{root}: another writer (process {holder}) has this dataset open; wait for it "
                f"to finish (lock: {path})") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None and not self._file.closed:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()


def writer_active(root: Path) -> bool:
    """True while some process holds the dataset's writer lock (readers only report it)."""
    path = root / PRIVATE_DIR / "lock"
    if not path.exists():
        return False
    with open(path) as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return False


# --------------------------------------------------------------------------- committed files


def load_json(path: Path) -> Any:
    """A dataset JSON file; a missing or broken one is a :class:`DataFormatError`."""
    if not path.exists():
        raise DataFormatError(f"{path}: missing (expected a nactuator dataset folder)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}: not valid JSON: {e}") from e


def load_info(root: Path) -> dict:
    """``meta/info.json``, checked to be a nactuator dataset of this codebase version."""
    info = load_json(root / "meta" / "info.json")
    where = root / "meta" / "info.json"
    for key in ("codebase_version", "fps", "features", "total_episodes", "total_frames"):
        if key not in info:
            raise DataFormatError(f"{where}: missing field '{key}'")
    if info["codebase_version"] != CODEBASE_VERSION:
        raise DataFormatError(
            f"{where}: codebase_version {info['codebase_version']!r}, expected {CODEBASE_VERSION!r}"
        )
    if info.get("nactuator", {}).get("format") != FORMAT_TAG:
        raise DataFormatError(f"{where}: not a nactuator dataset (nactuator.format missing)")
    recorded_fps(info, where)  # a bad rate is refused here, not as a crash later
    return info


def recorded_fps(info: dict, where: str | Path = "meta/info.json") -> float:
    """The dataset's frame rate as recorded: ``nactuator.fps``; datasets written before it
    existed hold the recorded rate (possibly fractional) in LeRobot's ``fps`` itself."""
    value = info.get("nactuator", {}).get("fps", info["fps"])
    try:
        fps = float(value)
    except (TypeError, ValueError):
        fps = math.nan
    if not (math.isfinite(fps) and fps > 0):
        raise DataFormatError(f"{where}: fps must be a positive number, got {value!r}")
    return fps


def read_parquet(path: Path) -> pa.Table:
    """A dataset parquet file; a missing or truncated one is a :class:`DataFormatError`."""
    if not path.exists():
        raise DataFormatError(f"{path}: missing file referenced by the dataset")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataFormatError(f"{path}: corrupt or truncated parquet file ({e})") from e


def _numbered(folder: Path) -> list[tuple[int, Path]]:
    """``chunk-CCC/file-FFF.parquet`` files under ``folder`` as (file number, path), sorted."""
    out = []
    for p in folder.glob("chunk-*/file-*.parquet"):
        try:
            number = int(p.parent.name.split("-")[1]) * CHUNKS_SIZE + int(p.stem.split("-")[1])
        except (IndexError, ValueError):
            continue
        out.append((number, p))
    return sorted(out)


def stray_files(root: Path) -> list[Path]:
    """Temporary files of writes that never finished (a crash between write and rename)."""
    folders = [root, root / "meta", *root.glob("meta/episodes/chunk-*"), *root.glob("data/chunk-*")]
    return [p for f in folders for p in f.glob(f".*{atomic.TEMP_SUFFIX}") if p.is_file()]


@dataclass
class CommittedState:
    """What ``info.json`` commits, and what else lies in the dataset's folders."""

    root: Path
    total: int  # episodes committed
    episodes_paths: list[Path]  # the committed episodes files, in order
    episodes_files: int  # episodes files 0 .. episodes_files - 1 are committed
    data_files: int  # data files 0 .. data_files - 1 are committed
    leftovers: list[Path]  # not committed: ignored by readers, removed by the next writer
    stats_current: bool  # stats.json is the committed one

    @functools.cached_property
    def rows(self) -> list[dict]:
        """The committed meta/episodes rows, in episode order (read on first use)."""
        rows = _episode_rows(self.episodes_paths)
        if [r["episode_index"] for r in rows] != list(range(self.total)):
            raise DataFormatError(
                f"{self.root}: meta/episodes holds {len(rows)} episodes but info.json says "
                f"{self.total} (damaged dataset: episode files missing or edited)"
            )
        return rows


def committed_state(root: Path, info: dict) -> CommittedState:
    """What ``info`` (the dataset's info.json) commits; a missing committed file is an error."""
    episodes = _numbered(root / "meta" / "episodes")
    data = _numbered(root / "data")
    total = int(info["total_episodes"])
    commit = info.get("nactuator", {}).get("commit")
    if commit is not None:
        n_eps = int(commit["episodes_files"])
        kept = [p for k, p in episodes if k < n_eps]
        if len(kept) != n_eps:
            have = {k for k, _ in episodes}
            k = next(i for i in range(n_eps) if i not in have)
            path = root / EPISODES_PATH.format(chunk_index=k // CHUNKS_SIZE,
                                               file_index=k % CHUNKS_SIZE)
            raise DataFormatError(f"{path}: missing file referenced by the dataset")
        # A writer that does not know `commit` (an older nactuator) keeps it as it was while
        # changing total_episodes: then its count is the truth, and the files are counted.
        if commit.get("total_episodes", total) != total:
            commit = None
    if commit is not None:
        n_data = int(commit["data_files"])
        stats = root / "meta" / "stats.json"
        current = stats.exists() and sha256(stats.read_bytes()) == commit["stats_sha256"]
        state = CommittedState(root, total, kept, n_eps, n_data, [], current)
    else:
        # No usable commit block (written before it existed): the committed episodes files
        # are the first ones, up to the total info.json counts (later: an interrupted append).
        kept, counted = [], 0
        for _, p in episodes:
            if counted >= total:
                break
            kept.append(p)
            counted += _num_rows(p)
        state = CommittedState(root, total, kept, len(kept), 0, [], False)
        state.data_files = 1 + max((r["data/chunk_index"] * CHUNKS_SIZE + r["data/file_index"]
                                    for r in state.rows), default=-1)
        state.stats_current = len(kept) == len(episodes) and state.data_files == len(data)
    staging = root / PRIVATE_DIR / "staging"
    state.leftovers = (
        [p for k, p in episodes if k >= state.episodes_files]
        + [p for k, p in data if k >= state.data_files]
        + sorted(p for p in staging.glob("*") if p.is_file())
        + stray_files(root)
    )
    return state


def _num_rows(path: Path) -> int:
    try:
        return pq.read_metadata(path).num_rows
    except (pa.ArrowException, OSError) as e:
        raise DataFormatError(f"{path}: corrupt or truncated parquet file ({e})") from e


def _episode_rows(paths: list[Path]) -> list[dict]:
    rows = pa.concat_tables([read_parquet(p) for p in paths]).to_pylist() if paths else []
    return sorted(rows, key=lambda r: r["episode_index"])


# --------------------------------------------------------------------------- committed frames


def _column_numpy(table: pa.Table, name: str, width: int, where: Path) -> np.ndarray:
    if name not in table.column_names:
        raise DataFormatError(f"{where}: missing column '{name}'")
    col = table.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
        values = col.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(col), width)
    return col.to_numpy(zero_copy_only=False).reshape(len(col), width)


def read_frames(root: Path, rows: list[dict], n: int) -> dict[str, np.ndarray]:
    """The frames of the committed episodes ``rows``, concatenated (canonical keys)."""
    by_file: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        by_file.setdefault((r["data/chunk_index"], r["data/file_index"]), []).append(r)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in [*FEATURES, "timestamp"]}
    in_order = sorted(by_file.items(), key=lambda kv: kv[1][0]["episode_index"])
    for (chunk, fidx), file_rows in in_order:
        path = root / DATA_PATH.format(chunk_index=chunk, file_index=fidx)
        table = read_parquet(path)
        index = _column_numpy(table, "index", 1, path)[:, 0]
        expected = np.concatenate(
            [np.arange(r["dataset_from_index"], r["dataset_to_index"]) for r in file_rows]
        )
        if index.shape != expected.shape or (index != expected).any():
            raise DataFormatError(
                f"{path}: frame 'index' column does not match meta/episodes "
                f"(episodes {file_rows[0]['episode_index']}..{file_rows[-1]['episode_index']})"
            )
        for key, spec in FEATURES.items():
            if key in LATER_OPTIONAL_KEYS + DECLARED_KEYS and spec.name not in table.column_names:
                shape = (table.num_rows,) if spec.width == "1" else \
                    (table.num_rows, feature_width(spec, n))
                parts[key].append(np.full(shape, spec.default, np.float32))
                continue
            values = _column_numpy(table, spec.name, feature_width(spec, n), path)
            values = values.astype(np.float32)
            parts[key].append(values[:, 0] if spec.width == "1" else values)
        timestamps = _column_numpy(table, "timestamp", 1, path)[:, 0]
        parts["timestamp"].append(timestamps.astype(np.float32))

    def empty(key: str) -> np.ndarray:
        spec = FEATURES.get(key)
        scalar = spec is None or spec.width == "1"
        return np.zeros((0,) if scalar else (0, feature_width(spec, n)), np.float32)

    return {k: np.concatenate(v) if v else empty(k) for k, v in parts.items()}
