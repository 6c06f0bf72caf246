"""The servos' firmware: answer instruction packets from their control tables.

One class per protocol. ``handle(packet)`` returns the reply packets in wire order; it
never sleeps or writes (timing and fault injection belong to the emulator loop). Dead
servos are silent; a fast sync/bulk read stops at the first dead servo, because the real
chain is broken there and the client sees an incomplete packet.

Malformed instructions (a parameter block that does not fit the instruction) are answered
as the protocol prescribes and never stop the firmware: DYNAMIXEL replies with a Data
Length Error (an undefined instruction, or ACTION without REG_WRITE, with an Instruction
Error); the Feetech SCS protocol has no error code for it (its status bits are all hardware
conditions), so an STS3215 ignores such a packet as it ignores a bad checksum.
"""

from __future__ import annotations

from collections.abc import Iterable

from nactuator.hardware.control_table import (
    XM430_BUS_WATCHDOG_EXPIRED,
    XM430_BUS_WATCHDOG_MAX,
    XM430_GOAL_REGISTERS,
    ControlTable,
)
from nactuator.hardware.protocol import dxl2, scs


class MalformedInstruction(ValueError):
    """The parameter block does not fit the instruction (too short, wrong block sizes)."""


def _u16(b: bytes, i: int) -> int:
    if i + 2 > len(b):
        raise MalformedInstruction(f"parameter bytes {i}..{i + 1} missing ({len(b)} given)")
    return b[i] | (b[i + 1] << 8)


def _need(prm: bytes, n: int, exact: bool = False) -> None:
    if len(prm) < n or (exact and len(prm) != n):
        want = f"{n}" if exact else f"at least {n}"
        raise MalformedInstruction(f"{want} parameter bytes needed, {len(prm)} given")


# XM430 e-manual: in Position Control Mode (3) Goal Position must lie within Min/Max
# Position Limit; in Extended Position (4) and Current-based Position (5) modes within
# +-1,048,575. Goal PWM/Current/Velocity must lie within +-their limit registers.
DXL_POSITION_MODE, DXL_EXTENDED_MODES, DXL_MULTI_TURN = 3, (4, 5), 1_048_575
DXL_GOAL_LIMITS = {"Goal_PWM": "PWM_Limit", "Goal_Current": "Current_Limit",
                   "Goal_Velocity": "Velocity_Limit"}


