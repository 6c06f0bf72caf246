"""Fault detection as a user needs it: how fast, how often wrongly, on which motor.

Input is a per-frame *degraded score* per motor, ``s = 1 - c`` for the model's condition
``c`` (or any baseline's score mapped to [0, 1]), from an episode whose motor ``channel``
degrades at frame ``onset`` (the ``onset`` tasks of ``conf/world/*_onset.yaml``).

The flag rule is causal, so a live monitor can apply it frame by frame: frame ``t`` is
flagged when the score was above ``threshold`` on each of the ``hold`` frames ``t-hold+1..t``
(a debounce: one noisy frame does not raise an alarm, and the rule costs ``hold - 1`` frames
of delay at most once the score has crossed). A motor is flagged, not the arm: the flag of
the faulted motor counts toward the delay, the flags of every motor before the onset count
as false.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nactuator.errors import UserError

__all__ = ["DetectionResult", "causal_flags", "detect", "detection_delay", "false_flag_rate",
           "localisation", "summarise"]


def causal_flags(score: np.ndarray, threshold: float = 0.5, hold: int = 1) -> np.ndarray:
    """(T, ...) bool: True where ``score`` exceeded ``threshold`` on this frame and the
    ``hold - 1`` frames before it (frames before the first ``hold - 1`` are never flagged).
    NaN scores count as not above."""
    if hold < 1:
        raise UserError(f"detection hold must be >= 1 frame, got {hold!r}")
    above = np.nan_to_num(np.asarray(score, dtype=np.float64), nan=-np.inf) > threshold
    # Length of the run of consecutive above-threshold frames ending at each frame.
    run = np.zeros(above.shape, dtype=np.int64)
    count = np.zeros(above.shape[1:], dtype=np.int64)
    for t in range(above.shape[0]):
        count = np.where(above[t], count + 1, 0)
        run[t] = count
    return run >= hold


def detection_delay(flags: np.ndarray, onset: int) -> int | None:
    """Frames from ``onset`` to the first flagged frame at or after it (None: never)."""
    after = np.flatnonzero(np.asarray(flags, dtype=bool)[onset:])
    return int(after[0]) if after.size else None


def false_flag_rate(flags: np.ndarray, onset: int) -> float:
    """Fraction of frames (x motors) before ``onset`` that are flagged (NaN if none)."""
    before = np.asarray(flags, dtype=bool)[:onset]
    return float(before.mean()) if before.size else float("nan")


def localisation(score: np.ndarray, onset: int) -> np.ndarray:
    """(n,) how far each motor's mean score moved from before to after ``onset``: the
    faulted motor should move most."""
    s = np.asarray(score, dtype=np.float64)
    return np.nanmean(s[onset:], axis=0) - np.nanmean(s[:onset], axis=0)


@dataclass
class DetectionResult:
    task: str
    fault: str  # band | wear
    channel: int
    onset: int  # frame
    delay_frames: int | None  # on the faulted motor; None: never flagged
    delay_s: float | None
    false_flag_rate: float  # before onset, all motors
    flagged_before_onset: bool  # the faulted motor already flagged before the fault
    shift: list[float]  # per motor, localisation()
    localised: bool  # the faulted motor's score moved most

    @property
    def flagged(self) -> bool:
        return self.delay_frames is not None


def detect(score: np.ndarray, onset: int, channel: int, dt: float, task: str = "",
           fault: str = "", threshold: float = 0.5, hold: int = 1) -> DetectionResult:
    """All detection figures of one episode; ``score`` (T, n) degraded scores."""
    s = np.asarray(score, dtype=np.float64)
    if s.ndim != 2 or not 0 < onset < s.shape[0] or not 0 <= channel < s.shape[1]:
        raise UserError(f"detection: need a (frames, motors) score, 0 < onset < frames and a "
                        f"motor index; got shape {s.shape}, onset {onset}, channel {channel}")
    flags = causal_flags(s, threshold, hold)
    delay = detection_delay(flags[:, channel], onset)
    shift = localisation(s, onset)
    return DetectionResult(
        task=task, fault=fault, channel=int(channel), onset=int(onset), delay_frames=delay,
        delay_s=None if delay is None else delay * dt,
        false_flag_rate=false_flag_rate(flags, onset),
        flagged_before_onset=bool(flags[:onset, channel].any()), shift=shift.tolist(),
        localised=bool(np.nanargmax(shift) == channel))


def summarise(results: list[DetectionResult]) -> dict:
    """Per (fault, channel): episodes, flagged count, median / worst delay [s] of the
    flagged ones (and the median over those not flagged before their onset), mean
    false-flag rate, localised count."""
    groups: dict[tuple[str, int], list[DetectionResult]] = {}
    for r in results:
        groups.setdefault((r.fault, r.channel), []).append(r)
    out = {}
    for (fault, ch), rs in sorted(groups.items()):
        delays = [r.delay_s for r in rs if r.delay_s is not None]
        # a run flagged before its onset counts 0 s above: the median without such runs
        clean = [r.delay_s for r in rs if r.delay_s is not None and not r.flagged_before_onset]
        out[f"{fault}@{ch}"] = {
            "episodes": len(rs), "flagged": len(delays),
            # a delay on a motor flagged before its fault began measures nothing
            "flagged_before_onset": sum(r.flagged_before_onset for r in rs),
            "median_delay_s": float(np.median(delays)) if delays else None,
            "median_delay_not_preflagged_s": float(np.median(clean)) if clean else None,
            "worst_delay_s": float(np.max(delays)) if delays else None,
            "false_flag_rate": float(np.mean([r.false_flag_rate for r in rs])),
            "localised": sum(r.localised for r in rs)}
    return out
