"""OpenManipulator-X bus: DYNAMIXEL XM430-W350 servos, Protocol 2.0.

LeRobot's ``DynamixelMotorsBus`` opens the port, pings and checks each servo, switches
torque and sync-writes goals. Telemetry is one FAST_SYNC_READ of the contiguous block
Present_PWM..Present_Temperature (124..146, 23 bytes: PWM, current, velocity, position, both
trajectories, voltage, temperature) per cycle, sent with ``dynamixel_sdk``'s packet
handler: LeRobot reads one register per sync read and cannot see the per-servo error byte.
Registers are addressed by name (``control_table.py``); units: ``servo_units.py``.
"""

from __future__ import annotations

import dynamixel_sdk as dxl
from lerobot.motors import Motor, MotorNormMode
from lerobot.motors.dynamixel import DynamixelMotorsBus

from nactuator import servo_units as units
from nactuator.hardware.bus import TelemetryBus, TelemetryFrame
from nactuator.hardware.control_table import (
    XM430_BUS_WATCHDOG_MIN_FIRMWARE,
    XM430_HARDWARE_ERRORS,
    XM430_W350,
)
from nactuator.hardware.port import BusError, lerobot_calibration

TELEMETRY = XM430_W350.block("Present_PWM", "Present_Temperature")
FAST_SYNC_MIN_FIRMWARE = 45

_ADDRESS = {name: reg.address for name, reg in XM430_W350.registers.items()}  # for messages
HW_ERROR_ADVICE = {
    0: "check the supply (12 V, enough current) and the voltage limits (registers "
       f"{_ADDRESS['Max_Voltage_Limit']}/{_ADDRESS['Min_Voltage_Limit']})",
    2: "let it cool down; reduce load or duty cycle",
    3: "the motor encoder failed: contact ROBOTIS",
    4: "electrical shock/short: check wiring and supply",
    5: "it was overloaded: remove the blocking load; check Current Limit "
       f"({_ADDRESS['Current_Limit']})",
}


def hardware_error_text(status: int) -> str:
    bits = [b for b in XM430_HARDWARE_ERRORS if status & (1 << b)]
    if not bits:
        return f"Hardware Error Status 0x{status:02X}"
    parts = "; ".join(f"{XM430_HARDWARE_ERRORS[b]} ({HW_ERROR_ADVICE[b]})" for b in bits)
    return (f"Hardware Error Status (register {_ADDRESS['Hardware_Error_Status']}) = "
            f"0x{status:02X}: {parts}. The firmware switched torque off; clear it with a "
            "REBOOT instruction or a power cycle")