class DynamixelServos:
    """Protocol 2.0 firmware for a chain of XM430s (servos.md §1)."""

    def __init__(self, tables: dict[int, ControlTable], dead: set[int]) -> None:
        self.tables = tables
        self.dead = dead  # shared with Faults: mutations take effect at once
        self._registered: dict[int, tuple[int, bytes]] = {}
        self.malformed = 0  # instructions answered with a Data Length Error

    def _alive(self, ids: Iterable[int]) -> list[int]:
        return [i for i in ids if i in self.tables and i not in self.dead]

    def _error(self, sid: int, code: int = 0) -> int:
        alert = dxl2.ERR_ALERT if self.tables[sid].get("Hardware_Error_Status") else 0
        return alert | code

    def _status(self, sid: int, code: int = 0, params: bytes = b"") -> bytes:
        return dxl2.status_packet(sid, self._error(sid, code), params)

    def _replies_to(self, sid: int, is_read: bool) -> bool:
        level = self.tables[sid].get("Status_Return_Level")
        return level >= 2 or (is_read and level >= 1)

    def _read(self, sid: int, addr: int, length: int) -> tuple[int, bytes]:
        t = self.tables[sid]
        if not t.in_range(addr, length):
            return dxl2.ERR_ACCESS, b""  # e-manual: reading an undefined address
        return 0, t.read(addr, length)

    def _write(self, sid: int, addr: int, data: bytes) -> int:
        t = self.tables[sid]
        if not t.in_range(addr, len(data)):
            return dxl2.ERR_ACCESS  # e-manual: writing an undefined address
        if not t.writable(addr, len(data)):
            return dxl2.ERR_ACCESS
        if t.splits_register(addr, len(data)):
            return dxl2.ERR_DATA_LENGTH  # e.g. 2 bytes into a 4-byte register
        if self._watchdog_refuses(t, addr, data):
            return dxl2.ERR_DATA_RANGE  # e-manual, Bus Watchdog(98): see emulator/watchdog.py
        if self._over_limit(t, addr, data):
            return dxl2.ERR_DATA_LIMIT  # the value is refused, the register keeps its own
        t.write(addr, data)
        return 0

    @staticmethod
    def _watchdog_refuses(t: ControlTable, addr: int, data: bytes) -> bool:
        """After a Bus Watchdog Error the goal registers are read-only, and only 0 clears
        the error; a Bus Watchdog value outside 0..127 is never accepted."""
        new = t.values_in(addr, data)
        expired = t.get("Bus_Watchdog") == XM430_BUS_WATCHDOG_EXPIRED
        if expired and any(goal in new for goal in XM430_GOAL_REGISTERS):
            return True
        if "Bus_Watchdog" in new:
            period = new["Bus_Watchdog"]
            return not 0 <= period <= XM430_BUS_WATCHDOG_MAX or (expired and period != 0)
        return False

    @staticmethod
    def _over_limit(t: ControlTable, addr: int, data: bytes) -> bool:
        new = t.values_in(addr, data)
        if "Goal_Position" in new:
            mode = new.get("Operating_Mode", t.get("Operating_Mode"))
            goal = new["Goal_Position"]
            if mode == DXL_POSITION_MODE and not (
                    t.get("Min_Position_Limit") <= goal <= t.get("Max_Position_Limit")):
                return True
            if mode in DXL_EXTENDED_MODES and abs(goal) > DXL_MULTI_TURN:
                return True
        return any(abs(new[goal]) > t.get(limit)
                   for goal, limit in DXL_GOAL_LIMITS.items() if goal in new)

    def handle(self, p: dxl2.Packet) -> list[bytes]:
        broadcast = p.id == dxl2.BROADCAST_ID
        if not broadcast and p.id not in self._alive([p.id]):
            return []
        if not p.crc_ok:
            return [] if broadcast else [self._status(p.id, dxl2.ERR_CRC)]
        try:
            return self._execute(p, broadcast)
        except MalformedInstruction:
            self.malformed += 1
            return [] if broadcast else [self._status(p.id, dxl2.ERR_DATA_LENGTH)]

    def failure_reply(self, p: dxl2.Packet) -> list[bytes]:
        """What the servo answers when it could not process a packet (Result Fail)."""
        if p.id == dxl2.BROADCAST_ID or p.id not in self._alive([p.id]):
            return []
        return [self._status(p.id, dxl2.ERR_RESULT_FAIL)]

    def _execute(self, p: dxl2.Packet, broadcast: bool) -> list[bytes]:
        prm = p.params
        if p.inst == dxl2.PING:
            ids = self._alive(sorted(self.tables)) if broadcast else [p.id]
            return [self._status(i, 0, self._ping_data(i)) for i in ids]
        if p.inst == dxl2.READ:
            _need(prm, 4, exact=True)
            if broadcast:
                return []
            code, data = self._read(p.id, _u16(prm, 0), _u16(prm, 2))
            return [self._status(p.id, code, data)] if self._replies_to(p.id, True) else []
        if p.inst in (dxl2.WRITE, dxl2.REG_WRITE):
            _need(prm, 3)
            addr, data = _u16(prm, 0), prm[2:]
            if p.inst == dxl2.WRITE:
                codes = [self._write(sid, addr, data)
                         for sid in self._alive(self.tables if broadcast else [p.id])]
                code = codes[0] if codes else 0
            elif broadcast:
                return []
            else:
                self._registered[p.id] = (addr, data)
                self.tables[p.id].set("Registered_Instruction", 1)
                code = 0
            if broadcast or not self._replies_to(p.id, False):
                return []
            return [self._status(p.id, code)]
        if p.inst == dxl2.ACTION:
            ids = self._alive(self.tables if broadcast else [p.id])
            if not broadcast and p.id not in self._registered:
                # e-manual: "Action has been used without Reg Write" is an Instruction Error.
                return [self._status(p.id, dxl2.ERR_INSTRUCTION)]
            for sid in ids:
                if sid in self._registered:
                    addr, data = self._registered.pop(sid)
                    self._write(sid, addr, data)
                    self.tables[sid].set("Registered_Instruction", 0)
            return [] if broadcast else [self._status(p.id)]
        if p.inst == dxl2.REBOOT:
            for sid in self._alive(self.tables if broadcast else [p.id]):
                self.tables[sid].set("Hardware_Error_Status", 0)
                self.tables[sid].set("Torque_Enable", 0)
            return [] if broadcast else [self._status(p.id)]
        if p.inst in (dxl2.CLEAR, dxl2.FACTORY_RESET):
            # Multi-turn clear / factory reset: nothing the emulated arm keeps needs undoing.
            _need(prm, 1)
            return [] if broadcast else [self._status(p.id)]
        if p.inst in (dxl2.SYNC_READ, dxl2.FAST_SYNC_READ):
            _need(prm, 4)
            addr, length = _u16(prm, 0), _u16(prm, 2)
            return self._group_read([(i, addr, length) for i in prm[4:]],
                                    fast=p.inst == dxl2.FAST_SYNC_READ)
        if p.inst in (dxl2.BULK_READ, dxl2.FAST_BULK_READ):
            if not prm or len(prm) % 5:
                raise MalformedInstruction(f"bulk read blocks are 5 bytes, got {len(prm)}")
            reqs = [(prm[k], _u16(prm, k + 1), _u16(prm, k + 3)) for k in range(0, len(prm), 5)]
            return self._group_read(reqs, fast=p.inst == dxl2.FAST_BULK_READ)
        if p.inst == dxl2.SYNC_WRITE:
            _need(prm, 4)
            addr, length = _u16(prm, 0), _u16(prm, 2)
            if length == 0 or (len(prm) - 4) % (length + 1):
                raise MalformedInstruction(f"sync write blocks of 1 + {length} bytes do not "
                                           f"fill {len(prm) - 4} bytes")
            for k in range(4, len(prm), length + 1):
                sid = prm[k]
                if sid in self._alive([sid]):
                    self._write(sid, addr, prm[k + 1 : k + 1 + length])
            return []
        if p.inst == dxl2.BULK_WRITE:
            blocks, k = [], 0
            while k < len(prm):
                _need(prm[k:], 5)
                sid, addr, length = prm[k], _u16(prm, k + 1), _u16(prm, k + 3)
                _need(prm[k + 5 :], length)
                blocks.append((sid, addr, prm[k + 5 : k + 5 + length]))
                k += 5 + length
            for sid, addr, data in blocks:
                if sid in self._alive([sid]):
                    self._write(sid, addr, data)
            return []
        return [] if broadcast else [self._status(p.id, dxl2.ERR_INSTRUCTION)]

    def _ping_data(self, sid: int) -> bytes:
        t = self.tables[sid]
        model = t.get("Model_Number")
        return bytes([model & 0xFF, model >> 8, t.get("Firmware_Version")])

    def _group_read(self, reqs: list[tuple[int, int, int]], fast: bool) -> list[bytes]:
        if not fast:
            out = []
            for sid, addr, length in reqs:
                if sid in self._alive([sid]):
                    code, data = self._read(sid, addr, length)
                    out.append(self._status(sid, code, data))
            return out
        blocks = []
        for sid, addr, length in reqs:
            if sid not in self._alive([sid]):
                break  # the chain is broken here
            code, data = self._read(sid, addr, length)
            blocks.append((self._error(sid, code), sid, data.ljust(length, b"\x00")))
        if not blocks:
            return []
        # Devices before a break did answer, under a header that promised all of them:
        # the client sees an incomplete packet and times out.
        promised = 1 + sum(length + 4 for _, _, length in reqs)
        return [dxl2.fast_status_packet(blocks, length=promised)]


