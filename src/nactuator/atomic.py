"""Atomic file writes: a reader never sees a half-written file, a crash never leaves one.

Every room that writes something a user keeps (datasets, checkpoints, metrics, plots, CSVs)
writes through here: the bytes go to a temporary file beside the target, are flushed to
disk, and only then replace the target with ``os.replace`` (atomic on POSIX).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = ["atomic_path", "json_safe", "write_bytes", "write_json", "write_text"]


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; on success it replaces ``path``,
    on any error it is removed and ``path`` is left as it was. ``suffix`` keeps writers that
    look at the extension (matplotlib, pandas) happy."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
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