class DynamixelTelemetryBus(TelemetryBus):
    spec = XM430_W350
    telemetry = TELEMETRY
    RX_TIMEOUT, RX_CORRUPT = dxl.COMM_RX_TIMEOUT, dxl.COMM_RX_CORRUPT

    def __init__(self, platform, port, calibration=None, torque=None,
                 torque_off_on_close=True) -> None:
        super().__init__(platform, port, calibration, torque, torque_off_on_close)
        hw = platform.hardware
        self.model = str(hw.get("servo", "xm430_w350")).replace("_", "-")
        m_per_pulse = float(hw.get("gripper_m_per_pulse", units.OMX_GRIPPER_M_PER_PULSE))
        self.units = [units.xm430_units(c.kind == "prismatic", m_per_pulse)
                      for c in platform.channels]
        self.effort_signal = platform.effort_signal
        self.use_fast = bool(hw.get("fast_sync_read", True))
        motors = {n: Motor(i, self.model, MotorNormMode.RANGE_M100_100)
                  for n, i in zip(self.names, self.ids, strict=True)}
        self.lerobot = DynamixelMotorsBus(
            port, motors, calibration=lerobot_calibration(calibration, self.names))
        self._ph = self.lerobot.packet_handler
        self._port = self.lerobot.port_handler
        self._alerts: dict[int, str] = {}
        self.firmware: dict[int, int] = {}  # servo id -> Firmware_Version, read at connect

    setup_hint = ("check power (12 V), the daisy-chain cable, and the ID/baud rate "
                  "(DYNAMIXEL Wizard can scan)")

    # --- lifecycle --------------------------------------------------------------------
    def _check_servos(self) -> None:
        super()._check_servos()
        firmware = {}
        for sid in self.ids:
            fw, comm, _ = self._read_register(sid, "Firmware_Version")
            firmware[sid] = fw if comm == dxl.COMM_SUCCESS else 0
        if self.use_fast and any(fw < FAST_SYNC_MIN_FIRMWARE for fw in firmware.values()):
            self.use_fast = False  # fast sync read needs firmware >= 45: plain sync read
        # Those that answered (arming a servo whose version was not read decides for it).
        self.firmware = {sid: fw for sid, fw in firmware.items() if fw}

    def _check_watchdog_support(self) -> None:
        old = [f"{sid} ({self._name(sid)}): v{fw}" for sid, fw in self.firmware.items()
               if fw < XM430_BUS_WATCHDOG_MIN_FIRMWARE]
        if old:
            raise BusError(f"the bus watchdog needs XM430 firmware v"
                           f"{XM430_BUS_WATCHDOG_MIN_FIRMWARE} or newer; on {self.port} servo(s) "
                           f"{', '.join(old)}: update it with DYNAMIXEL Wizard 2.0, "
                           f"or set {self.platform.source}: hardware.bus_watchdog_ms: 0")

    # --- telemetry ----------------------------------------------------------------------
    def _rx(self, fast: bool) -> tuple[list[int], int]:
        return self._ph.rxPacket(self._port, fast)

    @staticmethod
    def _complete(rx) -> bool:
        return len(rx) >= 7 and len(rx) >= 7 + (rx[5] | rx[6] << 8)

    def _read_blocks(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        port = self._port
        self._drain()  # drop (and count) late replies of a timed-out earlier request
        fast = self.use_fast
        result = self._ph.syncReadTx(port, TELEMETRY.address, TELEMETRY.length, ids, len(ids),
                                     fast)
        if result != dxl.COMM_SUCCESS:
            port.is_using = False
            return {}, {}
        port.setPacketTimeoutMillis(self.rx_timeout_ms)
        blocks: dict[int, bytes] = {}
        errors: dict[int, str] = {}
        if fast:
            rx, result = self._rx(True)
            self._count(result, rx)
            if result == dxl.COMM_SUCCESS:
                if rx[4] != dxl.BROADCAST_ID:
                    self.counters["late_replies"] += 1  # a servo's own reply to an old read
                    return {}, {}
                k, step = 8, TELEMETRY.length + 4  # after header(4) ID LEN(2) 0x55; ERR ID DATA CRC
                for _ in ids:
                    if k + step > len(rx) or rx[k + 1] not in ids:
                        return {}, {}  # malformed: let the per-servo retry decide
                    blocks[rx[k + 1]] = bytes(rx[k + 2 : k + 2 + TELEMETRY.length])
                    errors[rx[k + 1]] = self._error_text(rx[k + 1], rx[k])
                    k += step
            return blocks, errors
        answers = 0  # replies received, good or with a bad CRC: one per servo
        while answers < len(ids):
            rx, result = self._rx(False)
            self._count(result, rx)
            answers += (result == dxl.COMM_SUCCESS and rx[4] in ids) or \
                (result == dxl.COMM_RX_CORRUPT and self._complete(rx))
            if result == dxl.COMM_RX_TIMEOUT or (result != dxl.COMM_SUCCESS
                                                  and port.isPacketTimeout()):
                break
            if result == dxl.COMM_SUCCESS and rx[4] in ids:
                blocks[rx[4]] = bytes(rx[9 : 9 + TELEMETRY.length])
                errors[rx[4]] = self._error_text(rx[4], rx[8])
            elif result == dxl.COMM_SUCCESS:
                self.counters["late_replies"] += 1
        return blocks, errors

    def _read_each(self, ids: list[int]) -> tuple[dict[int, bytes], dict[int, str]]:
        blocks, errors = {}, {}
        for sid in ids:
            self._drain()
            if self._ph.readTx(self._port, sid, TELEMETRY.address, TELEMETRY.length) \
                    != dxl.COMM_SUCCESS:
                self._port.is_using = False
                continue
            self._port.setPacketTimeoutMillis(self.rx_timeout_ms)
            while True:
                rx, result = self._rx(False)
                self._count(result, rx)
                if result != dxl.COMM_SUCCESS or rx[4] == sid:
                    break
                self.counters["late_replies"] += 1  # another request's reply, late
            if result == dxl.COMM_SUCCESS and len(rx) >= 9 + TELEMETRY.length:
                blocks[sid] = bytes(rx[9 : 9 + TELEMETRY.length])
                errors[sid] = self._error_text(sid, rx[8])
        return blocks, errors

    def _error_text(self, sid: int, err: int) -> str:
        """'' if fine. The Alert bit (7) means a latched hardware error: read
        Hardware_Error_Status once to say which (one extra read, only when it first appears)."""
        if err & 0x7F:
            return f"status error: {self._ph.getRxPacketError(err & 0x7F)}"
        if not err & 0x80:
            self._alerts.pop(sid, None)
            return ""
        if sid not in self._alerts:
            status = self.read_hardware_error(sid)
            self._alerts[sid] = hardware_error_text(status if status is not None else 0)
        return self._alerts[sid]

    def read_hardware_error(self, sid: int) -> int | None:
        self._drain()
        value, comm, _ = self._read_register(sid, "Hardware_Error_Status")
        return value if comm == dxl.COMM_SUCCESS else None

    def _decode(self, k: int, b: bytes, f: TelemetryFrame) -> None:
        r = TELEMETRY.decode(b)
        u = self.units[k]
        f.q[k] = u.position(r["Present_Position"])
        f.qd[k] = u.velocity(r["Present_Velocity"])
        f.current[k] = r["Present_Current"] * units.XM430_A_PER_UNIT
        f.pwm[k] = r["Present_PWM"] / units.XM430_PWM_FULL
        f.voltage[k] = r["Present_Input_Voltage"] * units.VOLT_PER_UNIT
        f.temperature[k] = r["Present_Temperature"]
        f.effort[k] = f.pwm[k] if self.effort_signal == "pwm" else f.current[k]

    # --- commands -----------------------------------------------------------------------
    def _write_torque(self, sid: int, enabled: bool) -> str | None:
        self._drain()
        comm, err = self._write_register(sid, "Torque_Enable", int(enabled))
        if comm != dxl.COMM_SUCCESS:
            return "no status packet"
        if err & 0x7F:
            return f"status error: {self._ph.getRxPacketError(err & 0x7F)}"
        if err & 0x80 and enabled:
            return "hardware error alert"
        return None

    def _explain(self, sid: int, problem: str) -> str:
        if problem == "no status packet":
            return "does not answer (check its cable and power)"
        status = self.read_hardware_error(sid)
        if status:
            return hardware_error_text(status)
        return problem
