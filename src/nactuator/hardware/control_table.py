"""Control tables of the two servo models, as the emulators hold them in memory.

Addresses and sizes match LeRobot 0.4.4's tables (``lerobot/motors/*/tables.py``) and the
XM430-W350 e-manual; defaults are factory values from servos.md §2 and §5. A
:class:`ControlTable` is the byte image one servo answers READ/WRITE from.
"""

from __future__ import annotations

from dataclasses import dataclass

from nactuator.hardware.protocol.scs import decode_sign_magnitude, encode_sign_magnitude


@dataclass(frozen=True)
class Register:
    address: int
    size: int
    access: str = "RW"  # "R" or "RW"
    default: int = 0
    signed: int | None = None  # XM430: two's complement (any value); STS: sign bit index


@dataclass(frozen=True)
class ServoSpec:
    model: str  # LeRobot model name
    model_number: int
    bus: str  # "dynamixel" | "feetech"
    registers: dict[str, Register]
    memory_size: int
    eeprom_end: int  # addresses below this are EEPROM (writable only with torque off)
    twos_complement: bool  # XM430 True; STS3215 sign-magnitude


R = Register
XM430_W350 = ServoSpec(
    model="xm430-w350",
    model_number=1020,
    bus="dynamixel",
    memory_size=700,
    eeprom_end=64,
    twos_complement=True,
    registers={
        "Model_Number": R(0, 2, "R", 1020),
        "Model_Information": R(2, 4, "R", 0),
        "Firmware_Version": R(6, 1, "R", 48),  # fast sync read needs >= 45
        "ID": R(7, 1, "RW", 1),
        "Baud_Rate": R(8, 1, "RW", 3),  # 3 = 1 Mbps (the OMX setting; factory is 1)
        "Return_Delay_Time": R(9, 1, "RW", 250),  # 2 us units
        "Drive_Mode": R(10, 1, "RW", 0),
        "Operating_Mode": R(11, 1, "RW", 3),
        "Secondary_ID": R(12, 1, "RW", 255),
        "Protocol_Type": R(13, 1, "RW", 2),
        "Homing_Offset": R(20, 4, "RW", 0, signed=1),
        "Moving_Threshold": R(24, 4, "RW", 10),
        "Temperature_Limit": R(31, 1, "RW", 80),
        "Max_Voltage_Limit": R(32, 2, "RW", 160),
        "Min_Voltage_Limit": R(34, 2, "RW", 95),
        "PWM_Limit": R(36, 2, "RW", 885),
        "Current_Limit": R(38, 2, "RW", 1193),
        "Acceleration_Limit": R(40, 4, "RW", 32767),
        "Velocity_Limit": R(44, 4, "RW", 200),
        "Max_Position_Limit": R(48, 4, "RW", 4095),
        "Min_Position_Limit": R(52, 4, "RW", 0),
        "Shutdown": R(63, 1, "RW", 52),
        "Torque_Enable": R(64, 1, "RW", 0),
        "LED": R(65, 1, "RW", 0),
        "Status_Return_Level": R(68, 1, "RW", 2),
        "Registered_Instruction": R(69, 1, "R", 0),
        "Hardware_Error_Status": R(70, 1, "R", 0),
        "Velocity_I_Gain": R(76, 2, "RW", 1920),
        "Velocity_P_Gain": R(78, 2, "RW", 100),
        "Position_D_Gain": R(80, 2, "RW", 0),
        "Position_I_Gain": R(82, 2, "RW", 0),
        "Position_P_Gain": R(84, 2, "RW", 800),
        "Feedforward_2nd_Gain": R(88, 2, "RW", 0),
        "Feedforward_1st_Gain": R(90, 2, "RW", 0),
        "Bus_Watchdog": R(98, 1, "RW", 0),
        "Goal_PWM": R(100, 2, "RW", 885, signed=1),
        "Goal_Current": R(102, 2, "RW", 1193, signed=1),
        "Goal_Velocity": R(104, 4, "RW", 0, signed=1),
        "Profile_Acceleration": R(108, 4, "RW", 0),
        "Profile_Velocity": R(112, 4, "RW", 0),
        "Goal_Position": R(116, 4, "RW", 2048, signed=1),
        "Realtime_Tick": R(120, 2, "R", 0),
        "Moving": R(122, 1, "R", 0),
        "Moving_Status": R(123, 1, "R", 0),
        "Present_PWM": R(124, 2, "R", 0, signed=1),
        "Present_Current": R(126, 2, "R", 0, signed=1),
        "Present_Velocity": R(128, 4, "R", 0, signed=1),
        "Present_Position": R(132, 4, "R", 2048, signed=1),
        "Velocity_Trajectory": R(136, 4, "R", 0, signed=1),
        "Position_Trajectory": R(140, 4, "R", 2048, signed=1),
        "Present_Input_Voltage": R(144, 2, "R", 120),
        "Present_Temperature": R(146, 1, "R", 30),
    },
)

