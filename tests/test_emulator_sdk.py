"""Real SDK bytes over a pty: dynamixel_sdk, scservo_sdk and both LeRobot buses against the
emulated servos (protocol behaviour; the arm model is a fixed pose so values are exact).

Every SDK port here waits up to 5 s for a reply (``no_spin``): the SDKs' own 34-50 ms
assume an idle machine, and on a loaded one a thread of this process (the emulator) can
go unscheduled for a second. Where nothing is meant to answer, the SDK's own wait is used.
"""

from __future__ import annotations

import logging
import os
import time

import dynamixel_sdk as dxl
import numpy as np
import pytest
import scservo_sdk as scs_sdk

from nactuator import servo_units as units
from nactuator.hardware.emulator import ArmState, Emulator, EmulatorError, Faults
from nactuator.hardware.port import min_reply_timeout
from nactuator.hardware.protocol import dxl2, scs

PATIENT_MS = 5000.0

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
    instead. Protocol behaviour is unchanged (the bus layer does the same). Replies may
    take up to ``PATIENT_MS``."""
    port.ser.timeout = 0.002
    min_reply_timeout(port, PATIENT_MS)


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
    # A servo that is not on the bus: the SDK times out (after its own short wait).
    del port.setPacketTimeout
    assert ph.ping(port, 99)[1] == dxl.COMM_RX_TIMEOUT


def test_dynamixel_byte_stuffing_in_a_read_reply(dxl_port) -> None:
    port, ph = dxl_port
    value = 0x00FDFFFF  # little-endian bytes FF FF FD 00: the reply must be stuffed
    # Profile Velocity (112) has no limit register, so any 4-byte value is accepted.
    assert ph.write4ByteTxRx(port, 13, 112, value) == (dxl.COMM_SUCCESS, 0)
    raw, comm, _ = ph.read4ByteTxRx(port, 13, 112)
    assert comm == dxl.COMM_SUCCESS and raw == value
    ph.write4ByteTxRx(port, 13, 112, 0)


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
    del port.setPacketTimeout  # nothing will answer: the SDK's own short wait will do
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
         "so101", "--leader", "--link", str(link), "--duration", "120"],
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
        proc.terminate()  # SIGTERM: stops like Ctrl-C, cleaning up
        assert proc.wait(timeout=240) == 0
    finally:
        proc.kill()
    assert not link.exists()  # the symlink goes away with the emulator


# --- robustness and fidelity of the emulated firmware ------------------------------------
def _raw_reply(port, ph, packet: bytes, fast: bool = False):
    """Send hand-made bytes, return the SDK's (reply, result) for what comes back."""
    port.ser.reset_input_buffer()
    port.writePort(list(packet))
    port.setPacketTimeoutMillis(PATIENT_MS)
    return ph.rxPacket(port, fast) if isinstance(ph, dxl.Protocol2PacketHandler) \
        else ph.rxPacket(port)


def _served(emu: Emulator, malformed: int) -> None:
    """Wait until the emulator has taken in ``malformed`` malformed packets in all."""
    t_end = time.monotonic() + 30
    while emu.stats["malformed"] < malformed and time.monotonic() < t_end:
        time.sleep(0.005)


def test_dynamixel_malformed_instructions_get_an_error_status_and_the_servo_serves_on(
        dxl_emu, dxl_port) -> None:
    port, ph = dxl_port
    before = dxl_emu.stats["malformed"]
    # A CRC-valid READ with one parameter byte (the address is cut short): Data Length Error.
    rx, comm = _raw_reply(port, ph, dxl2.instruction_packet(12, dxl2.READ, b"\x84"))
    assert comm == dxl.COMM_SUCCESS and rx[4] == 12 and rx[8] == dxl2.ERR_DATA_LENGTH
    for params in (b"", b"\x84\x00\x04", b"\x84\x00\x04\x00\x00"):
        rx, comm = _raw_reply(port, ph, dxl2.instruction_packet(12, dxl2.READ, params))
        assert comm == dxl.COMM_SUCCESS and rx[8] == dxl2.ERR_DATA_LENGTH, params
    rx, comm = _raw_reply(port, ph, dxl2.instruction_packet(12, dxl2.WRITE, b"\x74"))
    assert rx[8] == dxl2.ERR_DATA_LENGTH
    # Group instructions are broadcast: a malformed one is ignored, silently, as it must be.
    replies = dxl_emu.stats["replies"]
    port.writePort(list(dxl2.instruction_packet(dxl2.BROADCAST_ID, dxl2.SYNC_WRITE,
                                                b"\x74\x00\x04")))
    _served(dxl_emu, before + 5)
    assert dxl_emu.stats["replies"] == replies
    # Protocol 2.0: an undefined instruction, or ACTION with nothing registered, is an
    # Instruction Error; writing 2 bytes of the 4-byte Goal Position a Data Length Error.
    rx, _ = _raw_reply(port, ph, dxl2.instruction_packet(12, 0x77))
    assert rx[8] == dxl2.ERR_INSTRUCTION
    rx, _ = _raw_reply(port, ph, dxl2.instruction_packet(12, dxl2.ACTION))
    assert rx[8] == dxl2.ERR_INSTRUCTION
    assert ph.write2ByteTxRx(port, 12, 116, 100) == (dxl.COMM_SUCCESS, dxl2.ERR_DATA_LENGTH)
    assert dxl_emu.stats["malformed"] - before == 6
    # ... and the bus is still served.
    assert ph.ping(port, 12)[:2] == (1020, dxl.COMM_SUCCESS)
    assert ph.read4ByteTxRx(port, 12, 132)[1] == dxl.COMM_SUCCESS
    assert dxl_emu.alive


