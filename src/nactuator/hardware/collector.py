"""Autonomous data collection on a servo bus (``nactuator collect``; DexNDM, SPEC §7).

No human in the loop: a base command sequence (a recorded episode's commands, or generated
joint sweeps) is replayed open loop at the platform rate, ``episodes`` times back to back.
On every frame, with probability ``noise_probability``, Gaussian noise of ``noise_sigma``
(rad) is added to the action of the revolute channels (a prismatic gripper, in metres, is
replayed as is). Each episode starts with the recorder's smooth ramp to the sequence's
first command; there are no human resets.

Safety comes before every write. Each cycle reads the telemetry, then checks it and the
command about to be sent against :class:`SafetyLimits` (joint-limit margin on the measured
position and on the command, velocity, temperature, current, servo hardware alerts, and a
servo that has gone unread for too many cycles, whose limits cannot be checked). The ramp
to an episode's first command is checked the same way, except the measured position: an
arm at rest may sit outside the margin, and the ramp (a straight line to a command inside
it) is what brings it in; from the episode's first frame on, the position counts too. On a
violation the command is **not** written: torque goes off at once, the episode so far is
saved, and :class:`SafetyStop` says which servo broke which limit, with the value.

Recording guarantees are the recorder's (:mod:`nactuator.hardware.recorder`, the same
:class:`EpisodeBuffer`, journal and data writer): each episode is journaled while it runs
and committed before the next starts; Ctrl-C / SIGTERM ends the current episode, saves it
and stops; closing the bus switches torque off however collection ends.

:func:`replay_sequences` is the same guarded open-loop replay without noise or recording:
each given command sequence once, after the checked ramp to its first command and a full
settle, returning the telemetry it produced (what ``nactuator correct eval --port`` scores
corrected against uncorrected commands with).
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from nactuator.data.writer import DatasetWriter
from nactuator.hardware.bus import TelemetryBus, TelemetryFrame
from nactuator.hardware.open import open_bus
from nactuator.hardware.port import BusError
from nactuator.hardware.recorder import EpisodeBuffer, run_episode, save_episode
from nactuator.hardware.signals import sigterm_as_interrupt
from nactuator.hardware.timing import FixedRate
from nactuator.platforms import Platform, load_platform
from nactuator.progress import progress_bar

__all__ = ["SafetyLimits", "SafetyStop", "collect", "noisy_commands", "replay_sequences",
           "sweep_commands"]

NOISE_SIGMA = 0.01  # rad, SPEC §7
NOISE_PROBABILITY = 0.5


class SafetyStop(BusError):
    """Collection stopped on a safety limit; the command that would have broken it was not
    sent, torque is off and the frames before it are saved. The message says why."""


@dataclass(frozen=True)
class SafetyLimits:
    """What ``collect`` checks before every command (``hardware.collect`` in the platform
    YAML; units SI, as the telemetry).

    limit_margin: fraction of each joint's range kept clear at both ends, for the measured
        position and for the command.
    max_velocity: |qd| limit of revolute channels [rad/s]; ``max_velocity_prismatic`` [m/s].
    max_temperature: servo temperature [°C], on the median of the last
        ``temperature_window`` frames: STS3215 temperature reads glitch for single frames
        (80-95 °C spikes in the NAD logs) while a real overheating lasts minutes.
    max_current: |current| [A].
    max_blind_cycles: consecutive cycles a servo may go unread before its limits count as
        unknown (a stop).
    """

    limit_margin: float = 0.05
    max_velocity: float = 6.0
    max_velocity_prismatic: float = 0.2
    max_temperature: float = 60.0
    max_current: float = 1.5
    max_blind_cycles: int = 5
    temperature_window: int = 5

    def __post_init__(self) -> None:
        if not 0.0 <= self.limit_margin < 0.5:
            raise ValueError(f"limit_margin must be in [0, 0.5), got {self.limit_margin}")
        for name in ("max_velocity", "max_velocity_prismatic", "max_temperature",
                     "max_current"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name in ("max_blind_cycles", "temperature_window"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_platform(cls, platform: Platform, **overrides: Any) -> SafetyLimits:
        settings = dict(platform.hardware.get("collect") or {})
        unknown = sorted(set(settings) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{platform.source}: hardware.collect has unknown key(s) {unknown}; "
                             f"expected some of {sorted(cls.__dataclass_fields__)}")
        settings.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**settings)


class _Guard:
    """The checks of :class:`SafetyLimits` for one platform; each returns None or why not."""

    def __init__(self, platform: Platform, limits: SafetyLimits) -> None:
        self.names = platform.channel_names
        lo = np.array([c.limit_lower for c in platform.channels])
        hi = np.array([c.limit_upper for c in platform.channels])
        margin = limits.limit_margin * (hi - lo)
        self.lo, self.hi = lo + margin, hi - margin
        prismatic = np.array([c.kind == "prismatic" for c in platform.channels])
        self.max_qd = np.where(prismatic, limits.max_velocity_prismatic, limits.max_velocity)
        self.units = [c.unit for c in platform.channels]
        self.limits = limits
        self.blind = np.zeros(platform.n, dtype=int)
        self.temperatures: deque[np.ndarray] = deque(maxlen=int(limits.temperature_window))
        self.ids = [int(i) for i in platform.hardware["ids"]]

    def _where(self, k: int) -> str:
        return f"servo {self.ids[k]} ({self.names[k]})"

    def command(self, q_cmd: np.ndarray) -> str | None:
        bad = np.flatnonzero(~((q_cmd >= self.lo) & (q_cmd <= self.hi)))
        if bad.size:
            k = int(bad[0])
            return (f"{self._where(k)} command {q_cmd[k]:.4f} {self.units[k]} is outside its "
                    f"joint-limit margin [{self.lo[k]:.4f}, {self.hi[k]:.4f}]")
        return None

    def state(self, f: TelemetryFrame, positions: bool = True) -> str | None:
        """``positions=False`` skips the measured joint-limit margin (and only it): before
        an episode the arm may rest outside it (a folded SO-101 sits on its shoulder_lift
        limit) and the checked ramp is what brings it inside."""
        for sid, err in f.errors.items():
            k = self.ids.index(sid) if sid in self.ids else 0
            return f"{self._where(k)} reported a hardware error: {err}"
        self.blind = np.where(f.valid, 0, self.blind + 1)
        blind = np.flatnonzero(self.blind >= self.limits.max_blind_cycles)
        if blind.size:
            k = int(blind[0])
            return (f"{self._where(k)} was not read for {self.blind[k]} cycles: its limits "
                    "cannot be checked")
        self.temperatures.append(np.where(f.valid, f.temperature, np.nan))
        with warnings.catch_warnings():  # a servo with no reading in the window: NaN, no alarm
            warnings.simplefilter("ignore", RuntimeWarning)
            self.temperature = np.nanmedian(np.stack(self.temperatures), axis=0)
        checks = (
            ((f.q < self.lo) | (f.q > self.hi)) & positions,
            np.abs(f.qd) > self.max_qd,
            self.temperature > self.limits.max_temperature,
            np.abs(f.current) > self.limits.max_current,
        )
        for which, bad in enumerate(checks):
            hit = np.flatnonzero(bad & f.valid)
            if not hit.size:
                continue
            k = int(hit[0])
            return self._explain(which, k, f)
        return None

    def _explain(self, which: int, k: int, f: TelemetryFrame) -> str:
        if which == 0:
            return (f"{self._where(k)} position {f.q[k]:.4f} {self.units[k]} is outside its "
                    f"joint-limit margin [{self.lo[k]:.4f}, {self.hi[k]:.4f}]")
        if which == 1:
            return (f"{self._where(k)} velocity {f.qd[k]:.3f} {self.units[k]}/s exceeds "
                    f"{self.max_qd[k]:g}")
        if which == 2:
            return (f"{self._where(k)} temperature {self.temperature[k]:.1f} °C (median of "
                    f"the last {len(self.temperatures)} reads) exceeds "
                    f"{self.limits.max_temperature:g} °C")
        return (f"{self._where(k)} current {f.current[k]:.3f} A exceeds "
                f"{self.limits.max_current:g} A")


def sweep_commands(platform: Platform, seconds: float, seed: int = 0,
                   limits: SafetyLimits | None = None, amplitude: float = 0.35) -> np.ndarray:
    """A generated base sequence (T, n): per joint a sum of three slow sines (0.1–0.6 Hz,
    random phases) around the middle of the safe range, at most ``amplitude`` of its half
    width, faded in over the first second so it starts at the middle."""
    if not 0.0 < amplitude <= 0.9:
        raise ValueError(f"amplitude must be in (0, 0.9], got {amplitude}")
    guard = _Guard(platform, limits or SafetyLimits.from_platform(platform))
    frames = max(1, round(seconds * platform.fps))
    t = np.arange(frames) / platform.fps
    rng = np.random.default_rng(seed)
    freq = rng.uniform(0.1, 0.6, size=(3, platform.n))
    phase = rng.uniform(0, 2 * np.pi, size=(3, platform.n))
    weight = rng.dirichlet(np.ones(3), size=platform.n).T  # the sines' shares, sum 1
    wave = (weight * np.sin(2 * np.pi * freq * t[:, None, None] + phase)).sum(axis=1)
    fade = np.clip(t / 1.0, 0.0, 1.0)[:, None]
    fade = fade * fade * (3 - 2 * fade)
    centre, half = (guard.lo + guard.hi) / 2, (guard.hi - guard.lo) / 2
    return centre + amplitude * half * fade * (wave - wave[0])


def noisy_commands(platform: Platform, base: np.ndarray, sigma: float, probability: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``base`` with N(0, sigma²) added to the revolute channels of each frame chosen with
    ``probability``; returns the commands and the (T,) mask of noisy frames."""
    revolute = np.array([c.kind == "revolute" for c in platform.channels], dtype=float)
    noisy = rng.random(len(base)) < probability
    noise = rng.normal(0.0, sigma, size=base.shape) * revolute * noisy[:, None]
    return base + noise, noisy


