"""What a user keeps is never half-written: a failed write leaves the old file intact."""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest

from nactuator.atomic import atomic_path, write_json, write_png, write_text


def test_failed_write_keeps_the_previous_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "metrics.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_json_is_strict_with_nan_as_null(tmp_path):
    path = write_json(tmp_path / "a" / "m.json", {"mae": math.nan, "n": np.int64(3),
                                                 "x": [np.float32(0.5), math.inf]})
    assert json.loads(path.read_text()) == {"mae": None, "n": 3, "x": [0.5, None]}


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_files_follow_the_umask_like_any_other_file(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        written = write_text(tmp_path / "metrics.json", "{}")
        with open(tmp_path / "plain.txt", "w") as f:  # what any other file gets
            f.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(written.stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == mode


def test_replacing_a_file_keeps_its_permissions(tmp_path):
    target = write_text(tmp_path / "notes.txt", "old")
    target.chmod(0o640)
    write_text(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_plot_is_written_whole_and_matplotlib_keeps_its_backend(tmp_path):
    import matplotlib
    from matplotlib.figure import Figure

    backend = matplotlib.get_backend()
    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([0, 1], [1, 0])
    path = write_png(tmp_path / "p.png", fig)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]  # no temp file left
    from nactuator.experiments.cv import plot_summary

    summary = {"best": {"arm mean (deg), model": {"folds": [1.0, 2.0]},
                        "worst arm joint (deg), model": {"folds": [2.0, 3.0]},
                        "force 3-axis (N), model rollout": {"folds": [0.1, None]}}}
    plot_summary(summary, tmp_path / "cv.png")
    assert (tmp_path / "cv.png").stat().st_size > 1000
    assert matplotlib.get_backend() == backend  # a library plot never switches it
