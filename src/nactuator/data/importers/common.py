"""What every importer shares: the parsed episode, finding the source files, and writing
them (every file validated before the first write; duplicates by content skipped)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nactuator.data.schema import SPLITS, DataFormatError
from nactuator.data.writer import DatasetWriter
from nactuator.platforms import Platform

__all__ = ["FPS_TOLERANCE", "UTF8_BOM", "ParsedEpisode", "find_files", "write_episodes"]

FPS_TOLERANCE = 0.25  # measured frame rate may differ from the platform's by this fraction
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass
class ParsedEpisode:
    """One source file, converted: canonical frames plus its labels."""

    source: Path
    platform: Platform
    frames: dict[str, np.ndarray]
    task: str
    split: str
    meta: dict


def find_files(src: Path, suffix: str) -> list[Path]:
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise DataFormatError(f"{src}: no such file or folder")
    files = sorted(p for p in src.rglob(f"*{suffix}") if p.is_file())
    if not files:
        raise DataFormatError(f"{src}: no *{suffix} files found")
    return files


def write_episodes(out: Path, episodes: list[ParsedEpisode], metadata: dict,
           allow_duplicates: bool) -> str:
    platforms = {e.platform.name for e in episodes}
    if len(platforms) > 1:
        by = {name: next(str(e.source) for e in episodes if e.platform.name == name)
              for name in sorted(platforms)}
        raise DataFormatError(f"mixed platforms in one import: {by}; import them separately")
    platform = episodes[0].platform
    fps = platform.fps
    with DatasetWriter(out, platform, fps, metadata=metadata) as writer:
        for e in episodes:  # validate all first: a large import may flush more than once
            try:
                writer.check_episode(e.frames, e.task, e.split, e.meta)
            except DataFormatError as err:
                raise DataFormatError(f"{e.source}: {err}") from err
        new, duplicates = _new_episodes(episodes, writer, allow_duplicates)
        for e in new:
            writer.add_episode(e.frames, e.task, e.split, e.meta)
    lines = [_summary(out, new, fps)] if new else [
        f"nothing imported: every file is already in {out}"]
    if duplicates:
        names = [f"{e.source.name} (= {dup})" for e, dup in duplicates]
        shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
        lines.append(f"skipped {len(duplicates)} file(s) whose content is already in the "
                     f"dataset (same sha256): {shown}; --allow-duplicates imports them again")
    return "\n".join(lines)


def _new_episodes(episodes: list[ParsedEpisode], writer: DatasetWriter,
                  allow_duplicates: bool) -> tuple[list[ParsedEpisode], list]:
    """Split off files whose content (sha256) the dataset holds, or an earlier file here."""
    if allow_duplicates:
        return episodes, []
    seen = {m["source_sha256"]: f"episode {i} ({m.get('source', '?')})"
            for i, m in enumerate(writer.episode_metas()) if m.get("source_sha256")}
    new, duplicates = [], []
    for e in episodes:
        digest = e.meta["source_sha256"]
        if digest in seen:
            duplicates.append((e, seen[digest]))
        else:
            seen[digest] = f"{e.source} in this import"
            new.append(e)
    return new, duplicates


def _summary(out: Path, episodes: list[ParsedEpisode], fps: float) -> str:
    frames = sum(len(e.frames["timestamp"]) for e in episodes)
    splits = Counter(e.split for e in episodes)
    tasks = Counter(e.task for e in episodes)
    labelled = [np.isfinite(e.frames["force"]).any(axis=1) for e in episodes if "force" in e.frames]
    force = int(sum(m.sum() for m in labelled))
    lines = [
        f"imported {len(episodes)} episodes ({frames} frames, {frames / fps:.1f} s at {fps} Hz) "
        f"into {out}",
        f"platform: {episodes[0].platform.name}",
        "splits: " + ", ".join(f"{s} {splits[s]}" for s in SPLITS if splits[s]),
        f"tasks ({len(tasks)}): " + ", ".join(f"{t} x{k}" for t, k in sorted(tasks.items())),
        f"force-labelled frames: {force} of {frames}",
    ]
    return "\n".join(lines)
