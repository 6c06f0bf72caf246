"""Where the experiment drivers' runs execute (nactuator.distributed): the local pool and a
real Ray cluster started on 127.0.0.1 by the test (`ray start --head`)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from nactuator.cli import main
from nactuator.distributed import Backend, BackendError, local_head, make_backend, run_all
from nactuator.errors import UserError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slow_square(x: int, fail: bool = False) -> int:
    time.sleep(0.05 * x)
    if fail:
        raise UserError(f"call {x} failed on purpose")
    return x * x


def test_local_backend_runs_every_call_and_raises_the_first_failure_last(tmp_path):
    results = dict(run_all(make_backend("local", jobs=2), _slow_square,
                           [(3,), (1,), (2,)]))
    assert results == {0: 9, 1: 1, 2: 4}
    got = []
    with pytest.raises(UserError, match="call 1 failed on purpose"):
        for i, r in run_all(Backend("local", jobs=1), _slow_square,
                            [(1, True), (2,), (3,)]):
            got.append((i, r))
    assert got == [(1, 4), (2, 9)]  # the calls after the failure still ran


def _one_line_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [
    ["cv", "--platform", "so101", "--data", "nowhere"],
    ["sweep", "conf/sweeps/architecture.yaml"],
    ["adapt", "--ckpt", "pretrained/so101", "--data", "nowhere"],
])
def test_ray_settings_are_checked_before_any_work(capsys, command):
    port = _free_port()  # nothing listens there any more
    line = _one_line_error(capsys, [*command, "--backend", "ray",
                                    "--address", f"127.0.0.1:{port}"])
    assert f"--address 127.0.0.1:{port}: no Ray head answers there" in line
    assert f"ray start --head --port={port}" in line
    assert "expected HOST:PORT" in _one_line_error(
        capsys, [*command, "--backend", "ray", "--address", "headnode"])
    assert "--jobs is for --backend local" in _one_line_error(
        capsys, [*command, "--backend", "ray", "--jobs", "2"])
    assert "are for --backend ray" in _one_line_error(
        capsys, [*command, "--address", "127.0.0.1:6379"])


def test_ray_not_installed_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    line = _one_line_error(capsys, ["cv", "--platform", "so101", "--data", "x",
                                    "--backend", "ray"])
    assert "--backend ray needs Ray: pip install 'nactuator[ray]'" in line


def test_task_resources_come_from_the_config_and_the_flags(tmp_path):
    pytest.importorskip("ray")
    assert make_backend("ray").num_cpus == 1.0 and make_backend("ray").num_gpus == 0.0
    b = make_backend("ray", num_cpus=2, num_gpus=0.5)
    assert (b.num_cpus, b.num_gpus) == (2.0, 0.5)
    assert b.describe() == "Ray tasks on the default Ray cluster (2 CPU, 0.5 GPU each)"
    bad = tmp_path / "ray.yaml"
    bad.write_text("num_cpus: 1\nnum_gpu: 1\n")
    with pytest.raises(BackendError, match="expected exactly the keys num_cpus and num_gpus"):
        make_backend("ray", config=bad)
    with pytest.raises(BackendError, match="--task-gpus .*expected a number >= 0, got -1"):
        make_backend("ray", num_gpus=-1)


# ----------------------------------------------------------------- a real cluster


@pytest.fixture(scope="module")
def ray_head():
    """A 2-CPU Ray head on 127.0.0.1 (`ray start --head`), stopped after the module."""
    pytest.importorskip("ray")
    with local_head(num_cpus=2) as address:
        yield address


def _fold_figures(out: Path) -> dict:
    summary = json.loads((out / "cv.json").read_text())["summary"]
    return {sel: {k: v["folds"] for k, v in table.items()} for sel, table in summary.items()}


@pytest.mark.slow
def test_cv_on_a_ray_cluster_gives_the_local_per_fold_figures(tmp_path, ray_head,
                                                              monkeypatch):
    """The same 2 folds (same seeds) through `nactuator cv --backend local --jobs 2` and
    `--backend ray --address` on a real 2-CPU head: identical per-fold figures; a failing
    task's UserError reaches the driver as itself; a finished CV is not run again."""
    from test_training import write_sim_dataset

    data = write_sim_dataset(tmp_path / "ds", "so101", frames=32,
                             splits={"train": 2, "validation": 1})
    recipe = ["--", "--trainer.max_epochs=1", "--data.samples_per_epoch=4",
              "--data.horizon=3"]
    common = ["cv", "--platform", "so101", "--data", str(data), "--max-folds", "2"]
    assert main([*common, "--jobs", "2", "--out", str(tmp_path / "local"), *recipe]) == 0
    assert main([*common, "--backend", "ray", "--address", ray_head,
                 "--out", str(tmp_path / "ray"), *recipe]) == 0
    local, ray = _fold_figures(tmp_path / "local"), _fold_figures(tmp_path / "ray")
    assert set(local) == set(ray) == {"best", "last"}
    for selection in local:
        arm = local[selection]["arm mean (deg), model"]
        assert len(arm) == 2 and all(v is not None and v > 0 for v in arm)
        assert set(ray[selection]) == set(local[selection])
        for key, values in local[selection].items():  # None where a fold has no value
            assert [v is None for v in ray[selection][key]] == [v is None for v in values]
            assert [v for v in ray[selection][key] if v is not None] == pytest.approx(
                [v for v in values if v is not None], rel=1e-9, abs=1e-12), key
    cv = json.loads((tmp_path / "ray" / "cv.json").read_text())
    assert cv["backend"] == f"Ray tasks on {ray_head} (1 CPU, 0 GPU each)"
    for fold in (0, 1):  # the fold's logs are where a local run leaves them
        log = (tmp_path / "ray" / f"fold_{fold}" / "train.log").read_text()
        # one train and one eval (scoring best and last) per fold
        assert log.count("$ ") == 2 and "-m nactuator.cli train" in log
        assert "-m nactuator.cli eval" in log

    # resumed: both folds exist, nothing is submitted and the figures are the same
    stamp = (tmp_path / "ray" / "fold_0" / "eval_best" / "metrics.json").stat().st_mtime_ns
    assert main([*common, "--backend", "ray", "--address", ray_head,
                 "--out", str(tmp_path / "ray"), *recipe]) == 0
    assert (tmp_path / "ray" / "fold_0" / "eval_best" / "metrics.json").stat().st_mtime_ns \
        == stamp
    assert "2 fold(s) from an earlier run" in (tmp_path / "ray" / "cv.md").read_text()

    # a task's UserError keeps its type and its one-line message (the workers import this
    # test module through the forwarded PYTHONPATH)
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, *filter(None, [
        os.environ.get("PYTHONPATH")])]))
    backend = make_backend("ray", address=ray_head)
    with pytest.raises(UserError, match="^call 1 failed on purpose$"):
        dict(run_all(backend, _slow_square, [(1, True), (2,)]))


