"""Cross-validation by trajectory: the folds, the summary, and one small `nactuator cv` run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_training import write_sim_dataset

from nactuator.data import DataFormatError
from nactuator.data.datamodule import NADDataModule
from nactuator.data.folds import fold_splits
from nactuator.experiments.cv import run_cv, summarize_folds


def refs(runs_per_task: dict[str, int], test_runs: int = 1):
    out, index = [], 0
    for task, runs in runs_per_task.items():
        for j in range(runs + test_runs):
            out.append((0, index, task, "test" if j >= runs else
                        ("validation" if j == 0 else "train")))
            index += 1
    return out


def test_leave_one_run_out_holds_out_each_run_exactly_once():
    episodes = refs({"push": 4, "ref": 4})
    held = {}
    for fold in range(4):
        splits = fold_splits(episodes, 4, fold)
        test = [k for k, s in splits.items() if s == "test"]
        val = [k for k, s in splits.items() if s == "validation"]
        assert len(test) == 2 and len(val) == 2  # one run of each task
        assert not set(test) & set(val)
        for key in test:
            held[key] = held.get(key, 0) + 1
        # the stored test runs never take part
        assert all(splits[(0, i)] == "excluded" for _, i, _, split in episodes
                   if split == "test")
    pool = [(0, i) for _, i, _, split in episodes if split != "test"]
    assert held == {k: 1 for k in pool}


def test_fold_arguments_are_checked():
    with pytest.raises(DataFormatError, match="folds >= 2"):
        fold_splits(refs({"a": 3}), 1, 0)
    with pytest.raises(DataFormatError, match="fold must be in 0..2"):
        fold_splits(refs({"a": 3}), 3, 3)


def test_eval_wants_one_output_folder_per_model(tmp_path, capsys):
    from nactuator.cli import main

    ckpt = tmp_path / "a.ckpt"
    ckpt.write_bytes(b"x")
    assert main(["eval", "--ckpt", str(ckpt), str(ckpt), "--data", str(tmp_path),
                 "--out", str(tmp_path / "o")]) == 2
    assert "2 --ckpt value(s) but 1 --out folder(s)" in capsys.readouterr().err
    assert main(["eval", "--ckpt", str(ckpt), str(ckpt), "--data", str(tmp_path),
                 "--out", "x", "y", "--compare", str(ckpt)]) == 2
    assert "--compare goes with a single --ckpt" in capsys.readouterr().err


def test_the_datamodule_serves_a_fold(tmp_path):
    data = write_sim_dataset(tmp_path / "ds", "so101", frames=24,
                             splits={"train": 3, "validation": 1, "test": 1})
    dm = NADDataModule(data, "so101", horizon=4, cv_folds=4, cv_fold=1)
    splits = [e.split for e in dm.episodes]
    assert sorted(splits) == ["test", "train", "train", "validation"]  # stored test excluded
    held_out = next(e for e in dm.episodes if e.split == "test")
    assert held_out.dataset_episode == 1  # run 1 of the task (runs ordered by index)


def test_summary_is_mean_sd_min_max_and_a_missing_fold_shows():
    s = summarize_folds([{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": None}])
    assert s["a"]["mean"] == 2.0 and s["a"]["sd"] == pytest.approx(np.sqrt(2.0))
    assert (s["a"]["min"], s["a"]["max"]) == (1.0, 3.0)
    assert s["b"]["mean"] is None and s["b"]["folds"] == [2.0, None]


def test_cv_figure_shows_folds_as_points_with_units_and_mean_sd():
    from nactuator.experiments.cv import summary_figure

    arm = [1.0, 1.5, 0.7]
    force = [0.40, 0.45, 0.50]
    rows = [{"arm mean (deg), model": a, "arm mean (deg), command following": 0.3,
             "worst arm joint (deg), model": 2 * a, "force 3-axis (N), model rollout": f,
             "force 3-axis (N), linear regression": 0.6} for a, f in zip(arm, force, strict=True)]
    fig = summary_figure({"best": summarize_folds(rows)})
    joints, worst, force_ax = fig.axes[:3]
    assert joints.get_ylabel() == "mean joint error [deg]"
    assert worst.get_ylabel() == "worst joint error [deg]"
    assert force_ax.get_ylabel() == "force MAE [N]"
    for ax in (joints, worst, force_ax):  # no line joins folds: every line is one point
        assert all(len(line.get_xdata()) <= 1 for line in ax.lines)
    # one dot per fold at its value (the model's column), and its mean ± sd written out
    from matplotlib.collections import PathCollection

    dots = sorted(float(c.get_offsets()[0][1]) for c in joints.collections
                  if isinstance(c, PathCollection) and c.get_offsets()[0][0] < 0.5)
    assert dots == pytest.approx(sorted(arm))
    texts = [t.get_text() for t in joints.texts]
    assert f"{np.mean(arm):.3g} ± {np.std(arm, ddof=1):.2g}" in texts
    assert f"{np.mean(force):.3g} ± {np.std(force, ddof=1):.2g}" in [
        t.get_text() for t in force_ax.texts]
    assert [t.get_text() for t in force_ax.get_xticklabels()] == [
        "model\nrollout", "linear\nregression"]


def test_cv_trains_and_scores_a_fold_and_resumes(tmp_path):
    data = write_sim_dataset(tmp_path / "ds", "so101", frames=32,
                             splits={"train": 2, "validation": 1})
    recipe = ["--trainer.max_epochs=1", "--data.samples_per_epoch=4", "--data.horizon=3"]
    text = run_cv("so101", str(data), out=tmp_path / "cv", max_folds=1, extra_args=recipe)
    result = json.loads((tmp_path / "cv" / "cv.json").read_text())
    assert result["folds"] == 3 and result["scored_folds"] == [0]  # leave one run out
    for selection in ("best", "last"):
        arm = result["summary"][selection]["arm mean (deg), model"]
        assert len(arm["folds"]) == 1 and arm["folds"][0] >= 0
        held = json.loads((tmp_path / "cv" / "fold_0" / f"eval_{selection}" /
                           "metrics.json").read_text())
        assert held["cv"] == {"folds": 3, "fold": 0} and held["episodes"] == 1
        # one eval process scored both, each its own file
        assert Path(held["checkpoint"]).name.startswith(
            "last" if selection == "last" else "best-epoch=")
    assert "| arm mean (deg), model |" in text and (tmp_path / "cv" / "cv.png").is_file()
    # the training child's own time, per fold (CPU = user + sys, from its wait4 usage)
    train_s = result["train_s"]
    assert len(train_s["cpu"]["folds"]) == 1 and len(train_s["wall"]["folds"]) == 1
    assert 0 < train_s["cpu"]["folds"][0] and 0 < train_s["wall"]["folds"][0]
    assert "- training per fold (the `train` child; CPU = user + sys): CPU " in text
    # a finished fold is not run again
    stamp = (tmp_path / "cv" / "fold_0" / "eval_best" / "metrics.json").stat().st_mtime_ns
    run_cv("so101", str(data), out=tmp_path / "cv", max_folds=1, extra_args=recipe)
    assert (tmp_path / "cv" / "fold_0" / "eval_best" / "metrics.json").stat().st_mtime_ns \
        == stamp


def test_a_child_reports_its_own_cpu_and_wall_time(tmp_path):
    """`cv` records each fold's training time from the child's own resource usage: a busy
    child shows its CPU seconds, a sleeping one shows wall time but next to no CPU."""
    import sys

    from nactuator.child import run_command

    busy, idle = {}, {}
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    assert run_command([sys.executable, "-c", spin], tmp_path / "log", usage=busy) == 0
    assert run_command([sys.executable, "-c", "import time; time.sleep(0.4)"],
                       tmp_path / "log", usage=idle) == 0
    assert busy["cpu_s"] >= 0.4 and busy["wall_s"] >= 0.4
    assert idle["wall_s"] >= 0.4 and idle["cpu_s"] < 0.3
    assert run_command([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log") == 3
