"""Rerun recordings (``--rrd``) of ``data show``, ``live`` and ``record``, read back with
Rerun's own chunk reader and compared with what the dataset / the live CSV / the recorded
dataset hold. Live and record run against the emulators (the real wire protocol); the
viewer window (``--display``) is only checked for its refusal where no display exists."""

from __future__ import annotations

import csv
import threading
from pathlib import Path

import numpy as np
import pytest
import rerun.chunk
import torch
from test_live import untrained_bundle

from nactuator.cli import main
from nactuator.control.live import LiveLoop
from nactuator.data import read_dataset
from nactuator.data.synth import synthesize
from nactuator.hardware.emulator import Emulator
from nactuator.hardware.open import open_bus
from nactuator.hardware.recorder import record, with_hardware
from nactuator.models import load_actuator
from nactuator.platforms import load_platform
from nactuator.viewer import Viewer

PATIENT = {"rx_timeout_ms": 5000.0, "reply_timeout_ms": 5000.0}


def read_rrd(path: Path) -> dict[str, dict]:
    """Per entity path: ``frame`` (int), ``time`` (s), ``values`` (frames, width) or
    ``text``, and ``names`` (the series names, static), each sorted by frame."""
    reader = rerun.chunk.RrdReader(path)
    [recording] = reader.recordings()
    parts: dict[str, list] = {}
    names: dict[str, list[str]] = {}
    for chunk in reader.stream(store=recording).to_chunks():
        batch = chunk.to_record_batch()
        if chunk.is_static:
            if "SeriesLines:names" in batch.column_names:
                names[chunk.entity_path] = batch.column("SeriesLines:names")[0].as_py()
            continue
        parts.setdefault(chunk.entity_path, []).append(batch)
    out = {}
    for path_, batches in parts.items():
        frame = np.concatenate([b.column("frame").to_numpy() for b in batches])
        time = np.concatenate([b.column("time").cast("int64").to_numpy() for b in batches])
        order = np.argsort(frame, kind="stable")
        entity = {"frame": frame[order], "time": time[order] / 1e9,
                  "names": names.get(path_)}
        if "Scalars:scalars" in batches[0].column_names:
            rows = [r for b in batches for r in b.column("Scalars:scalars").to_pylist()]
            entity["values"] = np.array(rows, dtype=float)[order]
        else:
            entity["text"] = [r[0] for b in batches
                              for r in b.column("TextLog:text").to_pylist()]
        out[path_] = entity
    return out


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("viewer") / "ds"
    synthesize("so101", str(out), seed=0, trajectories_per_task=1, seconds=0.5,
               tasks=["pick_and_place_200g", "circular_ccw"])
    return out


def test_data_show_saves_the_episode_on_its_timestamps(tiny_dataset, tmp_path, capsys) -> None:
    ds = read_dataset(tiny_dataset)
    ep = ds.episodes[1]
    rrd = tmp_path / "ep.rrd"
    code = main(["data", "show", str(tiny_dataset), "--episode", str(ep.index),
                 "--rrd", str(rrd)])
    assert code == 0 and f"{ep.length} frames" in capsys.readouterr().out
    got = read_rrd(rrd)
    f = ep.frames
    shown = {"/joints/q": "q", "/joints/qd": "qd", "/commands/q_cmd": "q_cmd",
             "/telemetry/effort": "effort", "/telemetry/voltage": "voltage",
             "/telemetry/temperature": "temperature", "/telemetry/pwm": "pwm",
             "/telemetry/current": "current", "/telemetry/valid": "telemetry_valid",
             "/force/label": "force", "/condition/label": "condition",
             "/payload/mass": "payload_mass"}
    # A channel NaN throughout (not recorded, unlabelled) is left out, every other one is in.
    expected = {e for e, key in shown.items() if np.isfinite(f[key]).any()}
    assert {"/joints/q", "/commands/q_cmd", "/condition/label"} <= expected
    assert set(got) == expected
    channels = load_platform("so101").channel_names
    for entity in expected:
        g = got[entity]
        np.testing.assert_array_equal(g["frame"], np.arange(ep.length))
        np.testing.assert_allclose(g["time"], f["timestamp"], atol=1e-6)  # ns resolution
        np.testing.assert_array_equal(g["values"], f[shown[entity]].reshape(ep.length, -1))
    assert got["/joints/q"]["names"] == channels
    if "/force/label" in got:
        assert got["/force/label"]["names"] == ["fx", "fy", "fz"]


def test_data_show_errors_are_one_line(tiny_dataset, tmp_path, capsys, monkeypatch) -> None:
    def run(*args: str) -> str:
        code = main(["data", "show", str(tiny_dataset), *args])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1
        return err[0]

    assert "no episode 7 (it has episodes 0..1)" in run("--episode", "7", "--rrd",
                                                        str(tmp_path / "x.rrd"))
    assert "give --rrd FILE" in run("--episode", "0")
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    says = run("--episode", "0", "--display", "--rrd", str(tmp_path / "y.rrd"))
    assert "no graphical display" in says and "--rrd FILE" in says
    assert not (tmp_path / "y.rrd").exists()  # refused before anything was written


