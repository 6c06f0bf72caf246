"""SO-101 bus: Feetech STS3215 servos, SCS/STS protocol (little-endian, sign-magnitude).

LeRobot's ``FeetechMotorsBus`` opens the port, pings and checks each servo, switches
torque (and the EEPROM Lock) and sync-writes goals, so an SO-101 user's LeRobot
calibration file works unchanged. Telemetry is one SYNC_READ of the contiguous block
56..70 (15 bytes: position, velocity, load, voltage, temperature, status, moving, current)
per cycle via ``scservo_sdk``'s packet handler, collecting each servo's status packet by ID
(the SDK's GroupSyncRead gives up on the whole group at the first missing servo).
Units: ``units.py``.
"""

from __future__ import annotations

import numpy as np
import scservo_sdk as scs_sdk
from lerobot.motors import Motor, MotorNormMode
from lerobot.motors.feetech import FeetechMotorsBus

from nactuator.hardware import units
from nactuator.hardware.bus import (
    BusError,
    TelemetryBus,
    TelemetryFrame,
    lerobot_calibration,
)
from nactuator.hardware.protocol.scs import decode_sign_magnitude, error_text

TELEMETRY_ADDR, TELEMETRY_LEN = 56, 15
TORQUE_ADDR, LOCK_ADDR, GOAL_ADDR = 40, 55, 42
STATUS_ADVICE = {
    1: "check the supply voltage and the voltage limits (registers 14/15)",
    2: "angle sensor fault: check the servo",
    4: "let it cool down; reduce load or duty cycle",
    8: "over-current: remove the blocking load",
    32: "overload: remove the blocking load; check Overload_Torque (36)",
}


def status_text(err: int) -> str:
    advice = "; ".join(a for bit, a in STATUS_ADVICE.items() if err & bit)
    return (f"status error bits 0x{err:02X} ({error_text(err)}): {advice}. The servo unloads "
            "(torque off) while the condition lasts")


