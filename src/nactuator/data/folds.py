"""Cross-validation folds by episode: which episode is held out, which validates, which trains.

One validation file is noise: recipes are judged by k-fold cross-validation over episodes
(``nactuator cv``). The folds are a pure function of the data and ``(folds, fold)``, so the
DataModule (training) and ``nactuator eval`` (scoring the held-out episodes) agree on them
without writing anything to disk.

Rules: the train and validation episodes of all datasets are pooled (test episodes stay
out of cross-validation); within each task the episodes are ordered by (dataset, episode index)
and episode ``j`` belongs to group ``j % folds``. Fold ``f`` holds out group ``f`` (served as the
``test`` split, scored by ``eval``), validates on group ``(f + 1) % folds`` (model
selection never sees the held-out episodes), and trains on the rest. With ``folds`` = the
number of episodes per task this is leave-one-episode-out within each task.
"""

from __future__ import annotations

from collections.abc import Iterable

from nactuator.data.schema import DataFormatError

__all__ = ["CV_SPLITS", "fold_splits", "episodes_per_task"]

CV_SPLITS = ("train", "validation")  # the pool that cross-validation re-splits

EpisodeRef = tuple[int, int, str, str]  # (dataset position, episode index, task, split)


def episodes_per_task(episodes: Iterable[EpisodeRef]) -> dict[str, int]:
    """How many train + validation episodes each task has."""
    counts: dict[str, int] = {}
    for _, _, task, split in episodes:
        if split in CV_SPLITS:
            counts[task] = counts.get(task, 0) + 1
    return counts


def fold_splits(episodes: Iterable[EpisodeRef], folds: int,
                fold: int) -> dict[tuple[int, int], str]:
    """``{(dataset position, episode index): split}`` of fold ``fold`` of ``folds``:
    ``test`` (held out), ``validation``, ``train``, or ``excluded`` (the original test
    episodes, which cross-validation never touches)."""
    episodes = list(episodes)
    if not isinstance(folds, int) or folds < 2:
        raise DataFormatError(f"cross-validation needs folds >= 2, got {folds!r}")
    if not isinstance(fold, int) or not 0 <= fold < folds:
        raise DataFormatError(f"fold must be in 0..{folds - 1}, got {fold!r}")
    by_task: dict[str, list[tuple[int, int]]] = {}
    out: dict[tuple[int, int], str] = {}
    for position, index, task, split in episodes:
        if split in CV_SPLITS:
            by_task.setdefault(task, []).append((position, index))
        else:
            out[(position, index)] = "excluded"
    if not by_task:
        raise DataFormatError("cross-validation found no train or validation episodes")
    for episodes in by_task.values():
        for j, key in enumerate(sorted(episodes)):
            group = j % folds
            out[key] = ("test" if group == fold
                        else "validation" if group == (fold + 1) % folds else "train")
    return out
