"""Emulated servo arms on pseudo-terminals (importable for tests, or `nactuator emulate`)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from nactuator.hardware.emulator.arm import ArmModel, ArmState, ReferenceArm, ScriptedLeader
from nactuator.hardware.emulator.core import Emulator, EmulatorError, make_arm
from nactuator.hardware.emulator.faults import Faults

__all__ = ["ArmModel", "ArmState", "Emulator", "EmulatorError", "Faults", "ReferenceArm",
           "ScriptedLeader", "make_arm", "run_emulator"]


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt


def run_emulator(bus: str, platform: str, seed: int = 0, bus_timing: bool = False,
                 corrupt_rate: float = 0.0, drop_rate: float = 0.0, latency_ms: float = 0.0,
                 dead_ids: list[int] | None = None, alert_ids: list[int] | None = None,
                 voltage_sag: float = 0.0, leader: bool = False, link: str | None = None,
                 duration: float | None = None, arm: str | None = None,
                 payload_kg: float = 0.0, grasp: bool = False) -> None:
    """Run an emulated arm in the foreground until Ctrl-C/SIGTERM or ``duration`` seconds.

    Prints the device path (and the ``link`` symlink) so another terminal can connect.
    """
    faults = Faults(corrupt_rate=corrupt_rate, drop_rate=drop_rate, latency_ms=latency_ms,
                    dead_ids=set(dead_ids or []), alert_ids=set(alert_ids or []),
                    voltage_sag=voltage_sag, seed=seed)
    emu = Emulator(bus, platform, seed, arm=arm, leader=leader, bus_timing=bus_timing,
                   faults=faults, link=link, payload_kg=payload_kg, grasp=grasp)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # clean up the symlink as Ctrl-C does
    with emu:
        role = "leader" if leader else "follower"
        where = f"{emu.port} (link {Path(link).absolute()})" if link else emu.port
        # The try opens before the port is announced: a client may connect and signal at
        # once, before this thread has run another line (seen on a loaded machine).
        try:
            print(f"emulated {emu.platform.name} {role} on {bus} bus, servo ids {emu.ids}: "
                  f"{where}", flush=True)
            t_end = None if duration is None else time.monotonic() + duration
            while (t_end is None or time.monotonic() < t_end) and emu.alive:
                time.sleep(0.1)
        except KeyboardInterrupt:
            pass
        print(f"emulator stopped: {emu.stats}", file=sys.stderr, flush=True)
    # Leaving the with block raised EmulatorError if the emulator thread died on an error.
