"""Live virtual force sensor: telemetry in, force / contact gate / motor condition out.

A causal loop at the platform rate. Each cycle reads one telemetry frame, runs the trained
actuator on the last L (= 9) frames, re-sends the hold command, and streams one CSV row
with the per-cycle timing (read / infer / write / total ms) — the figures bench/live.py
summarises. The arm is not moved: every cycle commands the goal each servo held when the
loop started, and torque is not switched on (a passive arm still gives forces from its
telemetry; a holding arm gives the paper's setting). However the loop ends — ``seconds``
elapsed, Ctrl-C, SIGTERM, an error — closing the bus switches torque off.

Window rules (:class:`nactuator.rollout.StreamingWindow`, the window training and
``infer`` use): before L frames exist the missing frames are zeros flagged as padding
(``warm`` is 0 on those rows). Each frame goes through the checkpoint's input filters
(:mod:`nactuator.input_filters`, the function training ran over whole episodes), fed
frame by frame: a motor whose telemetry was not read this cycle gets the checkpoint's fill
rule (its last valid reading for models trained since the rule was recorded) *in the model
input only* (the row says ``valid = 0``), and temperature its trailing running median.

With a contact calibration (``--contact FILE``, docs/contact.md) each cycle also estimates
contact anywhere on the arm from that cycle's model torque and filtered joint state
(:class:`nactuator.contact.ContactStream`: the function ``infer --contact`` runs per frame,
causal both ways): columns ``contact_link`` (MJCF body, empty: none), ``contact_px/py/pz``
(m, that body's frame), ``contact_fx/fy/fz`` (N, base frame) and ``contact_ms``. It runs
after the goal write, so it never delays the command; the surface search runs only on
cycles the detector flags. A cycle that overruns its period loses the next slot(s)
(:class:`FixedRate`), and the residual's velocity filter, which assumes one frame per
period, then spans the gap as one period (as ``infer`` does on such a recording).
"""

from __future__ import annotations

import csv
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np
import torch

from nactuator.hardware.bus import TelemetryBus, TelemetryFrame
from nactuator.hardware.open import open_bus
from nactuator.hardware.signals import sigterm_as_interrupt
from nactuator.hardware.timing import FixedRate
from nactuator.models import load_model
from nactuator.platforms import Platform, load_platform
from nactuator.rollout import StreamingWindow
from nactuator.viewer import Viewer, open_viewer

if TYPE_CHECKING:  # the contact room (mujoco, scipy) is imported only with --contact
    from nactuator.contact import ContactStream

__all__ = ["CONTACT_COLUMNS", "LiveLoop", "StatusLine", "run_live", "summarize_timings"]


# What one live cycle provides to the model's window (LiveLoop.cycle).
LIVE_CHANNELS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature")
# The contact estimate's columns, named as `infer --contact` names them.
CONTACT_COLUMNS = ("contact_link", "contact_px", "contact_py", "contact_pz", "contact_fx",
                   "contact_fy", "contact_fz")