def test_live_rrd_holds_every_cycle_the_csv_holds(tmp_path, capsys) -> None:
    ckpt = untrained_bundle(tmp_path / "so101.pt", "so101", 6)
    rrd, out = tmp_path / "live.rrd", tmp_path / "live.csv"
    with Emulator("feetech", "so101", seed=1) as follower:
        code = main(["live", "--ckpt", ckpt, "--platform", "so101", "--port", follower.port,
                     "--seconds", "0.5", "--out", str(out), "--rrd", str(rrd), "--quiet"])
    assert code == 0
    rows = list(csv.DictReader(out.open()))
    n = len(rows)
    assert n == round(0.5 * load_platform("so101").fps)
    got = read_rrd(rrd)
    assert set(got) == {"/joints/q", "/joints/qd", "/commands/q_cmd", "/telemetry/effort",
                        "/force/estimate", "/contact/gate", "/condition/estimate"}
    for entity in got.values():
        np.testing.assert_array_equal(entity["frame"], np.arange(n))
        np.testing.assert_allclose(entity["time"], [float(r["t"]) for r in rows], atol=1e-5)
    force = np.array([[float(r[k]) for k in ("fx", "fy", "fz")] for r in rows])
    np.testing.assert_allclose(got["/force/estimate"]["values"], force, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["/contact/gate"]["values"][:, 0],
                               [float(r["gate"]) for r in rows], rtol=1e-5)
    channels = load_platform("so101").channel_names
    condition = np.array([[float(r[f"condition_{c}"]) for c in channels] for r in rows])
    np.testing.assert_allclose(got["/condition/estimate"]["values"], condition, rtol=1e-5)
    assert got["/condition/estimate"]["names"] == channels
    # The command is the hold pose, every cycle.
    assert (got["/commands/q_cmd"]["values"] == got["/commands/q_cmd"]["values"][0]).all()


class WithInterval(torch.nn.Module):
    """A model that also gives a force interval (force_lo / force_hi = force -/+ 0.5 N)."""

    def __init__(self, actuator: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.inputs = actuator, actuator.inputs
        self.window_length = actuator.window_length

    def forward(self, window: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(self.inner(window))
        return {**out, "force_lo": out["force"] - 0.5, "force_hi": out["force"] + 0.5}


def test_live_logs_the_force_interval_when_the_model_gives_one(tmp_path) -> None:
    omx = with_hardware(load_platform("omx"), **PATIENT)
    actuator, _ = load_actuator(untrained_bundle(tmp_path / "omx.pt", "omx", 5))
    viewer = Viewer("interval", omx.channel_names, rrd=tmp_path / "i.rrd")
    with Emulator("dynamixel", "omx", seed=3) as follower, open_bus(omx, follower.port) as bus:
        bus.wait_ready()
        loop = LiveLoop(WithInterval(actuator), bus, omx, bus.read_goal(), viewer=viewer)
        rows = loop.run(0.2, sink=None)
    viewer.close()
    got = read_rrd(tmp_path / "i.rrd")
    est = got["/force/estimate"]["values"]
    assert len(est) == len(rows) == round(0.2 * omx.fps)
    np.testing.assert_allclose(got["/force/estimate_lo"]["values"], est - 0.5, atol=1e-6)
    np.testing.assert_allclose(got["/force/estimate_hi"]["values"], est + 0.5, atol=1e-6)
    assert got["/force/estimate_hi"]["names"] == ["fx", "fy", "fz"]


def test_record_rrd_holds_leader_follower_and_commands_of_every_frame(tmp_path) -> None:
    omx = with_hardware(load_platform("omx"), record_ramp_s=0.2, read_retries=1, **PATIENT)
    step = 1.0 / omx.fps
    leader = Emulator("dynamixel", omx, seed=1, leader=True, step_per_read=step)
    follower = Emulator("dynamixel", omx, seed=2, step_per_read=step)
    frames = 40
    with leader, follower:
        stop = threading.Event()
        leader.after_reads(frames + 1, stop.set)  # its first read is the readiness check
        record(omx, leader.port, follower.port, "teleop", seconds=600.0, out=tmp_path / "ds",
               progress=False, stop=stop, rrd=tmp_path / "rec.rrd")
    [ep] = read_dataset(tmp_path / "ds").episodes
    assert ep.length == frames
    got = read_rrd(tmp_path / "rec.rrd")
    assert set(got) == {"/joints/q", "/joints/leader_q", "/joints/qd", "/commands/q_cmd",
                        "/telemetry/effort", "/telemetry/voltage", "/telemetry/temperature",
                        "/events"}
    assert got["/events"]["text"] == ["episode 1/1 ('teleop') starts"]
    for key, entity in (("q_cmd", "/commands/q_cmd"), ("q", "/joints/q"),
                        ("effort", "/telemetry/effort")):
        np.testing.assert_array_equal(got[entity]["frame"], np.arange(frames))
        np.testing.assert_allclose(got[entity]["values"], ep.frames[key], rtol=1e-6,
                                   atol=1e-7)
    # The recording's clock: the episode's frames, shifted by when the episode began.
    shift = got["/joints/q"]["time"] - ep.frames["timestamp"]
    np.testing.assert_allclose(shift, shift[0], atol=1e-5)
    assert shift[0] >= got["/events"]["time"][0] - 1e-6  # the marker comes first
