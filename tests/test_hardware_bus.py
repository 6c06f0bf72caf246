"""The TelemetryBus over real SDK bytes: SI units end to end, clear errors for bad ports
and servos, retries, absent servos, alerts, bus timing and voltage sag.

Load-proof: the buses wait patiently for replies (an emulator in this process can take a
few hundred ms to answer on a busy machine), and where the arm has to move, it advances a
fixed step per telemetry read (``step_per_read``) instead of in wall-clock time.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from nactuator.hardware.emulator import Emulator, Faults, ReferenceArm
from nactuator.hardware.open import open_bus
from nactuator.hardware.port import (
    BusError,
    HardwareAlert,
    PortError,
    ServoMissingError,
    WrongModelError,
)
from nactuator.hardware.recorder import with_hardware
from nactuator.platforms import load_platform

PATIENT_MS = 5000.0  # a thread of this process can go unscheduled for a second when loaded


def patient(name: str, **changes):
    """The platform with reply timeouts no loaded machine exceeds (unless a test says):
    ``rx_timeout_ms`` for telemetry reads, ``reply_timeout_ms`` for everything else."""
    settings = {"rx_timeout_ms": PATIENT_MS, "reply_timeout_ms": PATIENT_MS}
    return with_hardware(load_platform(name), **{**settings, **changes})


def _hold(arm: ReferenceArm, q: np.ndarray) -> ReferenceArm:
    arm.q = q.copy()
    arm.goal = q.copy()
    return arm


@pytest.mark.parametrize("bus,platform", [("dynamixel", "omx"), ("feetech", "so101")])
def test_frames_are_si_and_goals_round_trip(bus, platform) -> None:
    p = patient(platform)
    q = np.array([0.4, -0.3, 0.2, -0.1, 0.012, 0.8])[: p.n]
    with Emulator(bus, p, arm=_hold(ReferenceArm(p), q), step_per_read=0.02) as emu, \
            open_bus(p, emu.port) as b:
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
        b.write_goal(target)  # no reply; the next request is served after it
        np.testing.assert_array_less(np.abs(b.read_goal() - target), tol)
        for _ in range(25):  # 0.5 s of arm time, whatever the wall clock says
            f = b.read()
        np.testing.assert_array_less(np.abs(f.q - target), 3 * tol + 0.01)
    assert emu.tables[emu.ids[0]].get("Torque_Enable") == 0  # closing switched it off


def test_missing_port_and_busy_port_are_named() -> None:
    p = patient("omx")
    with pytest.raises(PortError, match=r"'/dev/ttyUSB-nope' does not exist"):
        open_bus(p, "/dev/ttyUSB-nope").connect()
    with Emulator("dynamixel", p, arm="reference") as emu, open_bus(p, emu.port):
        with pytest.raises(PortError, match="is busy"):
            open_bus(p, emu.port).connect()


def test_missing_servo_and_wrong_model_are_named() -> None:
    p = patient("omx", reply_timeout_ms=300.0)  # each missing servo costs 3 ping timeouts
    with Emulator("dynamixel", p, arm="reference", faults=Faults(dead_ids={14})) as emu:
        with pytest.raises(ServoMissingError, match=r"servo id\(s\) 14 \(joint4\)"):
            open_bus(p, emu.port).connect()
    with Emulator("dynamixel", p, arm="reference") as emu:
        emu.tables[12].set("Model_Number", 1060)  # an XL430 where an XM430 belongs
        with pytest.raises(WrongModelError, match=r"12 \(joint2\): model number 1060, expected"):
            open_bus(p, emu.port).connect()
    sp = patient("so101", reply_timeout_ms=300.0)
    with Emulator("feetech", sp, arm="reference", faults=Faults(dead_ids={2, 5})) as emu:
        with pytest.raises(ServoMissingError, match=r"2 \(shoulder_lift\), 5 \(wrist_roll\)"):
            open_bus(sp, emu.port).connect()


def test_corrupt_replies_are_counted_and_retried() -> None:
    p = patient("so101", read_retries=1)  # one retry round (the second has a time budget)
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
    p = patient("omx", rx_timeout_ms=300.0)  # each read of the dead servo costs a timeout
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
    p = patient("omx")
    with Emulator("dynamixel", p, arm="reference") as emu, open_bus(p, emu.port) as b:
        b.set_torque(True)
        emu.set_alert(13)
        f = b.read()
        assert "register 70" in f.errors[13] and "overload" in f.errors[13]
        assert f.torque[2] == 0.0 and f.torque[[0, 1, 3, 4]].tolist() == [1.0] * 4
        with pytest.raises(HardwareAlert, match=r"servo 13 \(joint3\).*overload"):
            b.set_torque(True)
    sp = patient("so101")
    with Emulator("feetech", sp, arm="reference", faults=Faults(alert_ids={4})) as emu, \
            open_bus(sp, emu.port) as b:
        f = b.wait_ready()
        assert "overload" in f.errors[4]
        with pytest.raises(HardwareAlert, match=r"servo 4 \(wrist_flex\).*overload"):
            b.set_torque(True)


def test_voltage_sag_lowers_voltage_and_raises_an_input_voltage_error() -> None:
    p = patient("omx")
    arm = ReferenceArm(p)
    with Emulator("dynamixel", p, arm=arm, faults=Faults(voltage_sag=3.0),
                  step_per_read=0.02) as emu, open_bus(p, emu.port) as b:
        b.set_torque(True)
        b.write_goal(np.array([1.0, 0.0, 0.0, 0.0, 0.0]))  # big error: full effort on joint1
        b.read()  # the arm steps after this read ...
        f = b.read()  # ... and this one reports the sag
        assert f.voltage.max() < 9.5
        assert any("input voltage" in e for e in f.errors.values())


def test_bus_timing_adds_wire_time() -> None:
    p = patient("so101")
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

    from nactuator import servo_units as units

    p = patient("so101")
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


@pytest.mark.parametrize("bus,platform", [("dynamixel", "omx"), ("feetech", "so101")])
def test_close_switches_torque_off_from_a_port_an_interrupt_left_busy(bus, platform,
                                                                     caplog) -> None:
    # Ctrl-C between an SDK request and its reply leaves the SDK's port flagged in use
    # (every later request would be refused with COMM_PORT_BUSY) and the reply pending.
    p = patient(platform, reply_timeout_ms=200.0)  # a dropped reply costs one timeout
    faults = Faults(seed=5)
    with Emulator(bus, p, arm="reference", faults=faults) as emu:
        b = open_bus(p, emu.port).connect()
        b.set_torque(True)
        assert b.torque.tolist() == [1.0] * p.n
        faults.corrupt_rate = faults.drop_rate = 0.1
        b.sdk_packet_handler.readTx(b.sdk_port, emu.ids[0], 56, 15)  # ... and no readRx
        assert b.sdk_port.is_using
        b.close()
        assert [emu.tables[sid].get("Torque_Enable") for sid in emu.ids] == [0] * p.n
    assert "torque may still be ON" not in caplog.text


def test_a_servo_that_cannot_be_switched_off_is_named_in_one_line(caplog) -> None:
    p = patient("omx", reply_timeout_ms=100.0)  # the dead servo costs 6 timeouts
    with Emulator("dynamixel", p, arm="reference") as emu:
        with open_bus(p, emu.port) as b:
            b.set_torque(True)
            emu.set_dead(13)  # its cable comes loose while torque is on
        torque = [emu.tables[sid].get("Torque_Enable") for sid in emu.ids]
    assert torque == [0, 0, 1, 0, 0]  # the others are off; servo 13 never heard us
    [record] = [r for r in caplog.records if "torque may still be ON" in r.getMessage()]
    assert record.levelname == "ERROR"
    assert "servo(s) 13 (joint3) did not confirm Torque_Enable = 0" in record.getMessage()
