"""Real SDK bytes over a pty: dynamixel_sdk, scservo_sdk and both LeRobot buses against the
emulated servos (protocol behaviour; the arm model is a fixed pose so values are exact)."""

from __future__ import annotations

import time

import dynamixel_sdk as dxl
import numpy as np
import pytest
import scservo_sdk as scs_sdk

from nactuator.hardware import units
from nactuator.hardware.emulator import ArmState, Emulator, Faults

Q = np.array([0.5, -0.4, 0.3, -0.2, 0.01, 0.9])


class FixedArm:
    """An arm model that holds one known state (negative efforts included)."""

    dt = 0.002

    def __init__(self, n: int) -> None:
        self.n = n
        self.goal = None
        self.enabled = np.zeros(n, dtype=bool)

    def set_goal(self, q):
        self.goal = np.asarray(q)

    def set_torque_enabled(self, e):
        self.enabled = np.asarray(e)

    def step(self, dt):
        pass

    def state(self) -> ArmState:
        n = self.n
        return ArmState(q=Q[:n].copy(), qd=np.linspace(-1, 1, n), current=np.full(n, -0.5),
                        load=np.full(n, -0.25), pwm=np.full(n, -0.3),
                        voltage=np.full(n, 11.9), temperature=np.full(n, 41.0))


@pytest.fixture(scope="module")
def dxl_emu():
    with Emulator("dynamixel", "omx", arm=FixedArm(5), faults=Faults(alert_ids={15})) as emu:
        yield emu


@pytest.fixture(scope="module")
def sts_emu():
    with Emulator("feetech", "so101", arm=FixedArm(6)) as emu:
        yield emu


def no_spin(port) -> None:
    """The SDKs poll read() with timeout=0, burning the CPU (and the GIL the in-process
    emulator needs) while they wait; a 2 ms read timeout makes them wait in select()
    instead. Protocol behaviour is unchanged (the bus layer does the same)."""
    port.ser.timeout = 0.002


@pytest.fixture
def dxl_port(dxl_emu):
    port = dxl.PortHandler(dxl_emu.port)
    assert port.openPort() and port.setBaudRate(1_000_000)
    no_spin(port)
    yield port, dxl.PacketHandler(2.0)
    port.closePort()


@pytest.fixture
def sts_port(sts_emu):
    port = scs_sdk.PortHandler(sts_emu.port)
    assert port.openPort() and port.setBaudRate(1_000_000)
    no_spin(port)
    yield port, scs_sdk.PacketHandler(0)
    port.closePort()


def connect_lerobot(bus) -> None:
    """``bus.connect()`` split in two so the port stops spinning before the handshake;
    the handshake (ping + model number check, Feetech: firmware check) is LeRobot's own."""
    bus.connect(handshake=False)
    no_spin(bus.port_handler)
    bus._handshake()


def _s32(v: int) -> int:
    return v - (1 << 32) if v & (1 << 31) else v


def test_dynamixel_ping_read_write(dxl_port) -> None:
    port, ph = dxl_port
    model, comm, err = ph.ping(port, 11)
    assert (model, comm, err) == (1020, dxl.COMM_SUCCESS, 0)
    fw, comm, _ = ph.read1ByteTxRx(port, 11, 6)
    assert comm == dxl.COMM_SUCCESS and fw >= 45
    raw, comm, _ = ph.read4ByteTxRx(port, 12, 132)
    assert comm == dxl.COMM_SUCCESS
    assert raw == units.xm430_units(False).raw_position(Q[1])
    comm, err = ph.write4ByteTxRx(port, 12, 116, 1500)
    assert (comm, err) == (dxl.COMM_SUCCESS, 0)
    assert ph.read4ByteTxRx(port, 12, 116)[0] == 1500
    # Writing a read-only register is refused with the access error (7).
    comm, err = ph.write2ByteTxRx(port, 12, 126, 5)
    assert comm == dxl.COMM_SUCCESS and err == 7
    # A servo that is not on the bus: the SDK times out.
    assert ph.ping(port, 99)[1] == dxl.COMM_RX_TIMEOUT


