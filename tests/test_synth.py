"""Synthetic datasets: determinism, labels, splits, metadata, safe writes, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import nactuator.data.synth as synth
from nactuator.cli import main
from nactuator.data import DataFormatError, read_dataset
from nactuator.platforms import load_platform
from nactuator.world import WorldError, WorldParams, load_world

G = 9.81


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_byte_identical_files(tmp_path):
    kwargs = dict(seed=3, trajectories_per_task=3, seconds=0.6,
                  tasks=["pick_and_place_200g", "circular_ccw"])
    synth.synthesize("so101", str(tmp_path / "a"), **kwargs)
    synth.synthesize("so101", str(tmp_path / "b"), **kwargs)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a.keys() == b.keys() and len(a) >= 5
    assert all(a[k] == b[k] for k in a), [str(k) for k in a if a[k] != b[k]]
    synth.synthesize("so101", str(tmp_path / "c"), **dict(kwargs, seed=4))
    c = _files(tmp_path / "c")
    data = [k for k in a if str(k).startswith("data/")]
    assert data and all(a[k] != c[k] for k in data)


def test_payload_labels_condition_and_splits(tmp_path):
    out = tmp_path / "ds"
    # 0.5 s: the carry interval is a fixed fraction (0.30..0.68) of any episode's duration.
    synth.synthesize("omx", str(out), seed=0, trajectories_per_task=10, seconds=0.5,
                     tasks=["pick_place_object_300g", "go_up_and_stay_still_with_object_200g",
                            "pick_place_object_200g_degrade"])
    ds = read_dataset(out)
    assert len(ds.episodes) == 30
    for task in ("pick_place_object_300g", "go_up_and_stay_still_with_object_200g"):
        splits = [e.split for e in ds.episodes if e.task == task]
        assert splits == ["train"] * 8 + ["validation", "test"]
    for e in ds.episodes:
        f = e.frames
        assert np.isnan(f["force"][:, :2]).all(), "x, y are unlabelled on weight tasks (NAD)"
        held = np.isfinite(f["force"][:, 2])
        mass = 0.3 if "300g" in e.task else 0.2
        np.testing.assert_allclose(f["force"][held, 2], -mass * G, rtol=1e-6)
        np.testing.assert_allclose(f["payload_mass"][held], mass, rtol=1e-6)
        assert (f["payload_mass"][~held] == 0).all()
        if e.task.startswith("go_up"):
            assert held.all(), "go-up-and-stay holds the object for the whole episode"
        else:
            assert 0.2 < held.mean() < 0.6 and not held[0] and not held[-1]
            assert np.diff(held.astype(int)).tolist().count(1) == 1  # one carry interval
        cond = f["condition"]
        expect_j3 = 0.0 if e.task.endswith("_degrade") else 1.0
        assert (cond[:, 2] == expect_j3).all()
        assert (np.delete(cond, 2, axis=1) == 1.0).all()
        assert e.meta["band"] == e.task.endswith("_degrade")


def test_push_labels_and_matched_reference_run(tmp_path):
    out = tmp_path / "ds"
    # 2.5 s: the approach (0.5 s) and three pushes of 0.5 s slots, each with its ramps and a
    # hold at full level (tasks._push), as in the 12 s task.
    synth.synthesize("omx", str(out), seed=0, trajectories_per_task=2, seconds=2.5,
                     tasks=["force_y_minus", "force_y_minus_ref"])
    ds = read_dataset(out)
    push = [e for e in ds.episodes if e.task == "force_y_minus"]
    ref = [e for e in ds.episodes if e.task == "force_y_minus_ref"]
    for p, r in zip(push, ref, strict=True):
        f = p.frames["force"]
        assert np.isfinite(f).all(), "pushes are labelled on all 3 axes, every frame"
        assert (f[:, [0, 2]] == 0).all() and (f[:, 1] <= 0).all()
        assert 3.0 - 1e-3 <= -f[:, 1].min() <= 9.0 + 1e-3
        assert (r.frames["force"] == 0).all(), "matched no-contact run: zero on every axis"
        # Same commanded motion, different response: the push shows in the tracking error.
        np.testing.assert_array_equal(p.frames["q_cmd"], r.frames["q_cmd"])
        assert np.abs(p.frames["q"] - r.frames["q"]).max() > np.radians(0.5)


def test_metadata_recreates_the_world(tmp_path):
    out = tmp_path / "ds"
    synth.synthesize("so101", str(out), seed=5, trajectories_per_task=2, seconds=0.5,
                     tasks=["pick_and_place_empty"])
    ds = read_dataset(out)
    meta = ds.info["nactuator"]["metadata"]
    assert meta["synthetic"] and meta["seed"] == 5
    params = WorldParams.from_dict(meta["world"])
    assert params.motors == load_world("so101", seed=5).motors
    again = synth.run_tasks(load_platform("so101"), params, ["pick_and_place_empty"], 2, 5, 0.5)
    for e, (_, frames, _) in zip(ds.episodes, again, strict=True):
        for key in ("q_cmd", "q", "qd", "effort", "voltage", "temperature"):
            np.testing.assert_array_equal(e.frames[key], frames[key].astype(np.float32))


def test_episode_does_not_depend_on_batch_mates():
    plat = load_platform("so101")
    params = load_world(plat, seed=0)
    alone = synth.run_tasks(plat, params, ["circular_cw"], 2, 0, 0.5)
    mixed = synth.run_tasks(plat, params, ["pick_and_place_300g", "circular_cw"], 2, 0, 0.5)
    for (_, a, _), (_, b, _) in zip(alone, mixed[2:], strict=True):
        for key in ("q", "effort", "voltage"):
            np.testing.assert_array_equal(a[key], b[key])


def test_user_world_file_changes_the_robot(tmp_path):
    world = tmp_path / "weak.yaml"
    world.write_text("platform: so101\nservo: {kp: 8}\n")
    out = tmp_path / "ds"
    synth.synthesize("so101", str(out), world=str(world), trajectories_per_task=1,
                     seconds=0.5, tasks=["go_up_and_stay_still_400g"])
    meta = read_dataset(out).info["nactuator"]["metadata"]
    assert meta["world"]["motors"]["kp"] == [8.0] * 6
    assert meta["world"]["source"] == str(world)


def test_failure_leaves_existing_dataset_untouched(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    synth.synthesize("so101", str(out), trajectories_per_task=1, seconds=0.3,
                     tasks=["pick_and_place_empty"])
    before = _files(out)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("simulated crash mid-run")
        return real(*args, **kwargs)

    real = synth.run_tasks
    monkeypatch.setattr(synth, "MAX_ARMS_PER_BATCH", 1)
    monkeypatch.setattr(synth, "run_tasks", broken)
    with pytest.raises(RuntimeError, match="mid-run"):
        synth.synthesize("so101", str(out), trajectories_per_task=1, seconds=0.3,
                         tasks=["pick_and_place_empty", "circular_cw"])
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"], "no partial folder left"


def test_refuses_to_replace_a_foreign_folder(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(DataFormatError, match="not a synthetic nactuator dataset"):
        synth.synthesize("so101", str(out), trajectories_per_task=1, seconds=0.3,
                         tasks=["circular_cw"])
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tasks": ["juggle"]}, "unknown task(s) ['juggle']"),
        ({"trajectories_per_task": 0}, "trajectories_per_task must be a positive integer"),
        ({"seconds": -1.0}, "seconds must be a positive number"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, kwargs, needle):
    with pytest.raises(WorldError) as e:
        synth.synthesize("so101", str(tmp_path / "x"), **kwargs)
    assert needle in str(e.value)
    assert not (tmp_path / "x").exists()


def test_split_rule():
    assert [synth.split_for(r, 10) for r in range(10)] == ["train"] * 8 + ["validation", "test"]
    assert [synth.split_for(r, 3) for r in range(3)] == ["train", "validation", "test"]
    assert [synth.split_for(r, 2) for r in range(2)] == ["train", "validation"]
    assert synth.split_for(0, 1) == "train"
    assert [synth.split_for(r, 20) for r in range(20)].count("test") == 2


def test_cli_data_synth(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = main(["data", "synth", "--platform", "pendulum", "--out", str(out),
               "--trajectories-per-task", "1", "--seconds", "2.5", "--tasks", "lift_and_drop"])
    assert rc == 0
    assert "synthesized 1 episodes" in capsys.readouterr().out
    (ep,) = read_dataset(out).episodes
    f = ep.frames
    # lift_and_drop: torque off after 2 s, so the PWM register reads 0 from the next read on
    # (a frame's telemetry is read before that frame's command is written).
    off = f["torque_enable"][:, 0] == 0
    after = off & np.concatenate([[False], off[:-1]])
    assert after.sum() >= 20
    assert (f["pwm"][after] == 0).all() and (f["effort"][after] == 0).all()
    assert (f["pwm"][~off] != 0).any()
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["nactuator"]["metadata"]["world"]["registers"] == "xl330"


# --------------------------------------------------------------------------- real postures
# The synthetic world must plan its tasks where the real arms work: the same task, synthesised
# with the default world, spans the same joint ranges as the real NAD files (read here straight
# from the CSV columns, not through the importer). Tolerance on the 5th and 95th percentiles:
# 0.2 rad (11.5 deg) on revolute joints (the real 5-95 % spans are 0.26-0.82 rad), 3 mm on the
# OMX finger slide. Before the posture fix the SO-101 shoulder_lift sat 1.4 rad away.
RANGE_TOL = {"revolute": 0.2, "prismatic": 0.003}


def _real_positions(folder, platform) -> np.ndarray:
    """Joint positions of every real CSV under ``folder`` (rad; OMX finger: aperture / 1000)."""
    p = load_platform(platform)
    rows = []
    for path in sorted(folder.rglob("*.csv")):
        table = np.genfromtxt(path, delimiter=",", names=True)
        cols = [table[f"pos{j + 1}"] for j in range(p.n)]
        if platform == "omx":
            cols[p.gripper_indices[0]] = table["aperture"] / 1000.0
        rows.append(np.stack(cols, axis=1))
    assert rows, f"no real CSV files under {folder}"
    return np.concatenate(rows)


@pytest.fixture(scope="module")
def so101_pick_place(tmp_path_factory):
    """The real files' task, 8 repetitions (as many as their train split), default world."""
    out = tmp_path_factory.mktemp("synth") / "so101"
    synth.synthesize("so101", str(out), seed=0, trajectories_per_task=8,
                     tasks=["pick_and_place_500g"])
    return read_dataset(out)


