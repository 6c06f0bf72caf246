"""Recording from an emulated leader (scripted human) and an emulated follower (the hidden
world's servo law and physics) through the real SDKs, into a nactuator dataset.

Deterministic on a loaded machine (users run the tests while training): the emulated arms
advance one recording period per telemetry read (``step_per_read``), so what they do per
frame does not depend on how fast the machine is; faults and events are scheduled at a
telemetry cycle (``after_reads``), not at a wall-clock time; episodes that must hold a
given number of frames end on the leader's N-th read (``stop``); the buses wait patiently
for replies (an in-process emulator can take a few hundred ms to answer on a loaded
machine), except where a short reply timeout is what is tested.
"""

from __future__ import annotations

import _thread
import re
import threading

import numpy as np
import pytest

from nactuator.data import read_dataset
from nactuator.hardware.emulator import Emulator, Faults
from nactuator.hardware.port import HardwareAlert
from nactuator.hardware.recorder import RecordingQualityError, record, with_hardware
from nactuator.platforms import load_platform

PATIENT_MS = 5000.0  # reply timeouts where no reply is meant to fail
LONG_S = 600.0  # an episode length never reached: these episodes end on a stop event


def _patient(name: str, **changes):
    # Patient telemetry reads (rx) and other replies; one retry round (the second depends
    # on a time budget); a short pre-roll ramp.
    settings = {"record_ramp_s": 0.2, "rx_timeout_ms": PATIENT_MS,
                "reply_timeout_ms": PATIENT_MS, "read_retries": 1}
    return with_hardware(load_platform(name), **{**settings, **changes})


@pytest.fixture(scope="module")
def omx():
    return _patient("omx")


@pytest.fixture(scope="module")
def so101():
    return _patient("so101")


def _arms(platform, bus, follower_faults=None):
    step = 1.0 / platform.fps
    leader = Emulator(bus, platform, seed=1, leader=True, step_per_read=step)
    follower = Emulator(bus, platform, seed=2, faults=follower_faults, step_per_read=step)
    return leader, follower


def _stop_after(leader: Emulator, frames: int) -> threading.Event:
    """An event set when the leader has served ``frames`` episode cycles (its first read
    is record's readiness check), so the episode holds exactly ``frames`` frames."""
    stop = threading.Event()
    leader.after_reads(frames + 1, stop.set)
    return stop


def _torque(emu: Emulator) -> list[int]:
    return [emu.tables[sid].get("Torque_Enable") for sid in emu.ids]


