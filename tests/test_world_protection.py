"""Firmware protections of the hidden world's servos (world/protection.py): register units,
trip timing, latching, and their effect inside the World."""

from __future__ import annotations

import numpy as np
import pytest

from nactuator.platforms import load_platform
from nactuator.world import World, WorldError, load_world
from nactuator.world.protection import (
    STS_OVERCURRENT_BIT,
    STS_OVERLOAD_BIT,
    XM_OVERLOAD_BIT,
    make_protection,
)

STS = {"Protection_Current": 185, "Over_Current_Protection_Time": 20, "Overload_Torque": 80,
       "Protection_Time": 200, "Protective_Torque": 20}


def test_feetech_registers_are_read_in_their_units() -> None:
    p = make_protection("feetech", 1, 2, STS)
    assert p.current_limit == pytest.approx(185 * 0.0065)  # 1.2025 A
    assert p.current_time == pytest.approx(0.2)
    assert p.overload == pytest.approx(0.8) and p.overload_time == pytest.approx(2.0)


def test_over_current_trips_after_the_protection_time_and_latches() -> None:
    p = make_protection("feetech", 1, 2, STS)
    dt = 0.001
    on = np.ones((1, 2), dtype=bool)
    current = np.array([[1.25, 1.19]])  # motor 0 above 1.2025 A, motor 1 below
    steps = 0
    while on[0, 0] and steps < 1000:
        on = p.update(current, np.zeros((1, 2)), on, dt)
        steps += 1
    assert steps == 200  # 20 x 10 ms at 1 ms steps
    assert on[0, 1] and p.errors[0, 0] == STS_OVERCURRENT_BIT and p.errors[0, 1] == 0
    # Latched: the current falls, the motor stays off until a reset.
    on = p.update(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2), bool), dt)
    assert not on[0, 0] and on[0, 1]
    assert p.peak_current[0, 0] == pytest.approx(1.25)
    p.reset()
    assert not p.tripped.any()


def test_short_current_spikes_do_not_trip() -> None:
    p = make_protection("feetech", 1, 1, STS)
    on = np.ones((1, 1), dtype=bool)
    for k in range(1000):  # 150 ms over, 50 ms under, repeated: the timer restarts
        i = 1.5 if k % 200 < 150 else 0.5
        on = p.update(np.array([[i]]), np.zeros((1, 1)), on, 0.001)
    assert on.all() and not p.tripped.any()


def test_overload_caps_the_output_to_the_protective_torque() -> None:
    p = make_protection("feetech", 1, 1, STS)
    on = np.ones((1, 1), dtype=bool)
    for _ in range(2000):
        on = p.update(np.zeros((1, 1)), np.array([[0.9]]), on, 0.001)
    assert p.errors[0, 0] == STS_OVERLOAD_BIT and on.all()  # overload limits, no torque off
    capped = p.limit_pwm(np.array([[900]]), np.array([1000]))
    assert capped[0, 0] == 200


def test_dynamixel_overload_at_the_current_limit_switches_torque_off() -> None:
    p = make_protection("dynamixel", 1, 1, {"Current_Limit": 1193, "overload_time": 0.5})
    limit = 1193 * 0.00269
    on = np.ones((1, 1), dtype=bool)
    for _ in range(499):
        on = p.update(np.array([[limit]]), np.zeros((1, 1)), on, 0.001)
    assert on.all()
    on = p.update(np.array([[limit]]), np.zeros((1, 1)), on, 0.001)
    assert not on.any() and p.errors[0, 0] == XM_OVERLOAD_BIT


def test_a_world_with_protection_trips_when_the_arm_is_torn_at() -> None:
    """A 2 kg pull at the end effector with the arm commanded up: the shoulder stalls, its
    current stays above the limit and its torque goes off; the same world without the
    protection keeps pushing."""
    p = load_platform("so101")
    params = load_world(p, None, 0)
    q0 = np.asarray(params.workspace["rest_pose"], float)
    runs = {}
    for guarded in (False, True):
        w = World(p, params, seed=0, n_envs=1)
        if guarded:
            w.set_protection(make_protection("feetech", 1, p.n, STS))
        w.reset(q0)
        goal = q0.copy()
        goal[1] -= 0.6  # shoulder_lift: a big step up
        w.set_goal(goal)
        w.set_external_force([0.0, 0.0, -20.0])
        w.step(0.5)
        runs[guarded] = w
    guarded = runs[True]
    assert guarded.protection.errors[0, 1] & STS_OVERCURRENT_BIT
    assert not guarded.servo.torque_enabled[0, 1] and abs(guarded.servo.current[0, 1]) == 0
    assert runs[False].servo.torque_enabled.all()
    assert abs(runs[False].servo.current[0, 1]) > 1.2
    with pytest.raises(WorldError, match="protection is for"):
        runs[False].set_protection(make_protection("feetech", 2, p.n, STS))
