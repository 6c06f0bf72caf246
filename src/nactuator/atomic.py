"""Atomic file writes: a reader never sees a half-written file, a crash never leaves one.

Every room that writes something a user keeps (datasets, checkpoints, metrics, plots, CSVs)
writes through here: the bytes go to a temporary file beside the target, are flushed to
disk, and only then replace the target with ``os.replace`` (atomic on POSIX); the folder is
flushed too, so the new name survives a power cut. Files get the permissions any other new
file would (``0o666`` less the umask), or keep those of the file they replace.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = [
    "atomic_path",
    "fsync_dir",
    "json_safe",
    "replace",
    "write_bytes",
    "write_json",
    "write_text",
]

TEMP_SUFFIX = ".tmp"


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (a new, renamed or removed name) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``os.replace`` that survives a power cut: both folders are flushed afterwards."""
    src, dst = Path(src), Path(dst)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def _create_temp(path: Path, suffix: str) -> Path:
    """A new empty file beside ``path``. Created with mode 0o666 so the umask applies, as it
    does to any file a program opens for writing (``tempfile.mkstemp`` would force 0o600)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}{suffix}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"{path.parent}: could not create a temporary file for {path.name}")


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = TEMP_SUFFIX) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; on success it replaces ``path``,
    on any error it is removed and ``path`` is left as it was. ``suffix`` keeps writers that
    look at the extension (matplotlib, pandas) happy."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp(path, suffix)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        try:  # replacing a file keeps its permissions, as writing into it would
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        except FileNotFoundError:
            pass
        replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_png(path: str | os.PathLike, figure, dpi: int = 90) -> Path:
    """A matplotlib ``Figure`` as a PNG, atomically (no half-drawn plot after a crash)."""
    with atomic_path(path, suffix=".png") as tmp:
        figure.savefig(tmp, dpi=dpi, format="png")
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def json_safe(x):
    """NaN/inf are not JSON: store them as null; numpy scalars as Python numbers."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    if isinstance(x, np.integer | np.bool_):
        return x.item()
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else None
    return x


def write_json(path: str | os.PathLike, obj) -> Path:
    """Strict JSON (NaN/inf -> null), indented, atomically."""
    return write_text(path, json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n")