def test_recording_units_validity_and_tracking(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        stop = _stop_after(leader, 150)
        msg = record(omx, leader.port, follower.port, "teleop_free", seconds=LONG_S,
                     out=tmp_path / "ds", payload_g=0, progress=False, stop=stop)
        assert _torque(follower) == [0] * 5  # torque off once recording ends
    assert "1 episode(s), 150 frames" in msg
    [ep] = read_dataset(tmp_path / "ds").episodes
    f = ep.frames
    assert ep.length == 150
    valid = f["telemetry_valid"] == 1
    assert valid.all() and ep.meta["valid_fraction"] == 1.0
    assert np.isfinite(f["q"]).all()
    assert (np.diff(f["timestamp"]) > 0).all()
    np.testing.assert_array_equal(f["torque_enable"], 1.0)
    lo = np.array([c.limit_lower for c in omx.channels])
    hi = np.array([c.limit_upper for c in omx.channels])
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


def test_every_slot_of_an_episode_is_a_frame_or_a_counted_drop(omx, tmp_path) -> None:
    # An episode lasts its seconds of wall time whatever the machine's load: a late cycle
    # costs frames, counted as dropped, and never stretches the episode.
    # With the progress bar on: its rate display runs inside the fixed-rate loop.
    seconds = 1.0
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        record(omx, leader.port, follower.port, "slots", seconds=seconds, out=tmp_path / "t",
               progress=True)
    [ep] = read_dataset(tmp_path / "t").episodes
    assert ep.length + ep.meta["overruns"] == round(seconds * omx.fps)
    t = ep.frames["timestamp"]
    assert t[0] >= 0.0 and (np.diff(t) > 0).all()


def test_feetech_recording_load_units_and_appending(so101, tmp_path) -> None:
    out = tmp_path / "so"
    leader, follower = _arms(so101, "feetech")
    with leader, follower:
        record(so101, leader.port, follower.port, "lift_200g", episodes=2, seconds=1.0,
               out=out, payload_g=200, split="validation", progress=False)
        record(so101, leader.port, follower.port, "lift_200g", episodes=1, seconds=0.5,
               out=out, payload_g=200, split="test", progress=False)
        assert _torque(follower) == [0] * 6
    ds = read_dataset(out)
    assert [e.split for e in ds.episodes] == ["validation", "validation", "test"]
    f = ds.frames
    assert np.abs(f["effort"]).max() <= 1.0  # signed load fraction
    assert np.isnan(f["pwm"]).all()  # STS3215 has no PWM register: not invented
    np.testing.assert_allclose(f["force"][:, 2], -0.2 * 9.81, rtol=1e-6)
    np.testing.assert_allclose(f["payload_mass"], 0.2)


def test_dead_servo_mid_recording_is_marked_and_the_episode_kept(tmp_path) -> None:
    # A dead servo costs reply timeouts until it counts as absent: keep them short here.
    omx = _patient("omx", rx_timeout_ms=300.0, reply_timeout_ms=300.0, dead_after_failures=2)
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        leader.after_reads(31, lambda: follower.set_dead(13))  # during episode frame 30
        stop = _stop_after(leader, 60)
        with pytest.raises(RecordingQualityError, match=r"only \d+% .*(no answer|incomplete)"):
            record(omx, leader.port, follower.port, "dead", seconds=LONG_S,
                   out=tmp_path / "d", progress=False, stop=stop)
    [ep] = read_dataset(tmp_path / "d").episodes  # saved although it failed the check
    valid = ep.frames["telemetry_valid"]
    assert ep.length == 60
    assert not valid[31:, 2].any()  # joint3 = servo 13, dead from frame 29 or 30 on
    # Before, it and all the time the others stream. (A 300 ms reply timeout can, rarely,
    # pass unanswered on a loaded machine; that frame is retried or marked, never invented.)
    assert valid[:29, 2].mean() > 0.9 and valid[:, [0, 1, 3, 4]].mean() > 0.95
    assert np.isnan(ep.frames["q"][valid[:, 2] == 0, 2]).all()
    assert 13 in ep.meta["absent_servos"]


@pytest.mark.parametrize("faults", [Faults(corrupt_rate=0.1, seed=3),
                                    Faults(drop_rate=0.1, seed=4)], ids=["corrupt", "drop"])
def test_corrupt_and_dropped_replies_are_retried(tmp_path, faults) -> None:
    # each dropped reply costs one timeout
    omx = _patient("omx", rx_timeout_ms=300.0, reply_timeout_ms=300.0)
    leader, follower = _arms(omx, "dynamixel", faults)
    with leader, follower:
        stop = _stop_after(leader, 40)
        record(omx, leader.port, follower.port, "faulty", seconds=LONG_S, out=tmp_path / "f",
               progress=False, stop=stop, min_valid_fraction=0.5)
        injected = follower.stats["corrupted"] + follower.stats["dropped"]
    [ep] = read_dataset(tmp_path / "f").episodes
    assert injected > 0
    counters = ep.meta["bus_counters"]
    assert counters["checksum_errors"] + counters["timeouts"] > 0 and counters["retries"] > 0
    # a failed group read is retried servo by servo: nearly every frame stays complete
    assert ep.frames["telemetry_valid"].mean() > 0.95


def test_alert_at_start_refuses_with_servo_and_register(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel", Faults(alert_ids={15}))
    with leader, follower, pytest.raises(HardwareAlert, match=r"servo 15 .*register 70.*overload"):
        record(omx, leader.port, follower.port, "alert", seconds=0.5, out=tmp_path / "a",
               progress=False)
    assert not (tmp_path / "a" / "data").exists()  # nothing half-written
    assert _torque(follower) == [0] * 5  # the servos it did switch on are off again


def test_alert_mid_recording_is_reported_in_the_episode(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        leader.after_reads(20, lambda: follower.set_alert(12))
        stop = _stop_after(leader, 50)
        record(omx, leader.port, follower.port, "alert_mid", seconds=LONG_S,
               out=tmp_path / "m", progress=False, stop=stop)
    [ep] = read_dataset(tmp_path / "m").episodes
    assert "overload" in ep.meta["hardware_errors"]["12"]
    assert ep.frames["telemetry_valid"][:, 1].all()  # an alert does not lose telemetry
    torque = ep.frames["torque_enable"][:, 1]
    assert torque[0] == 1.0 and torque[-1] == 0.0  # the firmware's shutdown is recorded


def test_ctrl_c_saves_the_current_episode_and_keeps_earlier_ones(omx, tmp_path,
                                                                 python_sigint) -> None:
    out = tmp_path / "c"
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        record(omx, leader.port, follower.port, "first", seconds=0.5, out=out, progress=False)
        leader.after_reads(21, _thread.interrupt_main)  # Ctrl-C during episode frame 20
        msg = record(omx, leader.port, follower.port, "second", episodes=3, seconds=LONG_S,
                     out=out, progress=False)
        assert _torque(follower) == [0] * 5
    assert "Ctrl-C" in msg
    ds = read_dataset(out)
    assert [e.task for e in ds.episodes] == ["first", "second"]
    assert ds.episodes[1].meta["interrupted"] is True
    assert 19 <= ds.episodes[1].length <= 20  # frame 19 is kept if it was complete


def test_a_second_ctrl_c_while_saving_waits_for_the_episode(omx, tmp_path, monkeypatch,
                                                             python_sigint) -> None:
    """The impatient user: Ctrl-C ends the episode, and a second, real SIGINT arrives while
    its files are being written. The save completes (the episode opens whole, its journal
    gone), torque goes off, and only then does the second Ctrl-C surface, as a
    KeyboardInterrupt out of ``record``."""
    import signal

    from nactuator.data import DatasetWriter

    add_episode = DatasetWriter.add_episode
    during_save: list[int] = []

    def impatient(self, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, mid-save
        during_save.append(len(list((self.root / ".nactuator" / "journal").iterdir())))
        return add_episode(self, *args, **kwargs)

    monkeypatch.setattr(DatasetWriter, "add_episode", impatient)
    out = tmp_path / "c"
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        leader.after_reads(21, _thread.interrupt_main)  # the first Ctrl-C, at frame 20
        with pytest.raises(KeyboardInterrupt):
            record(omx, leader.port, follower.port, "twice", seconds=LONG_S, out=out,
                   progress=False)
        assert _torque(follower) == [0] * 5
    assert during_save == [1]  # the signal landed while the journal still held the episode
    ds = read_dataset(out)
    [episode] = ds.episodes
    assert episode.task == "twice" and episode.meta["interrupted"] is True
    assert 19 <= episode.length <= 20
    assert not any((out / ".nactuator" / "journal").iterdir())
    monkeypatch.undo()
    with DatasetWriter(out, omx, omx.fps) as w:  # the writer was released: appendable
        w.add_episode(ds.episodes[0].frames, "again", "train")
    assert len(read_dataset(out).episodes) == 2


def test_follower_lost_mid_episode_saves_partial_raises_and_names_the_servos(
        omx, tmp_path, caplog) -> None:
    out = tmp_path / "crash"
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        record(omx, leader.port, follower.port, "ok", seconds=0.4, out=out, progress=False)
        leader.after_reads(16, follower.stop)  # the USB adapter is unplugged at frame 15
        with pytest.raises(Exception):  # noqa: B017 (whatever pyserial raises)
            record(omx, leader.port, follower.port, "crash", seconds=LONG_S, out=out,
                   progress=False)
    ds = read_dataset(out)
    assert [e.task for e in ds.episodes] == ["ok", "crash"]  # the partial episode is saved
    assert ds.episodes[1].meta["interrupted"] is True
    # Torque could not be switched off on an unplugged arm: said plainly, in one line.
    [line] = [r.getMessage() for r in caplog.records if "torque may still be ON" in r.getMessage()]
    assert "11 (joint1), 12 (joint2), 13 (joint3), 14 (joint4), 15 (gripper)" in line


def test_bad_ports_are_named(omx, tmp_path) -> None:
    from nactuator.hardware.port import PortError

    with pytest.raises(PortError, match="/dev/does-not-exist.*does not exist"):
        record(omx, "/dev/does-not-exist", "/dev/also-missing", "x", seconds=0.5,
               out=tmp_path / "p", progress=False)
    with pytest.raises(ValueError, match="different ports"):
        record(omx, "/dev/x", "/dev/x", "x", out=tmp_path / "p")
    with pytest.raises(ValueError, match="min_valid_fraction must be between 0 and 1"):
        record(omx, "/dev/x", "/dev/y", "x", out=tmp_path / "p", min_valid_fraction=1.5)


def test_late_replies_within_the_reply_timeout_are_accepted(omx, tmp_path) -> None:
    leader, follower = _arms(omx, "dynamixel", Faults(latency_ms=40.0))
    with leader, follower:
        stop = _stop_after(leader, 20)
        record(omx, leader.port, follower.port, "slow", seconds=LONG_S, out=tmp_path / "s",
               progress=False, stop=stop)
    [ep] = read_dataset(tmp_path / "s").episodes
    assert ep.length == 20 and ep.frames["telemetry_valid"].all()


def test_replies_beyond_the_timeout_fail_the_episode_naming_the_cause(tmp_path, capfd) -> None:
    # Every reply 400 ms late for a 40 ms reply timeout (a slow USB adapter): every frame
    # is invalid. The episode is kept, the error says "late" (not "check the cable") with
    # counts, and the progress bar shows no made-up temperature.
    omx = _patient("omx", rx_timeout_ms=40.0)
    leader, follower = _arms(omx, "dynamixel")
    with leader, follower:
        leader.after_reads(2, lambda: setattr(follower.faults, "latency_ms", 400.0))
        with pytest.raises(RecordingQualityError) as info:
            record(omx, leader.port, follower.port, "late", seconds=3.0, out=tmp_path / "l",
                   progress=True)
    message = str(info.value)
    assert re.search(r"\d+ repl(y|ies) arrived after the 40 ms reply timeout", message)
    assert "latency timer" in message and "--min-valid-fraction" in message
    [ep] = read_dataset(tmp_path / "l").episodes
    valid = ep.frames["telemetry_valid"]
    assert ep.meta["valid_fraction"] < 0.5 and not valid[-10:].any()
    assert np.isnan(ep.frames["q"][valid == 0]).all()  # late bytes never pass as data
    assert sorted(ep.meta["absent_servos"]) == [11, 12, 13, 14, 15]
    assert ep.meta["bus_counters"]["late_replies"] > 0
    bar = capfd.readouterr().err
    assert "T=" in bar and "T=-1C" not in bar


def test_voltage_sag_is_recorded_with_the_effort(tmp_path) -> None:
    sag = 6.0
    omx = _patient("omx")
    leader, follower = _arms(omx, "dynamixel", Faults(voltage_sag=sag))
    with leader, follower:
        stop = _stop_after(leader, 60)
        record(omx, leader.port, follower.port, "sag", seconds=LONG_S, out=tmp_path / "v",
               progress=False, stop=stop)
    [ep] = read_dataset(tmp_path / "v").episodes
    f = ep.frames
    ok = f["telemetry_valid"].all(axis=1)
    duty = np.abs(f["pwm"][ok]).max(axis=1)
    volts = f["voltage"][ok].max(axis=1)
    assert duty.max() > 0.1  # the follower worked, so the supply sagged
    # supply 12 V less sag x the largest duty (0.3 V for quantisation and sensor noise)
    assert (volts <= 12.0 - sag * duty + 0.3).all()
