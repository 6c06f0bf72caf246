"""DYNAMIXEL Protocol 2.0 packets (e-manual "Protocol 2.0"; facts in servos.md §1).

Instruction: ``FF FF FD 00 | ID | LEN_L LEN_H | INST | params | CRC_L CRC_H``.
Status:      ``FF FF FD 00 | ID | LEN_L LEN_H | 55 | ERR | params | CRC_L CRC_H``.
LEN counts INST..CRC after byte stuffing; the CRC (CRC-16/BUYPASS) covers the stuffed
packet from the first FF to the last parameter byte.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER = bytes([0xFF, 0xFF, 0xFD, 0x00])
BROADCAST_ID = 0xFE
STATUS = 0x55

PING, READ, WRITE, REG_WRITE, ACTION = 0x01, 0x02, 0x03, 0x04, 0x05
FACTORY_RESET, REBOOT, CLEAR = 0x06, 0x08, 0x10
SYNC_READ, SYNC_WRITE, FAST_SYNC_READ = 0x82, 0x83, 0x8A
BULK_READ, BULK_WRITE, FAST_BULK_READ = 0x92, 0x93, 0x9A

# Status ERR byte: bit 7 = hardware alert, bits 0..6 = result code.
ERR_ALERT = 0x80
ERR_RESULT_FAIL, ERR_INSTRUCTION, ERR_CRC = 1, 2, 3
ERR_DATA_RANGE, ERR_DATA_LENGTH, ERR_DATA_LIMIT, ERR_ACCESS = 4, 5, 6, 7


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return table


_CRC_TABLE = _crc_table()


def crc16(data: bytes | bytearray, crc: int = 0) -> int:
    """CRC-16/BUYPASS (poly 0x8005, init 0, no reflection); ``crc`` continues a running CRC."""
    for b in data:
        crc = ((crc << 8) ^ _CRC_TABLE[((crc >> 8) ^ b) & 0xFF]) & 0xFFFF
    return crc


def stuff(body: bytes) -> bytes:
    """Insert an extra FD after every FF FF FD inside INST..params (the header is excluded)."""
    out = bytearray()
    for b in body:
        out.append(b)
        if b == 0xFD and len(out) >= 3 and out[-3] == 0xFF and out[-2] == 0xFF:
            out.append(0xFD)
    return bytes(out)


def unstuff(body: bytes) -> bytes:
    """Remove the FD that stuffing inserted after each FF FF FD. Only an FD is removed:
    dynamixel_sdk's Python ``addStuffing`` never reaches the packet it sends (it rebinds a
    local list), so its instructions arrive unstuffed and FF FF FD 00 must stay intact."""
    out = bytearray()
    i = 0
    while i < len(body):
        out.append(body[i])
        if (body[i] == 0xFD and len(out) >= 3 and out[-3] == 0xFF and out[-2] == 0xFF
                and i + 1 < len(body) and body[i + 1] == 0xFD):
            i += 1  # skip the stuffed FD
        i += 1
    return bytes(out)


def _packet(dxl_id: int, body: bytes, stuffing: bool = True) -> bytes:
    # Stuffing the body in isolation is exact: LEN_H (<= 4) can never be FF, so no FF FF FD
    # straddles the header/body boundary.
    if stuffing:
        body = stuff(body)
    length = len(body) + 2
    pkt = HEADER + bytes([dxl_id, length & 0xFF, length >> 8]) + body
    crc = crc16(pkt)
    return pkt + bytes([crc & 0xFF, crc >> 8])


def instruction_packet(dxl_id: int, inst: int, params: bytes = b"") -> bytes:
    return _packet(dxl_id, bytes([inst]) + bytes(params))


def status_packet(dxl_id: int, error: int, params: bytes = b"") -> bytes:
    return _packet(dxl_id, bytes([STATUS, error]) + bytes(params))


def fast_status_packet(blocks: list[tuple[int, int, bytes]], length: int | None = None) -> bytes:
    """One aggregated FAST_SYNC_READ/FAST_BULK_READ reply for ``[(error, id, data), ...]``.

    Not stuffed. Each device's CRC_i is the running CRC from the first FF to the end of its
    data (earlier CRC_j included); the last CRC_i is the packet CRC. ``length`` overrides
    the LEN field: a chain broken at a dead servo sends a header that promised more.
    """
    if length is None:  # 0x55, then ERR ID DATA CRC per device
        length = 1 + sum(len(d) + 4 for _, _, d in blocks)
    pkt = bytearray(HEADER + bytes([BROADCAST_ID, length & 0xFF, length >> 8, STATUS]))
    for error, dxl_id, data in blocks:
        pkt += bytes([error, dxl_id]) + bytes(data)
        crc = crc16(pkt)
        pkt += bytes([crc & 0xFF, crc >> 8])
    return bytes(pkt)


@dataclass(frozen=True)
class Packet:
    """One received packet with stuffing removed. For status packets ``inst`` is 0x55."""

    id: int
    inst: int
    params: bytes
    crc_ok: bool


class PacketReader:
    """Reassembles packets from a byte stream (bytes may arrive in any chunking).

    Garbage before a header is skipped; a packet with a bad CRC is returned with
    ``crc_ok=False`` so a servo can answer with a CRC error, as the real firmware does.
    """

    MAX_LEN = 1024

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        self._buf += data
        packets = []
        while True:
            start = self._buf.find(HEADER)
            if start < 0:
                # keep a possible partial header at the end
                del self._buf[: max(0, len(self._buf) - 3)]
                return packets
            del self._buf[:start]
            if len(self._buf) < 7:
                return packets
            length = self._buf[5] | (self._buf[6] << 8)
            if length < 3 or length > self.MAX_LEN:
                del self._buf[:1]  # not a real header; resynchronise
                continue
            total = 7 + length
            if len(self._buf) < total:
                return packets
            raw = bytes(self._buf[:total])
            del self._buf[:total]
            crc_ok = crc16(raw[:-2]) == (raw[-2] | (raw[-1] << 8))
            body = unstuff(raw[7:-2])
            packets.append(Packet(id=raw[4], inst=body[0], params=body[1:], crc_ok=crc_ok))
