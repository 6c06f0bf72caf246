"""Wire formats: CRC-16 test vectors (servos.md §1.2), byte stuffing, fast sync read
packets, the Feetech checksum and sign-magnitude, and the register <-> SI conversions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nactuator import servo_units as units
from nactuator.hardware.control_table import STS3215, XM430_W350, ControlTable
from nactuator.hardware.protocol import dxl2, scs

# (packet without CRC, CRC bytes as on the wire) — the e-manual examples.
CRC_VECTORS = [
    ("FF FF FD 00 01 03 00 01", "19 4E"),  # ping ID 1
    ("FF FF FD 00 01 07 00 55 00 06 04 26", "65 5D"),  # ping status
    ("FF FF FD 00 01 07 00 02 84 00 04 00", "1D 15"),  # read addr 132 len 4
    ("FF FF FD 00 FE 09 00 82 84 00 04 00 01 02", "CE FA"),  # sync read IDs 1, 2
    ("FF FF FD 00 FE 11 00 83 74 00 04 00 01 96 00 00 00 02 AA 00 00 00", "82 87"),  # sync write
    ("FF FF FD 00 FE 0D 00 92 01 90 00 02 00 02 92 00 01 00", "1A 05"),  # bulk read
    ("FF FF FD 00 FE 0A 00 8A 84 00 04 00 03 07 04", "20 F2"),  # fast sync read
]


@pytest.mark.parametrize(("packet", "crc"), CRC_VECTORS)
def test_crc16_matches_emanual_vectors(packet: str, crc: str) -> None:
    value = dxl2.crc16(bytes.fromhex(packet))
    assert bytes([value & 0xFF, value >> 8]) == bytes.fromhex(crc)


def test_instruction_packet_is_byte_exact_emanual_ping() -> None:
    assert dxl2.instruction_packet(1, dxl2.PING) == bytes.fromhex("FF FF FD 00 01 03 00 01 19 4E")


def test_crc_agrees_with_dynamixel_sdk_table() -> None:
    import dynamixel_sdk as dxl

    ph = dxl.PacketHandler(2.0)
    data = bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8))
    assert dxl2.crc16(data) == ph.updateCRC(0, list(data), len(data))


def test_byte_stuffing_round_trip_and_length() -> None:
    body = bytes([0x55, 0x00, 0xFF, 0xFF, 0xFD, 0x01, 0xFF, 0xFF, 0xFD])
    stuffed = dxl2.stuff(body)
    assert stuffed == bytes([0x55, 0x00, 0xFF, 0xFF, 0xFD, 0xFD, 0x01, 0xFF, 0xFF, 0xFD, 0xFD])
    assert dxl2.unstuff(stuffed) == body
    pkt = dxl2.status_packet(3, 0, bytes([0xFF, 0xFF, 0xFD, 0x00]))
    # LEN counts the stuffed bytes: 0x55 ERR + 5 stuffed params + CRC = 9
    assert pkt[5] | pkt[6] << 8 == 9
    [parsed] = dxl2.PacketReader().feed(pkt)
    assert parsed.crc_ok and parsed.params == bytes([0x00, 0xFF, 0xFF, 0xFD, 0x00])


def test_packet_reader_resynchronises_on_garbage_and_split_chunks() -> None:
    pkt = dxl2.instruction_packet(11, dxl2.READ, bytes([132, 0, 4, 0]))
    reader = dxl2.PacketReader()
    stream = b"\x00\xff\x12" + pkt + pkt
    got = []
    for i in range(0, len(stream), 3):  # arrive in 3-byte chunks
        got += reader.feed(stream[i : i + 3])
    assert [(p.id, p.inst, p.params, p.crc_ok) for p in got] == \
        [(11, dxl2.READ, bytes([132, 0, 4, 0]), True)] * 2
    bad = pkt[:-1] + bytes([pkt[-1] ^ 1])
    [p] = dxl2.PacketReader().feed(bad)
    assert not p.crc_ok


def test_fast_sync_read_reply_running_crcs() -> None:
    blocks = [(0, 1, bytes([1, 2, 3, 4])), (0x80, 2, bytes([5, 6, 7, 8]))]
    pkt = dxl2.fast_status_packet(blocks)
    assert pkt[4] == dxl2.BROADCAST_ID and pkt[7] == dxl2.STATUS
    assert pkt[5] | pkt[6] << 8 == 1 + 2 * (4 + 4)
    # CRC_1 covers everything up to DATA_1; CRC_2 (= packet CRC) everything before it.
    end1 = 8 + 2 + 4
    assert pkt[end1] | pkt[end1 + 1] << 8 == dxl2.crc16(pkt[:end1])
    assert pkt[-2] | pkt[-1] << 8 == dxl2.crc16(pkt[:-2])


def test_feetech_checksum_and_reader() -> None:
    # The SDK's ping of ID 1: FF FF 01 02 01 CHK with CHK = ~(1 + 2 + 1) & 0xFF = 0xFB
    assert scs.instruction_packet(1, scs.PING) == bytes.fromhex("FF FF 01 02 01 FB")
    pkt = scs.instruction_packet(6, scs.READ, bytes([56, 15]))
    [p] = scs.PacketReader().feed(b"\xff" + pkt)  # an extra FF before the header
    assert (p.id, p.inst, p.params, p.checksum_ok) == (6, scs.READ, bytes([56, 15]), True)
    [bad] = scs.PacketReader().feed(pkt[:-1] + b"\x00")
    assert not bad.checksum_ok


@pytest.mark.parametrize(("value", "bit", "raw"), [(0, 15, 0), (2047, 15, 2047),
                                                    (-5, 15, 0x8005), (-300, 10, 0x400 | 300),
                                                    (-1023, 10, 0x7FF), (-100, 11, 0x800 | 100)])
def test_sign_magnitude(value: int, bit: int, raw: int) -> None:
    assert units.encode_sign_magnitude(value, bit) == raw
    assert units.decode_sign_magnitude(raw, bit) == value


def test_sign_magnitude_rejects_overflow() -> None:
    with pytest.raises(ValueError, match="sign bit 10"):
        units.encode_sign_magnitude(1024, 10)


def test_control_table_signed_registers_and_access() -> None:
    dx = ControlTable(XM430_W350, 11)
    assert dx.get("Model_Number") == 1020 and dx.get("ID") == 11
    dx.set("Present_Current", -5)
    assert dx.read(126, 2) == (-5 & 0xFFFF).to_bytes(2, "little")
    assert dx.get("Present_Current") == -5
    assert not dx.writable(126, 2)  # read-only
    assert dx.writable(9, 1)  # EEPROM, torque off
    dx.set("Torque_Enable", 1)
    assert not dx.writable(9, 1)  # EEPROM with torque on
    assert dx.writable(116, 4)
    st = ControlTable(STS3215, 3)
    st.set("Present_Load", -250)
    assert st.read(60, 2) == (0x400 | 250).to_bytes(2, "little")
    assert st.get("Model_Number") == 777


def test_units_round_trip_and_documented_scales() -> None:
    u = units.xm430_units(prismatic=False)
    assert u.position(2048) == 0.0
    assert u.position(3072) == pytest.approx(math.pi / 2)
    assert u.velocity(1) == pytest.approx(0.0239808, rel=1e-4)  # 0.229 rpm
    g = units.xm430_units(prismatic=True)
    assert g.position(2048 + 1000) == pytest.approx(0.017626621790)
    for q in (-1.2, 0.0, 0.7):
        assert u.raw_position(q) == round(2048 + q / (2 * math.pi / 4096))
        assert abs(u.position(u.raw_position(q)) - q) <= math.pi / 4096
    s = units.sts3215_units(1000, 3000, drive_mode=1)
    assert s.position(2000) == 0.0 and s.position(2100) == pytest.approx(-100 * 2 * math.pi / 4095)
    with pytest.raises(ValueError, match="revolute"):
        units.motor_units("feetech", prismatic=True)


def test_sign_magnitude_works_alike_on_arrays_as_the_world_uses_it() -> None:
    values = np.array([[0, 5, -5], [-1023, 1023, -300]])
    raw = units.encode_sign_magnitude(values, 10)
    assert raw.dtype == np.int64
    assert raw.tolist() == [[units.encode_sign_magnitude(int(v), 10) for v in row]
                            for row in values]
    np.testing.assert_array_equal(units.decode_sign_magnitude(raw, 10), values)
    with pytest.raises(ValueError, match="sign bit 10"):
        units.encode_sign_magnitude(np.array([3, -1024]), 10)


def _sdk_address_parameters() -> dict[str, dict[str, int]]:
    """Every vendor-SDK callable that takes a register address or a data length: {name:
    {parameter: position}}, read from the SDKs' own signatures."""
    import inspect

    import dynamixel_sdk
    import scservo_sdk

    found: dict[str, dict[str, int]] = {}
    for sdk in (dynamixel_sdk, scservo_sdk):
        classes = [c for _, c in inspect.getmembers(sdk, inspect.isclass)]
        classes.append(type(sdk.PacketHandler(2.0 if sdk is dynamixel_sdk else 0)))
        for cls in classes:
            for name, fn in inspect.getmembers(cls, inspect.isfunction):
                params = list(inspect.signature(fn).parameters)[1:]  # without self
                wanted = {p: i for i, p in enumerate(params)
                          if "address" in p or p in ("length", "data_length")}
                if wanted:
                    found.setdefault(cls.__name__ if name == "__init__" else name,
                                     {}).update(wanted)
    return found


