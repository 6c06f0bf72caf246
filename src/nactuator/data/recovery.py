"""Crash recovery when a writer opens a dataset: roll the files back to the last commit
(``info.json``), recompute stale statistics, and find the journals of recordings whose
process died (:mod:`nactuator.data.journal`) so the writer commits them as interrupted
episodes.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from nactuator.atomic import json_safe
from nactuator.data.commit import load_tasks, parquet_bytes, tasks_table
from nactuator.data.committed import (
    CommittedState,
    committed_state,
    json_bytes,
    sha256,
    stray_files,
)
from nactuator.data.dataset_stats import committed_stats_bytes
from nactuator.data.journal import EpisodeJournal, JournalError, read_journal
from nactuator.data.schema import PRIVATE_DIR, DataFormatError

__all__ = ["discard_journal", "foreign_files", "interrupted_recordings", "roll_back"]

log = logging.getLogger(__name__)


def roll_back(root: Path, info: dict, write: Callable[[Path, bytes], None]
              ) -> tuple[CommittedState, dict[str, int]]:
    """Bring the files of ``root`` to exactly what ``info`` (its ``info.json``) commits;
    returns that state and the committed tasks. Files are written with ``write`` (the
    writer's). Every step is idempotent: a crash in here is repaired by the next open."""
    state = committed_state(root, info)
    meta = root / "meta"
    total_tasks = int(info.get("total_tasks", 0))
    tasks_path = meta / "tasks.parquet"
    tasks = load_tasks(root) if tasks_path.exists() else {}
    # An interrupted append added tasks (they only grow), or a new dataset's went missing.
    if len(tasks) != total_tasks or not tasks_path.exists():
        kept = {t: i for t, i in tasks.items() if i < total_tasks}
        if len(kept) != total_tasks:
            raise DataFormatError(f"{tasks_path}: holds {len(tasks)} tasks, info.json "
                                  f"commits {total_tasks}; expected at least those")
        write(tasks_path, parquet_bytes(tasks_table(kept)))
        tasks = kept
    if not state.stats_current:  # stats.json of an interrupted append: recompute
        data = committed_stats_bytes(root, info, state.rows)
        write(meta / "stats.json", data)
        info.setdefault("nactuator", {})["commit"] = {
            "total_episodes": state.total, "data_files": state.data_files,
            "episodes_files": state.episodes_files, "stats_sha256": sha256(data)}
        write(meta / "info.json", json_bytes(json_safe(info)))
    for p in state.leftovers:
        p.unlink(missing_ok=True)
    if state.leftovers:
        log.warning("%s: removed %d file(s) left by an interrupted write; the dataset "
                    "holds its %d committed episodes", root, len(state.leftovers),
                    state.total)
    return state, tasks


def interrupted_recordings(root: Path, committed: set
                           ) -> Iterator[tuple[Path, dict, dict[str, np.ndarray]]]:
    """The journals in ``root`` of recordings whose process died, as (journal folder,
    header, frames), oldest first. Journals with nothing to recover (``committed`` names
    those whose episode was committed before the process died; others died before their
    first chunk) are deleted; one that cannot be read is left, with a warning."""
    folder = root / PRIVATE_DIR / "journal"
    for journal in sorted(p for p in folder.glob("*") if p.is_dir()):
        if journal.name in committed:  # committed, then the process died: just delete
            shutil.rmtree(journal, ignore_errors=True)
            continue
        try:
            header, frames = read_journal(journal)
        except JournalError as e:
            if not any(journal.glob("chunk-*.parquet")):  # died while starting: empty
                shutil.rmtree(journal, ignore_errors=True)
            else:
                log.warning("%s: cannot recover an interrupted recording: %s", root, e)
            continue
        if frames is None:  # died before the first chunk reached the disk
            shutil.rmtree(journal, ignore_errors=True)
            continue
        yield journal, header, frames


def foreign_files(root: Path) -> list[Path]:
    """Files in a folder without info.json that a crashed dataset creation cannot explain."""
    ours = set(stray_files(root))
    return [p for p in root.rglob("*")
            if p.is_file() and p not in ours and p.relative_to(root).parts[0] != PRIVATE_DIR]


def discard_journal(journal: EpisodeJournal | Path | None) -> None:
    if isinstance(journal, EpisodeJournal):
        journal.discard()
    elif journal is not None:
        shutil.rmtree(journal, ignore_errors=True)