def test_dynamixel_byte_stuffing_in_a_read_reply(dxl_port) -> None:
    port, ph = dxl_port
    value = 0x00FDFFFF  # little-endian bytes FF FF FD 00: the reply must be stuffed
    assert ph.write4ByteTxRx(port, 13, 116, value) == (dxl.COMM_SUCCESS, 0)
    raw, comm, _ = ph.read4ByteTxRx(port, 13, 116)
    assert comm == dxl.COMM_SUCCESS and raw == value
    ph.write4ByteTxRx(port, 13, 116, 2048)


def test_dynamixel_sync_and_fast_sync_read_of_the_telemetry_block(dxl_port) -> None:
    port, ph = dxl_port
    ids = [11, 12, 13, 14, 15]
    for fast in (False, True):
        group = dxl.GroupSyncRead(port, ph, 124, 23)
        for i in ids:
            assert group.addParam(i)
        comm = group.fastSyncRead() if fast else group.txRxPacket()
        assert comm == dxl.COMM_SUCCESS
        for k, i in enumerate(ids):
            u = units.xm430_units(prismatic=(i == 15))
            pos = _s32(group.getData(i, 132, 4))
            assert pos == u.raw_position(Q[k])
            cur = group.getData(i, 126, 2)
            assert cur - (1 << 16) == round(-0.5 / units.XM430_A_PER_UNIT)  # two's complement
            assert group.getData(i, 144, 2) == 119 and group.getData(i, 146, 1) == 41


def test_dynamixel_bulk_read_sync_write_and_alert_bit(dxl_port) -> None:
    port, ph = dxl_port
    writer = dxl.GroupSyncWrite(port, ph, 116, 4)
    for i, v in ((11, 1000), (12, 3000)):
        assert writer.addParam(i, list(v.to_bytes(4, "little")))
    assert writer.txPacket() == dxl.COMM_SUCCESS
    time.sleep(0.01)
    for fast in (False, True):
        bulk = dxl.GroupBulkRead(port, ph)
        assert bulk.addParam(11, 116, 4) and bulk.addParam(12, 146, 1)
        assert (bulk.fastBulkRead() if fast else bulk.txRxPacket()) == dxl.COMM_SUCCESS
        assert bulk.getData(11, 116, 4) == 1000 and bulk.getData(12, 146, 1) == 41
    # Servo 15 has a latched overload: every status carries the Alert bit, register 70 says why.
    _, comm, err = ph.ping(port, 15)
    assert comm == dxl.COMM_SUCCESS and err & 0x80
    hw, _, _ = ph.read1ByteTxRx(port, 15, 70)
    assert hw & 0x20
    assert ph.read1ByteTxRx(port, 15, 64)[0] == 0  # overload is in Shutdown: torque is off


def test_feetech_ping_read_sign_magnitude_and_sync_read(sts_port) -> None:
    port, ph = sts_port
    model, comm, err = ph.ping(port, 1)
    assert (model, comm, err) == (777, scs_sdk.COMM_SUCCESS, 0)
    group = scs_sdk.GroupSyncRead(port, ph, 56, 15)
    for i in range(1, 7):
        assert group.addParam(i)
    assert group.txRxPacket() == scs_sdk.COMM_SUCCESS
    for i in range(1, 7):
        pos = group.getData(i, 56, 2)
        assert pos == units.sts3215_units().raw_position(Q[i - 1])
        load = group.getData(i, 60, 2)
        assert load == (1 << 10) | 250  # -0.25 of max torque: sign bit 10
        assert group.getData(i, 62, 1) == 119 and group.getData(i, 63, 1) == 41
    vel = group.getData(1, 58, 2)  # qd = -1 rad/s: sign bit 15
    assert vel & 0x8000 and (vel & 0x7FFF) == round(1.0 / units.STS_RAD_S_PER_STEP_S)
    assert ph.ping(port, 42)[1] == scs_sdk.COMM_RX_TIMEOUT


def test_feetech_write_and_sync_write(sts_port) -> None:
    port, ph = sts_port
    assert ph.write2ByteTxRx(port, 2, 42, 0x8000 | 100) == (scs_sdk.COMM_SUCCESS, 0)
    assert ph.read2ByteTxRx(port, 2, 42)[0] == 0x8000 | 100
    writer = scs_sdk.GroupSyncWrite(port, ph, 42, 2)
    for i in (3, 4):
        writer.addParam(i, [0x00, 0x09])
    assert writer.txPacket() == scs_sdk.COMM_SUCCESS
    time.sleep(0.01)
    assert ph.read2ByteTxRx(port, 4, 42)[0] == 0x0900