def test_buses_take_every_register_address_from_the_control_table() -> None:
    # A register address or length written as a number (or a constant of the bus's own)
    # in a bus module is a second copy of the control table; every SDK call must get its
    # address from a control-table Register / RegisterBlock (``reg.address``,
    # ``TELEMETRY.address``) and its length likewise (``.size`` / ``.length``).
    import ast
    from pathlib import Path

    import nactuator.hardware

    sdk = _sdk_address_parameters()
    assert {"read1ByteTxRx", "syncReadTx", "write1ByteTxOnly", "GroupSyncRead"} <= set(sdk)
    root = Path(nactuator.hardware.__file__).parent
    bad, calls = [], 0
    # Every module of the bus (its parts: wire, telemetry, torque, watchdog, goals; the
    # protocols), not a list that a new part could escape.
    for path in sorted(root.glob("*.py")):
        module = path.name
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in sdk):
                continue
            calls += 1
            for param, pos in sdk[node.func.attr].items():
                arg = next((k.value for k in node.keywords if k.arg == param),
                           node.args[pos] if pos < len(node.args) else None)
                want = ("address",) if "address" in param else ("length", "size")
                if arg is not None and not (isinstance(arg, ast.Attribute)
                                            and arg.attr in want):
                    bad.append(f"{module}:{node.lineno} {node.func.attr}({param}="
                               f"{ast.unparse(arg)})")
    assert calls >= 10  # the helpers and the telemetry reads were all seen
    assert not bad, "register addresses/lengths not from control_table.py: " + "; ".join(bad)


def test_telemetry_blocks_come_from_the_control_tables() -> None:
    from nactuator.hardware.dynamixel import DynamixelTelemetryBus
    from nactuator.hardware.feetech import FeetechTelemetryBus

    dx, st = DynamixelTelemetryBus.telemetry, FeetechTelemetryBus.telemetry
    assert (str(dx), str(st)) == ("124..146 (23 bytes)", "56..70 (15 bytes)")  # servos.md
    assert DynamixelTelemetryBus.spec is XM430_W350 and FeetechTelemetryBus.spec is STS3215
    # Decoded by name exactly as the emulated servo's control table encodes each register.
    table = ControlTable(STS3215, 1)
    for name, value in {"Present_Position": -1234, "Present_Velocity": 350,
                        "Present_Load": -412, "Present_Current": 77}.items():
        table.set(name, value)
    got = st.decode(table.read(st.address, st.length))
    assert {k: got[k] for k in ("Present_Position", "Present_Velocity", "Present_Load",
                                "Present_Current")} == {
        "Present_Position": -1234, "Present_Velocity": 350, "Present_Load": -412,
        "Present_Current": 77}
