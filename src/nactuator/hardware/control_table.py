"""Control tables of the two servo models: every register address, size and encoding.

The one place that knows where a register lives. The buses address registers by name
through a :class:`ServoSpec` (``spec.registers["Torque_Enable"].address``,
``spec.block("Present_PWM", "Present_Temperature")``), and the emulators hold a
:class:`ControlTable`, the byte image one servo answers READ/WRITE from, built from the same
specs. Addresses and sizes match LeRobot 0.4.4's tables (``lerobot/motors/*/tables.py``)
and the XM430-W350 e-manual; defaults are factory values from servos.md §2 and §5. Signed
registers are encoded as :mod:`nactuator.servo_units` says (XM430 two's complement,
STS3215 sign-magnitude).
"""

from __future__ import annotations

from dataclasses import dataclass

from nactuator.servo_units import (
    STS_LOAD_SIGN_BIT,
    STS_OFFSET_SIGN_BIT,
    STS_SIGN_BIT,
    decode_sign_magnitude,
    decode_twos_complement,
    encode_sign_magnitude,
    encode_twos_complement,
)


@dataclass(frozen=True)
class Register:
    address: int
    size: int
    access: str = "RW"  # "R" or "RW"
    default: int = 0
    signed: int | None = None  # XM430: two's complement (any value); STS: sign bit index


@dataclass(frozen=True)
class RegisterBlock:
    """A contiguous run of registers read with one request (the telemetry block), decoded
    by name. ``str(block)`` is its span for messages, e.g. ``124..146 (23 bytes)``."""

    spec: ServoSpec
    address: int
    length: int
    layout: tuple[tuple[str, int, int], ...]  # (name, offset in the block, size)

    def decode(self, data: bytes) -> dict[str, int]:
        """Each register of the block in ``data``, decoded as the servo encodes it."""
        return {name: self.spec.decode(name, int.from_bytes(data[at : at + size], "little"))
                for name, at, size in self.layout}

    def __str__(self) -> str:
        return f"{self.address}..{self.address + self.length - 1} ({self.length} bytes)"


@dataclass(frozen=True)
class ServoSpec:
    model: str  # LeRobot model name
    model_number: int
    bus: str  # "dynamixel" | "feetech"
    registers: dict[str, Register]
    memory_size: int
    eeprom_end: int  # addresses below this are EEPROM (writable only with torque off)
    twos_complement: bool  # XM430 True; STS3215 sign-magnitude

    def decode(self, name: str, raw: int) -> int:
        """A register's unsigned bytes (as an int) -> its value."""
        reg = self.registers[name]
        if reg.signed is None:
            return raw
        if self.twos_complement:
            return decode_twos_complement(raw, 8 * reg.size)
        return decode_sign_magnitude(raw, reg.signed)

    def encode(self, name: str, value: int) -> int:
        """A register's value -> its unsigned bytes (as an int), clipped to what fits."""
        reg = self.registers[name]
        value = int(value)
        if reg.signed is None:
            return max(0, min(value, (1 << (8 * reg.size)) - 1))
        if self.twos_complement:
            bits = 8 * reg.size
            lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            return encode_twos_complement(max(lo, min(value, hi)), bits)
        limit = (1 << reg.signed) - 1
        return encode_sign_magnitude(max(-limit, min(value, limit)), reg.signed)

    def block(self, first: str, last: str) -> RegisterBlock:
        """Registers ``first`` .. ``last`` (by address) as one block."""
        start = self.registers[first].address
        end = self.registers[last].address + self.registers[last].size
        if end <= start:
            raise ValueError(f"{self.model}: register {last!r} lies before {first!r}")
        layout = tuple((name, reg.address - start, reg.size)
                       for name, reg in sorted(self.registers.items(), key=lambda r: r[1].address)
                       if start <= reg.address and reg.address + reg.size <= end)
        return RegisterBlock(self, start, end - start, layout)


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
        "Bus_Watchdog": R(98, 1, "RW", 0, signed=1),  # 20 ms units; 0 off; -1 expired
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

# Bus Watchdog (98), XM430 e-manual (firmware >= 38): 1..127 arms it in units of 20 ms; while
# Torque_Enable is 1, an instruction-packet silence longer than that stops the servo, the
# register reads -1 and the goal registers refuse writes (Data Range Error) until 0 is
# written. The STS3215 has no such register.
XM430_BUS_WATCHDOG_UNIT_S = 0.020
XM430_BUS_WATCHDOG_MAX = 127
XM430_BUS_WATCHDOG_EXPIRED = -1
XM430_BUS_WATCHDOG_MIN_FIRMWARE = 38
XM430_GOAL_REGISTERS = ("Goal_PWM", "Goal_Current", "Goal_Velocity", "Goal_Position")

# Hardware_Error_Status bits (XM430 e-manual): what the firmware detected and latched.
XM430_HARDWARE_ERRORS = {0: "input voltage", 2: "overheating", 3: "motor encoder",
                         4: "electrical shock", 5: "overload"}

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
        "Homing_Offset": R(31, 2, "RW", 0, signed=STS_OFFSET_SIGN_BIT),
        "Operating_Mode": R(33, 1, "RW", 0),
        "Protective_Torque": R(34, 1, "RW", 20),
        "Protection_Time": R(35, 1, "RW", 200),
        "Overload_Torque": R(36, 1, "RW", 80),
        "Velocity_closed_loop_P_proportional_coefficient": R(37, 1, "RW", 10),
        "Over_Current_Protection_Time": R(38, 1, "RW", 200),
        "Velocity_closed_loop_I_integral_coefficient": R(39, 1, "RW", 200),
        "Torque_Enable": R(40, 1, "RW", 0),
        "Acceleration": R(41, 1, "RW", 0),
        "Goal_Position": R(42, 2, "RW", 2048, signed=STS_SIGN_BIT),
        "Goal_Time": R(44, 2, "RW", 0),
        "Goal_Velocity": R(46, 2, "RW", 0, signed=STS_SIGN_BIT),
        "Torque_Limit": R(48, 2, "RW", 1000),
        "Lock": R(55, 1, "RW", 0),
        "Present_Position": R(56, 2, "R", 2048, signed=STS_SIGN_BIT),
        "Present_Velocity": R(58, 2, "R", 0, signed=STS_SIGN_BIT),
        "Present_Load": R(60, 2, "R", 0, signed=STS_LOAD_SIGN_BIT),
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
        return self.spec.decode(name, raw)

    def set(self, name: str, value: int) -> None:
        """Store ``value``, clipped to what the register holds."""
        reg = self.spec.registers[name]
        raw = self.spec.encode(name, value)
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