@pytest.mark.slow
def test_sweep_and_adapt_run_their_trainings_as_ray_tasks(tmp_path, ray_head, capsys):
    """A 2-run grid and an adapt with N = 1, 2 on the 127.0.0.1 head: each run / fine-tune is
    a task, and their results are gathered into results.json / adapt.json as locally."""
    import lightning as L
    from test_adapt import PRETRAINED_SIZES
    from test_sweep import arch_sweep
    from test_training import make_dm, make_module, make_trainer, write_sim_dataset

    data = write_sim_dataset(tmp_path / "ds", "so101", frames=32, seed=5,
                             splits={"train": 3, "validation": 1, "test": 1})
    sweep = arch_sweep(tmp_path / "arch.yaml", data, "csv")
    tiny = ["--trainer.max_epochs=1", "--data.samples_per_epoch=4", "--data.batch_size=4",
            "--data.horizon={0: 2}"]
    assert main(["sweep", str(sweep), "--backend", "ray", "--address", ray_head,
                 "--out", str(tmp_path / "sweep"), "--", *tiny,
                 "--trainer.limit_val_batches=1"]) == 0
    results = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert [r["status"] for r in results["runs"]] == ["ok", "ok"]
    assert [r["params"]["model.arch"] for r in results["runs"]] == ["mlp", "gru"]
    assert results["backend"].startswith(f"Ray tasks on {ray_head}")
    assert "[sweep] 2 run(s) on Ray tasks" in capsys.readouterr().out

    L.seed_everything(0)
    module = make_module(**PRETRAINED_SIZES)
    trainer = make_trainer(tmp_path / "pre", max_steps=4)
    trainer.fit(module, datamodule=make_dm(data, horizon=4))
    ckpt = tmp_path / "pretrained.ckpt"
    trainer.save_checkpoint(ckpt)
    out = tmp_path / "adapt"
    assert main(["adapt", "--ckpt", str(ckpt), "--data", str(data), "--episodes", "1", "2",
                 "--backend", "ray", "--address", ray_head, "--out", str(out), "--",
                 "--trainer.max_epochs=2", "--data.samples_per_epoch=4",
                 "--data.batch_size=4", "--data.horizon={0: 3}"]) == 0
    result = json.loads((out / "adapt.json").read_text())
    assert [p["n"] for p in result["points"]] == [0, 1, 2]
    assert all(p["metrics"]["arm mean (deg), model"] > 0 for p in result["points"])
    for n in (1, 2):  # each fine-tune's log and clock where a local run leaves them
        assert "-m nactuator.cli train" in (out / f"n_{n:03d}" / "train.log").read_text()
        assert json.loads((out / f"n_{n:03d}" / "done.json").read_text())["fit_s"] > 0
    assert "the fine-tunes on Ray tasks" in (out / "adapt.md").read_text()
