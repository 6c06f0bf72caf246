"""Feetech SCS/STS packets (servos.md §4).

Instruction: ``FF FF | ID | LEN | INST | params | CHK`` with LEN = len(params) + 2.
Status:      ``FF FF | ID | LEN | ERR | params | CHK``.
CHK = ~(ID + LEN + INST/ERR + sum(params)) & 0xFF. No CRC, no byte stuffing. STS servos
are little-endian (``PacketHandler(0)``); their signed registers are sign-magnitude
(:func:`nactuator.servo_units.decode_sign_magnitude`).
"""

from __future__ import annotations

from dataclasses import dataclass

BROADCAST_ID = 0xFE
PING, READ, WRITE, REG_WRITE, ACTION = 0x01, 0x02, 0x03, 0x04, 0x05
SYNC_READ, SYNC_WRITE = 0x82, 0x83

# Status ERR bits (the SDK rejects ERR > 0x7F, so bit 7 is never used).
ERR_VOLTAGE, ERR_ANGLE, ERR_OVERHEAT, ERR_OVERCURRENT, ERR_OVERLOAD = 1, 2, 4, 8, 32
ERR_NAMES = {
    ERR_VOLTAGE: "input voltage",
    ERR_ANGLE: "angle sensor",
    ERR_OVERHEAT: "overheat",
    ERR_OVERCURRENT: "over-current",
    ERR_OVERLOAD: "overload",
}


def checksum(body: bytes) -> int:
    """``body`` = ID, LEN, INST/ERR, params."""
    return ~sum(body) & 0xFF


def _packet(scs_id: int, first: int, params: bytes) -> bytes:
    body = bytes([scs_id, len(params) + 2, first]) + bytes(params)
    return b"\xff\xff" + body + bytes([checksum(body)])


def instruction_packet(scs_id: int, inst: int, params: bytes = b"") -> bytes:
    return _packet(scs_id, inst, params)


def status_packet(scs_id: int, error: int, params: bytes = b"") -> bytes:
    return _packet(scs_id, error, params)


def error_text(error: int) -> str:
    names = [name for bit, name in ERR_NAMES.items() if error & bit]
    return ", ".join(names) if names else f"unknown error bits 0x{error:02X}"


@dataclass(frozen=True)
class Packet:
    id: int
    inst: int
    params: bytes
    checksum_ok: bool


class PacketReader:
    """Reassembles instruction packets from a byte stream; bad checksums are flagged."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        self._buf += data
        packets = []
        while True:
            start = self._buf.find(b"\xff\xff")
            if start < 0:
                del self._buf[: max(0, len(self._buf) - 1)]
                return packets
            del self._buf[:start]
            # A run of FF: the header is the last two FFs before the ID.
            while len(self._buf) > 2 and self._buf[2] == 0xFF:
                del self._buf[:1]
            if len(self._buf) < 4:
                return packets
            length = self._buf[3]
            if length < 2:
                del self._buf[:2]
                continue
            total = 4 + length
            if len(self._buf) < total:
                return packets
            raw = bytes(self._buf[:total])
            del self._buf[:total]
            ok = checksum(raw[2:-1]) == raw[-1]
            packets.append(Packet(id=raw[2], inst=raw[4], params=raw[5:-1], checksum_ok=ok))
