"""The TelemetryBus over real SDK bytes: SI units end to end, clear errors for bad ports
and servos, retries, absent servos, alerts, bus timing and voltage sag."""

from __future__ import annotations

import time

import numpy as np
import pytest

from nactuator.hardware.bus import (
    BusError,
    HardwareAlert,
    PortError,
    ServoMissingError,
    WrongModelError,
    open_bus,
)
from nactuator.hardware.emulator import Emulator, Faults, ReferenceArm
from nactuator.platforms import load_platform


def _hold(arm: ReferenceArm, q: np.ndarray) -> ReferenceArm:
    arm.q = q.copy()
    arm.goal = q.copy()
    return arm


@pytest.mark.parametrize("bus,platform", [("dynamixel", "omx"), ("feetech", "so101")])
def test_frames_are_si_and_goals_round_trip(bus, platform) -> None:
    p = load_platform(platform)
    q = np.array([0.4, -0.3, 0.2, -0.1, 0.012, 0.8])[: p.n]
    with Emulator(bus, p, arm=_hold(ReferenceArm(p), q)) as emu, open_bus(p, emu.port) as b:
        f = b.wait_ready()
        assert f.valid.all()
        step = 2 * np.pi / 4095 if bus == "feetech" else 2 * np.pi / 4096
        tol = np.where([c.kind == "prismatic" for c in p.channels], 2e-5, step)
        np.testing.assert_array_less(np.abs(f.q - q), tol)
        np.testing.assert_allclose(f.voltage, 12.0)
        np.testing.assert_allclose(f.temperature, 30.0)
        if bus == "feetech":
            assert np.isnan(f.pwm).all()  # no PWM register on the STS3215
        b.set_torque(True)
        assert b.torque.tolist() == [1.0] * p.n
        target = q + np.where([c.kind == "prismatic" for c in p.channels], 0.003, 0.2)
        b.write_goal(target)
        time.sleep(0.05)
        np.testing.assert_array_less(np.abs(b.read_goal() - target), tol)
        time.sleep(0.5)
        f = b.read()
        np.testing.assert_array_less(np.abs(f.q - target), 3 * tol + 0.01)


def test_missing_port_and_busy_port_are_named() -> None:
    p = load_platform("omx")
    with pytest.raises(PortError, match=r"'/dev/ttyUSB-nope' does not exist"):
        open_bus(p, "/dev/ttyUSB-nope").connect()
    with Emulator("dynamixel", p, arm="reference") as emu, open_bus(p, emu.port):
        with pytest.raises(PortError, match="is busy"):
            open_bus(p, emu.port).connect()


def test_missing_servo_and_wrong_model_are_named() -> None:
    p = load_platform("omx")
    with Emulator("dynamixel", p, arm="reference", faults=Faults(dead_ids={14})) as emu:
        with pytest.raises(ServoMissingError, match=r"servo id\(s\) 14 \(joint4\)"):
            open_bus(p, emu.port).connect()
    with Emulator("dynamixel", p, arm="reference") as emu:
        emu.tables[12].set("Model_Number", 1060)  # an XL430 where an XM430 belongs
        with pytest.raises(WrongModelError, match=r"12 \(joint2\): model number 1060, expected"):
            open_bus(p, emu.port).connect()
    sp = load_platform("so101")
    with Emulator("feetech", sp, arm="reference", faults=Faults(dead_ids={2, 5})) as emu:
        with pytest.raises(ServoMissingError, match=r"2 \(shoulder_lift\), 5 \(wrist_roll\)"):
            open_bus(sp, emu.port).connect()


def test_corrupt_replies_are_counted_and_retried() -> None:
    p = load_platform("so101")
    faults = Faults(corrupt_rate=0.2, seed=7)
    with Emulator("feetech", p, arm="reference", faults=faults) as emu, \
            open_bus(p, emu.port) as b:
        frames = [b.read() for _ in range(40)]
    assert b.counters["checksum_errors"] > 0 and b.counters["retries"] > 0
    valid = np.array([f.valid for f in frames])
    assert valid.mean() > 0.9  # one reply in five is corrupt; the retries recover most
    q = np.array([f.q for f in frames])
    assert np.isnan(q[~valid]).all()  # an unread motor is NaN, never the previous value


