"""The XM430 Bus Watchdog (register 98): a host that dies without a word leaves the OMX
arm stopped, not driven (issue 18, item 6).

Three layers, all through real Protocol 2.0 bytes on a pty:

- the emulated firmware, with the bare dynamixel_sdk, on a clock the test moves: the
  silence that trips the watchdog is a schedule, not a wall-clock wait;
- the TelemetryBus: armed at the first goal write (clearing what a killed session left),
  re-armed after a silence, cleared on close; configuration checks;
- the real ``record`` and ``live`` in subprocesses are in tests/test_hardware_ctrl_c.py:
  SIGKILLed, the arm is left stopped (0xFF, goals refused); every other exit clears it.

Polls have generous deadlines; assertions are on the emulator's registers and counters,
never on how long anything took.
"""

from __future__ import annotations

import logging
import time

import dynamixel_sdk as dxl
import numpy as np
import pytest

from nactuator.hardware.control_table import XM430_W350
from nactuator.hardware.emulator import Emulator, ReferenceArm
from nactuator.hardware.open import open_bus
from nactuator.hardware.port import BusError, min_reply_timeout
from nactuator.hardware.protocol import dxl2
from nactuator.hardware.recorder import with_hardware
from nactuator.platforms import load_platform

PATIENT_MS = 5000.0
REG = XM430_W350.registers
WATCHDOG, TORQUE = REG["Bus_Watchdog"].address, REG["Torque_Enable"].address
GOAL, PRESENT = REG["Goal_Position"].address, REG["Present_Position"].address


