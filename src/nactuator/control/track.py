"""Closed-loop point tracking by damped least squares on dx/du (`nactuator track`).

Every tick (``period`` control steps; 4 on the SO-101 = 15.6 Hz) the controller reads the
arm, forms a Jacobian of the tracked point(s) with respect to the joint commands, and moves
the command by the damped-least-squares step of the Neural Jacobian Fields controller::

    du = gain * (JᵀJ + λ² I)⁻¹ Jᵀ e          e = x*(t + h) − x̂(t + h)

plus a pull toward the start pose in J's null space (``null_gain``: five joints move a
three-coordinate point, and the posture must not wander into a joint limit), then applies
the safety rules in this order: a dead-zone (``‖e‖ < dead_zone``: no step), a
step clip (``max|du| ≤ step_clip`` rad per tick, scaled as a whole so the direction is
kept), a lead limit (the command never runs more than ``max_lead`` rad ahead of the
measured joint: no wind-up against a payload or a stall), the joint limits less a margin,
and a velocity trip (a measured joint speed above ``trip_speed`` stops the run).

Three Jacobians (:mod:`nactuator.control.jacobian`, :mod:`nactuator.control.field`):

* ``kinematic``: ``J = dx/dq`` of rigid FK at the measured q, ``x̂`` = the observed point.
* ``actuator``: the counterfactual actuator model + simulator rolled ``horizon`` steps from
  the current state and the model's window of history with the command held: ``J = dx/du``
  there; ``x̂`` = the observed point (or, with ``predict``, the observed point plus the
  model's predicted displacement: lag and momentum included, but a model that predicts
  motion where the arm holds then leaves that much steady-state error).

* ``field``: a Jacobian field J_θ(obs) fitted to the world's point tracks under random
  command perturbations (the seed's self-supervised recipe); the observation is the
  measured joints and, as the field file says, the servos' effort and ``u − q``;
  ``x̂`` = the observed point.

In the image (:mod:`.image`, ``--camera`` with a pixel path ``time, u, v``): ``e`` is the
target pixel minus the camera's projection of ``x̂``, and each method's J becomes
d(pixel)/du = d(project)/dx · dx/du by the chain rule (the projection's Jacobian at the
point dx/du was taken at); ``damping_px``, ``dead_zone_px`` and ``settle_tol_px`` replace
their metre counterparts. Two pixel coordinates leave three of five joints free: the
null-space pull keeps the posture (and so the depth along the camera ray) near the start.

The stop rule: after the path's last point, the run ends ``settled`` once the error stayed
under ``settle_tol`` for ``settle_ticks`` ticks, else ``timeout`` after ``extra_s``.

Plants (:mod:`.plants`: what the loop reads and commands): the hidden world with a payload
the controller is not told about, or a servo bus
(:func:`nactuator.hardware.open.open_bus`, real or emulated), whose closing switches torque
off whatever ends the loop.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from nactuator.errors import UserError
from nactuator.platforms import Platform

from .jacobian import ActuatorJacobian, Points, kinematic_jacobian
from .plants import Observation

__all__ = ["METHODS", "PathError", "TrackResult", "TrackSettings", "Tracker", "dls_step",
           "read_path", "read_table", "run_tracking", "write_path"]

METHODS = ("kinematic", "actuator", "field")


class PathError(UserError, ValueError):
    """A target path file cannot be used; the message names the file and the field."""


@dataclass
class TrackSettings:
    """The controller's knobs (conf/track/<platform>.yaml; docs in the module docstring)."""

    gain: float = 0.6
    damping: float = 0.02           # λ [m/rad]: keeps steps finite near singular poses
    dead_zone: float = 0.0005       # m
    step_clip: float = 0.12         # rad per tick, max over joints
    max_lead: float = 0.35          # rad: |u − q_measured| per joint
    joint_margin: float = 0.05      # rad inside the platform limits
    trip_speed: float = 6.0         # rad/s measured: stop
    period: int = 4                 # control steps per tick
    horizon: int = 4                # actuator-aware prediction, control steps
    predict: bool = False           # actuator-aware: add the model's predicted displacement
    settle_tol: float = 0.003       # m
    settle_ticks: int = 5
    extra_s: float = 2.0            # s after the path's end before "timeout"
    joints: list[int] = field(default_factory=list)  # controlled joints ([] = all non-gripper)
    null_gain: float = 0.1          # per tick, toward the start pose in J's null space
    # The same three in pixels, for a loop that tracks in the image (--camera, pixel path).
    damping_px: float = 5.0         # λ [px/rad]
    dead_zone_px: float = 0.1       # px
    settle_tol_px: float = 0.7      # px