class LiveLoop:
    """One bus + one actuator; :meth:`cycle` does read -> infer -> write once."""

    def __init__(self, actuator: torch.nn.Module, bus: TelemetryBus, platform: Platform,
                 q_hold: np.ndarray, device: str = "cpu", viewer: Viewer | None = None,
                 input_filters: dict | None = None,
                 contact: ContactStream | None = None) -> None:
        self.actuator, self.bus, self.platform = actuator, bus, platform
        self.contact = contact  # --contact: one estimate per cycle (after the write)
        if contact is not None and not {"q", "qd"} <= set(actuator.inputs):
            raise ValueError("contact needs the joint state the model reads (q, qd); this "
                             f"model reads {list(actuator.inputs)}")
        self.viewer = viewer  # Rerun (--rrd / --display): one log_frame per cycle
        self.q_cmd = np.asarray(q_hold, dtype=float)
        # input_filters: the checkpoint's (load_actuator's meta["input_filters"]); None feeds
        # the raw frames (NaN as 0), for benches of untrained models only.
        self.window = StreamingWindow(actuator.inputs, actuator.window_length, platform.n,
                                      device, filters=input_filters)
        self.t0: float | None = None  # time of the first frame; rows carry t - t0
        names = platform.channel_names
        # A model with the uncertainty head also streams its calibrated force interval.
        self.interval = bool(getattr(actuator, "has_uncertainty", False))
        bounds = ([f"force_{b}_{a}" for b in ("lo", "hi") for a in "xyz"]
                  if self.interval else [])
        self.columns = (["t", "fx", "fy", "fz", *bounds, "gate"]
                        + [f"condition_{c}" for c in names]
                        + (list(CONTACT_COLUMNS) if contact is not None else [])
                        + ["valid", "warm", "read_ms", "infer_ms", "write_ms"]
                        + (["contact_ms"] if contact is not None else [])
                        + ["total_ms", "late_ms"])

    def cycle(self, scheduled: float) -> dict[str, float]:
        t0 = time.perf_counter()
        frame: TelemetryFrame = self.bus.read()
        t1 = time.perf_counter()
        values = {"q_cmd": self.q_cmd, "q": frame.q, "qd": frame.qd, "effort": frame.effort,
                  "voltage": frame.voltage, "temperature": frame.temperature}
        self.window.push(values, valid=frame.valid)
        with torch.inference_mode():
            out = self.actuator(self.window.tensors())
        force = out["force"][0].cpu().numpy()
        gate = float(out["gate"][0, 0])
        condition = out["condition"][0].cpu().numpy()
        t2 = time.perf_counter()
        self.bus.write_goal(self.q_cmd)
        t3 = time.perf_counter()
        est = None
        if self.contact is not None:  # after the write: the command is not delayed
            f = self.window.frame  # q, qd as the model saw them (the input filters')
            est = self.contact.push(f["q"], f["qd"], out["tau"][0].cpu().numpy())
        t4 = time.perf_counter()
        if self.t0 is None:
            self.t0 = frame.t
        row = {"t": frame.t - self.t0, "fx": float(force[0]), "fy": float(force[1]),
               "fz": float(force[2])}
        if self.interval:
            for b in ("lo", "hi"):
                bound = out[f"force_{b}"][0].cpu().numpy()
                row.update({f"force_{b}_{a}": float(v) for a, v in zip("xyz", bound,
                                                                      strict=True)})
        row["gate"] = gate
        row.update({f"condition_{c}": float(v)
                    for c, v in zip(self.platform.channel_names, condition, strict=True)})
        if est is not None:
            row["contact_link"] = self.contact.surfaces.names[est.link] if est.link >= 0 else ""
            row.update({f"contact_p{a}": float(v) for a, v in zip("xyz", est.point_local,
                                                                  strict=True)})
            row.update({f"contact_f{a}": float(v) for a, v in zip("xyz", est.force,
                                                                  strict=True)})
        row.update(valid=int(frame.valid.all()), warm=int(self.window.warm),
                   read_ms=1e3 * (t1 - t0), infer_ms=1e3 * (t2 - t1),
                   write_ms=1e3 * (t3 - t2))
        if est is not None:
            row["contact_ms"] = 1e3 * (t4 - t3)
        # total: the cycle's work (read .. contact), what decides whether it overruns
        row.update(total_ms=1e3 * (t4 - t0), late_ms=1e3 * (t0 - scheduled))
        if self.viewer is not None:  # after the write: the command is not delayed
            self.viewer.log_frame(row["t"], q=frame.q, qd=frame.qd, q_cmd=self.q_cmd,
                                  effort=frame.effort, force=force,
                                  force_lo=_first(out, "force_lo"),
                                  force_hi=_first(out, "force_hi"), gate=gate,
                                  condition=condition,
                                  contact_link=None if est is None else float(est.link),
                                  contact_point=None if est is None else est.point_local,
                                  contact_force=None if est is None else est.force)
        return row

    def run(self, seconds: float | None, sink: csv.DictWriter | None,
            stream: TextIO | None = None,
            status: StatusLine | None = None) -> list[dict[str, float]]:
        """Cycle at the platform rate (:class:`FixedRate`: a late cycle loses slots, counted
        in ``lost_slots``, and never bursts) until ``round(seconds * fps)`` cycles have run
        (None: until Ctrl-C)."""
        n_cycles = None if seconds is None else int(round(seconds * self.platform.fps))
        rows: list[dict[str, float]] = []
        self.lost_slots = 0
        pace = FixedRate(self.platform.fps).start()
        try:
            while n_cycles is None or len(rows) < n_cycles:
                row = self.cycle(pace.scheduled)
                rows.append(row)
                if sink is not None:
                    sink.writerow({k: _fmt(v) for k, v in row.items()})
                    if stream is not None:
                        stream.flush()
                if status is not None:
                    status.update(rows, self.lost_slots)
                self.lost_slots += pace.wait()
        except KeyboardInterrupt:
            pass
        finally:
            if status is not None:
                status.close()
        return rows


