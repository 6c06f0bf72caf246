"""Every ``bench/*.py`` still runs: each script's ``main`` at tiny sizes and one repeat, in
this process (no fresh interpreter per bench), reading back the table it prints. A bench
that no longer runs against today's code fails here instead of rotting unseen; the figures
themselves are not judged (they are timings on a shared machine)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from nactuator.data import DatasetWriter
from nactuator.models import NeuralActuator, bundle_to_dict, save_bundle
from nactuator.platforms import load_platform

BENCH = Path(__file__).resolve().parents[1] / "bench"
STATS_KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def bench_main(name: str):
    """``bench/<name>.py``'s ``main``, imported from its file (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.main


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    """The markdown rows of ``text`` whose first cell starts with ``first_cell``."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows if r[0].startswith(first_cell) and not r[0].startswith("---")]


def number(cell: str) -> float:
    return float(re.match(r"[-\d.,]+", cell).group().replace(",", ""))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """An untrained MLP bundle and a 4-episode dataset, both SO-101."""
    folder = tmp_path_factory.mktemp("bench")
    p = load_platform("so101")
    stats = {k: {"mean": [0.0] * p.n, "std": [1.0] * p.n} for k in STATS_KEYS}
    actuator = NeuralActuator(n_motors=p.n, norm_stats=stats, model_config={"arch": "mlp"})
    bundle = folder / "mlp.pt"
    save_bundle(bundle_to_dict(actuator, "so101"), bundle)
    rng = np.random.default_rng(0)
    with DatasetWriter(folder / "data", p, p.fps) as w:
        for e, split in enumerate(("train", "train", "validation", "test")):
            frames = {k: rng.normal(size=(120, p.n)) for k in
                      ("q_cmd", "q", "qd", "effort", "voltage", "temperature")}
            frames["force"] = rng.normal(size=(120, 3))
            w.add_episode(frames, f"t{e}", split)
    return bundle, folder / "data"


def test_bench_data_runs(nad_dir, capsys):
    bench_main("data")(["--seconds", "0.01", "--synthetic", "12x140", "--nad", str(nad_dir)])
    out = capsys.readouterr().out
    assert re.search(r"import_nad: 16078 frames", out), out
    rows = table_rows(out, "NAD") + table_rows(out, "synthetic OMX (12 ep x 140)")
    assert len(rows) == 6, out
    assert all(number(r[2]) > 0 and number(r[3]) > 0 for r in rows), out
    assert sum("materialised" in r[1] for r in rows) == 3  # like with like (bench checks it)


def test_bench_sim_runs_with_its_training_share(shared_dir, monkeypatch, capsys):
    monkeypatch.setenv("NACTUATOR_SHARED", str(shared_dir))
    bench_main("sim")(["--platforms", "pendulum", "--batch", "2", "--horizon", "3",
                       "--repeats", "1", "--train-batch", "2", "--train-horizon", "4",
                       "--train-steps", "1", "--no-start"])
    out = capsys.readouterr().out
    rows = table_rows(out, "pendulum")
    assert [r[2] for r in rows] == ["chain", "newton"], out
    assert all(number(r[3]) > 0 and number(r[4]) > 0 for r in rows), out  # arm-substeps/s
    # the training share of a real SO-101 training step, both engines
    assert re.search(r"\| chain \| [\d.]+ \| [\d.]+ \| \d+ % \|", out), out
    assert re.search(r"\| newton \| [\d.]+ \| [\d.]+ \| \d+ % \| 1.00x \|", out), out


def test_bench_sim_start_up_probe_runs(capsys):
    # The start-up section times this snippet in a fresh process (cold: minutes of kernel
    # compilation); here it runs in this one, which is what can rot.
    bench_main("sim")  # loads bench/sim.py
    exec(sys.modules["bench_sim"]._START.format(platform="pendulum", engine="chain"), {})
    assert float(capsys.readouterr().out.strip().splitlines()[-1]) > 0


def test_bench_infer_runs(capsys):
    bench_main("infer")(["--arch", "mlp", "--rounds", "1", "--latency-calls", "2",
                         "--throughput-calls", "1", "--batches", "4", "--warmup-calls", "1",
                         # torch.compile (a ~30 s inductor build) and the fp32 ONNX file
                         # (the int8 path exports it too) are left out
                         "--paths", "torchscript", "onnx-int8", "torchscript-int8"])
    out = capsys.readouterr().out
    assert "## mlp:" in out and "unavailable" not in out, out
    paths = [r[0] for r in table_rows(out, "")][1:]
    assert paths == ["eager", "torchscript (frozen + optimize_for_inference)",
                     "onnxruntime int8 dynamic (1 thread)",
                     "torchscript int8 (torch.ao dynamic, frozen)"], out
    assert "int8 accuracy vs eager: tau" in out, out


def test_bench_infer_times_model_files(tiny, capsys):
    bundle, data = tiny
    bench_main("infer")(["--models", str(bundle), "--data", str(data), "--rounds", "1"])
    [row] = table_rows(capsys.readouterr().out, str(bundle))
    assert row[1] == "checkpoint" and number(row[2]) > 0


def test_bench_live_runs(tiny, capsys):
    bundle, _ = tiny
    bench_main("live")(["--model", str(bundle), "--seconds", "0.3", "--timing", "off"])
    [row] = table_rows(capsys.readouterr().out, "so101")
    # the model's own filters (no pooling), no bus timing; rate Hz
    assert row[2] == "off" and row[3] == "off" and number(row[4]) > 0


def test_bench_dropped_reads_runs(tiny, capsys):
    bundle, data = tiny
    bench_main("dropped_reads")(["--data", str(data), "--split", "validation", str(bundle)])
    out = capsys.readouterr().out
    assert re.search(r"validation: 1 episode\(s\), \d+ of 720 motor-frames dropped", out), out
    [row] = table_rows(out, str(bundle))
    assert all(re.match(r"[\d.]+ N, [\d.]+ %", c) for c in row[1:]), row


def test_bench_render_runs_with_its_baselines(capsys):
    bench_main("render")(["--batches", "1,2", "--repeats", "1"])
    out = capsys.readouterr().out
    ray = re.search(r"MuJoCo ray cast, 1 frame \(forward only\): ([\d.]+) ms", out)
    assert ray and float(ray.group(1)) > 0, out  # the reference renderer, same run
    rows = table_rows(out, "")[1:]
    assert [r[0] for r in rows] == ["1", "2"], out
    for r in rows:
        batch_ms, frame_ms, fps = number(r[1]), number(r[2]), number(r[3])
        assert batch_ms > 0 and frame_ms > 0 and fps > 0
        assert frame_ms == pytest.approx(batch_ms / int(r[0]), abs=0.6)  # printed rounded
    assert rows[0][4] == "1.00x", out  # B = 1 is the in-run baseline
    assert re.search(r"vs one ray-cast frame: [\d.]+x slower", out), out


@pytest.mark.slow
def test_bench_data_efficiency_runs_both_archs_through_cv(tmp_path, monkeypatch, capsys):
    # Child trainings (`nactuator train`, then `nactuator eval`) at the tiniest recipe: one
    # count (3 episodes: train on 1, select on 1, score 1), one fold, one short epoch each.
    from test_training import write_sim_dataset

    data = write_sim_dataset(tmp_path / "full", "so101", frames=32,
                             splits={"train": 2, "validation": 1})
    monkeypatch.chdir(BENCH.parent)  # the recipe names conf/train/so101.yaml
    out = tmp_path / "de"
    bench_main("data_efficiency")(["--data", str(data), "--out", str(out), "--counts", "1",
                                   "--max-folds", "1", "--epochs", "1", "--horizon", "3",
                                   "--samples-per-epoch", "4"])
    text = capsys.readouterr().out
    saved = json.loads((out / "data_efficiency.json").read_text())
    assert saved["counts"] == [1] and set(saved["results"]) == {"transformer", "jointwise"}
    for arch in ("transformer", "jointwise"):
        point = saved["results"][arch]["1"]
        assert len(point["model"]["folds"]) == 1 and np.isfinite(point["model"]["mean"])
        assert point["model"]["mean"] >= 0 and point["command_following"]["mean"] >= 0
        held = json.loads((out / f"cv_{arch}_01" / "fold_0" / "eval_best" /
                           "metrics.json").read_text())
        assert held["cv"] == {"folds": 3, "fold": 0} and held["episodes"] == 1
    # both archs see the same folds: the same held-out episode, the same reference
    ref = {a: saved["results"][a]["1"]["command_following"]["mean"] for a in saved["results"]}
    assert ref["transformer"] == ref["jointwise"]
    [row] = table_rows(text.split("jointwise N=1")[-1], "1")
    assert len(row) == 4 and row[3] == f"{ref['jointwise']:.2f}", text
    assert (out / "data_efficiency.png").stat().st_size > 0
    assert (out / "data_efficiency.md").read_text().splitlines()[-1].startswith("| 1 |")


def test_bench_uncertainty_times_both_heads(capsys):
    bench_main("uncertainty")(["--repeats", "1", "--batches", "1,8", "--calls", "2"])
    out = capsys.readouterr().out
    for batch in ("1", "8"):
        (row,) = table_rows(out, batch)
        base, head, ratio = (number(c) for c in row[1:4])
        assert base > 0 and head > 0 and ratio == pytest.approx(head / base, rel=0.01)
    assert "85,488 without, 85,587 with" in out  # the head adds 3 x 33 weights


def test_bench_time_to_accuracy_plots_cv_runs_against_training_cpu(tmp_path, capsys):
    # Two fake `nactuator cv` outputs (cv.json with each fold's training time, as cv writes
    # them) and a documented band: the table reads back the per-fold means.
    from nactuator.experiments.cv import summarize_folds

    def fake(name: str, cpu: list[float], worst: list[float]) -> Path:
        rows = [{"arm mean (deg), model": w / 2, "worst arm joint (deg), model": w,
                 "contact/force 3-axis (N), model rollout": 0.4} for w in worst]
        times = summarize_folds([{"cpu": c, "wall": 1.5 * c} for c in cpu])
        out = tmp_path / name
        out.mkdir()
        (out / "cv.json").write_text(json.dumps({
            "scored_folds": list(range(len(cpu))), "train_s": times,
            "summary": {"best": summarize_folds(rows)}}))
        return out

    old = fake("old", [400.0, 420.0], [1.0, 2.0])
    new = fake("new", [90.0, 100.0], [1.2, 1.4])
    png = tmp_path / "t2a.png"
    bench_main("time_to_accuracy")(["--run", f"old={old}", "--run", f"new={new}", "--contact",
                                    "--band", "worst arm joint (deg), model=1.73,0.79,doc",
                                    "--out", str(png)])
    text = capsys.readouterr().out
    [row_old] = table_rows(text, "old")
    [row_new] = table_rows(text, "new")
    assert row_old[1] == "0, 1" and row_old[2] == "410 ± 14" and row_old[3] == "615 ± 21"
    assert row_new[2] == "95 ± 7" and row_new[5] == "1.30 ± 0.14" and row_new[6] == "0.400 ± 0.000"
    assert png.stat().st_size > 0


def test_bench_calibrate_curve_plans_each_point_once_in_priority_order():
    # The first pass (every seed's minutes curve up to first_pass_max_minutes) comes first, a
    # weights-curve point equal to a minutes-curve point is measured once, then the rest.
    bench_main("calibrate_curve")
    mod = sys.modules["bench_calibrate_curve"]
    cfg = mod.load_config(BENCH.parent / "conf" / "bench" / "calibrate_curve.yaml")
    cfg.update(seeds=[1, 2], first_pass_max_minutes=5)
    cfg["curves"]["minutes"].update(weights_g=[400, 200], minutes=[1, 5, 20])
    cfg["curves"]["weights"].update(minutes=5, weight_sets=[[200], [200, 400]])
    got = [(p["seed"], tuple(p["weights"]), p["minutes"]) for p in mod.plan_points(cfg)]
    assert got == [(1, (200, 400), 1.0), (1, (200, 400), 5.0), (2, (200, 400), 1.0),
                   (2, (200, 400), 5.0), (1, (200,), 5.0), (2, (200,), 5.0),
                   (1, (200, 400), 20.0), (2, (200, 400), 20.0)]
    assert mod.tasks_for([200, 300], cfg) == [
        "go_up_and_stay_still_200g", "pick_and_place_200g", "go_up_and_stay_still_300g",
        "pick_and_place_300g", "pick_and_place_empty"]


@pytest.mark.parametrize("design", ["calibrate_curve.yaml", "calibrate_curve_omx.yaml"])
def test_bench_calibrate_curve_designs_name_tasks_their_world_has(design):
    # Every task a design trains or holds out on must exist in its world, or `data synth`
    # fails after minutes of other points.
    from nactuator.world.params import load_world_config

    bench_main("calibrate_curve")
    mod = sys.modules["bench_calibrate_curve"]
    cfg = mod.load_config(BENCH.parent / "conf" / "bench" / design)
    world, _ = load_world_config(cfg["platform"], BENCH.parent / cfg["world"])
    sets = cfg["curves"]["weights"]["weight_sets"] + [cfg["curves"]["minutes"]["weights_g"]]
    wanted = {t for ws in sets for t in mod.tasks_for(ws, cfg)} | set(mod.unseen_tasks(cfg))
    assert wanted <= set(world["tasks"]), sorted(wanted - set(world["tasks"]))


def test_bench_calibrate_curve_config_error_names_the_file(tmp_path):
    bench_main("calibrate_curve")
    mod = sys.modules["bench_calibrate_curve"]
    bad = tmp_path / "curve.yaml"
    bad.write_text("platform: so101\nseeds: [1]\n")
    with pytest.raises(mod.UserError, match=rf"{re.escape(str(bad))}: expected the keys"):
        mod.load_config(bad)


def test_bench_calibrate_curve_adapt_config_and_no_scratch(tmp_path, monkeypatch):
    # --adapt-config replaces the protocol's recipe (written, time curve off, into --out);
    # --no-scratch drops the from-scratch column of every point. Nothing is trained here.
    import yaml

    main = bench_main("calibrate_curve")
    mod = sys.modules["bench_calibrate_curve"]
    monkeypatch.chdir(BENCH.parent)
    recipe = yaml.safe_load((BENCH.parent / "conf" / "train" / "adapt.yaml").read_text())
    recipe["train"]["model"]["loss"] = {"w_force": 120.0}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    seen = []

    class Measured(Exception):
        pass

    def fake_measure(point, cfg, folder, held, pool, adapt_cfg, per_epoch, steps,
                     held_unseen=None):
        seen.append((point, yaml.safe_load(Path(adapt_cfg).read_text())))
        raise Measured

    monkeypatch.setattr(mod, "synth", lambda cfg, seed, tasks, folder: folder)
    monkeypatch.setattr(mod, "split_pools",
                        lambda data, folder, sets, cfg: (folder, {"pool_200-400": folder}))
    monkeypatch.setattr(mod, "measure", fake_measure)
    with pytest.raises(Measured):
        main(["--out", str(tmp_path / "cc"), "--seeds", "7", "--minutes", "10",
              "--weight-sets", "200,400", "--weights-minutes", "10", "--no-scratch",
              "--adapt-config", str(path)])
    # --set writes the same recipe from the protocol's own
    with pytest.raises(Measured):
        main(["--out", str(tmp_path / "cc2"), "--seeds", "7", "--minutes", "10",
              "--weight-sets", "200,400",
              "--weights-minutes", "10", "--set", "model.loss.w_force=120"])
    (point, written), (point2, written2) = seen
    assert point["with_scratch"] is False and point["minutes"] == 10.0
    assert point2["with_scratch"] is True and point2["weights"] == [200, 400]
    assert written["train"]["model"]["loss"] == {"w_force": 120.0}
    assert written["adapt"]["time_curve"] == "none"
    assert written2 == written
    with pytest.raises(mod.UserError, match="expected KEY=VALUE"):
        mod.set_key({}, "model.lr")


@pytest.mark.slow
def test_bench_calibrate_curve_runs_resumes_and_summarises_over_seeds(tmp_path, monkeypatch,
                                                                       capsys):
    # Tiny sizes: 2 arms, 5 tasks of 3 runs of 2 s (1 train, 1 validation, 1 test), 8 steps.
    from nactuator.data import read_dataset

    monkeypatch.chdir(BENCH.parent)  # the config's paths are relative to the project
    out = tmp_path / "cc"
    args = ["--out", str(out), "--seeds", "3", "4", "--minutes", "0.1", "--weight-sets", "200",
            "--weights-minutes", "0.1", "--trajectories-per-task", "3", "--run-seconds", "2",
            "--steps", "8"]
    bench_main("calibrate_curve")(args)
    text = capsys.readouterr().out
    saved = json.loads((out / "curve.json").read_text())
    assert len(saved["rows"]) == 4  # 2 seeds x {200+400 g, 200 g} at 0.1 min
    for r in saved["rows"]:
        subset = read_dataset(out / f"seed_{r['seed']}" / ("w" + "-".join(map(str, r["weights"])))
                              / "adapt" / "data" / f"n_{r['runs']:03d}")
        train = [e.task for e in subset.episodes if e.split == "train"]
        test = sorted(e.task for e in subset.episodes if e.split == "test")
        # N = 0.1 min / 2 s = 3 runs, of the point's weights (and the empty gripper) only
        assert r["runs"] == 3 == len(train) and r["steps"] == 8
        assert set(train) <= set(sys.modules["bench_calibrate_curve"].tasks_for(
            r["weights"], saved["config"]))
        # the same held-out runs for every point: the test run of every task
        assert test == sorted(sys.modules["bench_calibrate_curve"].tasks_for(
            [200, 400], saved["config"]))
        assert ("scratch" in r) == (r["weights"] == [200, 400])
        assert r["adapt_fit_cpu_s"] > 0
        # the weights no point trains on (250 and 350 g) are scored apart, on their own runs
        assert r["adapted_unseen"]["force"] is not None and r["adapted_unseen"]["linear"]
    cfg = saved["config"]
    unseen = sorted(sys.modules["bench_calibrate_curve"].unseen_tasks(cfg))
    assert unseen and "pick_and_place_250g" in unseen
    held = read_dataset(out / "seed_3" / "held_out_unseen")
    assert sorted(e.task for e in held.episodes) == unseen
    assert {e.split for e in held.episodes} == {"test"}
    # the summary: the mean over the two seeds of each point, read back from the table
    for s in saved["summary"]:
        rows = [r for r in saved["rows"] if r["weights"] == s["weights"]]
        assert s["seeds"] == [3, 4]
        assert s["adapted/joints"]["mean"] == pytest.approx(
            np.mean([r["adapted"]["joints"] for r in rows]))
        w = "+".join(map(str, s["weights"]))
        [row] = [r for r in table_rows(text, w) if r[0] == w]
        assert number(row[5]) == pytest.approx(s["adapted/joints"]["mean"], abs=0.006)
    assert (out / "curve.png").stat().st_size > 0
    # a rerun measures nothing again
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("points/*.json")}
    bench_main("calibrate_curve")(args)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("points/*.json")} == stamps


def test_bench_calibrate_bus_frame_timing_quantum_and_run_length():
    # Frame periods at 50 Hz: one period of 2 slots and one of 3 lose 1 + 2 slots; the
    # deviations from whole slots are 0, 0, 0, 0, 1 ms, 0 (one period is 21 ms).
    bench_main("calibrate_bus")
    mod = sys.modules["bench_calibrate_bus"]
    t = np.array([0.0, 0.02, 0.04, 0.08, 0.10, 0.16, 0.181])
    ft = mod.frame_timing(t, 50.0)
    assert ft["frames"] == 7 and ft["lost_slots"] == 3
    assert ft["dev_max_ms"] == pytest.approx(1.0, abs=1e-9)
    assert ft["dev_p50_ms"] == pytest.approx(0.0, abs=1e-9)
    # A channel read on a grid of 0.0015 (with NaNs where a read failed) has that quantum.
    rng = np.random.default_rng(0)
    x = rng.integers(-50, 50, size=200) * 0.0015
    x[::7] = np.nan
    assert mod.quantum(x) == pytest.approx(0.0015)
    assert np.isnan(mod.quantum(np.full(5, 0.3)))
    # conf/calibrate/so101.yaml with two weights: 3 free + 4 lift-and-hold + 6 pick-and-place
    # train runs, so 1 min of training recordings is 13 runs of 60 / 13 s.
    from nactuator.guide.protocol import load_protocol

    assert mod.episode_seconds(1.0, load_protocol("so101"), [200.0, 400.0]) == \
        pytest.approx(60.0 / 13)


def test_bench_calibrate_bus_replay_leader_plays_frame_k_at_read_k():
    # The replay leader on an emulated STS3215 bus in lockstep: after record's first read
    # (wait_ready), read k of the episode returns the k-th command, to the bus's resolution
    # (4096 counts per turn), and the last pose is held past the end.
    bench_main("calibrate_bus")
    mod = sys.modules["bench_calibrate_bus"]
    from nactuator.hardware.emulator import Emulator
    from nactuator.hardware.open import open_bus

    p = load_platform("so101")
    lo = np.array([c.limit_lower for c in p.channels])
    hi = np.array([c.limit_upper for c in p.channels])
    k = np.arange(12)[:, None]
    q_cmd = np.clip(0.05 * k * np.linspace(-1, 1, p.n)[None, :] + 0.1, lo, hi)
    lead = mod.ReplayLeader(p.n, p.fps)
    with Emulator("feetech", p, arm=lead, step_per_read=1.0 / p.fps) as emu:
        mod.play(emu, lead, q_cmd)
        with open_bus(p, emu.port, None, torque=False) as bus:
            first = bus.wait_ready()
            got = [bus.read().q for _ in range(len(q_cmd) + 2)]
    step = 2 * np.pi / 4096
    np.testing.assert_allclose(first.q, q_cmd[0], atol=step)
    np.testing.assert_allclose(np.array(got[:len(q_cmd)]), q_cmd, atol=step)
    np.testing.assert_allclose(got[-1], q_cmd[-1], atol=step)


def test_bench_calibrate_bus_synth_labels_replace_record_labels_only(tmp_path):
    # --labels synth: a recording (record's -m g on every frame) gets the replayed synth
    # run's own per-frame force and payload labels (unknown where the object is set down);
    # its telemetry, task and split stay the bus's. A recording longer than the run it
    # replays cannot be aligned and is refused.
    from types import SimpleNamespace

    from nactuator.data import DatasetWriter, read_dataset
    from nactuator.errors import UserError

    bench_main("calibrate_bus")
    mod = sys.modules["bench_calibrate_bus"]
    p = load_platform("so101")
    T, rng = 40, np.random.default_rng(3)
    rec = {"q": rng.normal(0, 0.1, (T, p.n)), "q_cmd": rng.normal(0, 0.1, (T, p.n)),
           "effort": rng.normal(0, 0.1, (T, p.n)), "force": np.tile([0.0, 0.0, -3.924], (T, 1)),
           "qd": rng.normal(0, 0.1, (T, p.n)), "voltage": np.full((T, p.n), 12.0),
           "temperature": np.full((T, p.n), 30.0),
           "payload_mass": np.full(T, 0.4), "timestamp": np.arange(T) / p.fps}
    run_dir = tmp_path / "003"
    with DatasetWriter(run_dir, p, fps=p.fps) as writer:
        writer.add_episode(rec, "pick_and_place_400g", "train")
    held = np.zeros(T + 5, dtype=bool)
    held[12:30] = True  # carried from the grasp to the release
    force = np.full((T + 5, 3), np.nan)
    force[held, 2] = -0.4 * 9.81
    synth = SimpleNamespace(length=T + 5, frames={"force": force,
                                                  "payload_mass": np.where(held, 0.4, 0.0)})
    out = mod.synth_labelled(run_dir, synth)
    [ep] = read_dataset(out).episodes
    [raw] = read_dataset(run_dir).episodes
    # stored as float32, NaN where synth has no label
    np.testing.assert_allclose(ep.frames["force"], force[:T], rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(ep.frames["payload_mass"], np.where(held, 0.4, 0.0)[:T],
                               rtol=1e-6)
    for key in ("q", "q_cmd", "effort", "timestamp"):
        np.testing.assert_array_equal(ep.frames[key], raw.frames[key])
    assert (ep.task, ep.split) == (raw.task, raw.split)
    short = SimpleNamespace(length=T - 1, frames=synth.frames)
    with pytest.raises(UserError, match="more than the replayed run"):
        mod.synth_labelled(_copy_run(run_dir, tmp_path / "004"), short)


def _copy_run(src, dest):
    import shutil

    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("synth_labels"))
    return dest


def test_bench_onset_twin_changes_nothing_before_the_onset(tmp_path, capsys):
    world = tmp_path / "onset.yaml"
    world.write_text("platform: omx\ntasks:\n"
                     "  band: {kind: pick_place, seconds: 4.0, payload_g: 0, onset: 2.0, "
                     "fault: band}\n")
    module_main = bench_main("onset_twin")
    module_main(["--world", str(world), "--reps", "1", "--out", str(tmp_path / "t.png")])
    out = capsys.readouterr().out
    (row,) = table_rows(out, "band")
    deltas, effort_range = [number(c) for c in row[2:6]], number(row[6])
    # the band's torque shows in the effort after the onset, less than the motion's swing
    assert deltas[-1] > 0 and effort_range > 0 and (tmp_path / "t.png").is_file()
    # independently: the twin world holds the same tasks with the onset at the run's end
    twin = sys.modules["bench_onset_twin"].twin_config(
        {"platform": "omx", "tasks": {"band": {"seconds": 4.0, "onset": 2.0}, "free": {}}})
    assert twin["tasks"] == {"band": {"seconds": 4.0, "onset": 3.9}, "free": {}}