def read_table(path: str | os.PathLike, columns: tuple[str, ...], expected: str
               ) -> tuple[np.ndarray, np.ndarray]:
    """A target path CSV with ``time`` and ``columns`` -> times (T,) from 0 and the values
    (T, len(columns)); ``expected`` names the format in the missing-column error."""
    path = Path(path)
    if not path.is_file():
        raise PathError(f"path file {path} does not exist")
    try:
        table = pd.read_csv(path)
    except (ValueError, pd.errors.ParserError) as err:
        raise PathError(f"{path}: not a CSV file ({err})") from err
    missing = [c for c in ("time", *columns) if c not in table.columns]
    if missing:
        raise PathError(f"{path}: missing column(s) {missing}; expected {expected}")
    if len(table) < 2:
        raise PathError(f"{path}: {len(table)} row(s); a path needs at least 2")
    t = table["time"].to_numpy(np.float64)
    x = table[list(columns)].to_numpy(np.float64)
    bad = np.argwhere(~np.isfinite(np.column_stack([t, x])))
    if len(bad):
        raise PathError(f"{path}: non-finite value in data row {int(bad[0, 0]) + 1}, column "
                        f"{('time', *columns)[int(bad[0, 1])]!r}")
    if (np.diff(t) <= 0).any():
        row = int(np.argmax(np.diff(t) <= 0)) + 2
        raise PathError(f"{path}: 'time' must strictly increase (data row {row})")
    return t - t[0], x


