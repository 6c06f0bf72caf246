"""``nactuator collect`` against the emulated SO-101 (the world's servo law and physics behind
the real Feetech SDK): open-loop replay with action noise, no human; every safety limit is
checked before a command is written, and a stop leaves torque off and the episode saved.

Deterministic on a loaded machine as in tests/test_recorder.py: the emulated arm advances one
period per telemetry read, faults are scheduled at a telemetry cycle, replies are awaited
patiently; slots lost to a late cycle are listed in the episode (``skipped_slots``), so the
tests know which base command each frame carries.
"""

from __future__ import annotations

import numpy as np
import pytest

from nactuator import servo_units
from nactuator.data import read_dataset
from nactuator.hardware.collector import SafetyLimits, SafetyStop, collect, sweep_commands
from nactuator.hardware.emulator import Emulator
from nactuator.hardware.recorder import with_hardware
from nactuator.platforms import load_platform


@pytest.fixture(scope="module")
def so101():
    # A short ramp to the first command (slowed by the velocity limit where it must be).
    return with_hardware(load_platform("so101"), record_ramp_s=0.2, record_settle_s=0.2,
                         rx_timeout_ms=5000.0, reply_timeout_ms=5000.0, read_retries=1)


def _arm(platform) -> Emulator:
    return Emulator("feetech", platform, seed=2, step_per_read=1.0 / platform.fps)


def _torque(emu: Emulator) -> list[int]:
    return [emu.tables[sid].get("Torque_Enable") for sid in emu.ids]


def _slots(ep) -> np.ndarray:
    """The base index each frame of an episode was commanded from."""
    skipped = set(ep.meta["skipped_slots"])
    return np.array([k for k in range(ep.length + len(skipped)) if k not in skipped])


def test_collects_episodes_with_action_noise_and_no_human(so101, tmp_path):
    base = sweep_commands(so101, 1.0, seed=3)
    with _arm(so101) as emu:
        msg = collect(so101, emu.port, base, episodes=2, out=tmp_path / "ds", seed=7,
                      progress=False)
        assert _torque(emu) == [0] * 6
    assert msg.startswith("collected 2 episode(s)")
    episodes = read_dataset(tmp_path / "ds").episodes
    assert len(episodes) == 2
    diffs = []
    for ep in episodes:
        assert ep.length + ep.meta["overruns"] == len(base)
        assert ep.meta["noise_sigma"] == 0.01 and ep.meta["safety_stop"] is None
        diffs.append(ep.frames["q_cmd"] - base[_slots(ep)])
        f = ep.frames
        for j in (0, 1, 3):  # the follower tracks the replayed sweep
            assert np.corrcoef(f["q_cmd"][:, j], f["q"][:, j])[0, 1] > 0.8
    d = np.concatenate(diffs)
    noised = np.abs(d) > 1e-6  # float32 storage of un-noised commands: < 2e-7 off
    per_frame = noised.sum(axis=1)
    # A noised frame has noise on every (revolute) joint; allow one draw below 1e-6.
    assert ((per_frame == 0) | (per_frame >= 5)).all()
    rows = per_frame > 0
    # Probability 0.5 and sigma 0.01 rad; bounds > 3.5 sd wide even if a loaded machine
    # costs half the frames (the frames seen are the slots not skipped).
    assert len(rows) >= 60 and 0.27 < rows.mean() < 0.73
    assert 0.007 < d[noised].std() < 0.013
    assert not np.array_equal(diffs[0][:20], diffs[1][:20])  # fresh noise per episode


def test_a_command_beyond_the_limit_margin_is_never_sent(so101, tmp_path):
    lo, hi = so101.channels[1].limit_lower, so101.channels[1].limit_upper
    edge = hi - 0.05 * (hi - lo)  # the default margin: 5 % of the range
    base = sweep_commands(so101, 1.5, seed=1, amplitude=0.1)
    base[:, 1] = np.linspace(0.0, hi, len(base))  # shoulder_lift driven into its limit
    first_bad = int(np.argmax(base[:, 1] > edge))
    with _arm(so101) as emu:
        with pytest.raises(SafetyStop, match=r"servo 2 \(shoulder_lift\) command 1\.\d+ rad is "
                                             r"outside its joint-limit margin"):
            collect(so101, emu.port, base, episodes=3, out=tmp_path / "ds", noise_sigma=0.0,
                    progress=False)
        assert _torque(emu) == [0] * 6
        goal = servo_units.sts3215_units().position(emu.tables[2].get("Goal_Position"))
    [ep] = read_dataset(tmp_path / "ds").episodes
    assert "shoulder_lift" in ep.meta["safety_stop"]
    stopped = ep.meta["stopped_at_slot"]
    assert stopped >= first_bad and base[stopped, 1] > edge
    assert ep.frames["q_cmd"][:, 1].max() <= edge  # every command sent was inside the margin
    assert goal <= edge + 0.002  # what the servo holds (one count = 0.0015 rad)


def test_a_hardware_fault_or_a_measured_limit_stops_with_torque_off(so101, tmp_path):
    base = sweep_commands(so101, 1.5, seed=2)
    with _arm(so101) as emu:
        emu.after_reads(60, lambda: emu.set_alert(3))  # after the ramp (<= 40 reads)
        with pytest.raises(SafetyStop, match=r"servo 3 \(elbow_flex\) reported a hardware "
                                             "error"):
            collect(so101, emu.port, base, out=tmp_path / "alert", progress=False)
        assert _torque(emu) == [0] * 6
    [ep] = read_dataset(tmp_path / "alert").episodes
    assert 0 < ep.length < len(base) and ep.meta["interrupted"]

    slow = SafetyLimits.from_platform(so101, max_velocity=1.0)  # the sweep reaches ~1.7
    with _arm(so101) as emu:
        with pytest.raises(SafetyStop, match=r"velocity -?\d\.\d+ rad/s exceeds 1\b"):
            collect(so101, emu.port, base, out=tmp_path / "fast", limits=slow, progress=False)
        assert _torque(emu) == [0] * 6
    [ep] = read_dataset(tmp_path / "fast").episodes
    qd = ep.frames["qd"][ep.frames["telemetry_valid"] == 1]
    assert ep.length > 0 and np.abs(qd).max() <= 1.0  # no frame past the limit was driven


def test_a_servo_gone_silent_stops_collection(so101, tmp_path):
    # Short reply timeouts (as tests/test_recorder.py's dead servo): its reads fail in 0.3 s
    # instead of 5 s each, and after 2 it counts as absent (then it is not asked at all).
    quick = with_hardware(so101, rx_timeout_ms=300.0, reply_timeout_ms=300.0,
                          dead_after_failures=2)
    with _arm(quick) as emu:
        emu.after_reads(60, lambda: emu.set_dead(4))  # after the ramp (<= 40 reads)
        with pytest.raises(SafetyStop, match=r"servo 4 \(wrist_flex\) was not read for 5 "
                                             "cycles"):
            # 4 s of base: its failed reads cost wall time, so slots, before it is absent.
            collect(quick, emu.port, sweep_commands(quick, 4.0), out=tmp_path / "ds",
                    progress=False)
        assert [_torque(emu)[k] for k in (0, 1, 2, 4, 5)] == [0] * 5  # the rest: off
    [ep] = read_dataset(tmp_path / "ds").episodes
    blind = ep.frames["telemetry_valid"][:, 3] == 0
    assert blind[-4:].all() and np.isnan(ep.frames["q"][blind, 3]).all()