STS3215 = ServoSpec(
    model="sts3215",
    model_number=777,
    bus="feetech",
    memory_size=256,
    eeprom_end=40,
    twos_complement=False,
    registers={
        "Firmware_Major_Version": R(0, 1, "R", 3),
        "Firmware_Minor_Version": R(1, 1, "R", 10),
        "Model_Number": R(3, 2, "R", 777),
        "ID": R(5, 1, "RW", 1),
        "Baud_Rate": R(6, 1, "RW", 0),  # 0 = 1 Mbps
        "Return_Delay_Time": R(7, 1, "RW", 250),
        "Response_Status_Level": R(8, 1, "RW", 1),
        "Min_Position_Limit": R(9, 2, "RW", 0),
        "Max_Position_Limit": R(11, 2, "RW", 4095),
        "Max_Temperature_Limit": R(13, 1, "RW", 70),
        "Max_Voltage_Limit": R(14, 1, "RW", 140),
        "Min_Voltage_Limit": R(15, 1, "RW", 40),
        "Max_Torque_Limit": R(16, 2, "RW", 1000),
        "Phase": R(18, 1, "RW", 12),
        "Unloading_Condition": R(19, 1, "RW", 44),
        "LED_Alarm_Condition": R(20, 1, "RW", 47),
        "P_Coefficient": R(21, 1, "RW", 32),
        "D_Coefficient": R(22, 1, "RW", 32),
        "I_Coefficient": R(23, 1, "RW", 0),
        "Minimum_Startup_Force": R(24, 2, "RW", 16),
        "CW_Dead_Zone": R(26, 1, "RW", 1),
        "CCW_Dead_Zone": R(27, 1, "RW", 1),
        "Protection_Current": R(28, 2, "RW", 500),
        "Angular_Resolution": R(30, 1, "RW", 1),
        "Homing_Offset": R(31, 2, "RW", 0, signed=11),
        "Operating_Mode": R(33, 1, "RW", 0),
        "Protective_Torque": R(34, 1, "RW", 20),
        "Protection_Time": R(35, 1, "RW", 200),
        "Overload_Torque": R(36, 1, "RW", 80),
        "Velocity_closed_loop_P_proportional_coefficient": R(37, 1, "RW", 10),
        "Over_Current_Protection_Time": R(38, 1, "RW", 200),
        "Velocity_closed_loop_I_integral_coefficient": R(39, 1, "RW", 200),
        "Torque_Enable": R(40, 1, "RW", 0),
        "Acceleration": R(41, 1, "RW", 0),
        "Goal_Position": R(42, 2, "RW", 2048, signed=15),
        "Goal_Time": R(44, 2, "RW", 0),
        "Goal_Velocity": R(46, 2, "RW", 0, signed=15),
        "Torque_Limit": R(48, 2, "RW", 1000),
        "Lock": R(55, 1, "RW", 0),
        "Present_Position": R(56, 2, "R", 2048, signed=15),
        "Present_Velocity": R(58, 2, "R", 0, signed=15),
        "Present_Load": R(60, 2, "R", 0, signed=10),
        "Present_Voltage": R(62, 1, "R", 74),
        "Present_Temperature": R(63, 1, "R", 30),
        "Status": R(65, 1, "R", 0),
        "Moving": R(66, 1, "R", 0),
        "Present_Current": R(69, 2, "R", 0),
        "Maximum_Velocity_Limit": R(84, 1, "RW", 0),
        "Maximum_Acceleration": R(85, 1, "RW", 0),
    },
)
del R