def read_path(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """A target path CSV -> times (T,) [s] and points (T, 3) [m, base frame].

    Columns ``time``, ``x``, ``y``, ``z``; times start anywhere and strictly increase. (The
    image-space format, ``time, u, v`` in pixels: :func:`.image.read_pixel_path`.)"""
    return read_table(path, ("x", "y", "z"), "time, x, y, z (s, m in the base frame)")


def write_path(path: str | os.PathLike, t: np.ndarray, x: np.ndarray) -> Path:
    from nactuator.atomic import atomic_path

    path = Path(path)
    with atomic_path(path, suffix=".csv") as tmp:
        pd.DataFrame({"time": t, "x": x[:, 0], "y": x[:, 1], "z": x[:, 2]}).to_csv(
            tmp, index=False, float_format="%.6f")
    return path


def target_at(times: np.ndarray, points: np.ndarray, t: float) -> np.ndarray:
    """The path's point at time ``t`` (linear between rows, held after the end)."""
    return np.array([np.interp(t, times, points[:, k]) for k in range(points.shape[1])])


def dls_step(J: np.ndarray, e: np.ndarray, damping: float) -> np.ndarray:
    """argmin_du ‖J du − e‖² + λ²‖du‖² = (JᵀJ + λ²I)⁻¹ Jᵀ e."""
    n = J.shape[1]
    return np.linalg.solve(J.T @ J + damping**2 * np.eye(n), J.T @ e)


# ---------------------------------------------------------------------------- controller


class Tracker:
    """One method's controller: :meth:`decide` maps an observation (+ history) to a command."""

    def __init__(self, method: str, platform: Platform, kinematics, points: Points,
                 settings: TrackSettings, actuator_jacobian: ActuatorJacobian | None = None,
                 window_length: int = 9, field=None, image=None) -> None:
        if method not in METHODS:
            raise UserError(f"track method {method!r}: expected one of {list(METHODS)}")
        if method == "actuator" and actuator_jacobian is None:
            raise UserError("track --method actuator needs a counterfactual checkpoint (--ckpt)")
        self.method, self.platform, self.kin, self.points = method, platform, kinematics, points
        if method == "field" and field is None:
            raise UserError("track --method field needs a fitted Jacobian field")
        self.s, self.aj, self.field = settings, actuator_jacobian, field
        # An ImageView (control.image): targets are pixels and the loop minimises the pixel
        # error through d(pixel)/du; None: targets are base-frame points [m].
        self.image = image
        if image is None:
            self.damping, self.dead_zone = settings.damping, settings.dead_zone
            self.settle_tol = settings.settle_tol
        else:
            self.damping, self.dead_zone = settings.damping_px, settings.dead_zone_px
            self.settle_tol = settings.settle_tol_px
        n = platform.n
        self.joints = np.array(settings.joints or [j for j in range(n)
                                                   if j not in platform.gripper_indices])
        lo = np.array([c.limit_lower for c in platform.channels]) + settings.joint_margin
        hi = np.array([c.limit_upper for c in platform.channels]) - settings.joint_margin
        self.lo, self.hi = lo, hi
        self.home: np.ndarray | None = None  # the start command (run_tracking sets it)
        self.history: dict[str, deque] = {k: deque(maxlen=window_length - 1)
                                          for k in ("q_cmd", "q", "qd")}

    def record(self, q_cmd: np.ndarray, obs: Observation) -> None:
        """One control step's frame (the command written after reading ``obs``)."""
        self.history["q_cmd"].append(np.asarray(q_cmd, np.float64))
        self.history["q"].append(obs.q)
        self.history["qd"].append(obs.qd)

    def error(self, x: np.ndarray, target: np.ndarray) -> float:
        """‖target − x‖ of the first point in the loop's own units: m, or px through the
        camera (``x`` (m, 3) base-frame points either way)."""
        if self.image is not None:
            x = self.image.project(x)
        return float(np.linalg.norm(np.asarray(target) - x[0]))

    def decide(self, obs: Observation, u: np.ndarray, target: np.ndarray
               ) -> tuple[np.ndarray, dict[str, float]]:
        """The next command from the current one ``u`` and the target at the prediction
        time: (m, 3) points [m], or (m, 2) pixels with an image view. Returns it and what
        the tick did (for the log)."""
        t0 = time.perf_counter()
        pair = None  # a signed field's (up, down) columns
        if self.method == "kinematic":
            x_at, J = kinematic_jacobian(self.kin, self.points, obs.q)
            x_hat = obs.x
        elif self.method == "field":  # learned J_θ(obs) (control.field)
            # The observation a field may read: joints, the servos' effort, and the lag
            # behind the command now held (u − q); a residual field adds rigid FK at q.
            prior = (kinematic_jacobian(self.kin, self.points, obs.q)[1]
                     if self.field.prior != "none" else None)
            both = self.field.jacobians(obs.q, len(u), effort=obs.effort, q_cmd=u, prior=prior)
            J, x_hat = both.mean(0), obs.x
            pair = list(both) if self.field.signed else None
            x_at = x_hat
        else:
            hist = {k: np.array(v) for k, v in self.history.items()} if self.history["q"] \
                else {}
            x_pred, J, _ = self.aj(hist, obs.q, obs.qd, u)
            x_model_now = kinematic_jacobian(self.kin, self.points, obs.q)[0]
            # With `predict`, aim the predicted point (lag and momentum included); else aim the
            # observed one, as the kinematic loop does: the model's own drift then cannot
            # leave a steady-state offset (a model that predicts sag where the arm holds
            # would stop the loop that far from the target).
            x_hat = obs.x + (x_pred - x_model_now) if self.s.predict else obs.x
            x_at = x_pred  # the point the model's dx/du was taken at
        if self.image is not None:
            # d(pixel)/du = d(project)/dx at the point J was taken at · dx/du (chain rule);
            # the error is the target pixel minus the pixel of the observed point.
            J = self.image.image_jacobian(x_at, J)[1]
            if pair is not None:
                pair = [self.image.image_jacobian(x_at, Jp)[1] for Jp in pair]
            x_hat = self.image.project(x_hat)
        e = (np.asarray(target) - x_hat).reshape(-1)
        info = {"err_pred": float(np.linalg.norm(e))}
        du = np.zeros_like(u)
        Jc = J[:, self.joints]
        if np.linalg.norm(e) >= self.dead_zone:
            du[self.joints] = self.s.gain * dls_step(Jc, e, self.damping)
            if pair is not None:
                # A signed field answers a step up and a step down with different columns:
                # take each joint's column for the sign of its step and solve again, until
                # the signs hold (a few rounds; the last one's step is kept).
                up, down = pair[0][:, self.joints], pair[1][:, self.joints]
                for _ in range(3):
                    Jc = np.where(du[self.joints] >= 0, up, down)
                    new_du = self.s.gain * dls_step(Jc, e, self.damping)
                    settled = np.array_equal(new_du >= 0, du[self.joints] >= 0)
                    du[self.joints] = new_du
                    if settled:
                        break
        if self.s.null_gain > 0 and self.home is not None:
            # Redundancy (5 joints, 3 coordinates, or 2 in the image): drift toward the start
            # pose only where it does not move the point (I − J⁺J), so the posture cannot
            # wander into a limit (in the image: nor along the camera ray).
            pinv = np.linalg.solve(Jc.T @ Jc + self.damping**2 * np.eye(len(self.joints)),
                                   Jc.T)
            null = np.eye(len(self.joints)) - pinv @ Jc
            du[self.joints] += self.s.null_gain * null @ (self.home - u)[self.joints]
        peak = np.abs(du).max()
        if peak > self.s.step_clip:
            du *= self.s.step_clip / peak
        new = u + du
        new = np.clip(new, obs.q - self.s.max_lead, obs.q + self.s.max_lead)
        new = np.where(np.isin(np.arange(len(u)), self.joints), new, u)
        new = np.clip(new, self.lo, self.hi)
        info["decide_ms"] = 1e3 * (time.perf_counter() - t0)
        return new, info


@dataclass
class TrackResult:
    method: str
    stop: str                       # settled | timeout | velocity
    t: np.ndarray                   # (F,) s, every control step
    target: np.ndarray              # (F, 3) path point at t [m]; (F, 2) [px] in the image
    x: np.ndarray                   # (F, 3) true tracked point (first point) [m]
    q: np.ndarray                   # (F, n)
    u: np.ndarray                   # (F, n) command written
    decide_ms: np.ndarray           # (ticks,)
    path_end: float
    settings: dict
    lost_slots: int = 0             # bus runs: schedule slots a late cycle skipped
    space: str = "base"             # "base": targets in m; "image": targets in px
    x_px: np.ndarray | None = None  # (F, 2) the camera's projection of x (with a camera)
    target_px: np.ndarray | None = None  # (F, 2) the target in px (a 3-D one projected)

    def errors_mm(self) -> np.ndarray:
        if self.space != "base":
            raise ValueError("an image-space run has no 3-D target: use errors_px()")
        return 1e3 * np.linalg.norm(self.x - self.target, axis=1)

    def errors_px(self) -> np.ndarray:
        if self.x_px is None:
            raise ValueError("a run without a camera has no pixel errors")
        return np.linalg.norm(self.x_px - self.target_px, axis=1)

    def _stats(self, err: np.ndarray, tol: float | None) -> tuple[float, ...]:
        """rms, mean, max on the path (from 0.5 s), final and, with ``tol``, settling."""
        on_path = self.t <= self.path_end
        after = ~on_path
        settle = float("nan")
        if tol is not None and after.any():
            late = np.flatnonzero(after & (err > tol))
            first_after = int(np.flatnonzero(after)[0])
            if not len(late):
                settle = 0.0
            elif late[-1] + 1 < len(err):
                settle = float(self.t[late[-1] + 1] - self.t[first_after])
        # Skip the first 0.5 s: the loop's start transient from rest is not tracking.
        steady = on_path & (self.t >= 0.5)
        return (float(np.sqrt((err[steady] ** 2).mean())), float(err[steady].mean()),
                float(err[steady].max()), float(err[-1]), settle)

    def metrics(self) -> dict[str, float]:
        """Errors in mm (3-D targets) and in px (with a camera; the loop's own unit for
        pixel targets), settling in the loop's unit, decision times and rates."""
        nan = float("nan")
        image = self.space == "image"
        mm = (nan,) * 5 if image else self._stats(self.errors_mm(),
                                                  1e3 * self.settings["settle_tol"])
        px = (nan,) * 5 if self.x_px is None else self._stats(
            self.errors_px(), self.settings["settle_tol_px"] if image else None)
        period_s = self.settings["period"] * self.settings["dt"]
        return {
            "rms_mm": mm[0], "mean_mm": mm[1], "max_mm": mm[2], "final_mm": mm[3],
            "rms_px": px[0], "mean_px": px[1], "max_px": px[2], "final_px": px[3],
            "settling_s": px[4] if image else mm[4],
            "decide_p50_ms": float(np.percentile(self.decide_ms, 50)),
            "decide_p99_ms": float(np.percentile(self.decide_ms, 99)),
            "tick_hz": 1.0 / period_s,
            # Cycles per second of the plant's clock (simulated in the world, wall on a bus).
            "cycle_hz": float((len(self.t) - 1) / (self.t[-1] - self.t[0])),
            "lost_slots": int(self.lost_slots),
            "ticks_hz": float(len(self.decide_ms) / (self.t[-1] - self.t[0] + period_s)),
            "max_rate_hz": 1e3 / float(np.percentile(self.decide_ms, 99)),
            "stop": self.stop,
        }


def _judged(tracker: Tracker, observations: list[Observation]) -> np.ndarray:
    """(F, 3) the first tracked point of every read; FK of the measured joints, in one
    batch, where the plant had no ground truth and the loop never asked for it."""
    import torch

    out = np.zeros((len(observations), 3))
    pending = []
    for i, o in enumerate(observations):
        if o._x_true is None and callable(o._x):
            pending.append(i)
        else:
            out[i] = o.x_true[0]
    if pending:
        q = torch.tensor(np.stack([observations[i].q for i in pending]), dtype=torch.float64)
        out[pending] = tracker.points.positions(tracker.kin, q)[:, 0].numpy()
    return out


def run_tracking(plant, tracker: Tracker, times: np.ndarray, path: np.ndarray,
                 progress=None, camera=None) -> TrackResult:
    """Run the closed loop on ``plant`` until the stop rule ends it (module docstring).

    ``path``: (T, 3) points [m], or (T, 2) pixels when the tracker tracks in the image.
    ``camera`` (an :class:`.image.ImageView`; default the tracker's own): the judged point
    and the target are also reported in its pixels."""
    s = tracker.s
    camera = tracker.image if camera is None else camera
    dims = 2 if tracker.image is not None else 3
    if path.shape[1] != dims:
        raise UserError(f"track: a path of {path.shape[1]} columns for a loop that tracks in "
                        f"{'the image (u, v)' if dims == 2 else '3-D (x, y, z)'}")
    dt = tracker.platform.control_dt
    u = np.asarray(plant.goal(), np.float64).copy()
    tracker.home = u.copy()
    end = float(times[-1])
    lookahead = (s.horizon if tracker.method == "actuator" else s.period) * dt
    log: dict[str, list] = {k: [] for k in ("t", "target", "x", "q", "u")}
    decide_ms: list[float] = []
    stop, inside, k = "timeout", 0, 0
    try:
        while True:
            obs = plant.read()
            if np.abs(obs.qd).max() > s.trip_speed:
                stop = "velocity"
                break
            if k % s.period == 0:
                target = target_at(times, path, obs.t + lookahead)
                u, info = tracker.decide(obs, u, np.broadcast_to(target, (len(obs.x), dims)))
                decide_ms.append(info["decide_ms"])
                err_now = tracker.error(obs.x_true, target_at(times, path, obs.t))
                if obs.t > end:
                    inside = inside + 1 if err_now < tracker.settle_tol else 0
                    if inside >= s.settle_ticks:
                        stop = "settled"
                        break
                    if obs.t > end + s.extra_s:
                        break
                if progress is not None:
                    progress(obs.t, end)
            log["t"].append(obs.t)
            log["target"].append(target_at(times, path, obs.t))
            log["x"].append(obs)  # the judged point, read after the loop (bus: FK)
            log["q"].append(obs.q)
            log["u"].append(u.copy())
            tracker.record(u, obs)
            plant.write(u)
            k += 1
    finally:
        plant.close()
    settings = dict(asdict(s), dt=dt)
    target, x = np.array(log["target"]), _judged(tracker, log["x"])
    x_px = target_px = None
    if camera is not None:
        x_px = camera.project(x)
        target_px = target if tracker.image is not None else camera.project(target)
    return TrackResult(tracker.method, stop, np.array(log["t"]), target, x,
                       np.array(log["q"]), np.array(log["u"]), np.array(decide_ms), end,
                       settings, int(getattr(plant, "lost_slots", 0)),
                       "image" if tracker.image is not None else "base", x_px, target_px)
