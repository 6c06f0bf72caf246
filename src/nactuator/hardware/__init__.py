"""nactuator.hardware: servo buses, emulated arms and the teleoperation recorder.

- :mod:`.open` — ``open_bus(platform, port)`` -> a :class:`~.bus.TelemetryBus` giving one
  SI :class:`~.bus.TelemetryFrame` per cycle (LeRobot buses + one vendor-SDK group read;
  the protocols in :mod:`.dynamixel` and :mod:`.feetech`, the port lock, errors and the
  calibration file in :mod:`.port`; the bus's parts in :mod:`.wire`, :mod:`.telemetry`,
  :mod:`.torque`, :mod:`.watchdog` and :mod:`.goals`).
- :mod:`.emulator` — ``Emulator(bus, platform)``: a virtual arm on a pty, driven by the
  hidden world (or a scripted leader), with fault injection; ``nactuator emulate``.
- :mod:`.recorder` — ``record(...)``: leader -> follower recording into a nactuator dataset.

Submodules are imported on use: importing LeRobot's buses pulls in torch.
See docs/hardware.md.
"""
