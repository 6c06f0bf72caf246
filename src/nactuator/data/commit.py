"""The files of a commit, as bytes: the parquet encoding, the episodes and tasks tables
(the LeRobot v3.0 shapes), and the episode ranges of ``info.json``'s splits. No file is
written here; :mod:`nactuator.data.writer` writes them (through its one hooked writer, so
the crash tests see every write) and :mod:`nactuator.data.recovery` rebuilds ``tasks.parquet``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nactuator.data.committed import read_parquet

__all__ = ["episodes_table", "load_tasks", "parquet_bytes", "ranges", "tasks_table"]


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue().to_pybytes()


def ranges(indices: list[int]) -> str:
    out, start, prev = [], None, None
    for i in indices:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}:{prev + 1}")
            start = prev = i
    if start is not None:
        out.append(f"{start}:{prev + 1}")
    return ",".join(out)


def episodes_table(rows: list[dict], n: int) -> pa.Table:
    cond = np.stack([r["condition"] for r in rows]).reshape(-1)
    cols = {
        "episode_index": pa.array([r["episode_index"] for r in rows], pa.int64()),
        "tasks": pa.array([r["tasks"] for r in rows], pa.list_(pa.string())),
        "length": pa.array([r["length"] for r in rows], pa.int64()),
        "split": pa.array([r["split"] for r in rows], pa.string()),
        "task": pa.array([r["task"] for r in rows], pa.string()),
        "payload_mass": pa.array([r["payload_mass"] for r in rows], pa.float64()),
        "condition": pa.FixedSizeListArray.from_arrays(pa.array(cond, pa.float32()), n),
        "data/chunk_index": pa.array([r["data/chunk_index"] for r in rows], pa.int64()),
        "data/file_index": pa.array([r["data/file_index"] for r in rows], pa.int64()),
        "dataset_from_index": pa.array([r["dataset_from_index"] for r in rows], pa.int64()),
        "dataset_to_index": pa.array([r["dataset_to_index"] for r in rows], pa.int64()),
        "meta/episodes/chunk_index": pa.array(
            [r["meta/episodes/chunk_index"] for r in rows], pa.int64()
        ),
        "meta/episodes/file_index": pa.array(
            [r["meta/episodes/file_index"] for r in rows], pa.int64()
        ),
        "meta": pa.array([r["meta"] for r in rows], pa.string()),
    }
    return pa.table(cols)


def tasks_table(tasks: dict[str, int]) -> pa.Table:
    """LeRobot reads tasks.parquet with pandas (task string as the index); write that shape."""
    names = sorted(tasks, key=tasks.get)
    table = pa.table(
        {
            "task_index": pa.array([tasks[t] for t in names], pa.int64()),
            "__index_level_0__": pa.array(names, pa.string()),
        }
    )
    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def load_tasks(root: Path) -> dict[str, int]:
    """tasks.parquet as written by :func:`tasks_table`: task string -> task_index."""
    table = read_parquet(root / "meta" / "tasks.parquet")
    names = table.column("__index_level_0__").to_pylist()
    return dict(zip(names, table.column("task_index").to_pylist(), strict=True))