def test_feetech_malformed_instructions_are_ignored_and_the_servo_serves_on(
        sts_emu, sts_port) -> None:
    port, ph = sts_port
    stats = dict(sts_emu.stats)
    # A READ with no parameters: SCS has no status code for it, so no reply (as for a
    # bad checksum), and the next request is answered as usual.
    bad = [scs.instruction_packet(3, scs.READ, params)
           for params in (b"", b"\x38", b"\x38\x0f\x00")]
    bad.append(scs.instruction_packet(3, scs.WRITE, b"\x2a"))
    port.ser.reset_input_buffer()
    port.writePort(list(b"".join(bad)))
    _served(sts_emu, stats["malformed"] + 4)
    assert sts_emu.stats["malformed"] - stats["malformed"] == 4
    assert sts_emu.stats["replies"] == stats["replies"]  # nothing answered them
    assert ph.ping(port, 3)[:2] == (777, scs_sdk.COMM_SUCCESS)
    assert sts_emu.alive


def test_a_reply_is_counted_before_a_client_can_read_it(monkeypatch) -> None:
    # Tests compare emu.stats["replies"] right after a reply arrived: the count must never
    # lag the wire, however late the emulator thread runs after writing (a loaded machine;
    # here: a write that is slow to return).
    import types

    from nactuator.hardware.emulator import core

    def slow_write(fd: int, data: bytes) -> int:
        written = os.write(fd, data)
        time.sleep(0.2)
        return written

    monkeypatch.setattr(core, "os", types.SimpleNamespace(**{**vars(os), "write": slow_write}))
    with Emulator("dynamixel", "omx", arm=FixedArm(5)) as emu:
        port = dxl.PortHandler(emu.port)
        assert port.openPort() and port.setBaudRate(1_000_000)
        no_spin(port)
        try:
            for k in range(1, 4):
                model, comm, _ = dxl.PacketHandler(2.0).ping(port, 11)
                assert (model, comm) == (1020, dxl.COMM_SUCCESS)
                assert emu.stats["replies"] == k
        finally:
            port.closePort()


def test_dynamixel_goal_outside_the_position_limits_is_refused_with_data_limit_error() -> None:
    arm = FixedArm(5)
    with Emulator("dynamixel", "omx", arm=arm) as emu:
        port = dxl.PortHandler(emu.port)
        assert port.openPort() and port.setBaudRate(1_000_000)
        no_spin(port)
        ph = dxl.PacketHandler(2.0)
        try:
            assert ph.write4ByteTxRx(port, 11, 48, 3000) == (dxl.COMM_SUCCESS, 0)  # Max limit
            assert ph.write4ByteTxRx(port, 11, 52, 1000) == (dxl.COMM_SUCCESS, 0)  # Min limit
            assert ph.write4ByteTxRx(port, 11, 116, 2500) == (dxl.COMM_SUCCESS, 0)
            for goal in (3001, 999, -5):
                assert ph.write4ByteTxRx(port, 11, 116, goal) == (dxl.COMM_SUCCESS, 6), goal
            assert ph.read4ByteTxRx(port, 11, 116)[0] == 2500  # ignored, as an XM430 does
            # A sync write has no status to carry the error: the value is just not taken.
            writer = dxl.GroupSyncWrite(port, ph, 116, 4)
            writer.addParam(11, list((3500).to_bytes(4, "little")))
            assert writer.txPacket() == dxl.COMM_SUCCESS
            assert ph.read4ByteTxRx(port, 11, 116)[0] == 2500
            assert arm.goal[0] == pytest.approx(units.xm430_units(False).position(2500))
            # Goal PWM beyond PWM Limit (885) likewise.
            assert ph.write2ByteTxRx(port, 11, 100, 900) == (dxl.COMM_SUCCESS, 6)
        finally:
            port.closePort()


