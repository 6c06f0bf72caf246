"""The wandb-format sweep file and the local offline sweep driver."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from nactuator.experiments.sweep import (
    SweepError,
    build_command,
    configurations,
    load_sweep,
    ranked_table,
    run_sweep,
)
from nactuator.platforms import conf_dir

sys.path.insert(0, str(Path(__file__).parent))
from test_training import write_sim_dataset  # noqa: E402

ARCH_SWEEP = conf_dir() / "sweeps" / "architecture.yaml"


def write_yaml(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def arch_sweep(path: Path, data: Path, logger: str) -> Path:
    """A two-run grid (mlp, gru) of real trainings on ``data``, logging to ``logger``."""
    return write_yaml(path, {
        "program": "nactuator", "method": "grid",
        "metric": {"name": "val/joint_mae_deg", "goal": "minimize"},
        "parameters": {"model.arch": {"values": ["mlp", "gru"]}},
        "command": ["${env}", "${interpreter}", "-m", "nactuator.cli", "fit",
                    "--config", str(conf_dir() / "base.yaml"), "--platform", "so101",
                    f"--data.paths=[{data}]", "--logger", logger, "${args}"],
    })


def test_architecture_sweep_is_a_runnable_wandb_grid():
    spec = load_sweep(ARCH_SWEEP)
    assert spec["method"] == "grid"
    assert spec["metric"] == {"name": "val/score", "goal": "minimize"}
    assert spec["parameters"]["model.arch"]["values"] == ["transformer", "mlp", "gru", "lstm"]
    runs = configurations(spec)
    assert len(runs) == 4 * len(spec["parameters"]["model.width"]["values"])
    assert runs[0] == {"model.arch": "transformer", "model.width": 32, "model.depth": 1}
    # --max-runs 4 reaches every architecture and both widths (not 4 x width 32)
    capped = configurations(spec, max_runs=4)
    assert [(r["model.arch"], r["model.width"]) for r in capped] == [
        ("transformer", 32), ("mlp", 64), ("gru", 32), ("lstm", 64)]
    assert sorted(map(str, runs)) == sorted({str(r) for r in runs})  # no duplicates
    cmd = build_command(spec, runs[4], ["--trainer.max_steps=2"])
    assert cmd[0] == sys.executable
    assert cmd[1:5] == ["-m", "nactuator.cli", "train", "--platform"]
    assert "--model.arch=transformer" in cmd and "--model.width=64" in cmd
    assert cmd[-1] == "--trainer.max_steps=2"
    # Every parameter is a real option of the LightningCLI (strict parsing would reject
    # a typo only at run time, so check it here).
    import inspect

    from nactuator.training.module import NeuralActuatorModule
    options = inspect.signature(NeuralActuatorModule).parameters
    for name in spec["parameters"]:
        group, key = name.split(".", 1)
        assert group == "model" and key in options


def test_a_capped_grid_tries_every_value_of_every_parameter(tmp_path):
    import itertools

    axes = {"model.arch": ["transformer", "mlp", "gru"], "model.width": [16, 32, 64],
            "model.depth": [1, 2], "model.lr": [1e-3]}
    spec = load_sweep(write_yaml(tmp_path / "g.yaml", {
        "method": "grid", "metric": {"name": "val/loss", "goal": "minimize"},
        "parameters": {k: {"values": v} for k, v in axes.items()}}))
    full = configurations(spec)
    assert len(full) == 18
    for cap in range(1, 19):
        runs = configurations(spec, max_runs=cap)
        assert len(runs) == cap and len({json.dumps(r) for r in runs}) == cap
        assert all(r in full for r in runs)
        for name, values in axes.items():  # every value appears once the cap allows it
            seen = {r[name] for r in runs}
            assert len(seen) == min(cap, len(values)), (cap, name, seen)
    # balanced: 6 runs use each arch and each width twice, each depth three times
    six = configurations(spec, max_runs=6)
    for name, values in axes.items():
        counts = [sum(r[name] == v for r in six) for v in values]
        assert max(counts) - min(counts) <= 1, (name, counts)
    assert configurations(spec, max_runs=6) == six  # deterministic
    # uncapped (or a cap the grid fits in): the whole product in grid order
    assert configurations(spec, max_runs=18) == full == configurations(spec, max_runs=50)
    assert [tuple(r.values()) for r in full] == [
        tuple(reversed(c)) for c in itertools.product(*reversed(list(axes.values())))]


def test_random_search_is_seeded(tmp_path):
    spec = load_sweep(write_yaml(tmp_path / "s.yaml", {
        "method": "random", "metric": {"name": "val/loss", "goal": "minimize"},
        "parameters": {"model.lr": {"distribution": "log_uniform_values",
                                    "min": 1e-5, "max": 1e-2},
                       "model.width": {"values": [16, 32, 64]},
                       "model.depth": {"distribution": "int_uniform", "min": 1, "max": 3}},
    }))
    a = configurations(spec, max_runs=5, seed=3)
    assert a == configurations(spec, max_runs=5, seed=3)
    assert a != configurations(spec, max_runs=5, seed=4)
    assert all(1e-5 <= r["model.lr"] <= 1e-2 and r["model.depth"] in (1, 2, 3) for r in a)
    with pytest.raises(SweepError, match="max-runs"):
        configurations(spec)
    with pytest.raises(SweepError, match="grid search needs 'values'.*model.lr"):
        configurations(spec, method="grid")


@pytest.mark.parametrize("spec, message", [
    ({"method": "grid", "parameters": {"a": {"values": [1]}}}, "metric"),
    ({"method": "grid", "metric": {"name": "m", "goal": "up"},
      "parameters": {"a": {"values": [1]}}}, "metric"),
    ({"method": "grid", "metric": {"name": "m", "goal": "minimize"}, "parameters": {}},
     "parameters"),
    ({"method": "grid", "metric": {"name": "m", "goal": "minimize"},
      "parameters": {"a": {"values": []}}}, "non-empty list"),
    ({"method": "grid", "metric": {"name": "m", "goal": "minimize"},
      "parameters": {"a": {"distribution": "beta"}}}, "distribution"),
])
def test_bad_sweep_files(tmp_path, spec, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(write_yaml(tmp_path / "bad.yaml", spec))


def test_bayes_needs_a_local_method(tmp_path):
    spec = load_sweep(write_yaml(tmp_path / "b.yaml", {
        "method": "bayes", "metric": {"name": "m", "goal": "maximize"},
        "parameters": {"a": {"values": [1, 2]}}}))
    with pytest.raises(SweepError, match="cannot run locally"):
        configurations(spec)
    assert len(configurations(spec, method="grid")) == 2


def test_ranked_table_orders_by_goal():
    spec = {"metric": {"name": "acc", "goal": "maximize"}, "parameters": {"a": {}}}
    results = [{"run": f"run-{i}", "params": {"a": i}, "metric": m, "status": s, "seconds": 1.0}
               for i, (m, s) in enumerate([(0.5, "ok"), (None, "failed"), (0.9, "ok")])]
    rows = ranked_table(spec, results).splitlines()[2:]
    assert rows[0].startswith("| 1 | run-2 |") and rows[1].startswith("| 2 | run-0 |")
    assert rows[2].startswith("| 3 | run-1 |") and "failed" in rows[2]


@pytest.mark.parametrize("max_runs", [1, pytest.param(None, marks=pytest.mark.slow)])
def test_local_sweep_runs_offline_and_ranks(tmp_path, max_runs):
    """Real (tiny) runs of a grid, each the sweep's own command in a subprocess with wandb
    offline; the table is ranked by the metric and results.json / results.md written."""
    data = write_sim_dataset(tmp_path / "so101", "so101")
    sweep = arch_sweep(tmp_path / "arch.yaml", data, "wandb")
    out = tmp_path / "sweep"
    table = run_sweep(str(sweep), max_runs=max_runs, out=str(out), extra_args=[
        "--trainer.max_epochs=1", "--data.samples_per_epoch=4", "--data.batch_size=4",
        "--data.horizon={0: 2}",
        "--trainer.limit_val_batches=1"])
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert len(runs) == (max_runs or 2)
    assert [r["status"] for r in runs] == ["ok"] * len(runs), table
    assert [r["params"]["model.arch"] for r in runs] == ["mlp", "gru"][: len(runs)]
    assert all(r["metric"] is not None and r["metric"] >= 0 for r in runs)
    rows = table.splitlines()[2:]
    best = min(runs, key=lambda r: r["metric"])
    assert rows[0].split("|")[2].strip() == best["run"]
    assert (out / "results.md").read_text().strip() == table.strip()
    assert list((out / "run-000").rglob("wandb/offline-run-*")), "wandb ran offline"
    # The run's output went to a log file: one line per epoch instead of a redrawn tqdm bar,
    # and no Warp "no CUDA driver" notice on this CPU run.
    log = (out / "run-000" / "log.txt").read_text()
    assert "\r" not in log and "[nactuator] epoch 1/1, step 1: train/loss" in log
    assert "Could not find or load the NVIDIA CUDA driver" not in log
