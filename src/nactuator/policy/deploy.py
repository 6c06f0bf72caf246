"""``policy run``: a fitted policy driving a servo bus (a real follower or the emulator).

The same path as ``live`` (``nactuator.control.live``): :func:`nactuator.hardware.bus.open_bus`,
the checkpoint's causal window (:class:`~nactuator.rollout.StreamingWindow`, inside
:class:`~nactuator.policy.sensing.ForceSensor`) and the fixed-rate pacing
(:class:`~nactuator.hardware.timing.FixedRate`) at the platform rate. Each cycle reads one
telemetry frame, builds the policy's features exactly as in evaluation
(:class:`~nactuator.policy.evaluate.PolicyController`), writes the goal, then pushes the
frame and its command through the frozen actuator model. Torque is switched on at connect
and off on every exit: the episodes end, Ctrl-C, SIGTERM or an error (closing the bus).
A motor whose telemetry was not read this cycle keeps its last reading in the policy's
input. The oracle condition cannot run here: a bus has no true force.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from nactuator.errors import UserError
from nactuator.hardware.open import open_bus
from nactuator.hardware.signals import sigterm_as_interrupt
from nactuator.hardware.timing import FixedRate
from nactuator.models import load_model
from nactuator.platforms import load_platform

from .evaluate import PolicyController, load_policy
from .sensing import ForceSensor
from .task_world import Observation

__all__ = ["run_policy"]

TELEMETRY = ("q", "qd", "effort", "voltage", "temperature")


def run_policy(ckpt: str | Path, actuator: str | Path, port: str, seconds: float | None = None,
               episodes: int = 1, calibration: str | Path | None = None) -> str:
    """Run ``episodes`` episodes of ``seconds`` (default: the task's) on the arm at ``port``;
    returns a one-line summary. Ctrl-C ends the run early, torque off."""
    net, payload = load_policy(ckpt)
    if payload["condition"] == "oracle":
        raise UserError(f"{ckpt}: an oracle policy reads the true force, which no bus has")
    p = load_platform(payload["platform"])
    model, meta = load_model(actuator, expect_platform=p.name)
    if seconds is None:
        seconds = float(payload.get("seconds_per_episode", 6.0))
    if not seconds > 0 or episodes < 1:
        raise UserError(f"seconds must be > 0 and episodes >= 1, got {seconds}, {episodes}")
    frames = int(round(seconds * p.fps))
    done, cycles, lost, interrupted = 0, 0, 0, False
    timings: list[tuple[float, float, float, float]] = []
    started = time.perf_counter()
    try:  # outside the bus: leaving it (any way) switches torque off first
        with sigterm_as_interrupt(), open_bus(p, port, calibration, torque=True) as bus:
            bus.wait_ready()
            for _ in range(episodes):
                ran, missed = _episode(bus, PolicyController(
                    net, payload, ForceSensor(model, meta, 1, p.n)), frames, p.fps, p.control_dt,
                    timings)
                cycles, lost = cycles + ran, lost + missed
                done += 1
    except KeyboardInterrupt:
        interrupted = True
    wall = time.perf_counter() - started
    how = "interrupted (Ctrl-C), torque off" if interrupted else "torque off"
    p50 = (np.percentile(np.array(timings) * 1e3, 50, axis=0) if timings
           else np.full(4, np.nan))
    return (f"policy run: {done}/{episodes} episodes, {cycles} cycles in {wall:.1f} s "
            f"({payload['task']}, {payload['condition']}), {lost} schedule slots lost to late "
            f"cycles; per cycle p50 read {p50[0]:.2f} ms, policy {p50[1]:.2f} ms, write "
            f"{p50[2]:.2f} ms, force sensor {p50[3]:.2f} ms; {how}")


def _episode(bus, ctrl: PolicyController, frames: int, fps: float, dt: float,
             timings: list[tuple[float, float, float, float]]) -> tuple[int, int]:
    """One episode at the platform rate (a late cycle loses slots, never bursts); returns
    the cycles run and the slots lost, and appends each cycle's (read, policy, write,
    sensor) seconds to ``timings``."""
    last, lost = None, 0
    pace = FixedRate(fps).start()
    for k in range(frames):
        t0 = time.perf_counter()
        frame = bus.read()
        t1 = time.perf_counter()
        tel = {key: np.asarray(getattr(frame, key), float)[None] for key in TELEMETRY}
        if last is not None:  # an unread motor keeps its last reading
            tel = {key: np.where(np.isnan(v), last[key], v) for key, v in tel.items()}
        tel = last = {key: np.nan_to_num(v) for key, v in tel.items()}
        obs = Observation(k, k * dt, tel, np.zeros((1, 3)), np.zeros(1, bool),
                          np.full((1, 3), np.nan))
        q_cmd = ctrl(obs)
        t2 = time.perf_counter()
        bus.write_goal(q_cmd[0])
        t3 = time.perf_counter()
        ctrl.after_step(obs, q_cmd)
        t4 = time.perf_counter()
        timings.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        lost += pace.wait()
    return frames, lost