def test_feetech_goal_outside_the_position_limits_drives_to_the_nearest_limit() -> None:
    arm = FixedArm(6)
    with Emulator("feetech", "so101", arm=arm) as emu:
        port = scs_sdk.PortHandler(emu.port)
        assert port.openPort() and port.setBaudRate(1_000_000)
        no_spin(port)
        ph = scs_sdk.PacketHandler(0)
        try:
            assert ph.write2ByteTxRx(port, 2, 9, 1000) == (scs_sdk.COMM_SUCCESS, 0)
            assert ph.write2ByteTxRx(port, 2, 11, 3000) == (scs_sdk.COMM_SUCCESS, 0)
            # Accepted as written, no error bit (the STS3215 has none for it) ...
            assert ph.write2ByteTxRx(port, 2, 42, 3500) == (scs_sdk.COMM_SUCCESS, 0)
            assert ph.read2ByteTxRx(port, 2, 42)[0] == 3500
            # ... but the servo steers to the nearest limit (huggingface/lerobot#3585).
            assert ph.ping(port, 2)[1] == scs_sdk.COMM_SUCCESS  # commands applied by now
            assert arm.goal[1] == pytest.approx(units.sts3215_units().position(3000))
            assert ph.write2ByteTxRx(port, 2, 42, 500) == (scs_sdk.COMM_SUCCESS, 0)
            assert ph.ping(port, 2)[1] == scs_sdk.COMM_SUCCESS
            assert arm.goal[1] == pytest.approx(units.sts3215_units().position(1000))
        finally:
            port.closePort()


class BrokenArm(FixedArm):
    """An arm model with a bug: it fails on its 50th step."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.steps = 0

    def step(self, dt):
        self.steps += 1
        if self.steps == 50:
            raise FloatingPointError("the arm model diverged")


def test_an_error_in_the_emulator_thread_is_logged_and_raised_not_swallowed(caplog) -> None:
    with pytest.raises(EmulatorError, match="stopped serving: FloatingPointError"):
        with Emulator("dynamixel", "omx", arm=BrokenArm(5)) as emu:
            t_end = time.monotonic() + 30
            while emu.alive and time.monotonic() < t_end:
                time.sleep(0.01)
            assert not emu.alive
    [record] = [r for r in caplog.records if "stopped serving" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info  # with its traceback


def test_fault_ids_must_be_servos_of_the_platform() -> None:
    with pytest.raises(ValueError, match=r"cannot make servo id\(s\) 99 dead: the emulated "
                                         r"omx arm has servo ids 11, 12, 13, 14, 15"):
        Emulator("dynamixel", "omx", arm="reference", faults=Faults(dead_ids={99, 12}))
    with pytest.raises(ValueError, match=r"servo id\(s\) 0 alert: the emulated so101 arm"):
        Emulator("feetech", "so101", arm="reference", faults=Faults(alert_ids={0}))
    with Emulator("feetech", "so101", arm="reference") as emu, \
            pytest.raises(ValueError, match=r"servo id\(s\) 7 dead"):
        emu.set_dead(7)


def test_cli_refuses_a_dead_id_the_platform_does_not_have() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "nactuator.cli", "emulate", "--bus",
                           "dynamixel", "--platform", "omx", "--dead-id", "99"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert "cannot make servo id(s) 99 dead" in line and "11, 12, 13, 14, 15" in line


def test_an_emulator_removes_its_link_only_while_it_points_at_its_own_pty(tmp_path) -> None:
    link = tmp_path / "follower"
    first = Emulator("feetech", "so101", arm="reference", link=link).start()
    second = Emulator("feetech", "so101", arm="reference", link=link).start()
    try:
        assert os.readlink(link) == second.port  # the newer emulator took the name over
        first.stop()
        assert os.readlink(link) == second.port  # ... and keeps it
    finally:
        first.stop()
        second.stop()
    assert not link.is_symlink()