def _check_base(platform: Platform, base: np.ndarray) -> np.ndarray:
    base = np.asarray(base, dtype=float)
    if base.ndim != 2 or base.shape[1] != platform.n or len(base) < 1:
        raise ValueError(f"the base command sequence must have shape (T, {platform.n}) for "
                         f"{platform.name}, got {base.shape}")
    if not np.isfinite(base).all():
        raise ValueError("the base command sequence contains NaN or inf")
    return base


def _start_sequence(bus: TelemetryBus, guard: _Guard, target: np.ndarray, first: bool,
                    ramp_s: float, fps: float, settle_s: float, tolerance: float) -> str | None:
    """Check the arm and the first command, switch torque on (holding where the arm is) if
    this is the first sequence, and ramp to ``target`` with every step checked; returns the
    violation that stopped it, or None."""
    frame = bus.wait_ready()
    violation = guard.state(frame, positions=False) or guard.command(target)
    if violation is not None:
        return violation
    if first:
        bus.write_goal(frame.q)  # hold where it is, then torque on
        bus.set_torque(True)
    return _checked_ramp(bus, guard, frame.q, target, ramp_s, fps, settle_s, tolerance)


def _checked_ramp(bus: TelemetryBus, guard: _Guard, start: np.ndarray, target: np.ndarray,
                  seconds: float, fps: float, settle_s: float, tolerance: float) -> str | None:
    """Move smoothly from ``start`` to ``target`` (no human resets), reading and checking the
    telemetry before every goal like the episode itself; then hold ``target`` until every
    joint is within ``tolerance`` (at most ``settle_s``). Returns a violation or None.

    The path is a straight line between two commands inside the (convex) safe box, so every
    goal on it is inside too; it is slow enough that the smoothstep's peak speed (1.5 x the
    mean) is at most half the velocity limit."""
    start = np.where(np.isfinite(start), start, target)
    seconds = max(seconds, float(np.max(3.0 * np.abs(target - start) / guard.max_qd)))
    steps = max(1, int(seconds * fps))
    hold = max(0, int(settle_s * fps))
    pace = FixedRate(fps).start()
    for k in range(1, steps + hold + 1):
        frame = bus.read()
        why = guard.state(frame, positions=False)
        if why is not None:
            return why
        if k > steps and np.nanmax(np.abs(frame.q - target), initial=0.0) < tolerance:
            return None
        s = min(1.0, k / steps)
        bus.write_goal(start + s * s * (3 - 2 * s) * (target - start))
        pace.wait()
    return None


