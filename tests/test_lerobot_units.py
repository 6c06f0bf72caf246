"""Our SO-101 joint units against LeRobot's own: docs/data-format.md ("Opening a dataset with
LeRobot") tells users that degrees = rad x 180/pi for the arm joints (LeRobot's
``use_degrees=True`` SO-101) and how the gripper's 0..100 follows from the calibration
range. Both sides read the same emulated servos through their own code: our TelemetryBus
(``q``, rad) and LeRobot 0.4.4's ``FeetechMotorsBus`` with the motors and norm modes its
SO-101 follower uses, under the calibration file LeRobot's SO-101 calibration writes
(``drive_mode`` 0, a homing offset, the recorded ranges)."""

from __future__ import annotations

import json
import math

import numpy as np

from nactuator import servo_units as units
from nactuator.hardware.emulator import Emulator, ReferenceArm
from nactuator.hardware.open import open_bus
from nactuator.hardware.port import min_reply_timeout
from nactuator.hardware.recorder import with_hardware
from nactuator.platforms import load_platform

PATIENT_MS = 5000.0
Q = np.array([0.4, -0.3, 0.2, -0.1, 0.05, 0.8])  # rad, inside every joint's limits
RANGES = [(900, 3100), (1100, 2990), (1000, 3001), (700, 3400), (0, 4095), (2000, 3300)]


def test_our_radians_are_lerobot_degrees_and_the_gripper_percent_follows(tmp_path) -> None:
    from lerobot.motors import Motor, MotorCalibration, MotorNormMode
    from lerobot.motors.feetech import FeetechMotorsBus

    p = with_hardware(load_platform("so101"), rx_timeout_ms=PATIENT_MS,
                      reply_timeout_ms=PATIENT_MS)
    names = p.channel_names
    cal = {n: {"id": k + 1, "drive_mode": 0, "homing_offset": 0, "range_min": lo,
               "range_max": hi} for k, (n, (lo, hi)) in enumerate(zip(names, RANGES,
                                                                       strict=True))}
    path = tmp_path / "my_follower.json"
    path.write_text(json.dumps(cal))
    arm = ReferenceArm(p)
    # the servos hold raw positions chosen so our q (calibrated zero = mid-range) is Q
    mids = np.array([(lo + hi) / 2 for lo, hi in RANGES])
    raw = np.round(mids + Q * 4095 / (2 * math.pi))
    arm.q = np.array([units.sts3215_units().position(r) for r in raw])
    arm.goal = arm.q.copy()
    with Emulator("feetech", p, arm=arm) as emu:
        with open_bus(p, emu.port, calibration=path) as ours:
            q = ours.wait_ready().q
        motors = {n: Motor(k + 1, "sts3215", MotorNormMode.RANGE_0_100 if n == "gripper"
                           else MotorNormMode.DEGREES) for k, n in enumerate(names)}
        theirs = FeetechMotorsBus(emu.port, motors, calibration={
            n: MotorCalibration(**c) for n, c in cal.items()})
        theirs.connect(handshake=False)
        theirs.port_handler.ser.timeout = 0.002
        min_reply_timeout(theirs.port_handler, PATIENT_MS)
        try:
            read = theirs.sync_read("Present_Position")  # LeRobot's normalised units
            present = theirs.sync_read("Present_Position", normalize=False)
        finally:
            theirs.disconnect(disable_torque=False)
    assert [present[n] for n in names] == raw.astype(int).tolist()
    np.testing.assert_allclose(q, (raw - mids) * 2 * math.pi / 4095, atol=1e-9)
    degrees = np.array([read[n] for n in names[:5]])
    np.testing.assert_allclose(degrees, np.degrees(q[:5]), atol=1e-6)  # deg = rad x 180/pi
    lo, hi = RANGES[5]
    gripper_raw = (lo + hi) / 2 + q[5] * 4095 / (2 * math.pi)  # the documented formula
    np.testing.assert_allclose(read["gripper"], 100 * (gripper_raw - lo) / (hi - lo), atol=1e-6)