class StatusLine:
    """A one-line running status on a terminal (stderr): rate, last force, gate, cycles
    with incomplete telemetry, lost slots. Redrawn in place at most every ``every`` s; on a
    non-terminal (a log file) one line every ``every_log`` s instead.

    The rate is over the last second of cycles, "—" until two cycles exist. "incomplete":
    cycles in which at least one servo's telemetry was not read (the model input holds its
    last reading; the row says ``valid = 0``). "lost": schedule slots skipped because a cycle
    overran its period (:class:`FixedRate`; no row exists for them)."""

    def __init__(self, fps: float, stream: TextIO | None = None, every: float = 0.25,
                 every_log: float = 5.0) -> None:
        self.fps, self.stream = fps, stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every if self.tty else every_log
        self._last = -math.inf
        self._drawn = False

    def text(self, rows: list[dict[str, float]], lost_slots: int) -> str:
        last = rows[-1]
        recent = [r["t"] for r in rows[-int(self.fps) :]]
        span = recent[-1] - recent[0]
        rate = f"{(len(recent) - 1) / span:5.1f}" if span > 0 else "    —"  # not known yet
        force = math.sqrt(last["fx"] ** 2 + last["fy"] ** 2 + last["fz"] ** 2)
        incomplete = sum(1 - int(r["valid"]) for r in rows)
        contact = ""
        if "contact_link" in last:  # --contact: the latest estimate
            where = last["contact_link"]
            size = math.hypot(*(last[f"contact_f{a}"] for a in "xyz"))
            contact = f" | contact {where} {size:.2f} N" if where else " | contact none"
        return (f"live {rate} Hz | |f| {force:6.2f} N (fx {last['fx']:+.2f} fy "
                f"{last['fy']:+.2f} fz {last['fz']:+.2f}) gate {last['gate']:.2f}{contact} | "
                f"{len(rows)} cycles, {incomplete} incomplete, {lost_slots} lost")

    def update(self, rows: list[dict[str, float]], lost_slots: int) -> None:
        now = time.perf_counter()
        if now - self._last < self.every:
            return
        self._last = now
        end = "" if self.tty else "\n"
        self.stream.write(("\r\x1b[K" if self.tty else "") + self.text(rows, lost_slots) + end)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _first(out: dict[str, torch.Tensor], key: str) -> np.ndarray | None:
    """Batch row 0 of an optional model output (None when the model has no such head)."""
    return out[key][0].cpu().numpy() if key in out else None


def _fmt(v: float) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def summarize_timings(rows: list[dict[str, float]], fps: float) -> dict[str, float]:
    """p50/p99 of each phase, the achieved rate and the start jitter (|actual - scheduled|)."""
    if not rows:
        return {"cycles": 0}
    out: dict[str, float] = {"cycles": len(rows)}
    for key in ("read_ms", "infer_ms", "write_ms", "contact_ms", "total_ms"):
        if key not in rows[0]:  # contact_ms: with --contact only
            continue
        v = np.array([r[key] for r in rows])
        out[f"{key[:-3]}_p50_ms"] = float(np.percentile(v, 50))
        out[f"{key[:-3]}_p99_ms"] = float(np.percentile(v, 99))
    late = np.abs([r["late_ms"] for r in rows])
    out["jitter_p50_ms"] = float(np.percentile(late, 50))
    out["jitter_p99_ms"] = float(np.percentile(late, 99))
    ts = np.array([r["t"] for r in rows])
    out["rate_hz"] = float((len(ts) - 1) / (ts[-1] - ts[0])) if len(ts) > 1 else math.nan
    out["invalid_cycles"] = int(sum(1 - r["valid"] for r in rows))
    if "contact_link" in rows[0]:
        out["contact_cycles"] = int(sum(bool(r["contact_link"]) for r in rows))
    return out