def _frames(ds, key) -> np.ndarray:
    return np.concatenate([e.frames[key] for e in ds.episodes])


def _assert_ranges_match(synthetic, real, platform):
    p = load_platform(platform)
    lo_s, hi_s = np.percentile(synthetic, [5, 95], axis=0)
    lo_r, hi_r = np.percentile(real, [5, 95], axis=0)
    bad = [f"{c.name}: synthetic {lo_s[j]:+.3f}..{hi_s[j]:+.3f} vs real "
           f"{lo_r[j]:+.3f}..{hi_r[j]:+.3f}" for j, c in enumerate(p.channels)
           if max(abs(lo_s[j] - lo_r[j]), abs(hi_s[j] - hi_r[j])) > RANGE_TOL[c.kind]]
    assert not bad, "5-95 % joint ranges differ: " + "; ".join(bad)


def test_synthetic_so101_pick_place_spans_the_real_joint_ranges(so101_pick_place, nad_dir):
    real = _real_positions(nad_dir / "so101" / "pick_and_place" / "500g", "so101")
    _assert_ranges_match(_frames(so101_pick_place, "q"), real, "so101")


def test_synthetic_so101_stays_off_the_joint_limits(so101_pick_place):
    p = load_platform("so101")
    q = _frames(so101_pick_place, "q")
    lower = np.array([c.limit_lower for c in p.channels])
    upper = np.array([c.limit_upper for c in p.channels])
    assert np.all(q > lower + 0.05) and np.all(q < upper - 0.05)


