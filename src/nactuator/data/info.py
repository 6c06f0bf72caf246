"""``nactuator data info DST``: a human-readable description of a dataset.

Reads only the meta files (info.json, stats.json, meta/episodes), never the frames, so it is
instant even on large datasets -- except right after a crash that left ``stats.json`` of an
uncommitted append, when the statistics are recomputed from the committed frames.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from nactuator.data.committed import (
    committed_state,
    load_info,
    load_json,
    recorded_fps,
    writer_active,
)
from nactuator.data.masks import mask_summary
from nactuator.data.reader import read_dataset
from nactuator.data.schema import FEATURES, PRIVATE_DIR, SPLITS

__all__ = ["describe"]


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.4g}"


def describe(path: str | Path) -> str:
    """Episodes, frames, fps, platform, tasks, splits and per-feature ranges of a dataset."""
    root = Path(path)
    info = load_info(root)
    state = committed_state(root, info)
    episodes = state.rows
    if state.stats_current:
        stats = load_json(root / "meta" / "stats.json")
    else:
        stats = read_dataset(root).stats
    nact = info["nactuator"]
    total = int(info["total_frames"])
    fps = recorded_fps(info)
    lines = [
        f"dataset: {root}",
        f"platform: {nact['platform']} (robot_type {info['robot_type']}, "
        f"effort signal {nact['effort_signal']})",
        f"channels: {', '.join(nact['channels'])}",
        f"fps: {fps:g}" + (f" (LeRobot fps {info['fps']})" if info["fps"] != fps else ""),
        f"episodes: {info['total_episodes']}   frames: {total} ({total / fps:.1f} s)",
    ]
    split_eps = Counter(e["split"] for e in episodes)
    split_frames = Counter()
    for e in episodes:
        split_frames[e["split"]] += e["length"]
    lines.append(
        "splits: "
        + ", ".join(f"{s} {split_eps[s]} ep / {split_frames[s]} frames" for s in SPLITS
                    if split_eps[s])
    )
    tasks = Counter(e["task"] for e in episodes)
    lines.append(f"tasks ({len(tasks)}):")
    for task, k in sorted(tasks.items()):
        per = Counter(e["split"] for e in episodes if e["task"] == task)
        masses = [e["payload_mass"] for e in episodes if e["task"] == task]
        known = sorted({float(m) for m in masses if m is not None and math.isfinite(m)})
        unknown = len(masses) - sum(1 for m in masses if m is not None and math.isfinite(m))
        payload = ", ".join(f"{m:g}" for m in known) + " kg" if known else ""
        if unknown:  # recorded without --payload-g: nobody said what the arm held
            payload += (", " if known else "") + (
                "unknown" if not known else f"unknown for {unknown} episode(s)")
        lines.append(
            f"  {task}: {k} episodes ("
            + ", ".join(f"{s} {per[s]}" for s in SPLITS if per[s])
            + ")"
            + (f", payload {payload}" if payload else "")
        )
    lengths = [e["length"] for e in episodes]
    if lengths:
        lines.append(f"episode length: {min(lengths)}..{max(lengths)} frames")

    lines.append("features (per channel: min..max, NaN fraction):")
    features = info["features"]
    for key, spec in FEATURES.items():
        feat = features.get(spec.name)
        s = stats.get(spec.name)
        if feat is None or s is None:
            continue
        names = feat["names"] or [spec.name.split(".")[-1]]
        units = feat["unit"] if isinstance(feat["unit"], list) else [feat["unit"]] * len(names)
        lines.append(f"  {spec.name} ({key}):")
        for j, name in enumerate(names):
            nan_frac = 1.0 - s["count"][j] / total if total else 0.0
            lo, hi = (s["min"][j], s["max"][j]) if s["count"][j] else (None, None)
            lines.append(
                f"    {name:<14} {_fmt(lo):>10} .. {_fmt(hi):<10} "
                f"{units[j]:<24} NaN {nan_frac:6.1%}"
            )
    masks = mask_summary(root)
    if masks:
        lines += ["masks (beside the shards, docs/data-format.md 'Masks'):", *masks]
    lines += _unfinished(root, len(state.leftovers))
    return "\n".join(lines)


def _unfinished(root: Path, leftovers: int) -> list[str]:
    """Notes on writes in progress or interrupted (not part of the committed dataset)."""
    journals = [p for p in (root / PRIVATE_DIR / "journal").glob("*") if p.is_dir()]
    if not (leftovers or journals):
        return []
    if writer_active(root):
        return [f"note: a writer is working on this dataset ({len(journals)} recording(s) in "
                "progress); the figures above are its last commit"]
    notes = []
    if leftovers:
        notes.append(f"note: {leftovers} file(s) of an interrupted write are not part of the "
                     "dataset (ignored; the next append removes them)")
    if journals:
        notes.append(f"note: {len(journals)} interrupted recording(s) in {PRIVATE_DIR}/journal "
                     "will be committed by the next writer on it (`nactuator record` or an "
                     "import into it)")
    return notes