def _collect_episode(bus: TelemetryBus, guard: _Guard, commands: np.ndarray,
                     buf: EpisodeBuffer, fps: float, bar: Any, stats: dict,
                     stop: threading.Event | None) -> str | None:
    """Replay ``commands`` once; returns the safety violation that ended it, or None.
    Slot k of the fixed-rate loop sends command k, so an overrun skips commands (counted
    in ``stats["overruns"]``, listed in ``stats["skipped_slots"]``) and the replay keeps the
    sequence's timing."""
    n_slots = len(commands)
    stats.update(overruns=0, invalid_frames=0, skipped_slots=[])
    t0 = time.monotonic()
    pace = FixedRate(fps).start()
    while pace.slot < n_slots and not (stop is not None and stop.is_set()):
        frame = bus.read()
        q_cmd = commands[pace.slot]
        why = guard.state(frame) or guard.command(q_cmd)
        if why is not None:
            bus.torque_off()  # before anything else; the command above is never sent
            stats["stopped_at_slot"] = pace.slot
            return why
        bus.write_goal(q_cmd)
        buf.append(frame.t - t0, q_cmd, frame)
        stats["invalid_frames"] += int(not frame.valid.all())
        if bar is not None:
            bar.update(1)
        slot = pace.slot
        lost = pace.wait(n_slots)
        stats["overruns"] += lost
        stats["skipped_slots"] += list(range(slot + 1, slot + 1 + lost))
    return None