class FeetechTelemetryBus(TelemetryBus):
    telemetry_span = "56..70 (15 bytes)"
    TORQUE_ADDR = TORQUE_ADDR
    RX_TIMEOUT, RX_CORRUPT = scs_sdk.COMM_RX_TIMEOUT, scs_sdk.COMM_RX_CORRUPT

    def __init__(self, platform, port, calibration=None, torque=None,
                 torque_off_on_close=True) -> None:
        super().__init__(platform, port, calibration, torque, torque_off_on_close)
        hw = platform.hardware
        self.model = str(hw.get("servo", "sts3215"))
        self.model_number = int(hw.get("model_number", 777))
        for c in platform.channels:
            if c.kind != "revolute":
                raise BusError(f"{platform.source}: channel {c.name!r} is {c.kind}; STS3215 "
                               "channels must be revolute")
        cal_of = (calibration or {})
        self.units = [units.motor_units("feetech", False, cal_of.get(n)) for n in self.names]
        self.lo = np.array([c.limit_lower for c in platform.channels])
        self.hi = np.array([c.limit_upper for c in platform.channels])
        motors = {n: Motor(i, self.model, MotorNormMode.RANGE_0_100 if c.is_gripper
                           else MotorNormMode.RANGE_M100_100)
                  for n, i, c in zip(self.names, self.ids, platform.channels, strict=True)}
        self.lerobot = FeetechMotorsBus(
            port, motors, calibration=lerobot_calibration(calibration, self.names))
        self._ph = self.lerobot.packet_handler
        self._port = self.lerobot.port_handler

    setup_hint = ("check the power supply, the daisy-chain cable, and the ID/baud rate "
                  "(lerobot-setup-motors assigns them)")

    @staticmethod
    def _complete(rx) -> bool:
        return len(rx) >= 4 and len(rx) >= 4 + rx[3]

    def _read_blocks(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        port = self._port
        # The SDK's clearPort() only drains output; stale input would pass as fresh data.
        self._drain()
        result = self._ph.syncReadTx(port, TELEMETRY_ADDR, TELEMETRY_LEN, ids, len(ids))
        if result != scs_sdk.COMM_SUCCESS:
            port.is_using = False
            return {}, {}
        port.setPacketTimeoutMillis(self.rx_timeout_ms)
        return self._collect(ids)

    def _read_each(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        blocks, errors = {}, {}
        for sid in ids:
            self._drain()
            if self._ph.readTx(self._port, sid, TELEMETRY_ADDR, TELEMETRY_LEN) \
                    != scs_sdk.COMM_SUCCESS:
                self._port.is_using = False
                continue
            self._port.setPacketTimeoutMillis(self.rx_timeout_ms)
            b, e = self._collect([sid])
            blocks.update(b)
            errors.update(e)
        return blocks, errors

    def _collect(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        blocks: dict[int, bytes] = {}
        errors: dict[int, str] = {}
        answers = 0  # replies received, good or with a bad checksum: one per servo
        while answers < len(ids):
            rx, result = self._ph.rxPacket(self._port)
            self._count(result, rx)
            answers += (result == scs_sdk.COMM_SUCCESS and rx[2] in ids) or \
                (result == scs_sdk.COMM_RX_CORRUPT and self._complete(rx))
            if result == scs_sdk.COMM_RX_TIMEOUT or (result != scs_sdk.COMM_SUCCESS
                                                     and self._port.isPacketTimeout()):
                break
            if result == scs_sdk.COMM_SUCCESS and rx[2] in ids and len(rx) >= 6 + TELEMETRY_LEN:
                blocks[rx[2]] = bytes(rx[5 : 5 + TELEMETRY_LEN])
                errors[rx[2]] = status_text(rx[4]) if rx[4] else ""
            elif result == scs_sdk.COMM_SUCCESS:
                self.counters["late_replies"] += 1  # another request's reply, late
        return blocks, errors

    def _decode(self, k: int, b: bytes, f: TelemetryFrame) -> None:
        u = self.units[k]
        f.q[k] = u.position(decode_sign_magnitude(b[0] | b[1] << 8, 15))
        f.qd[k] = u.velocity(decode_sign_magnitude(b[2] | b[3] << 8, 15))
        load = decode_sign_magnitude(b[4] | b[5] << 8, 10) / units.STS_LOAD_FULL
        f.effort[k] = u.sign * load
        f.voltage[k] = b[6] * units.VOLT_PER_UNIT
        f.temperature[k] = b[7]
        f.current[k] = (b[13] | b[14] << 8) * units.STS_A_PER_UNIT
        f.pwm[k] = np.nan  # the STS3215 has no PWM register

    def _write_torque(self, sid: int, enabled: bool) -> str | None:
        # As LeRobot does: Torque_Enable, then Lock (EEPROM writes persist only unlocked).
        for addr in (TORQUE_ADDR, LOCK_ADDR):
            self._drain()
            comm, err = self._ph.write1ByteTxRx(self._port, sid, addr, int(enabled))
            if comm != scs_sdk.COMM_SUCCESS:
                return "no status packet"
            if err and enabled:
                return f"status error 0x{err:02X}"
        return None

    def _read_goal_raw(self, sid: int) -> int | None:
        value, comm, _ = self._ph.read2ByteTxRx(self._port, sid, GOAL_ADDR)
        return decode_sign_magnitude(value, 15) if comm == scs_sdk.COMM_SUCCESS else None

    def _read_torque(self, sid: int) -> int | None:
        self._drain()
        value, comm, _ = self._ph.read1ByteTxRx(self._port, sid, TORQUE_ADDR)
        return value if comm == scs_sdk.COMM_SUCCESS else None

    def _explain(self, sid: int, problem: str) -> str:
        if problem == "no status packet":
            return "does not answer (check its cable and power)"
        self._drain()
        _, comm, err = self._ph.read1ByteTxRx(self._port, sid, TORQUE_ADDR)
        if comm == scs_sdk.COMM_SUCCESS and err:
            return status_text(err)
        return problem
