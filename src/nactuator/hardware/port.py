"""The serial port side of a servo bus, shared by every protocol: the errors a bus raises,
the exclusive port lock, the SDK reply-timeout floor, the description of failed replies, and
the LeRobot calibration file a bus is opened with.

Below ``bus`` (the protocol-independent :class:`~nactuator.hardware.bus.TelemetryBus`), the
protocol subclasses (``dynamixel``, ``feetech``) and ``open`` (the factory), so none of them
imports another in a circle.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from nactuator.errors import UserError

COMM_SUCCESS = 0  # dynamixel_sdk and scservo_sdk share the SDK result codes


def lerobot_calibration(calibration: dict | None, names: list[str]):
    """A LeRobot calibration JSON ({motor: {id, drive_mode, homing_offset, range_min,
    range_max}}) as the ``MotorCalibration`` map LeRobot's buses take, or None."""
    if not calibration:
        return None
    from lerobot.motors import MotorCalibration

    return {n: MotorCalibration(**{k: int(v) for k, v in calibration[n].items()})
            for n in names if n in calibration}


class BusError(UserError, RuntimeError):
    """A servo bus problem; the message says which port/servo/register and what to check."""


class PortError(BusError):
    """The serial port does not exist, cannot be opened, or another process holds it."""


class ServoMissingError(BusError):
    """A configured servo ID does not answer."""


class WrongModelError(BusError):
    """A servo answers with a model number other than the platform's."""


class HardwareAlert(BusError):
    """A servo latched a hardware error (overload, overheating, input voltage, ...)."""


def lock_port(port: str) -> int:
    """Open the device and take an exclusive advisory lock, so two nactuator processes
    never share one bus (interleaved packets corrupt both). Returns the fd to keep."""
    if not os.path.exists(port):
        raise PortError(
            f"serial port {port!r} does not exist: check the USB cable and the adapter "
            "(U2D2 / Feetech board), and the path (ls /dev/ttyUSB* /dev/ttyACM*; for an "
            "emulator, the path it printed)")
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except PermissionError as e:
        raise PortError(f"no permission to open {port!r}: add your user to the 'dialout' "
                        "group (sudo usermod -aG dialout $USER) and log in again") from e
    except OSError as e:
        raise PortError(f"cannot open serial port {port!r}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise PortError(f"serial port {port!r} is busy: another nactuator process "
                            "(record/live/bench) is using it; stop it first") from e
        raise PortError(f"cannot lock serial port {port!r}: {e.strerror}") from e
    return fd


def load_calibration(path: str | Path | None) -> dict | None:
    """A LeRobot calibration JSON ``{motor: {id, drive_mode, homing_offset, range_min,
    range_max}}`` (written by LeRobot's ``.venv-lerobot/bin/lerobot-calibrate``, see
    docs/hardware.md), or None."""
    if path is None:
        return None
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError as e:
        raise BusError(f"calibration file {p} does not exist") from e
    except json.JSONDecodeError as e:
        raise BusError(f"calibration file {p} is not valid JSON: {e}") from e
    keys = {"id", "drive_mode", "homing_offset", "range_min", "range_max"}
    for motor, entry in raw.items():
        if not isinstance(entry, dict) or not keys <= set(entry):
            raise BusError(f"calibration file {p}: motor {motor!r} needs the fields "
                           f"{sorted(keys)}, got {entry!r}")
    return raw


def min_reply_timeout(port_handler, ms: float | Callable[[], float]) -> None:
    """Make the waits a vendor SDK ``PortHandler`` sizes itself last at least ``ms`` (a
    number, or a function giving the current floor).

    The SDKs size their waits (ping, read, write) from a fixed USB latency guess
    (dynamixel_sdk: 2 x 16 ms + 2; LeRobot's Feetech patch: 50 ms + bytes). A slower
    adapter, or a loaded machine running an emulator, needs longer. Waits given in ms
    (``setPacketTimeoutMillis``, e.g. the telemetry read's ``rx_timeout_ms``) are kept.
    """
    set_bytes = port_handler.setPacketTimeout
    floor = ms if callable(ms) else (lambda: ms)

    def at_least(packet_length):
        set_bytes(packet_length)
        port_handler.packet_timeout = max(port_handler.packet_timeout, floor())

    port_handler.setPacketTimeout = at_least


def describe_failures(delta: dict[str, int], rx_timeout_ms: float) -> str:
    """What went wrong on the wire, from a difference of :attr:`TelemetryBus.counters`:
    replies that came too late, requests nobody answered, replies with a bad checksum and
    replies cut short — with counts and what to check for each."""
    late, timeouts = delta.get("late_replies", 0), delta.get("timeouts", 0)
    corrupt, partial = delta.get("checksum_errors", 0), delta.get("partial_replies", 0)
    silent = max(0, timeouts - late)
    parts = []
    if late:
        parts.append(f"{late} repl{'y' if late == 1 else 'ies'} arrived after the "
                     f"{rx_timeout_ms:g} ms reply timeout (the servos answer, too slowly: set "
                     "the USB adapter's latency timer to 1 ms or raise hardware.rx_timeout_ms)")
    if silent:
        parts.append(f"{silent} request{'' if silent == 1 else 's'} got no answer at all "
                     "(check the cable, the daisy chain and the power)")
    if corrupt:
        parts.append(f"{corrupt} repl{'y' if corrupt == 1 else 'ies'} with a bad checksum "
                     "(electrical noise, a loose connector or a baud-rate mismatch)")
    if partial:
        parts.append(f"{partial} incomplete repl{'y' if partial == 1 else 'ies'} (the "
                     "daisy chain breaks at a servo that does not answer)")
    return "; ".join(parts) if parts else "no failed reply was counted"