class Clock:
    """The emulator's watchdog clock, moved by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _until(predicate, what: str, timeout: float = 60.0) -> None:
    t_end = time.monotonic() + timeout  # generous: only a loaded machine comes near it
    while not predicate():
        if time.monotonic() > t_end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _checked(emu: Emulator) -> None:
    """Return once the emulator has looked at its watchdogs twice more: one whole look
    began after whatever the test just changed."""
    seen = emu.stats["watchdog_checks"]
    _until(lambda: emu.stats["watchdog_checks"] >= seen + 2, "the emulator's watchdog check")


def _patient(name: str, **changes):
    return with_hardware(load_platform(name), rx_timeout_ms=PATIENT_MS,
                         reply_timeout_ms=PATIENT_MS, **changes)


def _sdk(path: str):
    port, ph = dxl.PortHandler(path), dxl.PacketHandler(2.0)
    assert port.openPort() and port.setBaudRate(1_000_000)
    port.ser.timeout = 0.002  # wait in select(), not in a busy loop
    min_reply_timeout(port, PATIENT_MS)
    return port, ph


def _watchdogs(emu: Emulator) -> list[int]:
    return [t.get("Bus_Watchdog") for t in emu.tables.values()]


# --- the emulated firmware, on a schedule -----------------------------------------------
def test_firmware_stops_after_the_period_refuses_goals_and_reads_minus_one() -> None:
    clock = Clock()
    with Emulator("dynamixel", "omx", arm="reference", clock=clock) as emu:
        port, ph = _sdk(emu.port)
        try:
            sid, other = emu.ids[0], emu.ids[1]
            assert ph.write1ByteTxRx(port, sid, TORQUE, 1) == (dxl.COMM_SUCCESS, 0)
            assert ph.write1ByteTxRx(port, sid, WATCHDOG, 5) == (dxl.COMM_SUCCESS, 0)  # 100 ms
            table = emu.tables[sid]
            clock.t = 0.099  # just inside the period: nothing happens
            _checked(emu)
            assert table.get("Bus_Watchdog") == 5 and emu.stats["watchdog_expiries"] == 0
            ph.ping(port, other)  # a packet to another servo does not count for this one
            clock.t = 0.101
            _checked(emu)
            assert table.get("Bus_Watchdog") == -1 and emu.stats["watchdog_expiries"] == 1
            assert table.get("Torque_Enable") == 1  # it stops; torque stays on
            stopped = table.get("Present_Position")
            assert table.get("Goal_Position") == stopped  # position mode: goal := present

            value, comm, err = ph.read1ByteTxRx(port, sid, WATCHDOG)
            assert (value, comm, err) == (0xFF, dxl.COMM_SUCCESS, 0)
            comm, err = ph.write4ByteTxRx(port, sid, GOAL, stopped + 300)
            assert comm == dxl.COMM_SUCCESS and err & 0x7F == dxl2.ERR_DATA_RANGE
            assert table.get("Goal_Position") == stopped
            comm, err = ph.write1ByteTxRx(port, sid, WATCHDOG, 5)  # only 0 clears it
            assert err & 0x7F == dxl2.ERR_DATA_RANGE and table.get("Bus_Watchdog") == -1
            assert ph.write1ByteTxRx(port, sid, WATCHDOG, 0) == (dxl.COMM_SUCCESS, 0)
            assert ph.write4ByteTxRx(port, sid, GOAL, stopped + 300) == (dxl.COMM_SUCCESS, 0)
            assert table.get("Goal_Position") == stopped + 300
            comm, err = ph.write1ByteTxRx(port, sid, WATCHDOG, 128)  # beyond 1..127
            assert err & 0x7F == dxl2.ERR_DATA_RANGE and table.get("Bus_Watchdog") == 0
        finally:
            port.closePort()


def test_firmware_timer_is_reset_by_its_own_and_broadcast_packets_and_idle_without_torque(
        ) -> None:
    clock = Clock()
    with Emulator("dynamixel", "omx", arm="reference", clock=clock) as emu:
        port, ph = _sdk(emu.port)
        try:
            sid = emu.ids[2]
            table = emu.tables[sid]
            assert ph.write1ByteTxRx(port, sid, WATCHDOG, 5) == (dxl.COMM_SUCCESS, 0)
            clock.t = 10.0  # torque off: the watchdog does not watch
            _checked(emu)
            assert table.get("Bus_Watchdog") == 5
            assert ph.write1ByteTxRx(port, sid, TORQUE, 1) == (dxl.COMM_SUCCESS, 0)  # at 10.0
            clock.t = 10.08
            ph.read1ByteTxRx(port, sid, TORQUE)  # its own packet: deadline 10.18
            clock.t = 10.16
            ph.broadcastPing(port)  # broadcast: deadline 10.26
            clock.t = 10.25
            _checked(emu)
            assert table.get("Bus_Watchdog") == 5
            clock.t = 10.27
            _checked(emu)
            assert table.get("Bus_Watchdog") == -1
            assert emu.stats["watchdog_expiries"] == 1  # the others were never armed
        finally:
            port.closePort()


# --- the bus ------------------------------------------------------------------------------
def test_bus_arms_at_the_first_goal_rearms_after_a_silence_and_clears_on_close(caplog) -> None:
    p = _patient("omx")
    clock = Clock()
    q = np.array([0.3, -0.2, 0.1, 0.2, 0.005])
    arm = ReferenceArm(p)
    arm.q, arm.goal = q.copy(), q.copy()
    with Emulator("dynamixel", p, arm=arm, step_per_read=0.02, clock=clock) as emu:
        for t in emu.tables.values():  # what a SIGKILLed session leaves behind
            t.set("Torque_Enable", 1)
            t.set("Bus_Watchdog", -1)
        with open_bus(p, emu.port) as bus, caplog.at_level(logging.WARNING):
            units = round(p.hardware["bus_watchdog_ms"] / 20)
            bus.wait_ready()
            assert _watchdogs(emu) == [-1] * p.n  # reading telemetry arms nothing
            bus.write_goal(q)
            assert _watchdogs(emu) == [units] * p.n
            assert "had expired (a previous session ended without clearing it" in caplog.text
            np.testing.assert_allclose(bus.read_goal(), q, atol=2e-3)  # goals accepted again

            clock.t += 10.0  # the servos hear nothing for 10 s of their time: they stop
            _checked(emu)
            assert _watchdogs(emu) == [-1] * p.n
            time.sleep(1.2 * bus.watchdog_s)  # and the bus sent nothing for longer
            target = q + np.where([c.kind == "prismatic" for c in p.channels], 0.005, 0.05)
            bus.write_goal(target)
            assert "longer than their bus watchdog" in caplog.text
            np.testing.assert_allclose(bus.read_goal(), target, atol=2e-3)
            assert _watchdogs(emu) == [units] * p.n
        assert _watchdogs(emu) == [0] * p.n  # cleared, then torque off
        assert [t.get("Torque_Enable") for t in emu.tables.values()] == [0] * p.n


def test_a_passive_bus_never_arms_it() -> None:
    p = _patient("omx")
    with Emulator("dynamixel", p, arm="leader") as emu:
        with open_bus(p, emu.port, torque=False) as bus:
            bus.wait_ready()
            bus.read_goal()
        assert _watchdogs(emu) == [0] * p.n  # a leader is read, never driven


def test_old_firmware_and_bad_periods_are_named() -> None:
    p = _patient("omx")
    with Emulator("dynamixel", p, arm="reference") as emu:
        emu.tables[emu.ids[3]].set("Firmware_Version", 37)
        with open_bus(p, emu.port) as bus:
            with pytest.raises(BusError, match=r"firmware v38 or newer.*14 \(joint4\): v37"):
                bus.write_goal(bus.wait_ready().q)
    for bad in (30, 0.01, 3000, -20):
        rule = r"omx.yaml: hardware.bus_watchdog_ms must be 0 \(off\) or a multiple of 20 from 20"
        with pytest.raises(BusError, match=rf"{rule} to 2540 .*, got {bad:g}$"):
            open_bus(with_hardware(p, bus_watchdog_ms=bad), "/dev/null")
    so101 = with_hardware(load_platform("so101"), bus_watchdog_ms=200)
    with pytest.raises(BusError, match=r"so101.yaml: hardware.bus_watchdog_ms is 200, but the "
                                       r"sts3215 has no bus watchdog"):
        open_bus(so101, "/dev/null")