def test_synthetic_so101_load_has_the_real_servos_sign(so101_pick_place, nad_dir):
    """Present_Load reads positive while the motor drives toward lower positions (real data:
    load vs goal - position correlates at -0.96..-1.00 on every joint)."""
    real = [np.genfromtxt(f, delimiter=",", names=True)
            for f in sorted((nad_dir / "so101").rglob("*.csv"))]
    for j in range(6):
        err = np.concatenate([t[f"goal_pos{j + 1}"] - t[f"pos{j + 1}"] for t in real])
        load = np.concatenate([t[f"load{j + 1}"] for t in real])
        assert np.corrcoef(err, load)[0, 1] < -0.7, f"real joint {j + 1}"
    err = _frames(so101_pick_place, "q_cmd") - _frames(so101_pick_place, "q")
    effort = _frames(so101_pick_place, "effort")
    for j in range(6):
        assert np.corrcoef(err[:, j], effort[:, j])[0, 1] < -0.7, f"synthetic joint {j + 1}"


def test_synthetic_so101_jaw_closes_on_the_carried_object(so101_pick_place):
    """The leader squeezes its jaw shut; the follower's jaw stops on the object and pushes."""
    ws = load_world("so101").workspace
    for e in so101_pick_place.episodes:
        ep = e.frames
        held = ep["payload_mass"].reshape(-1) > 0
        jaw, cmd, load = ep["q"][held, 5], ep["q_cmd"][held, 5], ep["effort"][held, 5]
        assert np.min(cmd) < ws["grasp_jaw"] - 0.2  # commanded well past the object
        assert np.min(jaw) > ws["grasp_jaw"] - 0.03  # ... but the jaw stops on it
        assert np.median(load) > 0.3  # squeezing: driving toward lower positions


