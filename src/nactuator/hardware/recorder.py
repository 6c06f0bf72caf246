"""Leader-follower teleoperation recording into a nactuator dataset.

Each cycle at the platform rate: read the leader's joints (torque off, moved by a person),
read the follower's full telemetry, command the follower to the leader's joints, and append
``(q_cmd, follower telemetry)`` as one frame. Frame t therefore holds the command issued at
t and the state measured just before it took effect — the convention the simulator rollout
uses (window ending at t predicts t + 1).

Safety of what is on disk: every episode is handed to the data writer and flushed (new
files, then the meta files atomically) before the next starts, so a crash or Ctrl-C never
touches episodes already saved. Ctrl-C (or SIGTERM) ends the current episode, saves it, and
stops; a second Ctrl-C while it is being saved waits until it is. A motor whose telemetry
could not be read in a cycle is stored with telemetry_valid = 0 and NaN values for that
cycle, never a copied or interpolated value. An episode whose follower telemetry is
complete in fewer than ``min_valid_fraction`` of its frames is still saved, then recording
stops with :class:`RecordingQualityError` naming what failed on the wire.

Safety of the arm: however recording ends — normally, Ctrl-C, SIGTERM, an exception, a
bus error — closing the follower's bus switches its torque off (``TelemetryBus.close``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from nactuator.data.schema import REQUIRED_KEYS
from nactuator.data.writer import DatasetWriter
from nactuator.hardware.bus import TelemetryBus, TelemetryFrame
from nactuator.hardware.open import open_bus
from nactuator.hardware.port import BusError, describe_failures
from nactuator.hardware.signals import interrupts_deferred, sigterm_as_interrupt
from nactuator.hardware.timing import FixedRate
from nactuator.platforms import Platform, load_platform
from nactuator.progress import progress_bar
from nactuator.viewer import Viewer, open_viewer

log = logging.getLogger(__name__)
G = 9.81  # NAD payload labels use g = 9.81
MIN_VALID_FRACTION = 0.9  # default share of frames with complete follower telemetry

__all__ = ["EpisodeBuffer", "RecordingQualityError", "record", "run_episode", "save_episode"]


class RecordingQualityError(BusError):
    """An episode was recorded (and saved) with too little valid follower telemetry."""


class EpisodeBuffer:
    """Frames of one episode, appended cycle by cycle, as Contract 1 arrays."""

    KEYS = (*REQUIRED_KEYS, "pwm", "current")

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
    pace = FixedRate(fps).start()
    for k in range(1, steps + 1):
        s = k / steps
        s = s * s * (3 - 2 * s)  # smoothstep: zero velocity at both ends
        follower.write_goal(start + s * (target - start))
        pace.wait()
    t_end = time.monotonic() + settle_s
    off = math.inf
    while time.monotonic() < t_end:
        off = float(np.nanmax(np.abs(follower.read().q - target), initial=0.0))
        if off < tolerance:
            return
        follower.write_goal(target)
        pace.wait()
    log.warning("follower did not reach the leader's pose within %.1f s (worst joint off by "
                "%.3f); recording anyway", settle_s, off)


def run_episode(loop: Callable[[], Any], bar: Any, stop: threading.Event | None
                ) -> tuple[Any, str | None, BaseException | None]:
    """Run one episode's loop so that whatever ends it, what it buffered can still be saved.

    Returns ``(the loop's result, stopped_by, error)``: a Ctrl-C (or SIGTERM, raised as one)
    or the ``stop`` event ends the episode with ``stopped_by`` saying which; any other
    exception is returned for the caller to re-raise after the save (record and collect).
    """
    result, stopped_by, error = None, None, None
    try:
        result = loop()
    except KeyboardInterrupt as e:
        stopped_by = str(e.args[0]) if e.args else "Ctrl-C"
    except BaseException as e:  # save what was buffered, then re-raise
        error = e
    finally:
        bar.close()
    if stopped_by is None and stop is not None and stop.is_set():
        stopped_by = "the stop event"
    return result, stopped_by, error


def save_episode(writer: DatasetWriter, buf: EpisodeBuffer, task: str, split: str,
                 episode_meta: dict, journal=None) -> int:
    """Commit one episode (its journal deleted once it is in the dataset); a second Ctrl-C
    waits until its files are written. Returns its ``episode_index``."""
    with interrupts_deferred():
        index = writer.add_episode(buf.frames(), task, split, episode_meta=episode_meta,
                                   journal=journal)
        writer.flush()
    return index


def _hottest(frame: TelemetryFrame) -> str:
    """The hottest servo's temperature for the progress bar; '?' when none was read."""
    t = frame.temperature[np.isfinite(frame.temperature)]
    return f"{t.max():.0f}C" if t.size else "?"


def _record_episode(leader: TelemetryBus, follower: TelemetryBus, buf: EpisodeBuffer,
                    seconds: float, fps: float, bar: Any, stats: dict,
                    stop: threading.Event | None, viewer: Viewer | None = None,
                    viewer_t0: float = 0.0) -> None:
    """Record one episode into ``buf``; ``stats`` is filled as it goes (it survives an
    interrupt). Every slot of the episode is either a frame or counted in
    ``stats["overruns"]``: frames + overruns = round(seconds * fps) unless stopped early.
    ``viewer``: each frame also goes to Rerun, on a clock that started at ``viewer_t0``
    (the recording's start: episodes follow one another on its timeline)."""
    n_slots = max(1, round(seconds * fps))
    lo = np.array([c.limit_lower for c in follower.platform.channels])
    hi = np.array([c.limit_upper for c in follower.platform.channels])
    q_cmd = follower.read_goal()
    stats.update(overruns=0, invalid_frames=0, leader_invalid=0)
    t0 = time.monotonic()  # frame timestamps: the bus's frame times since the episode began
    t_rate, k_rate = -math.inf, 0
    # The episode lasts ``seconds`` of wall time (``n_slots`` slots of the fixed-rate loop);
    # a cycle that overruns costs frames (lost slots, counted as dropped), it never
    # stretches the episode.
    pace = FixedRate(fps).start()
    while pace.slot < n_slots and not (stop is not None and stop.is_set()):
        lead = leader.read()
        # Hold the previous command for a leader motor that was not read: that hold is
        # exactly what the follower was commanded, so recording it invents nothing.
        q_cmd = np.clip(np.where(lead.valid, lead.q, q_cmd), lo, hi)
        stats["leader_invalid"] += int(not lead.valid.all())
        frame = follower.read()
        follower.write_goal(q_cmd)
        buf.append(frame.t - t0, q_cmd, frame)
        if viewer is not None:
            viewer.log_frame(frame.t - viewer_t0, q=frame.q, leader_q=lead.q, q_cmd=q_cmd,
                             qd=frame.qd, effort=frame.effort, voltage=frame.voltage,
                             temperature=frame.temperature)
        stats["invalid_frames"] += int(not frame.valid.all())
        if bar is not None:
            bar.update(1)
            k_rate += 1
            now = time.monotonic()
            if now - t_rate >= 0.5:
                hz = k_rate / (now - t_rate) if math.isfinite(t_rate) else 0.0
                bar.set_postfix(rate=f"{hz:.1f}Hz", dropped=stats["overruns"],
                                invalid=stats["invalid_frames"], T=_hottest(frame))
                t_rate, k_rate = now, 0
        stats["overruns"] += pace.wait(n_slots)


def record(platform: str | Platform, leader: str, follower: str, task: str,
           episodes: int = 1, seconds: float = 10.0, out: str | Path = "data/recorded",
           payload_g: float | None = None, split: str = "train",
           leader_calibration: str | Path | None = None,
           follower_calibration: str | Path | None = None, progress: bool = True,
           min_valid_fraction: float = MIN_VALID_FRACTION,
           stop: threading.Event | None = None, rrd: str | Path | None = None,
           display: bool = False) -> str:
    """Record ``episodes`` teleoperation episodes of ``seconds`` each into ``out``.

    ``leader``/``follower``: serial ports. ``payload_g``: grams held by the follower
    throughout; labels force = (0, 0, -m g) N (0 g labels free motion as zero force); None
    leaves force unlabelled (NaN). Re-running with the same ``out`` appends.
    ``min_valid_fraction``: an episode with complete follower telemetry in fewer of its
    frames is saved, then :class:`RecordingQualityError` says what failed on the wire.
    ``stop``: another thread (a key listener, a foot pedal) sets it to end the current
    episode early, save it and stop, as Ctrl-C does. ``rrd`` / ``display``: also stream
    every frame to a Rerun recording file / viewer (:mod:`nactuator.viewer`).
    """
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive number, got {seconds}")
    if payload_g is not None and not (payload_g >= 0 and math.isfinite(payload_g)):
        raise ValueError(f"payload_g must be >= 0 grams, got {payload_g}")
    if not 0.0 <= min_valid_fraction <= 1.0:
        raise ValueError(f"min_valid_fraction must be between 0 and 1, got {min_valid_fraction}")
    if leader == follower:
        raise ValueError(f"leader and follower must be different ports, both are {leader!r}")
    if not task or not task.strip():
        raise ValueError("task must be a non-empty description, e.g. 'pick_place_200g'")
    viewer = open_viewer(f"record {p.name} {task}", p.channel_names, rrd, display)
    try:
        with sigterm_as_interrupt():
            return _record(p, leader, follower, task, episodes, seconds, Path(out), payload_g,
                           split, leader_calibration, follower_calibration, progress,
                           min_valid_fraction, stop, viewer)
    finally:
        if viewer is not None:
            viewer.close()


def _record(p: Platform, leader: str, follower: str, task: str, episodes: int,
            seconds: float, out: Path, payload_g: float | None, split: str,
            leader_calibration, follower_calibration, progress: bool,
            min_valid_fraction: float, stop: threading.Event | None,
            viewer: Viewer | None = None) -> str:
    fps = p.fps
    ramp_s = float(p.hardware.get("record_ramp_s", 1.0))
    settle_s = float(p.hardware.get("record_settle_s", 2.0))
    tolerance = float(p.hardware.get("record_settle_tolerance", 0.05))
    payload_kg = None if payload_g is None else payload_g / 1000.0
    meta = {"source": "nactuator record", "bus": p.hardware.get("bus")}
    writer = DatasetWriter(out, p, fps, metadata=meta)
    saved: list[tuple[int, int]] = []
    stopped_by: str | None = None
    poor: str | None = None
    # Leaving this block closes both buses, whatever ended it: the follower's torque off.
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
        viewer_t0 = time.monotonic()
        for ep in range(episodes):
            journal = writer.begin_episode(task, split, episode_meta={
                "leader_port": leader, "follower_port": follower, "payload_g": payload_g,
                "seconds_requested": seconds})
            buf = EpisodeBuffer(p.n, payload_kg, journal)
            bar = progress_bar(total=max(1, round(seconds * fps)),
                               desc=f"episode {ep + 1}/{episodes}", unit="frame",
                               disable=not progress, leave=True)
            stats: dict = {}
            before = dict(foll_bus.counters)
            if viewer is not None:
                viewer.log_event(time.monotonic() - viewer_t0,
                                 f"episode {ep + 1}/{episodes} ({task!r}) starts")
            _, stopped_by, error = run_episode(
                partial(_record_episode, lead_bus, foll_bus, buf, seconds, fps, bar, stats, stop,
                        viewer, viewer_t0), bar, stop)
            delta = {k: v - before[k] for k, v in foll_bus.counters.items()}
            if len(buf):
                complete = float(np.mean(np.all(np.stack(buf.rows["telemetry_valid"]) == 1,
                                                axis=1)))
                episode_meta = {
                    "leader_port": leader, "follower_port": follower,
                    "payload_g": payload_g, "seconds_requested": seconds,
                    "interrupted": bool(stopped_by or error), **stats,
                    "valid_fraction": complete,
                    "hardware_errors": {str(k): v for k, v in buf.errors.items()},
                    "absent_servos": foll_bus.absent_ids,
                    "bus_counters": delta,
                }
                index = save_episode(writer, buf, task, split, episode_meta, journal)
                saved.append((ep, len(buf)))
                if error is None and complete < min_valid_fraction:
                    poor = (f"episode {index} ({task!r}, {len(buf)} frames) has complete "
                            f"follower telemetry in only {complete:.0%} of its frames (minimum "
                            f"{min_valid_fraction:.0%}, --min-valid-fraction): "
                            f"{describe_failures(delta, foll_bus.rx_timeout_ms)}. It is saved "
                            f"in {out} (the missing values are NaN with telemetry_valid = 0); "
                            "fix the bus and record it again")
            else:
                journal.discard()
            if error is not None:
                writer.close()
                raise error
            if stopped_by or poor:
                break
    writer.close()
    if poor:
        raise RecordingQualityError(poor)
    frames = sum(n for _, n in saved)
    how = f" (stopped by {stopped_by})" if stopped_by else ""
    return (f"recorded {len(saved)} episode(s), {frames} frames at {fps:g} Hz "
            f"(task {task!r}, split {split}) to {out}{how}")


def with_hardware(platform: Platform, **changes) -> Platform:
    """A copy of ``platform`` with some ``hardware:`` keys changed (tests, benches)."""
    return dataclasses.replace(platform, hardware={**platform.hardware, **changes})
