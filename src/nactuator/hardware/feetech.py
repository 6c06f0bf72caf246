"""SO-101 bus: Feetech STS3215 servos, SCS/STS protocol (little-endian, sign-magnitude).

LeRobot's ``FeetechMotorsBus`` opens the port, pings and checks each servo, switches
torque (and the EEPROM Lock) and sync-writes goals, so an SO-101 user's LeRobot
calibration file works unchanged. Telemetry is one SYNC_READ of the contiguous block
Present_Position..Present_Current (56..70, 15 bytes: position, velocity, load, voltage,
temperature, status, moving, current) per cycle via ``scservo_sdk``'s packet handler,
collecting each servo's status packet by ID (the SDK's GroupSyncRead gives up on the whole
group at the first missing servo). Registers are addressed by name (``control_table.py``);
units: ``servo_units.py``.
"""

from __future__ import annotations

import numpy as np
import scservo_sdk as scs_sdk
from lerobot.motors import Motor, MotorNormMode
from lerobot.motors.feetech import FeetechMotorsBus

from nactuator import servo_units as units
from nactuator.hardware.bus import TelemetryBus, TelemetryFrame
from nactuator.hardware.control_table import STS3215
from nactuator.hardware.port import BusError, lerobot_calibration
from nactuator.hardware.protocol import scs

TELEMETRY = STS3215.block("Present_Position", "Present_Current")
_ADDRESS = {name: reg.address for name, reg in STS3215.registers.items()}  # for messages
STATUS_ADVICE = {
    scs.ERR_VOLTAGE: "check the supply voltage and the voltage limits (registers "
                     f"{_ADDRESS['Max_Voltage_Limit']}/{_ADDRESS['Min_Voltage_Limit']})",
    scs.ERR_ANGLE: "angle sensor fault: check the servo",
    scs.ERR_OVERHEAT: "let it cool down; reduce load or duty cycle",
    scs.ERR_OVERCURRENT: "over-current: remove the blocking load",
    scs.ERR_OVERLOAD: "overload: remove the blocking load; check Overload_Torque "
                      f"({_ADDRESS['Overload_Torque']})",
}


def status_text(err: int) -> str:
    advice = "; ".join(a for bit, a in STATUS_ADVICE.items() if err & bit)
    return (f"status error bits 0x{err:02X} ({scs.error_text(err)}): {advice}. The servo unloads "
            "(torque off) while the condition lasts")


class FeetechTelemetryBus(TelemetryBus):
    spec = STS3215
    telemetry = TELEMETRY
    RX_TIMEOUT, RX_CORRUPT = scs_sdk.COMM_RX_TIMEOUT, scs_sdk.COMM_RX_CORRUPT

    def __init__(self, platform, port, calibration=None, torque=None,
                 torque_off_on_close=True) -> None:
        super().__init__(platform, port, calibration, torque, torque_off_on_close)
        hw = platform.hardware
        self.model = str(hw.get("servo", "sts3215"))
        for c in platform.channels:
            if c.kind != "revolute":
                raise BusError(f"{platform.source}: channel {c.name!r} is {c.kind}; STS3215 "
                               "channels must be revolute")
        cal_of = (calibration or {})
        self.units = [units.motor_units("feetech", False, cal_of.get(n)) for n in self.names]
        motors = {n: Motor(i, self.model, MotorNormMode.RANGE_0_100 if c.is_gripper
                           else MotorNormMode.RANGE_M100_100)
                  for n, i, c in zip(self.names, self.ids, platform.channels, strict=True)}
        self.lerobot = FeetechMotorsBus(
            port, motors, calibration=lerobot_calibration(calibration, self.names))
        self._ph = self.lerobot.packet_handler
        self._port = self.lerobot.port_handler

    setup_hint = ("check the power supply, the daisy-chain cable, and the ID/baud rate "
                  "(LeRobot's setup tool assigns them: `make lerobot-env`, then "
                  "`.venv-lerobot/bin/lerobot-setup-motors --robot.type=so101_follower "
                  "--robot.port=PORT`; docs/hardware.md)")

    @staticmethod
    def _complete(rx) -> bool:
        return len(rx) >= 4 and len(rx) >= 4 + rx[3]

    def _read_blocks(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        port = self._port
        # The SDK's clearPort() only drains output; stale input would pass as fresh data.
        self._drain()
        result = self._ph.syncReadTx(port, TELEMETRY.address, TELEMETRY.length, ids, len(ids))
        if result != scs_sdk.COMM_SUCCESS:
            port.is_using = False
            return {}, {}
        port.setPacketTimeoutMillis(self.rx_timeout_ms)
        return self._collect(ids)

    def _read_each(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        blocks, errors = {}, {}
        for sid in ids:
            self._drain()
            if self._ph.readTx(self._port, sid, TELEMETRY.address, TELEMETRY.length) \
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
            complete = len(rx) >= 6 + TELEMETRY.length
            if result == scs_sdk.COMM_SUCCESS and rx[2] in ids and complete:
                blocks[rx[2]] = bytes(rx[5 : 5 + TELEMETRY.length])
                errors[rx[2]] = status_text(rx[4]) if rx[4] else ""
            elif result == scs_sdk.COMM_SUCCESS:
                self.counters["late_replies"] += 1  # another request's reply, late
        return blocks, errors

    def _decode(self, k: int, b: bytes, f: TelemetryFrame) -> None:
        r = TELEMETRY.decode(b)
        u = self.units[k]
        f.q[k] = u.position(r["Present_Position"])
        f.qd[k] = u.velocity(r["Present_Velocity"])
        f.effort[k] = u.sign * r["Present_Load"] / units.STS_LOAD_FULL
        f.voltage[k] = r["Present_Voltage"] * units.VOLT_PER_UNIT
        f.temperature[k] = r["Present_Temperature"]
        f.current[k] = r["Present_Current"] * units.STS_A_PER_UNIT
        f.pwm[k] = np.nan  # the STS3215 has no PWM register

    def _write_torque(self, sid: int, enabled: bool) -> str | None:
        # As LeRobot does: Torque_Enable, then Lock (EEPROM writes persist only unlocked).
        for register in ("Torque_Enable", "Lock"):
            self._drain()
            comm, err = self._write_register(sid, register, int(enabled))
            if comm != scs_sdk.COMM_SUCCESS:
                return "no status packet"
            if err and enabled:
                return f"status error 0x{err:02X}"
        return None

    def _explain(self, sid: int, problem: str) -> str:
        if problem == "no status packet":
            return "does not answer (check its cable and power)"
        self._drain()
        _, comm, err = self._read_register(sid, "Torque_Enable")
        if comm == scs_sdk.COMM_SUCCESS and err:
            return status_text(err)
        return problem