def test_synthetic_omx_push_spans_the_real_joint_ranges(tmp_path, nad_dir):
    out = tmp_path / "omx"
    synth.synthesize("omx", str(out), seed=0, trajectories_per_task=3,
                     tasks=["force_z_minus", "force_z_minus_ref"])
    real = _real_positions(nad_dir / "omx" / "force_sensor", "omx")
    _assert_ranges_match(_frames(read_dataset(out), "q"), real, "omx")


def test_default_dataset_digest_follows_the_world(monkeypatch, tmp_path):
    """The cached default dataset is named by everything that decides its content, so a
    change to a task's posture, a register's sign or the world file regenerates it."""
    import nactuator.data.defaults as defaults

    names = {Path(p).name for p in defaults._generator_files("so101")}
    assert {"so101.yaml", "so101.xml", "tasks.py", "registers.py", "world.py", "servo.py",
            "servo_units.py", "synth.py"} <= names
    copies = []
    for path in defaults._generator_files("so101"):
        copy = tmp_path / f"{len(copies)}-{Path(path).name}"
        copy.write_bytes(Path(path).read_bytes())
        copies.append(copy)
    monkeypatch.setattr(defaults, "_generator_files", lambda platform: copies)
    spec = {"seed": 0, "trajectories_per_task": 4}
    before = defaults._digest("so101", spec)
    tasks = next(c for c in copies if c.name.endswith("tasks.py"))
    tasks.write_text(tasks.read_text() + "\n# changed\n")
    assert defaults._digest("so101", spec) != before
    assert defaults._digest("so101", dict(spec, seed=1)) != defaults._digest("so101", spec)
