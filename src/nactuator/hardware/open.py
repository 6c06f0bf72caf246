"""Open the telemetry bus a platform names (``hardware.bus`` in its YAML).

The one module that knows every protocol subclass; it sits above ``bus``, ``dynamixel`` and
``feetech``, so the base class never imports its subclasses.

    with open_bus(platform, "/dev/ttyUSB0") as bus:
        frame = bus.read()            # TelemetryFrame
        bus.write_goal(frame.q)       # hold position
"""

from __future__ import annotations

from pathlib import Path

from nactuator.hardware.bus import TelemetryBus
from nactuator.hardware.port import BusError, load_calibration
from nactuator.platforms import Platform, load_platform


def open_bus(platform: str | Platform, port: str, calibration: str | Path | None = None,
             torque: bool | None = None, torque_off_on_close: bool = True) -> TelemetryBus:
    """The telemetry bus for a platform (``hardware.bus`` in its YAML), not yet connected.

    ``calibration``: a LeRobot calibration JSON (Feetech: sets each joint's zero at the
    middle of its calibrated range, as NAD and LeRobot do). ``torque``: switch torque
    on/off at connect (None leaves it as it is). ``torque_off_on_close``: closing the bus
    switches every servo's torque off (the default, as LeRobot's ``disconnect`` does).
    """
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    kind = p.hardware.get("bus")
    cal = load_calibration(calibration)
    if kind == "dynamixel":
        from nactuator.hardware.dynamixel import DynamixelTelemetryBus

        return DynamixelTelemetryBus(p, port, cal, torque, torque_off_on_close)
    if kind == "feetech":
        from nactuator.hardware.feetech import FeetechTelemetryBus

        return FeetechTelemetryBus(p, port, cal, torque, torque_off_on_close)
    raise BusError(f"{p.source}: hardware.bus must be 'dynamixel' or 'feetech', got {kind!r}")