def run_live(ckpt: str | Path, platform: str | Platform, port: str,
             out: str | Path | None = None, seconds: float | None = None,
             device: str = "cpu", calibration: str | Path | None = None,
             threads: int | None = 1, quiet: bool = False, rrd: str | Path | None = None,
             display: bool = False, contact: str | Path | None = None) -> str:
    """Stream force/gate/condition from the arm on ``port`` with the actuator in ``ckpt``.

    Rows go to ``out`` (CSV, written as ``out.partial`` and renamed when the loop ends) or
    to stdout. ``threads``: torch intra-op threads (1 keeps the per-cycle latency low and
    steady; None leaves torch's setting). Unless ``quiet``, a one-line running status goes
    to stderr (:class:`StatusLine`). ``rrd`` / ``display``: also stream each cycle to a
    Rerun recording file / viewer (:mod:`nactuator.viewer`). ``contact``: a calibration
    file of ``nactuator contact calibrate`` for this model file; each row then carries the
    contact estimate (``CONTACT_COLUMNS``, as ``infer --contact``). Returns a one-paragraph
    timing summary.
    """
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    if seconds is not None and not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    if contact is not None:  # a bad calibration file fails before the model loads
        from nactuator.contact import ContactCalibration

        ContactCalibration.load(contact)
    if threads is not None:  # before loading: an ONNX session takes its thread count then
        torch.set_num_threads(threads)
    # A checkpoint, bundle or exported .pt/.onnx file (nactuator.models.load_model).
    actuator, meta = load_model(ckpt, map_location=device, expect_platform=p.name)
    if actuator.n_motors != p.n:
        raise ValueError(f"{ckpt}: actuator has {actuator.n_motors} motors, platform "
                         f"{p.name!r} has {p.n} channels")
    unread = [k for k in actuator.inputs if k not in LIVE_CHANNELS]
    if unread:  # a counterfactual model (docs/counterfactual.md) is for rollouts and plans
        raise ValueError(f"{ckpt}: the model reads {unread}, which the live loop does not "
                         f"stream (it reads {list(LIVE_CHANNELS)}); use it with eval, "
                         "bench-bam or plan")
    stream = None
    if contact is not None:  # checked against this model and platform before the bus opens
        from nactuator.contact import ContactStream

        stream = ContactStream.open(contact, p, ckpt)
    viewer = open_viewer(f"live {p.name} {port}", p.channel_names, rrd, display)
    # SIGTERM ends the loop like Ctrl-C; leaving open_bus() switches torque off either way.
    with sigterm_as_interrupt(), open_bus(p, port, calibration) as bus:
        hold = bus.read_goal()
        bus.wait_ready()
        loop = LiveLoop(actuator, bus, p, hold, device, viewer,
                        input_filters=meta["input_filters"], contact=stream)
        if out is None:
            sink_file: TextIO = sys.stdout
            partial = None
        else:
            partial = Path(str(out) + ".partial")
            partial.parent.mkdir(parents=True, exist_ok=True)
            sink_file = open(partial, "w", newline="")  # closed in the finally below
        try:
            writer = csv.DictWriter(sink_file, fieldnames=loop.columns)
            writer.writeheader()
            status = None if quiet else StatusLine(p.fps)
            rows = loop.run(seconds, writer, sink_file, status)
        finally:
            if partial is not None:
                sink_file.close()
                os.replace(partial, out)
            if viewer is not None:
                viewer.close()
    s = summarize_timings(rows, p.fps)
    if not rows:
        return "live: no cycles ran"
    where = f"; rows in {out}" if out else ""
    contacts = ("" if stream is None else
                f"; contact on {s['contact_cycles']} cycles, estimate p50/p99 "
                f"{s['contact_p50_ms']:.2f}/{s['contact_p99_ms']:.2f} ms, "
                f"{loop.lost_slots} slots lost")
    return (f"live: {s['cycles']} cycles at {s['rate_hz']:.1f} Hz with {meta['source']} "
            f"({meta['weights']} weights); per cycle p50/p99 read {s['read_p50_ms']:.2f}/"
            f"{s['read_p99_ms']:.2f} ms, infer {s['infer_p50_ms']:.2f}/{s['infer_p99_ms']:.2f}"
            f" ms, write {s['write_p50_ms']:.2f}/{s['write_p99_ms']:.2f} ms, total "
            f"{s['total_p50_ms']:.2f}/{s['total_p99_ms']:.2f} ms; start jitter "
            f"{s['jitter_p50_ms']:.2f}/{s['jitter_p99_ms']:.2f} ms; "
            f"{s['invalid_cycles']} cycles with incomplete telemetry{contacts}{where}")