def collect(platform: str | Platform, port: str, base: np.ndarray, episodes: int = 1,
            out: str | Path = "data/collected", task: str = "collect",
            noise_sigma: float = NOISE_SIGMA, noise_probability: float = NOISE_PROBABILITY,
            seed: int = 0, split: str = "train", limits: SafetyLimits | None = None,
            calibration: str | Path | None = None, base_source: str = "given",
            progress: bool = True, stop: threading.Event | None = None) -> str:
    """Replay ``base`` (T, n) open loop ``episodes`` times with action noise into ``out``.

    Episode e draws its noise from ``default_rng([seed, e])``. Returns a one-line summary;
    raises :class:`SafetyStop` (after saving and switching torque off) on a violation.
    """
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    base = _check_base(p, base)
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not (noise_sigma >= 0 and math.isfinite(noise_sigma)):
        raise ValueError(f"noise_sigma must be >= 0 rad, got {noise_sigma}")
    if not 0.0 <= noise_probability <= 1.0:
        raise ValueError(f"noise_probability must be in [0, 1], got {noise_probability}")
    limits = limits or SafetyLimits.from_platform(p)
    with sigterm_as_interrupt():
        return _collect(p, port, base, episodes, Path(out), task, noise_sigma,
                        noise_probability, seed, split, limits, calibration, base_source,
                        progress, stop)


def _collect(p: Platform, port: str, base: np.ndarray, episodes: int, out: Path, task: str,
             sigma: float, probability: float, seed: int, split: str, limits: SafetyLimits,
             calibration, base_source: str, progress: bool,
             stop: threading.Event | None) -> str:
    fps = p.fps
    hw = p.hardware
    ramp_s = float(hw.get("record_ramp_s", 1.0))
    settle_s = float(hw.get("record_settle_s", 2.0))
    tolerance = float(hw.get("record_settle_tolerance", 0.05))
    guard = _Guard(p, limits)
    writer = DatasetWriter(out, p, fps, metadata={"source": "nactuator collect",
                                                  "bus": hw.get("bus")})
    saved: list[int] = []
    stopped_by: str | None = None
    violation: str | None = None
    # Leaving this block closes the bus, whatever ended it: torque off.
    with open_bus(p, port, calibration) as bus:
        for ep in range(episodes):
            commands, noisy = noisy_commands(p, base, sigma, probability,
                                             np.random.default_rng([seed, ep]))
            violation = _start_sequence(bus, guard, commands[0], ep == 0, ramp_s, fps,
                                        settle_s, tolerance)
            if violation is not None:
                bus.torque_off()
                break
            meta = {"port": port, "base": base_source, "noise_sigma": sigma,
                    "noise_probability": probability, "seed": seed, "collect_episode": ep,
                    "noisy_frames": int(noisy.sum())}
            journal = writer.begin_episode(task, split, episode_meta=meta)
            buf = EpisodeBuffer(p.n, None, journal)
            bar = progress_bar(total=len(commands), desc=f"collect {ep + 1}/{episodes}",
                               unit="frame", disable=not progress, leave=True)
            stats: dict = {}
            violation, stopped_by, error = run_episode(
                partial(_collect_episode, bus, guard, commands, buf, fps, bar, stats, stop),
                bar, stop)
            meta.update(stats, interrupted=bool(stopped_by or error or violation),
                        safety_stop=violation)
            if len(buf):
                save_episode(writer, buf, task, split, meta, journal)
                saved.append(len(buf))
            else:
                journal.discard()
            if error is not None:
                writer.close()
                raise error
            if stopped_by or violation:
                break
    writer.close()
    summary = (f"{len(saved)} episode(s), {sum(saved)} frames at {fps:g} Hz "
               f"(task {task!r}, split {split}) in {out}")
    if violation is not None:
        raise SafetyStop(f"safety stop: {violation}; that command was not sent and torque is "
                         f"off. Saved {summary}")
    how = f" (stopped by {stopped_by})" if stopped_by else ""
    return f"collected {summary}{how}"


