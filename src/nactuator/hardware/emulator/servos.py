"""The servos' firmware: answer instruction packets from their control tables.

One class per protocol. ``handle(packet)`` returns the reply packets in wire order; it
never sleeps or writes (timing and fault injection belong to the emulator loop). Dead
servos are silent; a fast sync/bulk read stops at the first dead servo, because the real
chain is broken there and the client sees an incomplete packet.
"""

from __future__ import annotations

from collections.abc import Iterable

from nactuator.hardware.control_table import ControlTable
from nactuator.hardware.protocol import dxl2, scs


def _u16(b: bytes, i: int) -> int:
    return b[i] | (b[i + 1] << 8)


class DynamixelServos:
    """Protocol 2.0 firmware for a chain of XM430s (servos.md §1)."""

    def __init__(self, tables: dict[int, ControlTable], dead: set[int]) -> None:
        self.tables = tables
        self.dead = dead  # shared with Faults: mutations take effect at once
        self._registered: dict[int, tuple[int, bytes]] = {}

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
            return dxl2.ERR_DATA_RANGE, b""
        return 0, t.read(addr, length)

    def _write(self, sid: int, addr: int, data: bytes) -> int:
        t = self.tables[sid]
        if not t.in_range(addr, len(data)):
            return dxl2.ERR_DATA_RANGE
        if not t.writable(addr, len(data)):
            return dxl2.ERR_ACCESS
        t.write(addr, data)
        return 0

    def handle(self, p: dxl2.Packet) -> list[bytes]:
        broadcast = p.id == dxl2.BROADCAST_ID
        if not broadcast and p.id not in self._alive([p.id]):
            return []
        if not p.crc_ok:
            return [] if broadcast else [self._status(p.id, dxl2.ERR_CRC)]
        prm = p.params
        if p.inst == dxl2.PING:
            ids = self._alive(sorted(self.tables)) if broadcast else [p.id]
            return [self._status(i, 0, self._ping_data(i)) for i in ids]
        if p.inst in (dxl2.READ, dxl2.WRITE, dxl2.REG_WRITE) and broadcast:
            if p.inst == dxl2.WRITE:
                for sid in self._alive(self.tables):
                    self._write(sid, _u16(prm, 0), prm[2:])
            return []
        if p.inst == dxl2.READ:
            code, data = self._read(p.id, _u16(prm, 0), _u16(prm, 2))
            return [self._status(p.id, code, data)] if self._replies_to(p.id, True) else []
        if p.inst == dxl2.WRITE:
            code = self._write(p.id, _u16(prm, 0), prm[2:])
            return [self._status(p.id, code)] if self._replies_to(p.id, False) else []
        if p.inst == dxl2.REG_WRITE:
            self._registered[p.id] = (_u16(prm, 0), prm[2:])
            self.tables[p.id].set("Registered_Instruction", 1)
            return [self._status(p.id)] if self._replies_to(p.id, False) else []
        if p.inst == dxl2.ACTION:
            for sid in self._alive(self.tables if broadcast else [p.id]):
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
            return [] if broadcast else [self._status(p.id)]
        if p.inst in (dxl2.SYNC_READ, dxl2.FAST_SYNC_READ):
            addr, length = _u16(prm, 0), _u16(prm, 2)
            return self._group_read([(i, addr, length) for i in prm[4:]],
                                    fast=p.inst == dxl2.FAST_SYNC_READ)
        if p.inst in (dxl2.BULK_READ, dxl2.FAST_BULK_READ):
            reqs = [(prm[k], _u16(prm, k + 1), _u16(prm, k + 3)) for k in range(0, len(prm), 5)]
            return self._group_read(reqs, fast=p.inst == dxl2.FAST_BULK_READ)
        if p.inst == dxl2.SYNC_WRITE:
            addr, length = _u16(prm, 0), _u16(prm, 2)
            for k in range(4, len(prm), length + 1):
                sid = prm[k]
                if sid in self._alive([sid]):
                    self._write(sid, addr, prm[k + 1 : k + 1 + length])
            return []
        if p.inst == dxl2.BULK_WRITE:
            k = 0
            while k + 5 <= len(prm):
                sid, addr, length = prm[k], _u16(prm, k + 1), _u16(prm, k + 3)
                if sid in self._alive([sid]):
                    self._write(sid, addr, prm[k + 5 : k + 5 + length])
                k += 5 + length
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
    """SCS/STS firmware for a chain of STS3215s (servos.md §4). Bad checksums are ignored
    (no reply), as the servo cannot tell it was addressed."""

    def __init__(self, tables: dict[int, ControlTable], dead: set[int]) -> None:
        self.tables = tables
        self.dead = dead
        self._registered: dict[int, tuple[int, bytes]] = {}

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
        prm = p.params
        if p.inst == scs.PING:
            ids = self._alive(sorted(self.tables)) if broadcast else [p.id]
            return [self._status(i) for i in ids]
        if p.inst == scs.READ and not broadcast:
            addr, length = prm[0], prm[1]
            t = self.tables[p.id]
            data = t.read(addr, length) if t.in_range(addr, length) else b""
            return [self._status(p.id, data)]
        if p.inst == scs.WRITE:
            for sid in self._alive(self.tables if broadcast else [p.id]):
                self._write(sid, prm[0], prm[1:])
            ok = not broadcast and self._replies_to_write(p.id)
            return [self._status(p.id)] if ok else []
        if p.inst == scs.REG_WRITE and not broadcast:
            self._registered[p.id] = (prm[0], prm[1:])
            return [self._status(p.id)] if self._replies_to_write(p.id) else []
        if p.inst == scs.ACTION:
            for sid in self._alive(self.tables if broadcast else [p.id]):
                if sid in self._registered:
                    self._write(sid, *self._registered.pop(sid))
            return []
        if p.inst == scs.SYNC_READ:
            addr, length = prm[0], prm[1]
            return [self._status(sid, self.tables[sid].read(addr, length))
                    for sid in self._alive(prm[2:])]
        if p.inst == scs.SYNC_WRITE:
            addr, length = prm[0], prm[1]
            for k in range(2, len(prm), length + 1):
                sid = prm[k]
                if sid in self._alive([sid]):
                    self._write(sid, addr, prm[k + 1 : k + 1 + length])
            return []
        return []
