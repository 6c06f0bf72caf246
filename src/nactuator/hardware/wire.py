"""The wire under a telemetry bus: one register of one servo by its control-table name, and
the accounting of what came back (timeouts, late, partial and corrupt replies).

:class:`Wire` is the base of every part of :class:`~nactuator.hardware.bus.TelemetryBus`
(telemetry reads, torque, the bus watchdog, goals): the register access and the port state
they all need. The attributes it reads (``ids``, ``names``, ``port``, ``spec``, ``counters``,
the SDK's ``_port``/``_ph``) are set by ``TelemetryBus.__init__`` and its protocol
subclasses.
"""

from __future__ import annotations

import abc

from nactuator.hardware.control_table import ServoSpec
from nactuator.hardware.port import COMM_SUCCESS


class Wire(abc.ABC):
    """Register access and reply accounting shared by the parts of a telemetry bus."""

    # Set by TelemetryBus and its protocol subclasses.
    ids: list[int]
    names: list[str]
    port: str
    spec: ServoSpec  # the servo model's control table: every register is addressed by name
    counters: dict[str, int]
    _port: object  # the vendor SDK's PortHandler
    _ph: object  # ... and PacketHandler
    _late_possible: bool  # a request timed out: its reply may still come

    RX_TIMEOUT: int  # the vendor SDK's result codes (subclasses)
    RX_CORRUPT: int
    BROADCAST_ID = 0xFE

    def _drain(self) -> None:
        """Drop whatever waits in the input buffer before a new request: bytes there are
        the reply to an earlier request that came after it timed out. Counted as late,
        never taken for a new answer."""
        ser = self._port.ser
        if ser.in_waiting:
            self.counters["late_replies"] += 1
        self._late_possible = False
        ser.reset_input_buffer()

    def _count(self, result: int, rx) -> None:
        """Count a failed receive: a timeout, a reply cut short, or a bad checksum."""
        if result == self.RX_TIMEOUT:
            self.counters["timeouts"] += 1
            self._late_possible = True
        elif result == self.RX_CORRUPT:
            if self._complete(rx):
                self.counters["checksum_errors"] += 1
            else:
                self.counters["partial_replies"] += 1
                self._late_possible = True

    @staticmethod
    def _complete(rx) -> bool:
        """Whether ``rx`` holds as many bytes as its LEN field announces (subclasses)."""
        return True

    def _reset_port(self, quiet: bool = False) -> None:
        """Undo what an interrupted SDK call leaves behind: the in-use flag, stale bytes."""
        self._port.is_using = False
        try:
            self._port.ser.reset_input_buffer()
            self._port.ser.reset_output_buffer()
        except Exception:
            if not quiet:
                raise

    # --- one register of one servo, by its control-table name -------------------------
    def _read_register(self, sid: int, name: str) -> tuple[int, int, int]:
        """(value, SDK result, status error byte); the value decoded as the servo encodes
        it (two's complement / sign-magnitude) and meaningful only on COMM_SUCCESS."""
        reg, ph, port = self.spec.registers[name], self._ph, self._port
        if reg.size == 1:
            raw, comm, err = ph.read1ByteTxRx(port, sid, reg.address)
        elif reg.size == 2:
            raw, comm, err = ph.read2ByteTxRx(port, sid, reg.address)
        else:
            raw, comm, err = ph.read4ByteTxRx(port, sid, reg.address)
        return self.spec.decode(name, raw), comm, err

    def _write_register(self, sid: int, name: str, value: int,
                        acknowledged: bool = True) -> tuple[int, int]:
        """(SDK result, status error byte); ``acknowledged=False`` sends without waiting
        for a reply (broadcasts), returning (COMM_SUCCESS, 0) once sent."""
        reg, ph, port = self.spec.registers[name], self._ph, self._port
        raw = self.spec.encode(name, value)
        if not acknowledged:
            if reg.size == 1:
                comm = ph.write1ByteTxOnly(port, sid, reg.address, raw)
            elif reg.size == 2:
                comm = ph.write2ByteTxOnly(port, sid, reg.address, raw)
            else:
                comm = ph.write4ByteTxOnly(port, sid, reg.address, raw)
            return comm, 0
        if reg.size == 1:
            return ph.write1ByteTxRx(port, sid, reg.address, raw)
        if reg.size == 2:
            return ph.write2ByteTxRx(port, sid, reg.address, raw)
        return ph.write4ByteTxRx(port, sid, reg.address, raw)

    def _name(self, sid: int) -> str:
        return self.names[self.ids.index(sid)]

    def _named(self, ids: list[int]) -> str:
        return ", ".join(f"{sid} ({self._name(sid)})" for sid in ids)

    def _read_torque(self, sid: int) -> int | None:
        """The servo's torque register (0/1), or None if it does not answer."""
        self._drain()
        value, comm, _ = self._read_register(sid, "Torque_Enable")
        return value if comm == COMM_SUCCESS else None
