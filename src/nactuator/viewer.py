"""See it live: joints, commands, telemetry, force, contact gate and condition in Rerun.

One :class:`Viewer` per run. ``live`` and ``record`` call :meth:`Viewer.log_frame` once per
control cycle; ``data show`` calls :meth:`Viewer.log_episode` once per episode. Where it
goes: ``rrd`` saves the recording to a ``.rrd`` file (headless; open it later with
``rerun FILE``), ``display`` spawns the Rerun viewer (it needs a graphical display), or both.

Every signal has one entity path (:data:`ENTITIES`, e.g. ``joints/q``); a per-joint signal
is one entity whose series carry the platform's channel names, a force one whose series are
``fx, fy, fz``. Two timelines: ``time`` (seconds) and ``frame`` (frame index). Per frame,
one ``log`` call per signal and nothing else (no conversion beyond what Rerun does): about
0.13 ms per signal on 2 busy cores (bench/live.py --rrd, docs/benchmarks.md).

A presentation room below ``hardware`` and ``control`` (as ``atomic`` is below all): it
imports only numpy and, lazily, ``rerun``, and it knows a dataset only by duck type.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from nactuator.errors import UserError


class StoredEpisode(Protocol):
    """What :func:`show_episode` reads of one episode (``data.schema.Episode`` has it)."""

    index: int
    task: str
    split: str
    length: int
    frames: dict[str, np.ndarray]


class StoredDataset(Protocol):
    """What :func:`show_episode` reads of a dataset: a duck type, so the viewer (below
    ``data`` and ``hardware``) never imports ``data`` (``data.schema.Dataset`` has it)."""

    root: Any
    fps: float
    info: dict
    episodes: list[StoredEpisode]

__all__ = ["ENTITIES", "TIMELINES", "Viewer", "ViewerError", "open_viewer", "show_episode"]

# signal -> entity path. "estimate" is what the model says (live), "label" what a dataset
# says (data show); the force interval (force_lo/force_hi) is logged only when the model
# gives one.
ENTITIES: dict[str, str] = {
    "q": "joints/q",
    "qd": "joints/qd",
    "leader_q": "joints/leader_q",
    "q_cmd": "commands/q_cmd",
    "effort": "telemetry/effort",
    "voltage": "telemetry/voltage",
    "temperature": "telemetry/temperature",
    "pwm": "telemetry/pwm",
    "current": "telemetry/current",
    "telemetry_valid": "telemetry/valid",
    "force": "force/estimate",
    "force_lo": "force/estimate_lo",
    "force_hi": "force/estimate_hi",
    "gate": "contact/gate",
    # live --contact: the touched link (index into the contact config's links; -1 none),
    # the point in that link's frame [m] and the force [N, base frame]
    "contact_link": "contact/link",
    "contact_point": "contact/point",
    "contact_force": "contact/force",
    "condition": "condition/estimate",
    "force_label": "force/label",
    "condition_label": "condition/label",
    "payload_mass": "payload/mass",
}
XYZ = ("fx", "fy", "fz")
_FORCES = ("force", "force_lo", "force_hi", "force_label", "contact_force")
_POINTS = ("contact_point",)
TIMELINES = ("time", "frame")  # seconds (duration), frame index (sequence)
# Contract 1 keys of a stored episode -> the signal they are shown as.
EPISODE_SIGNALS = {"q": "q", "qd": "qd", "q_cmd": "q_cmd", "effort": "effort",
                   "voltage": "voltage", "temperature": "temperature", "pwm": "pwm",
                   "current": "current", "telemetry_valid": "telemetry_valid",
                   "force": "force_label", "condition": "condition_label",
                   "payload_mass": "payload_mass"}
GRPC_PORT = 9876  # Rerun's default viewer port


class ViewerError(UserError):
    """No viewer can be opened here, or what to show does not exist."""


def _viewer_executable() -> str:
    """The ``rerun`` viewer binary: on PATH, or beside this Python (an unactivated venv)."""
    found = shutil.which("rerun") or shutil.which("rerun", path=str(Path(sys.executable).parent))
    if found is None:
        raise ViewerError("--display: the Rerun viewer executable `rerun` is not on PATH nor "
                          f"beside {sys.executable} (pip install rerun-sdk); save the "
                          "recording with --rrd FILE instead")
    return found


def _check_display() -> None:
    """The viewer is a native window: on Linux it needs X11 or Wayland. Without one, a
    spawned viewer dies at once while the SDK waits for it, so refuse before starting."""
    if sys.platform.startswith("linux") and not any(
            os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET")):
        raise ViewerError("--display: no graphical display here (DISPLAY and WAYLAND_DISPLAY "
                          "are unset, e.g. over ssh or in a container), so the Rerun viewer "
                          "cannot open; save the recording with --rrd FILE and open it where "
                          "there is a screen with `rerun FILE`")


class Viewer:
    """One Rerun recording; frames are logged on the ``time`` and ``frame`` timelines."""

    def __init__(self, name: str, channel_names: Sequence[str], rrd: str | Path | None = None,
                 display: bool = False) -> None:
        if rrd is None and not display:
            raise ValueError("a Viewer needs rrd (a file to save to), display, or both")
        if display:  # fail before anything is logged (or a bus opened)
            _check_display()
            executable = _viewer_executable()
        import rerun as rr

        self._rr = rr
        self.channel_names = list(channel_names)
        self.rrd = None if rrd is None else Path(rrd)
        self.frames = 0  # frames logged by log_frame (the next frame's index)
        self._named: set[str] = set()
        self.rec = rr.RecordingStream("nactuator")
        # Our own timelines only: Rerun's automatic log_time / log_tick would add two more.
        self.rec.set_log_time_enabled(False)
        self.rec.set_log_tick_enabled(False)
        sinks = []
        if display:
            rr.spawn(port=GRPC_PORT, connect=False, executable_path=executable, recording=self.rec)
            sinks.append(rr.GrpcSink(f"rerun+http://127.0.0.1:{GRPC_PORT}/proxy"))
        if self.rrd is not None:
            self.rrd.parent.mkdir(parents=True, exist_ok=True)
            sinks.append(rr.FileSink(str(self.rrd)))
        self.rec.set_sinks(*sinks)
        self.rec.send_recording_name(name)

    def _series_names(self, signal: str, width: int) -> None:
        """Name a signal's series once (static), the first time it is logged."""
        if signal in self._named:
            return
        names = (list(XYZ) if signal in _FORCES else ["px", "py", "pz"] if signal in _POINTS
                 else self.channel_names if width > 1 else [signal])
        self.rec.log(ENTITIES[signal], self._rr.SeriesLines(names=names[:width]), static=True)
        self._named.add(signal)

    def log_frame(self, t: float, **signals: np.ndarray | float | None) -> None:
        """One frame at ``t`` seconds (frame index: frames logged so far). A signal given as
        None is skipped (e.g. ``force_lo`` of a model without an interval)."""
        rec, scalars = self.rec, self._rr.Scalars
        rec.set_time("frame", sequence=self.frames)
        rec.set_time("time", duration=float(t))
        for signal, value in signals.items():
            if value is None:
                continue
            value = np.atleast_1d(np.asarray(value, dtype=np.float64))
            if signal not in self._named:
                self._series_names(signal, value.shape[0])
            rec.log(ENTITIES[signal], scalars(value))
        self.frames += 1

    def log_event(self, t: float, text: str) -> None:
        """A text marker at ``t`` seconds, before the next frame (e.g. an episode starts)."""
        self.rec.set_time("frame", sequence=self.frames)
        self.rec.set_time("time", duration=float(t))
        self.rec.log("events", self._rr.TextLog(text))

    def log_episode(self, timestamps: np.ndarray, signals: Mapping[str, np.ndarray]) -> list[str]:
        """A whole episode at once (columns): ``time`` = ``timestamps`` (s), ``frame`` =
        0..T-1. Signals that are NaN throughout (not recorded, unlabelled) are left out;
        returns the signals logged."""
        rr = self._rr
        ts = np.asarray(timestamps, dtype=np.float64)
        indexes = [rr.TimeColumn("frame", sequence=np.arange(len(ts))),
                   rr.TimeColumn("time", duration=ts)]
        logged = []
        for signal, values in signals.items():
            v = np.asarray(values, dtype=np.float64).reshape(len(ts), -1)
            if not np.isfinite(v).any():
                continue
            self._series_names(signal, v.shape[1])
            self.rec.send_columns(ENTITIES[signal], indexes=indexes,
                                  columns=rr.Scalars.columns(scalars=v))
            logged.append(signal)
        return logged

    def close(self) -> None:
        """Flush everything to the sinks and close the file (the .rrd is complete after)."""
        self.rec.flush()
        self.rec.disconnect()


