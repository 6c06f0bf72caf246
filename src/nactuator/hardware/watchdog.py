"""The bus watchdog of a telemetry bus (XM430 Bus Watchdog, register 98): armed at the first
goal write, kept fed before each goal, re-armed after a silence, cleared at close.

A host that dies without a word (SIGKILL, a crash, a pulled cable) then leaves the arm
stopped rather than driven (docs/hardware.md, "A killed host").
"""

from __future__ import annotations

import logging
import time

from nactuator.hardware.control_table import (
    XM430_BUS_WATCHDOG_EXPIRED,
    XM430_BUS_WATCHDOG_MAX,
    XM430_BUS_WATCHDOG_UNIT_S,
)
from nactuator.hardware.port import COMM_SUCCESS, BusError
from nactuator.hardware.torque import TorqueSafety
from nactuator.platforms import Platform

log = logging.getLogger(__name__)


class BusWatchdog(TorqueSafety):
    """Arming, feeding and clearing the servos' bus watchdog. It builds on
    :class:`~nactuator.hardware.torque.TorqueSafety` for the patient reply wait both use
    when the port may have been left in a bad state (``TORQUE_OFF_REPLY_MS``)."""

    platform: Platform
    watchdog_s: float  # 0.0: no bus watchdog
    _watchdog_armed: bool
    _absent: dict[int, float]
    _last_request: float

    WATCHDOG_TRIES = 10  # writes per servo when arming (a lost reply is no refusal)
    WATCHDOG_CLEAR_TRIES = 3  # when clearing at close

    def _watchdog_period(self, platform: Platform) -> float:
        """``hardware.bus_watchdog_ms`` in seconds (0: off), checked against the register."""
        ms = float(platform.hardware.get("bus_watchdog_ms", 0) or 0)
        if ms == 0:
            return 0.0
        if "Bus_Watchdog" not in self.spec.registers:
            raise BusError(f"{platform.source}: hardware.bus_watchdog_ms is {ms:g}, but the "
                           f"{self.spec.model} has no bus watchdog; remove the key "
                           "(docs/hardware.md, 'A killed host')")
        units = ms / (1000 * XM430_BUS_WATCHDOG_UNIT_S)
        if units != round(units) or not 1 <= units <= XM430_BUS_WATCHDOG_MAX:
            step = round(1000 * XM430_BUS_WATCHDOG_UNIT_S)
            raise BusError(f"{platform.source}: hardware.bus_watchdog_ms must be 0 (off) or a "
                           f"multiple of {step} from {step} to {step * XM430_BUS_WATCHDOG_MAX} "
                           f"(the register counts {step} ms), got {ms:g}")
        return ms / 1000.0

    @property
    def _watchdog_units(self) -> int:
        return round(self.watchdog_s / XM430_BUS_WATCHDOG_UNIT_S)

    def _check_watchdog_support(self) -> None:
        """Raise :class:`BusError` if a servo cannot have a bus watchdog (subclasses)."""
        return None

    def _set_watchdog(self, sid: int, units: int, tries: int) -> bool | None:
        """Make the servo's Bus_Watchdog read back ``units``: up to ``tries`` rounds of a
        read and, if it differs, a write (an expired one, -1, is cleared with 0 first:
        nothing else clears it). None if it never read back ``units``; else whether it had
        expired."""
        expired = False
        for attempt in range(tries + 1):
            self._drain()
            value, comm, _ = self._read_register(sid, "Bus_Watchdog")
            if comm == COMM_SUCCESS and value == units:
                return expired
            if attempt == tries:
                break
            if comm == COMM_SUCCESS and value == XM430_BUS_WATCHDOG_EXPIRED:
                expired = True
                if units:
                    self._drain()
                    self._write_register(sid, "Bus_Watchdog", 0)
            self._drain()
            self._write_register(sid, "Bus_Watchdog", units)  # its reply may be lost: read
        return None

    def _arm_watchdog(self) -> None:
        """Arm the bus watchdog of every servo not known to be absent (the first goal
        write): read each (to tell an expired one: a previous session was killed), one
        broadcast of 0 if any had expired, one of the period, then read each back. A servo
        that never reads back the period is a :class:`BusError`: the arm must not be driven
        without the protection the configuration asked for."""
        self._check_watchdog_support()
        self._watchdog_armed = True  # from here on, closing clears it (even if interrupted)
        units = self._watchdog_units
        present = [sid for sid in self.ids if sid not in self._absent]
        expired = []
        for sid in present:
            self._drain()
            value, comm, _ = self._read_register(sid, "Bus_Watchdog")
            if comm == COMM_SUCCESS and value == XM430_BUS_WATCHDOG_EXPIRED:
                expired.append(sid)
        self._drain()
        if expired:
            self._write_register(self.BROADCAST_ID, "Bus_Watchdog", 0, acknowledged=False)
        self._write_register(self.BROADCAST_ID, "Bus_Watchdog", units, acknowledged=False)
        failed = []
        for sid in present:
            state = self._set_watchdog(sid, units, self.WATCHDOG_TRIES)
            if state is None:
                failed.append(sid)
            elif state and sid not in expired:  # its first read had failed
                expired.append(sid)
        self._last_request = time.monotonic()
        if expired:
            log.warning("servo(s) %s on %s: their bus watchdog had expired (a previous session "
                        "ended without clearing it: killed or crashed) and had stopped the arm; "
                        "cleared", self._named(expired), self.port)
        if failed:
            raise BusError(f"could not arm the bus watchdog (register "
                           f"{self.spec.registers['Bus_Watchdog'].address}) of servo(s) "
                           f"{self._named(failed)} on {self.port} in {self.WATCHDOG_TRIES} "
                           f"tries: check the cable and power, or set "
                           f"{self.platform.source}: hardware.bus_watchdog_ms: 0 to run "
                           "without it")

    def _keep_watchdog(self) -> None:
        """Before a goal write: arm the watchdog the first time. Afterwards, if nothing was
        sent for half its period or more, a servo's watchdog may have run out (it then
        stopped the arm and refuses goals until 0 is written): clear and re-arm it with two
        broadcasts (no replies, so no wait on a slow bus), and say so if it surely ran out."""
        if not self._watchdog_armed:
            self._arm_watchdog()
            return
        silent = time.monotonic() - self._last_request
        if silent < self.watchdog_s / 2:
            return
        self._drain()
        self._write_register(self.BROADCAST_ID, "Bus_Watchdog", 0, acknowledged=False)
        self._write_register(self.BROADCAST_ID, "Bus_Watchdog", self._watchdog_units,
                             acknowledged=False)
        self._last_request = time.monotonic()
        if silent > self.watchdog_s:
            log.warning("nothing was sent to the servos on %s for %.2f s, longer than their bus "
                        "watchdog (hardware.bus_watchdog_ms = %g): those with torque on stopped "
                        "where they were; re-armed, goals are accepted again", self.port, silent,
                        1000 * self.watchdog_s)

    def clear_watchdog(self) -> list[int]:
        """Disarm every servo's bus watchdog from whatever state the port was left in: one
        broadcast of 0, then each servo not known to be absent read back (and written again
        if it differs); returns the IDs that never confirmed (after logging one line).
        Closing the bus calls it before switching torque off. Never raises."""
        self._reply_floor_ms = max(self.reply_timeout_ms, self.TORQUE_OFF_REPLY_MS)
        pending = []
        try:
            if self._port.is_using or self._late_possible:
                time.sleep(min(max(self.rx_timeout_ms, 35.0), 100.0) / 1000.0)
            try:  # one broadcast does it for every servo that hears it; then confirm each
                self._reset_port()
                self._write_register(self.BROADCAST_ID, "Bus_Watchdog", 0, acknowledged=False)
            except Exception as e:  # a broken port: the per-servo tries will say so
                log.debug("clearing the bus watchdog on %s: broadcast failed: %r", self.port, e)
            for sid in self.ids:
                if sid in self._absent:
                    continue  # it got the broadcast if it listens; the next session checks
                try:
                    self._reset_port()
                    ok = self._set_watchdog(sid, 0, self.WATCHDOG_CLEAR_TRIES) is not None
                except Exception as e:  # a broken port: say which servos, below
                    log.debug("clearing the bus watchdog on %s: servo %d: %r", self.port, sid, e)
                    ok = False
                if not ok:
                    pending.append(sid)
        finally:
            self._reply_floor_ms = self.reply_timeout_ms
            self._watchdog_armed = False
        if pending:
            log.warning("the bus watchdog may still be armed on %s: servo(s) %s did not confirm "
                        "Bus_Watchdog = 0; the next nactuator session clears it (or write 0 to "
                        "register %d with DYNAMIXEL Wizard)", self.port, self._named(pending),
                        self.spec.registers["Bus_Watchdog"].address)
        return pending

