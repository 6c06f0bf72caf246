"""The one interface the rest of nactuator uses to talk to a servo arm.

A :class:`TelemetryBus` gives one :class:`TelemetryFrame` per cycle (Contract 1 units:
rad / m, rad/s / m/s, effort in the platform's signal, V, degC, PWM duty) and takes one
goal vector per cycle. Underneath, LeRobot's ``DynamixelMotorsBus`` / ``FeetechMotorsBus``
open the port, check every servo (ping + model number), switch torque and write goals —
so a LeRobot calibration file works unchanged — while the telemetry block is read with
one vendor-SDK group read per cycle (see ``dynamixel.py`` and ``feetech.py``).
``hardware.open.open_bus`` picks the subclass a platform names; the port lock, the errors
and the calibration file are ``hardware.port``'s.

This module holds the bus's configuration and its lifecycle (connect: port lock, servo
check, torque state; close: watchdog cleared, torque off, lock released). Each job of a
cycle is a part of its own, all built on ``hardware.wire`` (register access, reply
accounting): ``hardware.telemetry`` (the per-cycle read and its decoding),
``hardware.torque`` (torque on/off, the safe torque-off), ``hardware.watchdog`` (the XM430
bus watchdog) and ``hardware.goals`` (goal writes and read-back).

    with open_bus(platform, "/dev/ttyUSB0") as bus:
        frame = bus.read()            # TelemetryFrame
        bus.write_goal(frame.q)       # hold position
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from nactuator.hardware.control_table import RegisterBlock, ServoSpec
from nactuator.hardware.frame import TelemetryFrame
from nactuator.hardware.goals import Goals
from nactuator.hardware.port import (
    COMM_SUCCESS,
    BusError,
    ServoMissingError,
    WrongModelError,
    lock_port,
    min_reply_timeout,
)
from nactuator.hardware.signals import interrupts_deferred
from nactuator.hardware.telemetry import TelemetryReads
from nactuator.platforms import Platform

__all__ = ["TelemetryBus", "TelemetryFrame"]

log = logging.getLogger(__name__)


class TelemetryBus(TelemetryReads, Goals):
    """One servo arm on one serial port. Subclasses fill in the protocol specifics.

    Closing the bus switches torque off on every servo (:meth:`torque_off`), whatever
    ended its use — a normal end, Ctrl-C, SIGTERM, an exception — unless the servo check
    at connect found missing or foreign servos (then nothing is written to them), or
    ``torque_off_on_close=False``.

    Where the servos have a bus watchdog (XM430 register 98) and ``hardware.bus_watchdog_ms``
    is set, the first goal write arms it on every servo, so a host that dies without a word
    (SIGKILL, a crash, a pulled cable) leaves the arm stopped rather than driven; closing the
    bus clears it again, before torque goes off (see docs/hardware.md, "A killed host").
    """

    def __init__(self, platform: Platform, port: str, calibration: dict | None = None,
                 torque: bool | None = None, torque_off_on_close: bool = True) -> None:
        self.platform = platform
        self.port = port
        hw = platform.hardware
        self.ids: list[int] = [int(i) for i in hw["ids"]]
        if len(self.ids) != platform.n:
            raise BusError(f"{platform.source}: hardware.ids lists {len(self.ids)} servos for "
                           f"{platform.n} channels {platform.channel_names}")
        self.names = platform.channel_names
        self.model_number = int(hw.get("model_number", self.spec.model_number))
        self.lo = np.array([c.limit_lower for c in platform.channels])  # goals are clipped
        self.hi = np.array([c.limit_upper for c in platform.channels])
        self.calibration = calibration
        self.baudrate = int(hw.get("baudrate", 1_000_000))
        self.rx_timeout_ms = float(hw.get("rx_timeout_ms", 12.0))
        # Floor of every other reply wait (ping, torque, goal reads); 0: the SDK's own.
        self.reply_timeout_ms = float(hw.get("reply_timeout_ms", 0.0))
        self._reply_floor_ms = self.reply_timeout_ms
        self.dead_after = int(hw.get("dead_after_failures", 3))
        self.read_retries = int(hw.get("read_retries", 2))
        self.retry_budget_s = float(hw.get("retry_budget_ms", 8.0)) / 1000.0
        self.reprobe_s = float(hw.get("reprobe_interval_s", 1.0))
        self._torque_request = torque
        self.torque_off_on_close = torque_off_on_close
        self._lock_fd = -1
        self._opened = False  # the SDK port is open: the servos may have heard us
        self._foreign = False  # the servo check found missing/wrong servos: write nothing
        self._failures = dict.fromkeys(self.ids, 0)
        self._absent: dict[int, float] = {}  # servo id -> when to probe it again
        self._reported: set[tuple[int, str]] = set()
        # timeouts: no complete reply in time; late_replies: bytes of a timed-out request
        # that came afterwards; partial_replies: a reply cut short (a broken chain).
        self.counters = {"reads": 0, "incomplete": 0, "retries": 0, "checksum_errors": 0,
                         "timeouts": 0, "late_replies": 0, "partial_replies": 0}
        self._since_ok = {sid: dict(self.counters) for sid in self.ids}
        self._late_possible = False  # a request timed out: its reply may still come
        self.torque = np.zeros(len(self.ids))  # refreshed at connect and on hardware errors
        self.watchdog_s = self._watchdog_period(platform)  # 0.0: no bus watchdog
        self._watchdog_armed = False
        self._last_request = -np.inf  # time.monotonic() of the last request of a cycle

    # --- lifecycle --------------------------------------------------------------------
    def connect(self) -> TelemetryBus:
        self._lock_fd = lock_port(self.port)
        try:
            self._connect()
            self._block_reads()
            for k, sid in enumerate(self.ids):
                state = self._read_torque(sid)
                self.torque[k] = 0.0 if state is None else float(state)
            if self._torque_request is not None:
                self.set_torque(self._torque_request)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Clear the bus watchdog and switch torque off (see the class docstring), close the
        port, release the lock. A Ctrl-C or SIGTERM arriving meanwhile is held until this
        is done."""
        with interrupts_deferred():
            try:
                if self._watchdog_armed and self._opened and not self._foreign:
                    self.clear_watchdog()  # first: an expired one keeps goals read-only
                if self.torque_off_on_close and self._opened and not self._foreign:
                    self.torque_off()
                self._close()
            finally:
                self._opened = False
                if self._lock_fd >= 0:
                    os.close(self._lock_fd)
                    self._lock_fd = -1

    def __enter__(self) -> TelemetryBus:
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()

    READ_BLOCK_S = 0.002

    def _block_reads(self) -> None:
        """Let the SDKs' receive loops block in select() instead of spinning.

        Both SDKs open the port with ``timeout=0`` and poll ``read()`` in a tight loop
        until their packet timeout: 100 % of a core while waiting, which on a shared
        machine starves whatever else runs (the model, an emulator). A short read timeout
        makes each ``read(k)`` return as soon as k bytes are there, or after 2 ms; the
        SDK's own packet timeout still decides when to give up.
        """
        ser = getattr(self.sdk_port, "ser", None)
        if ser is not None:
            ser.timeout = self.READ_BLOCK_S

    @property
    def sdk_port(self):
        """The vendor SDK's PortHandler (for tools that need raw SDK access, e.g. benches)."""
        return self._port

    @property
    def sdk_packet_handler(self):
        return self._ph

    @property
    def absent_ids(self) -> list[int]:
        return sorted(self._absent)

    # --- what subclasses implement ----------------------------------------------------
    spec: ServoSpec  # the servo model's control table: every register is addressed by name
    telemetry: RegisterBlock  # the block read each cycle; str() gives e.g. "124..146 (23 bytes)"

    # Set by subclasses: the LeRobot bus, and the SDK port/packet handlers under it.
    lerobot: object
    _port: object
    _ph: object
    model: str
    setup_hint: str = ""  # how to fix IDs/baud on this servo family, for ServoMissingError

    def _connect(self) -> None:
        self._port.baudrate = self.baudrate
        try:
            self.lerobot.connect(handshake=False)
        except ConnectionError as e:
            raise BusError(f"could not open {self.port} at {self.baudrate} baud: {e}") from e
        self._opened = True
        min_reply_timeout(self._port, lambda: self._reply_floor_ms)
        self._check_servos()

    def _check_servos(self) -> None:
        """Ping every configured servo; a missing one or a wrong model number is an error."""
        missing, wrong = [], []
        for name, sid in zip(self.names, self.ids, strict=True):
            found = self._ping(sid)
            if found is None:
                missing.append(f"{sid} ({name})")
            elif found != self.model_number:
                wrong.append(f"{sid} ({name}): model number {found}, expected "
                             f"{self.model_number} ({self.model})")
        self._foreign = bool(missing or wrong)
        if missing:
            raise ServoMissingError(
                f"no answer on {self.port} from servo id(s) {', '.join(missing)} (ping at "
                f"{self.baudrate} baud, {self.PING_SILENT_TRIES} tries): {self.setup_hint}; "
                f"IDs and baud rate must match {self.platform.source}: hardware.ids")
        if wrong:
            raise WrongModelError(f"wrong servo model on {self.port}: {'; '.join(wrong)}. "
                                  f"Is this the right arm/port for {self.platform.name!r}?")

    PING_SILENT_TRIES, PING_MAX_TRIES = 3, 10

    def _ping(self, sid: int) -> int | None:
        """Model number, or None if the servo stays silent for ``PING_SILENT_TRIES`` pings.
        A garbled reply proves something answered: it earns another try (up to
        ``PING_MAX_TRIES``), so a noisy bus is not mistaken for a missing servo. A servo
        whose status carries an error or Alert bit is present (its hardware error is
        reported separately)."""
        silent = 0
        for _ in range(self.PING_MAX_TRIES):
            self._drain()
            try:
                model, comm, _ = self._ph.ping(self._port, sid)
            except IndexError:
                # The SDK took a late reply to an earlier try (no parameters) for this
                # one and indexed into it. Let the stragglers arrive, drop them, retry.
                time.sleep(0.02)
                continue
            if comm == COMM_SUCCESS:
                return model
            silent += comm == self.RX_TIMEOUT
            if silent >= self.PING_SILENT_TRIES:
                break
            time.sleep(0.005)
        return None

    def _close(self) -> None:
        if self._port.is_open:
            self._port.closePort()