def test_lerobot_feetech_bus_handshake_sync_read_write(sts_emu) -> None:
    from lerobot.motors import Motor, MotorCalibration, MotorNormMode
    from lerobot.motors.feetech import FeetechMotorsBus

    names = sts_emu.platform.channel_names
    motors = {n: Motor(i + 1, "sts3215", MotorNormMode.RANGE_M100_100) for i, n in
              enumerate(names)}
    bus = FeetechMotorsBus(sts_emu.port, motors)
    connect_lerobot(bus)  # pings every motor, checks model numbers and firmware versions
    try:
        raw = bus.sync_read("Present_Position", normalize=False)
        assert raw == {n: units.sts3215_units().raw_position(Q[k]) for k, n in enumerate(names)}
        assert set(bus.sync_read("Present_Load", normalize=False).values()) == {-250}
        bus.sync_write("Goal_Position", {"shoulder_pan": 1000, "elbow_flex": 3000},
                       normalize=False)
        time.sleep(0.01)
        goal = bus.sync_read("Goal_Position", ["shoulder_pan", "elbow_flex"], normalize=False)
        assert goal == {"shoulder_pan": 1000, "elbow_flex": 3000}
        cal = {n: MotorCalibration(k + 1, 0, 0, 500, 3500) for k, n in enumerate(names)}
        bus.write_calibration(cal)
        assert bus.is_calibrated
        bus.sync_write("Goal_Position", {"wrist_flex": 0.0})  # normalised: mid-range
        time.sleep(0.01)
        assert bus.read("Goal_Position", "wrist_flex", normalize=False) == 2000
    finally:
        bus.disconnect()


def test_lerobot_dynamixel_bus_handshake_and_reads(dxl_emu) -> None:
    from lerobot.motors import Motor, MotorNormMode
    from lerobot.motors.dynamixel import DynamixelMotorsBus

    names = dxl_emu.platform.channel_names[:4]  # servo 15 carries the test's alert
    motors = {n: Motor(11 + k, "xm430-w350", MotorNormMode.RANGE_M100_100)
              for k, n in enumerate(names)}
    bus = DynamixelMotorsBus(dxl_emu.port, motors)
    connect_lerobot(bus)
    try:
        cal = bus.read_calibration()
        assert {c.range_max for c in cal.values()} == {4095}
        assert set(bus.sync_read("Present_Current", normalize=False).values()) == \
            {round(-0.5 / units.XM430_A_PER_UNIT)}
        bus.sync_write("Goal_Position", {"joint4": 2500}, normalize=False)
        time.sleep(0.01)
        assert bus.read("Goal_Position", "joint4", normalize=False) == 2500
    finally:
        bus.disconnect()


@pytest.mark.slow
def test_broadcast_ping_finds_every_servo(dxl_port, sts_emu) -> None:
    """Broadcast ping waits out its full window (~0.8 s), hence slow."""
    port, ph = dxl_port
    found, comm = ph.broadcastPing(port)
    assert comm == dxl.COMM_SUCCESS
    assert {i: v[0] for i, v in found.items()} == dict.fromkeys([11, 12, 13, 14, 15], 1020)
    from lerobot.motors import Motor, MotorNormMode
    from lerobot.motors.feetech import FeetechMotorsBus

    bus = FeetechMotorsBus(sts_emu.port, {"m": Motor(1, "sts3215", MotorNormMode.DEGREES)})
    connect_lerobot(bus)
    try:
        assert bus.broadcast_ping() == dict.fromkeys(range(1, 7), 777)
    finally:
        bus.disconnect(disable_torque=False)


def test_cli_emulator_prints_its_port_links_it_and_exits(tmp_path) -> None:
    import subprocess
    import sys

    link = tmp_path / "leader"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nactuator.cli", "emulate", "--bus", "feetech", "--platform",
         "so101", "--leader", "--link", str(link), "--duration", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "so101 leader on feetech bus" in line and str(link) in line
        port = scs_sdk.PortHandler(str(link))
        assert port.openPort() and port.setBaudRate(1_000_000)
        no_spin(port)
        model, comm, _ = scs_sdk.PacketHandler(0).ping(port, 6)
        port.closePort()
        assert (model, comm) == (777, scs_sdk.COMM_SUCCESS)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert not link.exists()  # the symlink goes away with the emulator
