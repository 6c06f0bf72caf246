"""The one interface the rest of nactuator uses to talk to a servo arm.

A :class:`TelemetryBus` gives one :class:`TelemetryFrame` per cycle (Contract 1 units:
rad / m, rad/s / m/s, effort in the platform's signal, V, degC, PWM duty) and takes one
goal vector per cycle. Underneath, LeRobot's ``DynamixelMotorsBus`` / ``FeetechMotorsBus``
open the port, check every servo (ping + model number), switch torque and write goals —
so a LeRobot calibration file works unchanged — while the telemetry block is read with
one vendor-SDK group read per cycle (see ``dynamixel.py`` and ``feetech.py``).
``hardware.open.open_bus`` picks the subclass a platform names; the port lock, the errors
and the calibration file are ``hardware.port``'s.

    with open_bus(platform, "/dev/ttyUSB0") as bus:
        frame = bus.read()            # TelemetryFrame
        bus.write_goal(frame.q)       # hold position
"""

from __future__ import annotations

import abc
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from nactuator.hardware.control_table import (
    XM430_BUS_WATCHDOG_EXPIRED,
    XM430_BUS_WATCHDOG_MAX,
    XM430_BUS_WATCHDOG_UNIT_S,
    RegisterBlock,
    ServoSpec,
)
from nactuator.hardware.port import (
    COMM_SUCCESS,
    BusError,
    HardwareAlert,
    ServoMissingError,
    WrongModelError,
    describe_failures,
    lock_port,
    min_reply_timeout,
)
from nactuator.hardware.signals import interrupts_deferred
from nactuator.platforms import Platform

log = logging.getLogger(__name__)


@dataclass
class TelemetryFrame:
    """One cycle of telemetry, one value per channel in the platform's order.

    ``valid[i]`` is False when motor i's telemetry could not be read this cycle; its values
    are then NaN (never the previous reading). ``errors`` maps servo id -> the hardware
    error text that servo reported this cycle.
    """

    t: float  # time.monotonic() when the read completed [s]
    q: np.ndarray
    qd: np.ndarray
    effort: np.ndarray
    voltage: np.ndarray
    temperature: np.ndarray
    pwm: np.ndarray
    current: np.ndarray
    valid: np.ndarray
    errors: dict[int, str] = field(default_factory=dict)
    torque: np.ndarray | None = None  # 1 where torque is on (as last set or read back)
    read_s: float = 0.0  # wall time the read took

    @classmethod
    def empty(cls, n: int) -> TelemetryFrame:
        nan = np.full(n, np.nan)
        return cls(time.monotonic(), nan.copy(), nan.copy(), nan.copy(), nan.copy(),
                   nan.copy(), nan.copy(), nan.copy(), np.zeros(n, dtype=bool))