class FeetechServos:
    """SCS/STS firmware for a chain of STS3215s (servos.md §4). Bad checksums and malformed
    instructions are ignored (no reply): the protocol has no status code for either.

    A Goal_Position outside Min/Max_Position_Limit is accepted as written (no error bit, the
    register keeps the value) and the servo drives to the nearest limit instead, as the
    STS3215 firmware does (reported in huggingface/lerobot#3585)."""

    def __init__(self, tables: dict[int, ControlTable], dead: set[int]) -> None:
        self.tables = tables
        self.dead = dead
        self._registered: dict[int, tuple[int, bytes]] = {}
        self.malformed = 0  # instructions ignored because their parameters did not fit

    def _alive(self, ids: Iterable[int]) -> list[int]:
        return [i for i in ids if i in self.tables and i not in self.dead]

    def _status(self, sid: int, params: bytes = b"") -> bytes:
        return scs.status_packet(sid, self.tables[sid].get("Status") & 0x7F, params)

    def _replies_to_write(self, sid: int) -> bool:
        return self.tables[sid].get("Response_Status_Level") >= 1

    def _write(self, sid: int, addr: int, data: bytes) -> None:
        t = self.tables[sid]
        if t.in_range(addr, len(data)) and t.writable(addr, len(data)):
            t.write(addr, data)

    def handle(self, p: scs.Packet) -> list[bytes]:
        broadcast = p.id == scs.BROADCAST_ID
        if not p.checksum_ok or (not broadcast and p.id not in self._alive([p.id])):
            return []
        try:
            return self._execute(p, broadcast)
        except MalformedInstruction:
            self.malformed += 1
            return []

    def failure_reply(self, p: scs.Packet) -> list[bytes]:
        return []  # no status code says "could not process": the servo stays silent

    def _execute(self, p: scs.Packet, broadcast: bool) -> list[bytes]:
        prm = p.params
        if p.inst == scs.PING:
            ids = self._alive(sorted(self.tables)) if broadcast else [p.id]
            return [self._status(i) for i in ids]
        if p.inst == scs.READ:
            _need(prm, 2, exact=True)
            if broadcast:
                return []
            addr, length = prm[0], prm[1]
            t = self.tables[p.id]
            data = t.read(addr, length) if t.in_range(addr, length) else b""
            return [self._status(p.id, data)]
        if p.inst == scs.WRITE:
            _need(prm, 2)
            for sid in self._alive(self.tables if broadcast else [p.id]):
                self._write(sid, prm[0], prm[1:])
            ok = not broadcast and self._replies_to_write(p.id)
            return [self._status(p.id)] if ok else []
        if p.inst == scs.REG_WRITE:
            _need(prm, 2)
            if broadcast:
                return []
            self._registered[p.id] = (prm[0], prm[1:])
            return [self._status(p.id)] if self._replies_to_write(p.id) else []
        if p.inst == scs.ACTION:
            for sid in self._alive(self.tables if broadcast else [p.id]):
                if sid in self._registered:
                    self._write(sid, *self._registered.pop(sid))
            return []
        if p.inst == scs.SYNC_READ:
            _need(prm, 2)
            addr, length = prm[0], prm[1]
            return [self._status(sid, self.tables[sid].read(addr, length))
                    for sid in self._alive(prm[2:])
                    if self.tables[sid].in_range(addr, length)]
        if p.inst == scs.SYNC_WRITE:
            _need(prm, 2)
            addr, length = prm[0], prm[1]
            if length == 0 or (len(prm) - 2) % (length + 1):
                raise MalformedInstruction(f"sync write blocks of 1 + {length} bytes do not "
                                           f"fill {len(prm) - 2} bytes")
            for k in range(2, len(prm), length + 1):
                sid = prm[k]
                if sid in self._alive([sid]):
                    self._write(sid, addr, prm[k + 1 : k + 1 + length])
            return []
        return []
