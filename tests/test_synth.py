"""Synthetic datasets: determinism, labels, splits, metadata, safe writes, the CLI."""

from __future__ import annotations

import json

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