SPECS = {s.model: s for s in (XM430_W350, STS3215)}
SPEC_BY_BUS = {"dynamixel": XM430_W350, "feetech": STS3215}


class ControlTable:
    """The byte image of one servo's control table (little-endian multi-byte fields)."""

    def __init__(self, spec: ServoSpec, servo_id: int) -> None:
        self.spec = spec
        self.memory = bytearray(spec.memory_size)
        self._read_only = bytearray(spec.memory_size)  # 1 where a read-only register lives
        for name, reg in spec.registers.items():
            self.set(name, reg.default)
            if reg.access == "R":
                self._read_only[reg.address : reg.address + reg.size] = b"\x01" * reg.size
        self.set("ID", servo_id)

    # --- the servo firmware's view: named registers, signed values -----------------------
    def get(self, name: str) -> int:
        reg = self.spec.registers[name]
        raw = int.from_bytes(self.memory[reg.address : reg.address + reg.size], "little")
        if reg.signed is None:
            return raw
        if self.spec.twos_complement:
            bits = 8 * reg.size
            return raw - (1 << bits) if raw & (1 << (bits - 1)) else raw
        return decode_sign_magnitude(raw, reg.signed)

    def set(self, name: str, value: int) -> None:
        reg = self.spec.registers[name]
        value = int(value)
        if reg.signed is None:
            raw = max(0, min(value, (1 << (8 * reg.size)) - 1))
        elif self.spec.twos_complement:
            bits = 8 * reg.size
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            raw = max(lo, min(value, hi)) & ((1 << bits) - 1)
        else:
            limit = (1 << reg.signed) - 1
            raw = encode_sign_magnitude(max(-limit, min(value, limit)), reg.signed)
        self.memory[reg.address : reg.address + reg.size] = raw.to_bytes(reg.size, "little")

    # --- the bus's view: raw bytes ------------------------------------------------------
    def in_range(self, address: int, length: int) -> bool:
        return 0 <= address and length >= 0 and address + length <= self.spec.memory_size

    def read(self, address: int, length: int) -> bytes:
        return bytes(self.memory[address : address + length])

    def writable(self, address: int, length: int) -> bool:
        """False if the range touches a read-only register, or (DYNAMIXEL) EEPROM while
        torque is on. Feetech servos have no access-error code; EEPROM is guarded by Lock,
        which only decides whether a write survives power-off, so it is not modelled."""
        if any(self._read_only[address : address + length]):
            return False
        if self.spec.bus != "dynamixel":
            return True
        torque_on = self.get("Torque_Enable") != 0
        return not (torque_on and address < self.spec.eeprom_end)

    def write(self, address: int, data: bytes) -> None:
        self.memory[address : address + len(data)] = data

    def splits_register(self, address: int, length: int) -> bool:
        """True if ``[address, address + length)`` covers only part of some register."""
        end = address + length
        return any(reg.address < end and address < reg.address + reg.size
                   and not (address <= reg.address and reg.address + reg.size <= end)
                   for reg in self.spec.registers.values())

    def values_in(self, address: int, data: bytes) -> dict[str, int]:
        """The value each register wholly inside a write of ``data`` at ``address`` would
        take, decoded as :meth:`get` decodes it (what limit checks compare)."""
        scratch = ControlTable.__new__(ControlTable)
        scratch.spec, scratch.memory = self.spec, bytearray(self.memory)
        scratch.memory[address : address + len(data)] = data
        end = address + len(data)
        return {name: scratch.get(name) for name, reg in self.spec.registers.items()
                if address <= reg.address and reg.address + reg.size <= end}