def open_viewer(name: str, channel_names: Sequence[str], rrd: str | Path | None = None,
                display: bool = False) -> Viewer | None:
    """A :class:`Viewer`, or None when neither ``rrd`` nor ``display`` asks for one."""
    if rrd is None and not display:
        return None
    return Viewer(name, channel_names, rrd=rrd, display=display)


def show_episode(dataset: StoredDataset, episode: int, rrd: str | Path | None = None,
                 display: bool = False) -> str:
    """``nactuator data show``: one stored episode (joints, commands, telemetry, force and
    condition labels) on the episode's own timestamps. Returns a one-line summary."""
    if rrd is None and not display:
        raise ViewerError("give --rrd FILE (save the recording), --display "
                          "(open the Rerun viewer), or both")
    by_index = {e.index: e for e in dataset.episodes}
    if episode not in by_index:
        have = sorted(by_index)
        span = f"episodes {have[0]}..{have[-1]}" if have else "no episodes"
        raise ViewerError(f"{dataset.root}: no episode {episode} (it has {span})")
    ep = by_index[episode]
    channels = dataset.info["nactuator"]["channels"]
    viewer = Viewer(f"{dataset.root} episode {episode} ({ep.task})", channels, rrd, display)
    try:
        signals = {EPISODE_SIGNALS[k]: v for k, v in ep.frames.items() if k in EPISODE_SIGNALS}
        logged = viewer.log_episode(ep.frames["timestamp"], signals)
    finally:
        viewer.close()
    where = " and ".join(([f"saved to {rrd}"] if rrd else []) + (["sent to the viewer"]
                                                                 if display else []))
    return (f"episode {episode} of {dataset.root} ({ep.task}, {ep.split}, {ep.length} frames, "
            f"{ep.length / dataset.fps:.1f} s): {', '.join(logged)} {where}")
