"""Reading a whole dataset into memory: :func:`read_dataset` returns the committed episodes
(and only those) as a :class:`~nactuator.data.schema.Dataset` of float32 arrays under the
canonical keys, with its statistics; it never writes, so it is safe beside a live writer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from nactuator.data.committed import (
    committed_state,
    load_info,
    load_json,
    read_frames,
    recorded_fps,
)
from nactuator.data.dataset_stats import committed_stats_bytes
from nactuator.data.schema import Dataset, Episode

__all__ = ["read_dataset"]


def read_dataset(root: str | Path) -> Dataset:
    """Read a whole dataset into memory (canonical keys, float32).

    Only what ``meta/info.json`` commits is read: files an interrupted append left are
    ignored (the next writer removes them), and statistics are recomputed if ``stats.json``
    is not the committed one. Never writes.
    """
    root = Path(root)
    info = load_info(root)
    state = committed_state(root, info)
    n = len(info["nactuator"]["channels"])
    frames = read_frames(root, state.rows, n)
    if state.stats_current:
        stats = load_json(root / "meta" / "stats.json")
    else:
        stats = json.loads(committed_stats_bytes(root, info, state.rows, frames))
    episodes = []
    offset = 0
    for r in state.rows:
        length = int(r["length"])
        sl = slice(offset, offset + length)
        episodes.append(
            Episode(
                index=int(r["episode_index"]),
                task=r["task"],
                split=r["split"],
                length=length,
                payload_mass=math.nan if r["payload_mass"] is None else float(r["payload_mass"]),
                meta=json.loads(r["meta"]) if r["meta"] else {},
                frames={k: v[sl] for k, v in frames.items()},
            )
        )
        offset += length
    return Dataset(
        root=root,
        platform=info["nactuator"]["platform"],
        fps=recorded_fps(info),  # the measured rate, not LeRobot's integer `fps`
        info=info,
        stats=stats,
        frames=frames,
        episodes=episodes,
    )
