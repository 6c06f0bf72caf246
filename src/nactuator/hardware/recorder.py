"""Leader-follower teleoperation recording into NAD shards.

Each cycle at the platform rate: read the leader's joints (torque off, moved by a person),
read the follower's full telemetry, command the follower to the leader's joints, and append
``(q_cmd, follower telemetry)`` as one frame. Frame t therefore holds the command issued at
t and the state measured just before it took effect — the convention the simulator rollout
uses (window ending at t predicts t + 1).

Safety of what is on disk: every episode is handed to the data writer and flushed (new
files, then the meta files atomically) before the next starts, so a crash or Ctrl-C never
touches episodes already saved. Ctrl-C ends the current episode, saves it, and stops.
A motor whose telemetry could not be read in a cycle is stored with telemetry_valid = 0 and
NaN values for that cycle, never a copied or interpolated value.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from nactuator.data.writer import DatasetWriter
from nactuator.hardware.bus import BusError, TelemetryBus, TelemetryFrame, open_bus
from nactuator.hardware.timing import sleep_until
from nactuator.platforms import Platform, load_platform

log = logging.getLogger(__name__)
G = 9.81  # NAD payload labels use g = 9.81

__all__ = ["EpisodeBuffer", "record"]


class EpisodeBuffer:
    """Frames of one episode, appended cycle by cycle, as Contract 1 arrays."""

    KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "pwm", "current")

    def __init__(self, n: int, payload_kg: float | None, journal=None) -> None:
        self.n = n
        self.payload_kg = payload_kg
        self.journal = journal  # data.EpisodeJournal: frames reach the disk every few seconds
        self._journaled = 0
        self.rows: dict[str, list[np.ndarray]] = {
            k: [] for k in (*self.KEYS, "telemetry_valid", "torque_enable")}
        self.timestamps: list[float] = []
        self.errors: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self.timestamps)

    def append(self, t: float, q_cmd: np.ndarray, f: TelemetryFrame) -> None:
        self.timestamps.append(t)
        self.rows["q_cmd"].append(np.asarray(q_cmd, dtype=float).copy())
        for key in self.KEYS[1:]:
            self.rows[key].append(getattr(f, key).copy())
        self.rows["telemetry_valid"].append(f.valid.astype(float))
        torque = f.torque if f.torque is not None else np.ones(self.n)
        self.rows["torque_enable"].append(np.asarray(torque, dtype=float))
        for sid, err in f.errors.items():
            self.errors.setdefault(sid, err)
        if self.journal is not None and len(self) - self._journaled >= self.journal.chunk_frames:
            self.journal.extend(self.frames(start=self._journaled))
            self._journaled = len(self)

    def frames(self, start: int = 0) -> dict[str, np.ndarray]:
        out = {k: np.stack(v[start:]) for k, v in self.rows.items()}
        T = len(self) - start
        if self.payload_kg is None:
            out["force"] = np.full((T, 3), math.nan)  # unlabelled
            out["payload_mass"] = np.full(T, math.nan)
        else:
            out["force"] = np.tile([0.0, 0.0, -self.payload_kg * G], (T, 1))
            out["payload_mass"] = np.full(T, self.payload_kg)
        out["timestamp"] = np.asarray(self.timestamps[start:])
        return out


def _ramp_to(follower: TelemetryBus, target: np.ndarray, seconds: float, fps: float,
             settle_s: float, tolerance: float) -> None:
    """Move the follower from where it is to ``target`` before recording starts, so
    enabling torque never snaps the arm to a far-away leader pose; then wait (at most
    ``settle_s``) until every joint is within ``tolerance`` of it, so an episode does not
    begin with the follower still catching up."""
    start = follower.wait_ready().q
    start = np.where(np.isfinite(start), start, target)
    steps = max(1, int(seconds * fps))
    for k in range(1, steps + 1):
        s = k / steps
        s = s * s * (3 - 2 * s)  # smoothstep: zero velocity at both ends
        follower.write_goal(start + s * (target - start))
        time.sleep(1.0 / fps)
    t_end = time.monotonic() + settle_s
    while time.monotonic() < t_end:
        q = follower.read().q
        if np.nanmax(np.abs(q - target), initial=0.0) < tolerance:
            return
        follower.write_goal(target)
        time.sleep(1.0 / fps)
    log.warning("follower did not reach the leader's pose within %.1f s (worst joint off by "
                "%.3f); recording anyway", settle_s, float(np.nanmax(np.abs(q - target))))


def _record_episode(leader: TelemetryBus, follower: TelemetryBus, buf: EpisodeBuffer,
                    seconds: float, fps: float, bar: tqdm | None) -> dict:
    period = 1.0 / fps
    lo = np.array([c.limit_lower for c in follower.platform.channels])
    hi = np.array([c.limit_upper for c in follower.platform.channels])
    q_cmd = follower.read_goal()
    stats = {"overruns": 0, "invalid_frames": 0, "leader_invalid": 0}
    t0 = time.monotonic()
    t_end = t0 + seconds
    t_next = t0
    t_rate, k_rate = t0, 0
    # The episode lasts ``seconds`` of wall time; a cycle that overruns costs frames (counted
    # as dropped), it never stretches the episode.
    while t_next < t_end:
        lead = leader.read()
        # Hold the previous command for a leader motor that was not read: that hold is
        # exactly what the follower was commanded, so recording it invents nothing.
        q_cmd = np.clip(np.where(lead.valid, lead.q, q_cmd), lo, hi)
        stats["leader_invalid"] += int(not lead.valid.all())
        frame = follower.read()
        follower.write_goal(q_cmd)
        buf.append(frame.t - t0, q_cmd, frame)
        stats["invalid_frames"] += int(not frame.valid.all())
        if bar is not None:
            bar.update(1)
            k_rate += 1
            now = time.monotonic()
            if now - t_rate >= 0.5:
                bar.set_postfix(rate=f"{k_rate / (now - t_rate):.1f}Hz",
                                dropped=stats["overruns"], invalid=stats["invalid_frames"],
                                T=f"{np.nanmax(frame.temperature, initial=-1):.0f}C")
                t_rate, k_rate = now, 0
        t_next += period
        delay = t_next - time.monotonic()
        if delay > 0:
            sleep_until(time.perf_counter() + delay)
        elif delay < -period:
            # More than one period late: the slot is lost. Re-anchor instead of bursting.
            stats["overruns"] += int(-delay // period)
            t_next = time.monotonic()
    return stats


def record(platform: str | Platform, leader: str, follower: str, task: str,
           episodes: int = 1, seconds: float = 10.0, out: str | Path = "data/recorded",
           payload_g: float | None = None, split: str = "train",
           leader_calibration: str | Path | None = None,
           follower_calibration: str | Path | None = None, progress: bool = True) -> str:
    """Record ``episodes`` teleoperation episodes of ``seconds`` each into ``out``.

    ``leader``/``follower``: serial ports. ``payload_g``: grams held by the follower
    throughout; labels force = (0, 0, -m g) N (0 g labels free motion as zero force); None
    leaves force unlabelled (NaN). Re-running with the same ``out`` appends.
    """
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive number, got {seconds}")
    if payload_g is not None and not (payload_g >= 0 and math.isfinite(payload_g)):
        raise ValueError(f"payload_g must be >= 0 grams, got {payload_g}")
    if leader == follower:
        raise ValueError(f"leader and follower must be different ports, both are {leader!r}")
    if not task or not task.strip():
        raise ValueError("task must be a non-empty description, e.g. 'pick_place_200g'")
    fps = p.fps
    ramp_s = float(p.hardware.get("record_ramp_s", 1.0))
    settle_s = float(p.hardware.get("record_settle_s", 2.0))
    tolerance = float(p.hardware.get("record_settle_tolerance", 0.05))
    payload_kg = None if payload_g is None else payload_g / 1000.0
    meta = {"source": "nactuator record", "bus": p.hardware.get("bus")}
    writer = DatasetWriter(out, p, fps, metadata=meta)
    saved: list[tuple[int, int]] = []
    interrupted = False
    with open_bus(p, leader, leader_calibration, torque=False) as lead_bus, \
            open_bus(p, follower, follower_calibration) as foll_bus:
        first = lead_bus.wait_ready()
        if not first.valid.all():
            bad = [f"{lead_bus.ids[k]} ({lead_bus.names[k]})" for k in np.flatnonzero(~first.valid)]
            raise BusError(f"leader on {leader}: no telemetry from servo(s) {', '.join(bad)} "
                           "within 1 s: check its cable and power; nothing was recorded")
        foll_bus.write_goal(foll_bus.wait_ready().q)  # hold where it is, then torque on
        foll_bus.set_torque(True)
        _ramp_to(foll_bus, first.q, ramp_s, fps, settle_s, tolerance)
        for ep in range(episodes):
            journal = writer.begin_episode(task, split, episode_meta={
                "leader_port": leader, "follower_port": follower, "payload_g": payload_g,
                "seconds_requested": seconds})
            buf = EpisodeBuffer(p.n, payload_kg, journal)
            bar = tqdm(total=int(round(seconds * fps)), desc=f"episode {ep + 1}/{episodes}",
                       unit="frame", disable=not progress, leave=True)
            stats: dict = {}
            error: BaseException | None = None
            before = dict(foll_bus.counters)
            try:
                stats = _record_episode(lead_bus, foll_bus, buf, seconds, fps, bar)
            except KeyboardInterrupt:
                interrupted = True
            except BaseException as e:  # save what was recorded, then re-raise
                error = e
            finally:
                bar.close()
            if len(buf):
                episode_meta = {
                    "leader_port": leader, "follower_port": follower,
                    "payload_g": payload_g, "seconds_requested": seconds,
                    "interrupted": bool(interrupted or error), **stats,
                    "hardware_errors": {str(k): v for k, v in buf.errors.items()},
                    "absent_servos": foll_bus.absent_ids,
                    "bus_counters": {k: v - before[k] for k, v in foll_bus.counters.items()},
                }
                writer.add_episode(buf.frames(), task, split, episode_meta=episode_meta,
                                   journal=journal)
                writer.flush()
                saved.append((ep, len(buf)))
            else:
                journal.discard()
            if error is not None:
                writer.close()
                raise error
            if interrupted:
                break
        foll_bus.set_torque(False)  # as LeRobot does on disconnect
    writer.close()
    frames = sum(n for _, n in saved)
    how = " (stopped by Ctrl-C)" if interrupted else ""
    return (f"recorded {len(saved)} episode(s), {frames} frames at {fps:g} Hz "
            f"(task {task!r}, split {split}) to {Path(out)}{how}")


def with_hardware(platform: Platform, **changes) -> Platform:
    """A copy of ``platform`` with some ``hardware:`` keys changed (tests, benches)."""
    return dataclasses.replace(platform, hardware={**platform.hardware, **changes})
