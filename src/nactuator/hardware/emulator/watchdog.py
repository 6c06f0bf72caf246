"""The XM430's Bus Watchdog (register 98): one timer per servo, on an explicit clock.

What the e-manual says ("Bus Watchdog(98)", firmware >= 38), and what is modelled:

- 1..127 arms it, in units of 20 ms; 0 disarms it and clears a Bus Watchdog Error.
- It watches only while Torque_Enable is 1. Every instruction packet the servo receives
  resets its timer; here, a packet with the servo's own ID or the broadcast ID (a SYNC /
  BULK instruction is broadcast) and a good CRC.
- When the silence outlasts the period the servo stops ("Profile Acceleration and Profile
  Velocity are applied as 0": at once, not along a profile), the register reads -1, and the
  goal registers (Goal PWM / Current / Velocity / Position) become read-only: a write to
  them is answered with a Data Range Error. Torque stays on.
- Writing 0 clears the error. The manual names no other way out, so the emulator refuses
  any other value while the error stands (Data Range Error), and values outside -1..127
  always; a client that writes 0 and then the period works with either reading.

"Stops", per Operating Mode: in the position modes (3, 4, 5) Goal Position becomes the
present position (the firmware rewrites it so: ROBOTIS-GIT/DynamixelSDK#584, a firmware
whose rewrite ignored Homing Offset); in velocity mode (1) Goal Velocity becomes 0; in
current (0) and PWM (16) modes the goal becomes 0 (no output), as rt-net/crane_x7_ros#11
reports ("free" in current control, braking in position/velocity control).

Packets reset the timers before expiry is checked: a starved emulator thread that reads a
burst of late-delivered packets treats the host as having spoken, never as silent, so a
loaded machine cannot fake a silence the host did not have.
"""

from __future__ import annotations

from nactuator.hardware.control_table import (
    XM430_BUS_WATCHDOG_EXPIRED,
    XM430_BUS_WATCHDOG_UNIT_S,
    ControlTable,
)
from nactuator.hardware.protocol import dxl2

# Operating Mode (11) -> the goal register that stops the servo, and how.
POSITION_MODES = (3, 4, 5)
STOP_AT_ZERO = {1: "Goal_Velocity", 0: "Goal_Current", 16: "Goal_PWM"}


class BusWatchdogs:
    """The Bus Watchdog of each servo in ``tables`` (id -> ControlTable). ``heard`` and
    ``expire`` take the time explicitly, so a test decides what the silence lasts."""

    def __init__(self, tables: dict[int, ControlTable]) -> None:
        self.tables = tables
        self.last_heard: dict[int, float] = {}

    def heard(self, packet: dxl2.Packet, now: float) -> None:
        """A packet arrived at ``now``: reset the timers of the servos it addresses."""
        if not packet.crc_ok:
            return  # the servo discards it unread
        if packet.id == dxl2.BROADCAST_ID:
            for sid in self.tables:
                self.last_heard[sid] = now
        elif packet.id in self.tables:
            self.last_heard[packet.id] = now

    def _deadline(self, sid: int) -> float | None:
        t = self.tables[sid]
        period = t.get("Bus_Watchdog")
        if period <= 0 or t.get("Torque_Enable") == 0 or sid not in self.last_heard:
            return None
        return self.last_heard[sid] + period * XM430_BUS_WATCHDOG_UNIT_S

    def watching(self) -> bool:
        """True while some servo's watchdog runs (armed, torque on)."""
        return any(self._deadline(sid) is not None for sid in self.tables)

    def due(self, now: float) -> list[int]:
        """The servos whose silence has outlasted their period at ``now``."""
        return [sid for sid in self.tables
                if (d := self._deadline(sid)) is not None and now > d]

    def expire(self, now: float) -> list[int]:
        """Stop every servo that is due (see the module docstring); returns their IDs. The
        caller refreshes Present_Position first, so the stop is where the arm is now."""
        stopped = self.due(now)
        for sid in stopped:
            t = self.tables[sid]
            mode = t.get("Operating_Mode")
            if mode in POSITION_MODES:
                t.set("Goal_Position", t.get("Present_Position"))
            elif mode in STOP_AT_ZERO:
                t.set(STOP_AT_ZERO[mode], 0)
            t.set("Bus_Watchdog", XM430_BUS_WATCHDOG_EXPIRED)
        return stopped