class TelemetryBus(abc.ABC):
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

    # --- per cycle --------------------------------------------------------------------
    def read(self) -> TelemetryFrame:
        """Read every servo's telemetry once. Servos that stopped answering are skipped
        (their channels invalid) and re-probed every ``reprobe_interval_s``."""
        t0 = time.perf_counter()
        now = time.monotonic()
        wanted = [i for i in self.ids if self._absent.get(i, 0.0) <= now]
        blocks, errors = self._read_blocks(wanted) if wanted else ({}, {})
        # Retry servo by servo (a read has no side effect, so it is always safe) while the
        # cycle's retry budget lasts: a corrupt reply costs microseconds, a lost one a timeout.
        for attempt in range(self.read_retries):
            missing = [i for i in wanted if i not in blocks]
            if not missing or (attempt > 0 and time.perf_counter() - t0 > self.retry_budget_s):
                break
            self.counters["retries"] += 1
            more, more_err = self._read_each(missing)
            blocks.update(more)
            errors.update(more_err)
        frame = TelemetryFrame.empty(len(self.ids))
        for k, sid in enumerate(self.ids):
            if sid in blocks:
                self._decode(k, blocks[sid], frame)
                frame.valid[k] = True
                self._note_alive(sid)
            elif sid in wanted:
                self._note_failure(sid)
        for sid, err in errors.items():
            if err:
                frame.errors[sid] = err
                if (sid, err) not in self._reported:
                    # A new hardware error: the firmware may have switched torque off.
                    state = self._read_torque(sid)
                    if state is not None:
                        self.torque[self.ids.index(sid)] = float(state)
                self._report_once(sid, err)
        frame.torque = self.torque.copy()
        self.counters["reads"] += 1
        if not frame.valid.all():
            self.counters["incomplete"] += 1
        frame.t = time.monotonic()
        frame.read_s = time.perf_counter() - t0
        if wanted:  # the last request went out at most one reply wait ago
            self._last_request = frame.t - self.rx_timeout_ms / 1000.0
        return frame

    def wait_ready(self, timeout: float = 1.0) -> TelemetryFrame:
        """Read until every servo answers (or ``timeout`` s); returns the last frame."""
        t_end = time.monotonic() + timeout
        frame = self.read()
        while not frame.valid.all() and time.monotonic() < t_end:
            frame = self.read()
        return frame

    def _note_alive(self, sid: int) -> None:
        if sid in self._absent:
            log.warning("servo %d (%s) answers again; its telemetry is valid from now on",
                        sid, self._name(sid))
            self._reported.discard((sid, "absent"))
        self._absent.pop(sid, None)
        self._failures[sid] = 0
        self._since_ok[sid] = dict(self.counters)

    def _note_failure(self, sid: int) -> None:
        self._failures[sid] += 1
        if self._failures[sid] >= self.dead_after:
            self._absent[sid] = time.monotonic() + self.reprobe_s
            delta = {k: v - self._since_ok[sid][k] for k, v in self.counters.items()}
            self._report_once(sid, "absent", (
                f"servo {sid} ({self._name(sid)}) on {self.port} stopped answering "
                f"({self._failures[sid]} reads of its telemetry block {self.telemetry} "
                f"failed in a row; on the bus since its last good read: "
                f"{describe_failures(delta, self.rx_timeout_ms)}). Its channel is recorded "
                f"with telemetry_valid=0; probing again every {self.reprobe_s:g} s"))

    # --- the wire: what came back, and when ---------------------------------------------
    def _drain(self) -> None:
        """Drop whatever waits in the input buffer before a new request: bytes there are
        the reply to an earlier request that came after it timed out. Counted as late,
        never taken for a new answer."""
        ser = self._port.ser
        if ser.in_waiting:
            self.counters["late_replies"] += 1
        self._late_possible = False
        ser.reset_input_buffer()

    def _count(self, result: int, rx) -> None:
        """Count a failed receive: a timeout, a reply cut short, or a bad checksum."""
        if result == self.RX_TIMEOUT:
            self.counters["timeouts"] += 1
            self._late_possible = True
        elif result == self.RX_CORRUPT:
            if self._complete(rx):
                self.counters["checksum_errors"] += 1
            else:
                self.counters["partial_replies"] += 1
                self._late_possible = True

    RX_TIMEOUT: int  # the vendor SDK's result codes (subclasses)
    RX_CORRUPT: int

    @staticmethod
    def _complete(rx) -> bool:
        """Whether ``rx`` holds as many bytes as its LEN field announces (subclasses)."""
        return True

    # --- torque ---------------------------------------------------------------------------
    TORQUE_OFF_TRIES = 6
    TORQUE_OFF_BACKOFF_S = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)  # before each round
    TORQUE_OFF_REPLY_MS = 250.0  # wait this long for each reply: a slow answer is no failure

    def torque_off(self) -> list[int]:
        """Switch torque off on every servo and make sure it took; returns the IDs that
        never confirmed (after logging one line that names them).

        Works from any state the port was left in: a Ctrl-C between an SDK request and its
        reply leaves the SDK's ``is_using`` flag set (every later request would fail with
        COMM_PORT_BUSY) and the reply in the buffers. So: wait out replies in flight, clear
        the flag, flush both buffers; then, in rounds with growing pauses, one broadcast
        Torque_Enable = 0 and, per servo not yet confirmed, a read-back (and if it answers
        with 1, a write of its own and another read-back), each reply awaited at least
        ``TORQUE_OFF_REPLY_MS``. A servo counts as off only once it has read back 0. Never
        raises: it is what runs when everything else went wrong.
        """
        self._reply_floor_ms = max(self.reply_timeout_ms, self.TORQUE_OFF_REPLY_MS)
        try:
            return self._torque_off()
        finally:
            self._reply_floor_ms = self.reply_timeout_ms

    def _torque_off(self) -> list[int]:
        with interrupts_deferred():
            pending = list(self.ids)
            if self._port.is_using or self._late_possible:
                # An interrupted or timed-out request: let its reply land before flushing.
                time.sleep(min(max(self.rx_timeout_ms, 35.0), 100.0) / 1000.0)
            for pause in self.TORQUE_OFF_BACKOFF_S[: self.TORQUE_OFF_TRIES]:
                time.sleep(pause)
                try:
                    self._reset_port()
                    self._broadcast_torque_off()
                except Exception as e:  # a broken port: the per-servo tries will say so
                    log.debug("torque off on %s: broadcast failed: %r", self.port, e)
                still = []
                for sid in pending:
                    try:  # the broadcast may have done it; if not, ask this servo alone
                        state = self._read_torque(sid)
                        ok = state == 0
                        if state is not None and not ok:  # it answers: tell it directly
                            self._write_torque(sid, False)
                            ok = self._read_torque(sid) == 0
                    except Exception as e:
                        log.debug("torque off on %s: servo %d: %r", self.port, sid, e)
                        self._reset_port(quiet=True)
                        ok = False
                    if ok:
                        self.torque[self.ids.index(sid)] = 0.0
                    else:
                        still.append(sid)
                pending = still
                if not pending:
                    return []
            names = ", ".join(f"{sid} ({self._name(sid)})" for sid in pending)
            log.error("torque may still be ON on %s: servo(s) %s did not confirm "
                      "Torque_Enable = 0 after %d tries; switch the arm's power off before "
                      "touching it, then check its cable and power", self.port, names,
                      self.TORQUE_OFF_TRIES)
            return pending

    def _reset_port(self, quiet: bool = False) -> None:
        """Undo what an interrupted SDK call leaves behind: the in-use flag, stale bytes."""
        self._port.is_using = False
        try:
            self._port.ser.reset_input_buffer()
            self._port.ser.reset_output_buffer()
        except Exception:
            if not quiet:
                raise

    def set_torque(self, enabled: bool) -> None:
        """Torque on/off on every servo, one acknowledged write each (3 tries).

        Switching on fails loudly (which servo, why); switching off is best effort — a
        servo that is gone or latched an error is reported and skipped.
        """
        problems = []
        for name, sid in zip(self.names, self.ids, strict=True):
            problem = None
            for _ in range(3):
                problem = self._write_torque(sid, enabled)
                if problem is None:
                    break
            if problem is None and enabled and self._read_torque(sid) == 0:
                problem = "refused to switch torque on"
            if problem is not None:
                problems.append((sid, name, problem))
            self.torque[self.ids.index(sid)] = float(enabled and problem is None)
        if not problems:
            return
        action = f"switching torque {'on' if enabled else 'off'} on {self.port}"
        detail = " | ".join(f"servo {sid} ({name}): {self._explain(sid, p)}"
                            for sid, name, p in problems)
        if not enabled:
            log.warning("%s: %s", action, detail)
            return
        silent = all(p == "no status packet" for _, _, p in problems)
        raise (BusError if silent else HardwareAlert)(f"{action} failed: {detail}")

    def _report_once(self, sid: int, key: str, message: str | None = None) -> None:
        if (sid, key) in self._reported:
            return
        self._reported.add((sid, key))
        log.warning(message or f"servo {sid} ({self._name(sid)}) on {self.port} reports a "
                    f"hardware error: {key}")

    def _name(self, sid: int) -> str:
        return self.names[self.ids.index(sid)]

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

    @abc.abstractmethod
    def _read_blocks(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        """One group read of the telemetry block: ({id: bytes}, {id: error text or ''})."""

    @abc.abstractmethod
    def _read_each(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        """The same block read servo by servo (the fallback when a group read failed)."""

    @abc.abstractmethod
    def _decode(self, k: int, block: bytes, frame: TelemetryFrame) -> None: ...

    def _broadcast_torque_off(self) -> None:
        """One unacknowledged Torque_Enable = 0 to every servo on the bus (broadcast ID)."""
        self._write_register(self.BROADCAST_ID, "Torque_Enable", 0, acknowledged=False)

    BROADCAST_ID = 0xFE
    GOAL_RETRIES = 5

    # --- one register of one servo, by its control-table name -------------------------
    def _read_register(self, sid: int, name: str) -> tuple[int, int, int]:
        """(value, SDK result, status error byte); the value decoded as the servo encodes
        it (two's complement / sign-magnitude) and meaningful only on COMM_SUCCESS."""
        reg, ph, port = self.spec.registers[name], self._ph, self._port
        if reg.size == 1:
            raw, comm, err = ph.read1ByteTxRx(port, sid, reg.address)
        elif reg.size == 2:
            raw, comm, err = ph.read2ByteTxRx(port, sid, reg.address)
        else:
            raw, comm, err = ph.read4ByteTxRx(port, sid, reg.address)
        return self.spec.decode(name, raw), comm, err

    def _write_register(self, sid: int, name: str, value: int,
                        acknowledged: bool = True) -> tuple[int, int]:
        """(SDK result, status error byte); ``acknowledged=False`` sends without waiting
        for a reply (broadcasts), returning (COMM_SUCCESS, 0) once sent."""
        reg, ph, port = self.spec.registers[name], self._ph, self._port
        raw = self.spec.encode(name, value)
        if not acknowledged:
            if reg.size == 1:
                comm = ph.write1ByteTxOnly(port, sid, reg.address, raw)
            elif reg.size == 2:
                comm = ph.write2ByteTxOnly(port, sid, reg.address, raw)
            else:
                comm = ph.write4ByteTxOnly(port, sid, reg.address, raw)
            return comm, 0
        if reg.size == 1:
            return ph.write1ByteTxRx(port, sid, reg.address, raw)
        if reg.size == 2:
            return ph.write2ByteTxRx(port, sid, reg.address, raw)
        return ph.write4ByteTxRx(port, sid, reg.address, raw)

    def write_goal(self, q: np.ndarray) -> None:
        """Command joint targets (SI, channel order, clipped to the joint limits) with one
        sync write through LeRobot, no reply; servos known to be absent are skipped."""
        q = np.clip(np.asarray(q, dtype=float), self.lo, self.hi)
        raw = {n: self.units[k].raw_position(q[k]) for k, n in enumerate(self.names)
               if np.isfinite(q[k]) and self.ids[k] not in self._absent}
        if raw:
            if self.watchdog_s:
                self._keep_watchdog()
            self.lerobot.sync_write("Goal_Position", raw, normalize=False)
            self._last_request = time.monotonic()

    # --- the bus watchdog (XM430 Bus Watchdog, register 98) ----------------------------
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

    def _named(self, ids: list[int]) -> str:
        return ", ".join(f"{sid} ({self._name(sid)})" for sid in ids)

    @abc.abstractmethod
    def _write_torque(self, sid: int, enabled: bool) -> str | None:
        """Write the torque register of one servo: None if acknowledged, else what failed."""

    def _read_torque(self, sid: int) -> int | None:
        """The servo's torque register (0/1), or None if it does not answer."""
        self._drain()
        value, comm, _ = self._read_register(sid, "Torque_Enable")
        return value if comm == COMM_SUCCESS else None

    @abc.abstractmethod
    def _explain(self, sid: int, problem: str) -> str:
        """Turn a failed torque write into a message a user can act on."""

    def read_goal(self) -> np.ndarray:
        """The goal position each servo currently holds (SI), read servo by servo with up
        to ``GOAL_RETRIES`` tries each (a read has no side effect; one corrupt reply in a
        group read would fail them all)."""
        q = np.empty(len(self.ids))
        for k, (name, sid) in enumerate(zip(self.names, self.ids, strict=True)):
            for _ in range(self.GOAL_RETRIES):
                self._drain()
                raw = self._read_goal_raw(sid)
                if raw is not None:
                    break
            else:
                raise BusError(f"could not read Goal_Position of servo {sid} ({name}) on "
                               f"{self.port} in {self.GOAL_RETRIES} tries: check its cable "
                               "and power")
            q[k] = self.units[k].position(raw)
        return q

    def _read_goal_raw(self, sid: int) -> int | None:
        """The servo's Goal_Position register (signed raw counts), or None if no answer."""
        value, comm, _ = self._read_register(sid, "Goal_Position")
        return value if comm == COMM_SUCCESS else None