def test_absent_servo_is_skipped_then_reprobed() -> None:
    p = load_platform("omx")
    with Emulator("dynamixel", p, arm="reference") as emu, open_bus(p, emu.port) as b:
        b.wait_ready()
        emu.set_dead(11)
        for _ in range(b.dead_after):
            b.read()
        assert b.absent_ids == [11]
        timeouts = b.counters["timeouts"]
        f = b.read()
        assert b.counters["timeouts"] == timeouts  # the absent servo is not waited for
        assert not f.valid[0] and f.valid[1:].all()
        emu.set_dead(11, False)
        time.sleep(b.reprobe_s)
        assert b.read().valid.all() and b.absent_ids == []


def test_hardware_alert_is_explained_and_torque_state_follows() -> None:
    p = load_platform("omx")
    with Emulator("dynamixel", p, arm="reference") as emu, open_bus(p, emu.port) as b:
        b.set_torque(True)
        emu.set_alert(13)
        f = b.read()
        assert "register 70" in f.errors[13] and "overload" in f.errors[13]
        assert f.torque[2] == 0.0 and f.torque[[0, 1, 3, 4]].tolist() == [1.0] * 4
        with pytest.raises(HardwareAlert, match=r"servo 13 \(joint3\).*overload"):
            b.set_torque(True)
    sp = load_platform("so101")
    with Emulator("feetech", sp, arm="reference", faults=Faults(alert_ids={4})) as emu, \
            open_bus(sp, emu.port) as b:
        f = b.wait_ready()
        assert "overload" in f.errors[4]
        with pytest.raises(HardwareAlert, match=r"servo 4 \(wrist_flex\).*overload"):
            b.set_torque(True)


def test_voltage_sag_lowers_voltage_and_raises_an_input_voltage_error() -> None:
    p = load_platform("omx")
    arm = ReferenceArm(p)
    with Emulator("dynamixel", p, arm=arm, faults=Faults(voltage_sag=3.0)) as emu, \
            open_bus(p, emu.port) as b:
        b.set_torque(True)
        b.write_goal(np.array([1.0, 0.0, 0.0, 0.0, 0.0]))  # big error: full effort on joint1
        time.sleep(0.02)
        f = b.read()
        assert f.voltage.max() < 9.5
        assert any("input voltage" in e for e in f.errors.values())


def test_bus_timing_adds_wire_time() -> None:
    p = load_platform("so101")
    with Emulator("feetech", p, arm="reference", bus_timing=True) as emu, \
            open_bus(p, emu.port) as b:
        b.wait_ready()
        t = np.median([b.read().read_s for _ in range(20)])
    # SYNC_READ of 15 bytes from 6 servos: (8 + 6) + 6 * 21 bytes = 140 bytes = 1.4 ms at 1 Mbps
    assert t > 1.3e-3


def test_open_bus_rejects_an_unknown_bus() -> None:
    import dataclasses

    p = dataclasses.replace(load_platform("omx"), hardware={"bus": "can", "ids": [1]})
    with pytest.raises(BusError, match="hardware.bus must be 'dynamixel' or 'feetech'"):
        open_bus(p, "/dev/null")


def test_lerobot_calibration_file_sets_zero_and_direction(tmp_path) -> None:
    import json

    from nactuator.hardware import units

    p = load_platform("so101")
    cal = {n: {"id": k + 1, "drive_mode": int(n == "wrist_flex"), "homing_offset": 0,
               "range_min": 1000, "range_max": 3000} for k, n in enumerate(p.channel_names)}
    path = tmp_path / "follower.json"
    path.write_text(json.dumps(cal))
    q = np.array([0.4, -0.3, 0.2, -0.1, 0.05, 0.8])
    with Emulator("feetech", p, arm=_hold(ReferenceArm(p), q)) as emu, \
            open_bus(p, emu.port, calibration=path) as b:
        f = b.wait_ready()
    raw = np.array([units.sts3215_units().raw_position(x) for x in q])
    expected = (raw - 2000) * 2 * np.pi / 4095 * np.where(np.arange(6) == 3, -1, 1)
    np.testing.assert_allclose(f.q, expected, atol=1e-9)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"shoulder_pan": {"id": 1}}))
    with pytest.raises(BusError, match="motor 'shoulder_pan' needs the fields"):
        open_bus(p, "/dev/null", calibration=bad)
