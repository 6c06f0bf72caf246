"""A virtual servo arm on a pseudo-terminal.

The SDKs open the pty's slave end like any serial port; a daemon thread reads the master
end, lets the servo firmware (:mod:`.servos`) answer, and between packets steps the arm
model in real time and copies its state into the control tables (servos.md §8).

    with Emulator("feetech", "so101", arm="reference") as emu:
        bus = FeetechMotorsBus(emu.port, ...)

Nothing in the emulator thread fails silently: a packet the firmware cannot process is
logged with its bytes and answered as the servo would (DYNAMIXEL: Result Fail), and the
thread serves on; anything else that stops the thread is logged, kept in
:attr:`Emulator.failure` and raised again when the emulator is stopped.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import sys
import threading
import time
import tty
from collections.abc import Callable
from pathlib import Path

import numpy as np

from nactuator import servo_units as units
from nactuator.errors import UserError
from nactuator.hardware.control_table import SPEC_BY_BUS, XM430_HARDWARE_ERRORS, ControlTable
from nactuator.hardware.emulator.arm import ArmModel, ReferenceArm, ScriptedLeader
from nactuator.hardware.emulator.faults import Faults
from nactuator.hardware.emulator.servos import DynamixelServos, FeetechServos
from nactuator.hardware.emulator.watchdog import BusWatchdogs
from nactuator.hardware.protocol import dxl2, scs
from nactuator.hardware.timing import sleep_until
from nactuator.platforms import Platform, load_platform

log = logging.getLogger(__name__)

# Baud_Rate register codes (XM430 e-manual; STS per LeRobot's table).
DXL_BAUD = {0: 9_600, 1: 57_600, 2: 115_200, 3: 1_000_000, 4: 2_000_000, 5: 3_000_000,
            6: 4_000_000}
STS_BAUD = {0: 1_000_000, 1: 500_000, 2: 250_000, 3: 128_000, 4: 115_200, 5: 57_600,
            6: 38_400, 7: 19_200}
# The XM430 Hardware Error Status bits the emulator latches (STS3215: scs.ERR_*).
_DXL_HW_BIT = {name: 1 << bit for bit, name in XM430_HARDWARE_ERRORS.items()}
DXL_HW_OVERLOAD, DXL_HW_VOLTAGE = _DXL_HW_BIT["overload"], _DXL_HW_BIT["input voltage"]
# Instructions that read several servos at once: one per telemetry cycle of a bus.
GROUP_READS = {"dynamixel": {dxl2.SYNC_READ, dxl2.FAST_SYNC_READ, dxl2.BULK_READ,
                             dxl2.FAST_BULK_READ},
               "feetech": {scs.SYNC_READ}}


def _sts_target(t: ControlTable) -> int:
    """Where an STS3215 drives for its Goal_Position: the firmware keeps an out-of-range
    goal in the register but steers to the nearest of Min/Max_Position_Limit (both 0:
    multi-turn, no limits; Min > Max: a range that wraps through 0)."""
    goal, lo, hi = t.get("Goal_Position"), t.get("Min_Position_Limit"), \
        t.get("Max_Position_Limit")
    if lo == hi == 0:
        return goal
    if lo <= hi:
        return min(max(goal, lo), hi)
    if goal >= lo or goal <= hi:
        return goal
    return hi if goal - hi < lo - goal else lo


class EmulatorError(RuntimeError):
    """The emulator thread stopped on an error (the log has its traceback)."""


class FaultIdError(UserError, ValueError):
    """A fault names a servo ID the emulated platform does not have."""


def make_arm(kind: str, platform: Platform, seed: int, supply_voltage: float,
             payload_kg: float = 0.0, grasp: bool = False) -> ArmModel:
    """``world`` (the hidden ground truth, ``payload_kg`` at its end effector: tied, or
    with ``grasp`` between its jaws; :class:`WorldArm`), ``reference``
    (first-order servo) or ``leader``."""
    if payload_kg and kind != "world":
        raise ValueError(f"a payload needs the 'world' arm model, not {kind!r}")
    if kind == "leader":
        return ScriptedLeader(platform, seed=seed, supply_voltage=supply_voltage)
    if kind == "reference":
        return ReferenceArm(platform, supply_voltage=supply_voltage)
    if kind == "world":
        from nactuator.hardware.emulator.world_arm import WorldArm

        return WorldArm(platform, seed=seed, payload_kg=payload_kg, grasp=grasp)
    raise ValueError(f"unknown arm model {kind!r}: expected 'world', 'reference' or 'leader'")


class Emulator:
    """Virtual arm: ``bus`` 'dynamixel' (XM430) or 'feetech' (STS3215) on a pty.

    ``arm``: an :class:`ArmModel` or a name for :func:`make_arm` (default 'world' for a
    follower, 'leader' with ``leader=True``). ``bus_timing`` adds wire time at the
    configured baud rate plus each servo's Return Delay Time before each reply.
    ``step_per_read``: instead of in real time, advance the arm model by this many
    seconds each time a group read (SYNC/BULK READ, one per telemetry cycle) has been
    answered, so the arm moves the same way on an idle and on a loaded machine (tests).
    ``clock``: the time the XM430 Bus Watchdog measures silences in (default
    ``time.perf_counter``; a test passes its own to decide when a silence ends).
    ``payload_kg``: a mass at the world arm's end effector (unseen load): tied there for the
    whole run, or with ``grasp`` an object between its jaws, its weight hung while they
    press it (:class:`WorldArm`).
    """

    def __init__(self, bus: str, platform: str | Platform, seed: int = 0, *,
                 arm: str | ArmModel | None = None, leader: bool = False,
                 bus_timing: bool = False, faults: Faults | None = None,
                 link: str | Path | None = None, step_per_read: float | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 payload_kg: float = 0.0, grasp: bool = False) -> None:
        self.platform = platform if isinstance(platform, Platform) else load_platform(platform)
        hw = self.platform.hardware
        if bus not in SPEC_BY_BUS:
            raise ValueError(f"bus must be 'dynamixel' or 'feetech', got {bus!r}")
        if hw.get("bus") != bus:
            raise ValueError(f"platform {self.platform.name!r} uses the {hw.get('bus')!r} bus "
                             f"({self.platform.source}: hardware.bus), not {bus!r}")
        if step_per_read is not None and not step_per_read > 0:
            raise ValueError(f"step_per_read must be > 0 seconds, got {step_per_read}")
        self.bus = bus
        self.spec = SPEC_BY_BUS[bus]
        self.ids = [int(i) for i in hw["ids"]]
        self.faults = faults or Faults(seed=seed)
        for what, ids in (("dead", self.faults.dead_ids), ("alert", self.faults.alert_ids)):
            self._check_ids(what, ids)
        self.bus_timing = bus_timing
        self.step_per_read = step_per_read
        self.link = Path(link) if link else None
        emu_conf = hw.get("emulator", {})
        supply = float(emu_conf.get("supply_voltage", 12.0))
        if arm is None:
            arm = "leader" if leader else "world"
        if isinstance(arm, str):
            arm = make_arm(arm, self.platform, seed, supply, payload_kg, grasp)
        elif payload_kg:
            raise ValueError("payload_kg applies to an arm model made by name ('world')")
        self.arm: ArmModel = arm
        m_per_pulse = float(hw.get("gripper_m_per_pulse", units.OMX_GRIPPER_M_PER_PULSE))
        self.units = [units.motor_units(bus, c.kind == "prismatic", None, m_per_pulse)
                      for c in self.platform.channels]
        self.tables = {sid: ControlTable(self.spec, sid) for sid in self.ids}
        for t in self.tables.values():
            t.set("Return_Delay_Time", int(emu_conf.get("return_delay_time", 0)))
        self.clock = clock
        self.watchdogs: BusWatchdogs | None = None  # the STS3215 has no bus watchdog
        if bus == "dynamixel":
            self.firmware = DynamixelServos(self.tables, self.faults.dead_ids)
            self._reader = dxl2.PacketReader()
            self.watchdogs = BusWatchdogs(self.tables)
        else:
            self.firmware = FeetechServos(self.tables, self.faults.dead_ids)
            self._reader = scs.PacketReader()
        self.stats = {"packets": 0, "replies": 0, "dropped": 0, "corrupted": 0,
                      "group_reads": 0, "malformed": 0, "firmware_errors": 0,
                      "physics_steps": 0, "physics_behind": 0,
                      "watchdog_checks": 0, "watchdog_expiries": 0}
        self.failure: BaseException | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._master = self._slave = -1
        self.port = ""
        # Replies waiting for their time on the wire: (due, bytes), in wire order.
        self._outbox: collections.deque[tuple[float, bytes]] = collections.deque()
        self._triggers: list[list] = []  # [group reads still to answer, callback]
        self._sync_registers(first=True)
        self._apply_commands()

    def _check_ids(self, what: str, ids) -> None:
        unknown = sorted(set(ids) - set(self.ids))
        if unknown:
            raise FaultIdError(
                f"cannot make servo id(s) {', '.join(map(str, unknown))} {what}: the emulated "
                f"{self.platform.name} arm has servo ids {', '.join(map(str, self.ids))} "
                f"({self.platform.source}: hardware.ids)")

    # --- lifecycle ------------------------------------------------------------------
    # A client in this process that busy-polls the port (the bare SDKs do) holds the GIL
    # the emulator needs to answer; while an emulator runs here, hand the GIL over every
    # 1 ms instead of Python's 5 ms. (The TelemetryBus does not poll: bus._block_reads.)
    SWITCH_INTERVAL = 1e-3
    _running = 0
    _saved_switch = 0.005

    def start(self) -> Emulator:
        if Emulator._running == 0:
            Emulator._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(self.SWITCH_INTERVAL)
        Emulator._running += 1
        self._master, self._slave = os.openpty()
        # Raw mode before any client opens the slave: no echo, no CR/NL translation.
        tty.setraw(self._slave)
        self.port = os.ttyname(self._slave)
        if self.link:
            self.link.parent.mkdir(parents=True, exist_ok=True)  # e.g. runs/ in a fresh checkout
            tmp = self.link.with_name(self.link.name + ".tmp")
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            os.symlink(self.port, tmp)
            os.replace(tmp, self.link)
        self._thread = threading.Thread(target=self._run, name=f"emulator-{self.bus}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            Emulator._running -= 1
            if Emulator._running == 0:
                sys.setswitchinterval(Emulator._saved_switch)
        self._stop.set()
        if self._thread:
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=2.0)
            self._thread = None
        for fd in (self._master, self._slave):
            if fd >= 0:
                os.close(fd)
        self._master = self._slave = -1
        # Only our own link: another emulator may have re-pointed it since.
        if self.link and self.link.is_symlink() and os.readlink(self.link) == self.port:
            self.link.unlink()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()
        if self.failure is not None and exc_type is None:
            raise EmulatorError(f"the {self.bus} emulator on {self.port} stopped serving: "
                                f"{self.failure!r} (traceback in the log)") from self.failure

    @property
    def alive(self) -> bool:
        """True while the emulator thread serves the bus."""
        return self._thread is not None and self._thread.is_alive()

    def set_dead(self, servo_id: int, dead: bool = True) -> None:
        """Make a servo stop (or resume) answering, e.g. mid-recording."""
        self._check_ids("dead", [servo_id])
        with self._lock:
            (self.faults.dead_ids.add if dead else self.faults.dead_ids.discard)(servo_id)

    def set_alert(self, servo_id: int, alert: bool = True) -> None:
        """Latch (or stop re-latching) an overload hardware error on a servo, at once."""
        self._check_ids("alert", [servo_id])
        with self._lock:
            (self.faults.alert_ids.add if alert else self.faults.alert_ids.discard)(servo_id)
            self._sync_registers()

    def after_reads(self, n: int, action: Callable[[], object]) -> None:
        """Call ``action`` (in the emulator thread) once ``n`` more group reads have been
        answered: a fault or event at a chosen telemetry cycle, not at a wall-clock time."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        with self._lock:
            self._triggers.append([n, action])

    # --- the loop -------------------------------------------------------------------
    # The arm model advances in its own steps, at most every STEP_INTERVAL of wall time
    # (batching steps saves wake-ups); registers are refreshed from it only when a packet
    # arrives and the model moved since the last refresh, because reading the world's
    # telemetry costs as much as a physics step.
    STEP_INTERVAL = 0.002
    MAX_CATCHUP = 10  # physics steps; beyond this the model's clock slips
    POLL_S = 0.05  # longest wait without a reason to wake (checks the stop flag)
    WATCHDOG_POLL_S = 0.005  # while a Bus Watchdog runs, look at it at least this often
    SPIN_S = 0.002  # replies due sooner than this are timed by spinning, not select()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # the thread must not end unnoticed
            if not self._stop.is_set():
                self.failure = e
                log.error("the %s emulator on %s stopped serving after an error", self.bus,
                          self.port, exc_info=True)

    def _serve(self) -> None:
        tick = float(getattr(self.arm, "dt", 0.002))
        t_model = time.perf_counter()
        lockstep_debt = 0.0  # model time owed by answered group reads (step_per_read)
        stale = False
        while not self._stop.is_set():
            now = time.perf_counter()
            wake = now + self.POLL_S if self.step_per_read else \
                t_model + max(tick, self.STEP_INTERVAL)
            if self._outbox:
                wake = min(wake, self._outbox[0][0] - self.SPIN_S)
            if self.watchdogs is not None and self.watchdogs.watching():
                wake = min(wake, now + self.WATCHDOG_POLL_S)
            try:
                ready, _, _ = select.select([self._master], [], [], max(0.0, wake - now))
            except (OSError, ValueError):
                return  # the pty was closed: stop() is under way
            group_reads = 0
            if ready:
                try:
                    data = os.read(self._master, 4096)
                except OSError:
                    return
                rx_done = time.perf_counter()
                with self._lock:
                    packets = self._reader.feed(data)
                    if packets and stale:
                        self._sync_registers()
                        stale = False
                    if self.watchdogs is not None:
                        heard = self.clock()
                        for p in packets:
                            self.watchdogs.heard(p, heard)
                    for p in packets:
                        self._queue(self._answer(p), len(data), rx_done)
                        group_reads += p.inst in GROUP_READS[self.bus]
                    if packets:
                        self._apply_commands()
            if not self._send_due():
                return
            if self.watchdogs is not None:
                stale = self._check_watchdogs(stale)
            if group_reads:
                self.stats["group_reads"] += group_reads
                self._fire_triggers(group_reads)
            if self.step_per_read:
                lockstep_debt += group_reads * self.step_per_read
                while lockstep_debt >= tick:
                    with self._lock:
                        self.arm.step(tick)
                    lockstep_debt -= tick
                    self.stats["physics_steps"] += 1
                    stale = True
                continue
            now = time.perf_counter()
            if now >= t_model + max(tick, self.STEP_INTERVAL):
                steps = int((now - t_model) / tick)
                if steps > self.MAX_CATCHUP:
                    # The model cannot keep real time (loaded machine): let its clock slip
                    # rather than stall the bus catching up.
                    self.stats["physics_behind"] += 1
                    t_model = now - self.MAX_CATCHUP * tick
                    steps = self.MAX_CATCHUP
                for _ in range(steps):
                    with self._lock:
                        self.arm.step(tick)
                    t_model += tick
                    self.stats["physics_steps"] += 1
                    stale = True
                    if select.select([self._master], [], [], 0)[0]:
                        break  # a request is waiting: answer it before stepping on

    def _check_watchdogs(self, stale: bool) -> bool:
        """Stop the servos whose Bus Watchdog ran out (after this loop's packets reset
        theirs); returns whether the registers are still stale."""
        with self._lock:
            now = self.clock()
            if self.watchdogs.due(now):
                if stale:
                    self._sync_registers()  # stop where the arm is now
                    stale = False
                stopped = self.watchdogs.expire(now)
                self.stats["watchdog_expiries"] += len(stopped)
                self._apply_commands()
                log.info("emulated servo(s) %s: Bus Watchdog expired (no instruction packet "
                         "for longer than its period); stopped, goals read-only",
                         ", ".join(map(str, stopped)))
            self.stats["watchdog_checks"] += 1
        return stale

    def _answer(self, packet) -> list[bytes]:
        self.stats["packets"] += 1
        try:
            replies = self.firmware.handle(packet)
        except Exception:
            # A firmware bug must neither kill the bus nor pass unnoticed.
            self.stats["firmware_errors"] += 1
            log.exception("the emulated %s firmware failed on %r; answering as a servo that "
                          "could not process it and serving on", self.bus, packet)
            replies = self.firmware.failure_reply(packet)
        self.stats["malformed"] = self.firmware.malformed
        return replies

    def _baud(self) -> int:
        code = self.tables[self.ids[0]].get("Baud_Rate")
        return (DXL_BAUD if self.bus == "dynamixel" else STS_BAUD).get(code, 1_000_000)

    def _queue(self, replies: list[bytes], request_len: int, rx_done: float) -> None:
        """Schedule replies: the servos answer at once; latency (a slow USB adapter) only
        delays when the bytes arrive, it never holds up the next request."""
        due = rx_done + self.faults.latency_ms / 1000.0
        if self._outbox:
            due = max(due, self._outbox[-1][0])  # one wire: replies keep their order
        byte_time = 10.0 / self._baud()
        for reply in replies:
            if self.bus_timing:
                sid = reply[4] if self.bus == "dynamixel" else reply[2]
                table = self.tables.get(sid, self.tables[self.ids[0]])
                return_delay = 2e-6 * table.get("Return_Delay_Time")
                due += request_len * byte_time + return_delay + len(reply) * byte_time
                request_len = 0  # the request crosses the wire once
            if self.faults.drop():
                self.stats["dropped"] += 1
                continue
            if self.faults.corrupt():
                self.stats["corrupted"] += 1
                reply = reply[:-1] + bytes([reply[-1] ^ 0xFF])
            self._outbox.append((due, reply))

    def _send_due(self) -> bool:
        """Write every reply whose time has come (spinning for the last ~2 ms, so wire
        timing stays exact). False if the pty is gone."""
        while self._outbox and self._outbox[0][0] - self.SPIN_S <= time.perf_counter():
            due, reply = self._outbox.popleft()
            sleep_until(due)
            # Counted before it is written: a client that has the reply sees it counted.
            self.stats["replies"] += 1
            try:
                os.write(self._master, reply)
            except OSError:
                return False
        return True

    def _fire_triggers(self, group_reads: int) -> None:
        with self._lock:
            due = []
            for trigger in self._triggers:
                trigger[0] -= group_reads
                if trigger[0] <= 0:
                    due.append(trigger[1])
            self._triggers = [t for t in self._triggers if t[0] > 0]
        for action in due:
            try:
                action()
            except Exception:
                log.exception("an after_reads action of the %s emulator failed", self.bus)

    # --- registers <-> arm model ----------------------------------------------------
    def _apply_commands(self) -> None:
        goal = np.empty(len(self.ids))
        enabled = np.empty(len(self.ids), dtype=bool)
        for i, sid in enumerate(self.ids):
            t = self.tables[sid]
            offset = t.get("Homing_Offset")
            # XM430: Present = Actual + Offset; STS3215: Present = Actual - Offset.
            actual = t.get("Goal_Position") - offset if self.bus == "dynamixel" else \
                _sts_target(t) + offset
            goal[i] = self.units[i].position(actual)
            enabled[i] = t.get("Torque_Enable") != 0
        self.arm.set_goal(goal)
        self.arm.set_torque_enabled(enabled)

    def _sync_registers(self, first: bool = False) -> None:
        s = self.arm.state()
        # Effort fraction for the sag: the load register where the servo has one, else PWM.
        effort = np.abs(np.where(np.isfinite(s.load), s.load, np.nan_to_num(s.pwm)))
        sag = self.faults.voltage_sag * float(np.clip(effort.max(initial=0.0), 0.0, 1.0))
        tick_ms = int(time.perf_counter() * 1000) % 32768
        for i, sid in enumerate(self.ids):
            t, u = self.tables[sid], self.units[i]
            volts = max(0.0, float(s.voltage[i]) - sag)
            offset = t.get("Homing_Offset")
            raw_q = u.raw_position(float(s.q[i]))
            if self.bus == "dynamixel":
                t.set("Present_Position", raw_q + offset)
                if first:
                    t.set("Goal_Position", raw_q + offset)
                t.set("Present_Velocity", u.raw_velocity(float(s.qd[i])))
                t.set("Present_Current", round(float(s.current[i]) / units.XM430_A_PER_UNIT))
                t.set("Present_PWM", round(float(np.nan_to_num(s.pwm[i])) * units.XM430_PWM_FULL))
                t.set("Present_Input_Voltage", round(volts / units.VOLT_PER_UNIT))
                t.set("Present_Temperature", round(float(s.temperature[i])))
                t.set("Position_Trajectory", t.get("Goal_Position"))
                t.set("Realtime_Tick", tick_ms)
                moving = abs(float(s.qd[i])) > 0.02
                t.set("Moving", int(moving))
                hw = t.get("Hardware_Error_Status")
                if sid in self.faults.alert_ids:
                    hw |= DXL_HW_OVERLOAD
                if volts < units.VOLT_PER_UNIT * t.get("Min_Voltage_Limit"):
                    hw |= DXL_HW_VOLTAGE
                t.set("Hardware_Error_Status", hw)
                if hw & t.get("Shutdown"):
                    t.set("Torque_Enable", 0)  # the firmware's shutdown rule
            else:
                t.set("Present_Position", raw_q - offset)
                if first:
                    t.set("Goal_Position", raw_q - offset)
                t.set("Present_Velocity", u.raw_velocity(float(s.qd[i])))
                t.set("Present_Load", round(float(np.nan_to_num(s.load[i])) * units.STS_LOAD_FULL))
                t.set("Present_Current", round(abs(float(s.current[i])) / units.STS_A_PER_UNIT))
                t.set("Present_Voltage", round(volts / units.VOLT_PER_UNIT))
                t.set("Present_Temperature", round(float(s.temperature[i])))
                t.set("Moving", int(abs(float(s.qd[i])) > 0.02))
                status = 0
                if sid in self.faults.alert_ids:
                    status |= scs.ERR_OVERLOAD
                if volts < units.VOLT_PER_UNIT * t.get("Min_Voltage_Limit"):
                    status |= scs.ERR_VOLTAGE
                t.set("Status", status)
                if status & t.get("Unloading_Condition"):
                    t.set("Torque_Enable", 0)
