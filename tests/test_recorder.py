"""Recording from an emulated leader (scripted human) and an emulated follower (the hidden
world's servo law and physics) through the real SDKs, into NAD shards."""

from __future__ import annotations

import _thread
import threading

import numpy as np
import pytest

from nactuator.data import read_dataset
from nactuator.hardware.bus import HardwareAlert
from nactuator.hardware.emulator import Emulator, Faults
from nactuator.hardware.recorder import record, with_hardware
from nactuator.platforms import load_platform


@pytest.fixture(scope="module")
def omx():
    # A short pre-roll ramp keeps the tests quick; everything else as configured.
    return with_hardware(load_platform("omx"), record_ramp_s=0.2)


@pytest.fixture(scope="module")
def so101():
    return with_hardware(load_platform("so101"), record_ramp_s=0.2)


def _arms(platform, bus, follower_faults=None):
    leader = Emulator(bus, platform, seed=1, leader=True)
    follower = Emulator(bus, platform, seed=2, faults=follower_faults)
    return leader, follower


def test_five_second_recording_rate_units_and_tracking(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        msg = record(omx, leader.port, follower.port, "teleop_free", episodes=1, seconds=5.0,
                     out=tmp_path / "ds", payload_g=0, progress=False)
    assert "1 episode(s)" in msg
    ds = read_dataset(tmp_path / "ds")
    [ep] = ds.episodes
    f = ep.frames
    expected = 5.0 * omx.fps
    assert ep.length >= 0.8 * expected and ep.length <= expected + 1
    dt = np.diff(f["timestamp"])
    assert np.median(dt) == pytest.approx(1 / omx.fps, rel=0.2)
    valid = f["telemetry_valid"] == 1
    assert valid.mean() > 0.97  # a reply may miss its 12 ms timeout on the loaded 2 cores
    assert np.isnan(f["q"][~valid]).all() and np.isfinite(f["q"][valid]).all()
    np.testing.assert_array_equal(f["torque_enable"], 1.0)
    lo = np.array([c.limit_lower for c in omx.channels])
    hi = np.array([c.limit_upper for c in omx.channels])
    ok = valid.all(axis=1)
    f = {k: v[ok] if k != "timestamp" else v for k, v in f.items()}  # complete frames
    assert (f["q"] >= lo - 0.05).all() and (f["q"] <= hi + 0.05).all()
    assert np.abs(f["q"][:, 4]).max() < 0.03  # the gripper channel is a finger in metres
    assert 0.0 < np.abs(f["effort"]).max() < 3.3  # Present Current in A, below the limit
    np.testing.assert_array_equal(f["effort"], f["current"])  # OMX effort signal = current
    assert (np.abs(f["pwm"]) <= 1.0).all()
    assert ((f["voltage"] > 10.0) & (f["voltage"] < 12.5)).all()
    assert ((f["temperature"] > 15) & (f["temperature"] < 60)).all()
    # The follower tracks the leader's scripted motion (world servo: a lag of a few frames).
    for j in range(4):
        assert np.corrcoef(f["q_cmd"][:, j], f["q"][:, j])[0, 1] > 0.8
    assert np.abs(f["q"] - f["q_cmd"])[:, :4].mean() < 0.15
    # payload 0 g labels the whole episode as free motion (zero force)
    np.testing.assert_array_equal(f["force"], 0.0)
    assert ep.split == "train" and ep.task == "teleop_free"


def test_feetech_recording_load_units_and_appending(so101, tmp_path) -> None:
    out = tmp_path / "so"
    leader, follower = _arms(so101, "feetech")
    with leader, follower:
        record(so101, leader.port, follower.port, "lift_200g", episodes=2, seconds=1.0,
               out=out, payload_g=200, split="validation", progress=False)
        record(so101, leader.port, follower.port, "lift_200g", episodes=1, seconds=0.5,
               out=out, payload_g=200, split="test", progress=False)
    ds = read_dataset(out)
    assert [e.split for e in ds.episodes] == ["validation", "validation", "test"]
    f = ds.frames
    assert np.abs(f["effort"]).max() <= 1.0  # signed load fraction
    assert np.isnan(f["pwm"]).all()  # STS3215 has no PWM register: not invented
    np.testing.assert_allclose(f["force"][:, 2], -0.2 * 9.81, rtol=1e-6)
    np.testing.assert_allclose(f["payload_mass"], 0.2)


def test_dead_servo_mid_recording_is_marked_not_invented(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        timer = threading.Timer(0.6, follower.set_dead, args=(13,))
        timer.start()
        record(omx, leader.port, follower.port, "dead", seconds=1.5, out=tmp_path / "d",
               progress=False)
        timer.cancel()
    [ep] = read_dataset(tmp_path / "d").episodes
    valid = ep.frames["telemetry_valid"]
    assert valid[:20].mean() > 0.9
    assert valid[-10:, 2].max() == 0.0  # joint3 = servo 13
    assert valid[-10:, [0, 1, 3, 4]].mean() > 0.9  # the others keep streaming
    assert np.isnan(ep.frames["q"][valid[:, 2] == 0, 2]).all()
    assert 13 in ep.meta["absent_servos"]
    assert ep.length >= 0.8 * 1.5 * omx.fps * 0.7  # a few slots cost by timeouts at most


@pytest.mark.parametrize("faults", [Faults(corrupt_rate=0.1, seed=3),
                                    Faults(drop_rate=0.1, seed=4)], ids=["corrupt", "drop"])
def test_corrupt_and_dropped_replies_are_retried(omx, tmp_path, faults) -> None:
    leader, follower = _arms(omx, "dynamixel", faults)
    with leader, follower:
        record(omx, leader.port, follower.port, "faulty", seconds=1.5, out=tmp_path / "f",
               progress=False)
        injected = follower.stats["corrupted"] + follower.stats["dropped"]
    [ep] = read_dataset(tmp_path / "f").episodes
    assert injected > 0
    counters = ep.meta["bus_counters"]
    assert counters["checksum_errors"] + counters["timeouts"] > 0
    # a failed group read is retried servo by servo: nearly every frame stays complete
    assert ep.frames["telemetry_valid"].mean() > 0.95


def test_alert_at_start_refuses_with_servo_and_register(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel", Faults(alert_ids={15}))
    with leader, follower, pytest.raises(HardwareAlert, match=r"servo 15 .*register 70.*overload"):
        record(omx, leader.port, follower.port, "alert", seconds=0.5, out=tmp_path / "a",
               progress=False)
    assert not (tmp_path / "a" / "data").exists()  # nothing half-written


def test_alert_mid_recording_is_reported_in_the_episode(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        timer = threading.Timer(0.5, follower.set_alert, args=(12,))
        timer.start()
        record(omx, leader.port, follower.port, "alert_mid", seconds=1.2, out=tmp_path / "m",
               progress=False)
        timer.cancel()
    [ep] = read_dataset(tmp_path / "m").episodes
    assert "overload" in ep.meta["hardware_errors"]["12"]
    assert ep.frames["telemetry_valid"][:, 1].mean() > 0.95  # an alert does not lose telemetry
    torque = ep.frames["torque_enable"][:, 1]
    assert torque[0] == 1.0 and torque[-1] == 0.0  # the firmware's shutdown is recorded


def test_ctrl_c_saves_the_current_episode_and_keeps_earlier_ones(omx, tmp_path) -> None:
    out = tmp_path / "c"
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        record(omx, leader.port, follower.port, "first", seconds=0.5, out=out, progress=False)
        timer = threading.Timer(0.8, _thread.interrupt_main)
        timer.start()
        msg = record(omx, leader.port, follower.port, "second", episodes=3, seconds=5.0,
                     out=out, progress=False)
        timer.cancel()
    assert "Ctrl-C" in msg
    ds = read_dataset(out)
    assert [e.task for e in ds.episodes] == ["first", "second"]
    assert ds.episodes[1].meta["interrupted"] is True
    assert 10 < ds.episodes[1].length < 5.0 * omx.fps


def test_follower_lost_mid_episode_saves_partial_and_raises(omx, tmp_path) -> None:
    out = tmp_path / "crash"
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        record(omx, leader.port, follower.port, "ok", seconds=0.4, out=out, progress=False)
        timer = threading.Timer(0.5, follower.stop)  # the USB adapter is unplugged
        timer.start()
        with pytest.raises(Exception):  # noqa: B017 (whatever pyserial raises)
            record(omx, leader.port, follower.port, "crash", seconds=3.0, out=out,
                   progress=False)
        timer.cancel()
    ds = read_dataset(out)
    assert ds.episodes[0].task == "ok"
    assert len(ds.episodes) in (1, 2)  # the partial episode is saved when it had frames


def test_bad_ports_are_named(omx, tmp_path) -> None:
    from nactuator.hardware.bus import PortError

    with pytest.raises(PortError, match="/dev/does-not-exist.*does not exist"):
        record(omx, "/dev/does-not-exist", "/dev/also-missing", "x", seconds=0.5,
               out=tmp_path / "p", progress=False)
    with pytest.raises(ValueError, match="different ports"):
        record(omx, "/dev/x", "/dev/x", "x", out=tmp_path / "p")


def test_latency_within_and_beyond_the_reply_timeout(omx, tmp_path) -> None:
    # 4 ms late replies still fit the 12 ms timeout: every frame complete.
    leader, follower = _arms(omx, "dynamixel", Faults(latency_ms=4.0))
    with leader, follower:
        record(omx, leader.port, follower.port, "slow", seconds=1.0, out=tmp_path / "s",
               progress=False)
    [ep] = read_dataset(tmp_path / "s").episodes
    assert ep.frames["telemetry_valid"].mean() > 0.95
    # 25 ms late replies miss it: frames are kept, marked invalid (NaN), servos reported
    # absent; the late bytes are never taken for a later cycle's answer.
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        timer = threading.Timer(0.4, setattr, args=(follower.faults, "latency_ms", 25.0))
        timer.start()
        record(omx, leader.port, follower.port, "late", seconds=1.5, out=tmp_path / "l",
               progress=False)
        timer.cancel()
    [ep] = read_dataset(tmp_path / "l").episodes
    valid = ep.frames["telemetry_valid"]
    assert valid[:5].mean() > 0.9 and valid[-10:].max() == 0.0
    assert np.isnan(ep.frames["q"][-10:]).all()
    assert sorted(ep.meta["absent_servos"]) == [11, 12, 13, 14, 15]


def test_voltage_sag_is_recorded_with_the_effort(omx, tmp_path) -> None:
    sag = 6.0
    leader, follower = _arms(omx, "dynamixel", Faults(voltage_sag=sag))
    with leader, follower:
        record(omx, leader.port, follower.port, "sag", seconds=1.0, out=tmp_path / "v",
               progress=False)
    [ep] = read_dataset(tmp_path / "v").episodes
    f = ep.frames
    ok = f["telemetry_valid"].all(axis=1)
    duty = np.abs(f["pwm"][ok]).max(axis=1)
    volts = f["voltage"][ok].max(axis=1)
    assert duty.max() > 0.1  # the follower worked, so the supply sagged
    # supply 12 V less sag x the largest duty (0.3 V for quantisation and sensor noise)
    assert (volts <= 12.0 - sag * duty + 0.3).all()