def replay_sequences(platform: str | Platform, port: str, sequences, limits: SafetyLimits |
                     None = None, calibration: str | Path | None = None,
                     settle_s: float | None = None, progress: bool = False,
                     labels: list[str] | None = None) -> list[dict[str, Any]]:
    """Play each command sequence (T, n) once, open loop, at the platform rate on the bus at
    ``port``, behind the safety checks of :func:`collect`, and return what the bus reported.

    Before each sequence the arm ramps (checked) to the sequence's first command and holds
    it for ``settle_s`` (default: the platform's ``record_settle_s``), the whole time, so
    every sequence starts from the same rest at its first command, as a replay in the world
    does. Frame k is the telemetry read just before command k is written: ``q[k + 1]`` is
    the response to ``commands[k]``. Per sequence: ``q``, ``qd`` (T, n), NaN where a servo
    was not read or the slot was lost to an overrun; ``valid`` (T, n) bool; ``overruns`` and
    ``skipped_slots``. Raises :class:`SafetyStop` (the command not sent, torque off) on a
    violation; closing the bus leaves torque off however it ends.
    """
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    sequences = [_check_base(p, s) for s in sequences]
    if not sequences:
        raise ValueError("replay_sequences needs at least one command sequence")
    limits = limits or SafetyLimits.from_platform(p)
    hw = p.hardware
    fps = p.fps
    ramp_s = float(hw.get("record_ramp_s", 1.0))
    settle_s = float(hw.get("record_settle_s", 2.0) if settle_s is None else settle_s)
    guard = _Guard(p, limits)
    results: list[dict[str, Any]] = []
    with sigterm_as_interrupt(), open_bus(p, port, calibration) as bus:
        for i, commands in enumerate(sequences):
            name = labels[i] if labels else f"sequence {i}"
            # tolerance 0: hold the first command for the whole settle time
            violation = _start_sequence(bus, guard, commands[0], i == 0, ramp_s, fps,
                                        settle_s, 0.0)
            if violation is None:
                result, violation = _replay_once(bus, guard, commands, fps, progress, name)
                results.append(result)
            if violation is not None:
                bus.torque_off()
                raise SafetyStop(f"safety stop in {name}: {violation}; that command was not "
                                 "sent and torque is off")
    return results


def _replay_once(bus: TelemetryBus, guard: _Guard, commands: np.ndarray, fps: float,
                 progress: bool, name: str) -> tuple[dict[str, Any], str | None]:
    n_slots, n = commands.shape
    q = np.full((n_slots, n), np.nan)
    qd = np.full((n_slots, n), np.nan)
    valid = np.zeros((n_slots, n), dtype=bool)
    skipped: list[int] = []
    violation = None
    bar = progress_bar(total=n_slots, desc=f"replay {name}", unit="frame",
                       disable=not progress, leave=False)
    with bar:
        pace = FixedRate(fps).start()
        while pace.slot < n_slots:
            frame = bus.read()
            k = pace.slot
            violation = guard.state(frame) or guard.command(commands[k])
            if violation is not None:
                break
            bus.write_goal(commands[k])
            valid[k] = frame.valid
            q[k] = np.where(frame.valid, frame.q, np.nan)
            qd[k] = np.where(frame.valid, frame.qd, np.nan)
            bar.update(1)
            lost = pace.wait(n_slots)
            skipped += list(range(k + 1, k + 1 + lost))
    return ({"q": q, "qd": qd, "valid": valid, "overruns": len(skipped),
             "skipped_slots": skipped}, violation)
