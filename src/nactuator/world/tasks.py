"""Commanded trajectories ("the leader arm") and the labels that go with them.

A task is one commanded motion repeated ``trajectories_per_task`` times with human-like
variation (speed, placement, amplitude, tremor). Each repetition becomes an
:class:`EpisodePlan`: goal positions at the frame rate plus the external force, the force
label, payload mass, condition label and torque-enable per frame.

Label semantics follow NAD (``../shared/docs/nad-format.md`` §6), except where the world
knows the truth and NAD had no reading:

- free motion (circles, sweeps, backward/forward): force NaN on all axes (unlabelled);
- payload tasks (pick-and-place, go-up-and-stay): x, y NaN always; z = -m g while the object
  is held, NaN otherwise; go-up-and-stay holds the object for the whole episode; payload 0
  ("empty" / "no_force") is NaN throughout;
- pushes: the applied force on all three axes on every frame (0 between pushes), like a tared
  F/T sensor; the matched ``*_ref`` run (same commanded motion, no contact) is 0 on all axes
  on every frame (NAD stores -999 there and its OMX loader reads it as 0);
- condition: every motor is labelled, 1 = nominal, 0 on the band joint in ``degrade`` runs;
  in ``onset`` runs 0 on the faulted joint from the onset frame on (1 before it), so the
  label switches at the frame where the world switches the fault on.

Postures follow the NAD operators (docs/synthetic-world.md §4): the IK starts from and is
pulled toward ``workspace.rest_pose``, which holds the gripper pitched down as in the real
files; a held object stops the jaw at ``workspace.grasp_jaw`` (the plan's ``grasp``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import mujoco
import numpy as np

from nactuator.constants import GRAVITY as G
from nactuator.platforms import Platform

from .params import WorldError, WorldParams

__all__ = ["EpisodePlan", "Kinematics", "plan_episode", "task_seed"]



@dataclass
class EpisodePlan:
    task: str
    q_goal: np.ndarray  # (T, n) joint units
    force: np.ndarray  # (T, 3) applied at the end effector [N], environment on robot
    force_label: np.ndarray  # (T, 3) what the dataset stores (NaN = unlabelled)
    payload_mass: np.ndarray  # (T,) kg
    condition: np.ndarray  # (T, n)
    torque_enable: np.ndarray  # (T, n) 0/1
    grasp: np.ndarray  # (T,) jaw angle where an object between the jaws stops them; NaN: none
    band: bool = False
    kp: float | None = None  # firmware P override for every motor (pendulum kp grid)
    # Mid-run fault: {"kind": band|wear, "channel": int, "onset_frame": int, "wear": float}
    fault: dict | None = None
    meta: dict = field(default_factory=dict)

    @property
    def frames(self) -> int:
        return self.q_goal.shape[0]


def task_seed(seed: int, name: str, *more: int) -> np.random.Generator:
    """A generator that depends only on the seed, the task's name and ``more``.

    Names are hashed (CRC-32, stable across runs) so a task's trajectories do not change
    when other tasks are added or removed.
    """
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(name.encode()),
                                                         *more]))


class Kinematics:
    """Forward kinematics and damped-least-squares IK of the *nominal* arm (the leader)."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.model = mujoco.MjModel.from_xml_path(str(platform.robot_model_path()))
        self.data = mujoco.MjData(self.model)
        ee = platform.end_effector
        self.body = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, ee.body)
        self.offset = np.asarray(ee.offset, dtype=np.float64)
        self.lower = np.array([c.limit_lower for c in platform.channels])
        self.upper = np.array([c.limit_upper for c in platform.channels])
        self.arm = np.array(platform.arm_indices)

    def fk(self, q: np.ndarray) -> np.ndarray:
        self.data.qpos[:] = q
        mujoco.mj_kinematics(self.model, self.data)
        b = self.body
        return self.data.xpos[b] + self.data.xmat[b].reshape(3, 3) @ self.offset

    def jacobian(self, q: np.ndarray) -> np.ndarray:
        """(3, n) position Jacobian of the end-effector point at ``q``."""
        p = self.fk(q)
        jacp = np.zeros((3, self.model.nv))
        mujoco.mj_comPos(self.model, self.data)
        mujoco.mj_jac(self.model, self.data, jacp, None, p, self.body)
        return jacp

    def posture_directions(self, q: np.ndarray) -> np.ndarray:
        """(k, n) unit joint directions that leave the end effector where it is at ``q``.

        The arm's redundancy beyond the 3 position coordinates: how a human may hold the arm
        differently for the same gripper position (mostly the gripper's pitch).
        """
        J = self.jacobian(q)
        # Joints that do not move the point at all (a wrist roll about the tool axis) are
        # redundant too, but a human does not hold them differently: leave them out.
        reach = np.linalg.norm(J[:, self.arm], axis=0)
        moving = self.arm[reach > 0.1 * reach.max()]
        _, sv, vt = np.linalg.svd(J[:, moving])
        rank = int((sv > 1e-6 * sv.max()).sum())
        out = np.zeros((len(moving) - rank, q.size))
        out[:, moving] = vt[rank:]
        return out

    def ik(self, target: np.ndarray, q_init: np.ndarray, q_rest: np.ndarray,
           iters: int = 60, tol: float = 2e-4) -> np.ndarray:
        """Joint positions putting the end effector at ``target`` (arm joints only)."""
        q = np.array(q_init, dtype=np.float64)
        jacp = np.zeros((3, self.model.nv))
        margin = 0.03 * (self.upper - self.lower)
        for _ in range(iters):
            p = self.fk(q)
            err = target - p
            if np.linalg.norm(err) < tol:
                break
            mujoco.mj_comPos(self.model, self.data)
            mujoco.mj_jac(self.model, self.data, jacp, None, p, self.body)
            J = jacp[:, self.arm]
            lam2 = 1e-4
            JJt = J @ J.T + lam2 * np.eye(3)
            dq = J.T @ np.linalg.solve(JJt, err)
            # Null-space pull toward the rest posture keeps redundant arms natural.
            pinv = J.T @ np.linalg.inv(JJt)
            null = (np.eye(len(self.arm)) - pinv @ J) @ (0.2 * (q_rest[self.arm] - q[self.arm]))
            q[self.arm] = np.clip(q[self.arm] + dq + null, self.lower[self.arm] + margin[self.arm],
                                  self.upper[self.arm] - margin[self.arm])
        return q


# --------------------------------------------------------------------------- motion pieces


def _min_jerk(s: np.ndarray) -> np.ndarray:
    s = np.clip(s, 0.0, 1.0)
    return s**3 * (10 - 15 * s + 6 * s**2)


def _through_waypoints(times: list[float], poses: list[np.ndarray], t: np.ndarray) -> np.ndarray:
    """Minimum-jerk segments between joint-space waypoints (held before/after)."""
    out = np.empty((t.size, poses[0].size))
    out[:] = poses[0]
    for (t0, t1), (a, b) in zip(zip(times[:-1], times[1:], strict=True),
                                zip(poses[:-1], poses[1:], strict=True), strict=True):
        w = _min_jerk((t - t0) / max(t1 - t0, 1e-9))[:, None]
        seg = (t >= t0)[:, None]
        out = np.where(seg, a + w * (b - a), out)
    return out


def _tremor(rng: np.random.Generator, frames: int, n: int, sigma: float, cutoff: float,
            dt: float) -> np.ndarray:
    """Smooth hand tremor: white noise through two first-order low-passes, scaled to sigma."""
    if sigma <= 0:
        return np.zeros((frames, n))
    x = rng.normal(size=(frames, n))
    a = 1.0 - np.exp(-2 * np.pi * cutoff * dt)
    for _ in range(2):
        y = np.empty_like(x)
        acc = np.zeros(n)
        for k in range(frames):
            acc = acc + a * (x[k] - acc)
            y[k] = acc
        x = y
    std = x.std(axis=0)
    return x * (sigma / np.where(std > 0, std, 1.0))


@dataclass
class _Ctx:
    platform: Platform
    params: WorldParams
    kin: Kinematics | None
    rest: np.ndarray
    t: np.ndarray  # frame times
    duration: float
    base: np.random.Generator  # same for every repetition of the task
    rep: np.random.Generator  # this repetition's variation

    def offset3(self) -> np.ndarray:
        return self.rep.normal(0.0, self.params.variation["position_offset"], 3)

    def ik_path(self, points: np.ndarray) -> np.ndarray:
        q = self.rest.copy()
        out = np.empty((points.shape[0], self.rest.size))
        for k, p in enumerate(points):
            q = self.kin.ik(p, q, self.rest, iters=60 if k == 0 else 8)
            out[k] = q
        return out

    def ik_points(self, points: list[np.ndarray]) -> list[np.ndarray]:
        q = self.rest.copy()
        out = []
        for p in points:
            q = self.kin.ik(p, q, self.rest)
            out.append(q.copy())
        return out


def _circle(c: _Ctx, spec: dict) -> np.ndarray:
    ws = c.params.workspace
    center = np.asarray(ws["circle_center"], float) + c.offset3()
    radius = c.base.uniform(*ws["circle_radius"]) * (1 + c.rep.uniform(-1, 1)
                                                     * c.params.variation["amplitude"])
    sign = 1.0 if spec["direction"] == "ccw" else -1.0
    t_in = min(1.5, 0.2 * c.duration)
    loops = max(1, round((c.duration - t_in) / 4.5))
    phase0 = c.base.uniform(0, 2 * np.pi)
    s = np.clip((c.t - t_in) / (c.duration - t_in), 0, 1)
    # Ease in and out of the angular motion so the circle starts and ends at rest.
    angle = phase0 + sign * 2 * np.pi * loops * _min_jerk(s)
    pts = center + radius * np.stack([np.cos(angle), np.sin(angle), np.zeros_like(angle)], 1)
    q_path = c.ik_path(pts)
    w = _min_jerk(c.t / t_in)[:, None]
    return c.rest + w * (q_path - c.rest) if t_in > 0 else q_path


def _sweep(c: _Ctx, spec: dict) -> np.ndarray:
    j = c.platform.channel_names.index(spec["channel"])
    ch = c.platform.channels[j]
    mid, half = 0.5 * (ch.limit_lower + ch.limit_upper), 0.45 * (ch.limit_upper - ch.limit_lower)
    half *= 1 - c.rep.uniform(0, c.params.variation["amplitude"])
    seg = 2.5
    n_seg = max(2, int(c.duration / seg))
    times = list(np.linspace(0, c.duration, n_seg + 1))
    ends = [mid + half * (1 if k % 2 else -1) for k in range(n_seg)]
    poses = [c.rest.copy()]
    for e in ends:
        p = c.rest.copy()
        p[j] = e
        poses.append(p)
    return _through_waypoints(times, poses, c.t)


def _perturb(c: _Ctx, spec: dict) -> np.ndarray:
    """Command steps around a slowly wandering pose: each 0.25-0.6 s a new goal, the pose
    plus up to ±0.12 rad per joint (grippers held). What a Jacobian field is fitted from
    (random command perturbations and the motion they cause; Neural Jacobian Fields), and
    what a model's dx/du is only right about if it has seen it."""
    dt = c.t[1] - c.t[0] if len(c.t) > 1 else 1.0
    lo = np.array([ch.limit_lower for ch in c.platform.channels])
    hi = np.array([ch.limit_upper for ch in c.platform.channels])
    arm = np.array([j not in c.platform.gripper_indices for j in range(c.rest.size)])
    q = np.repeat(c.rest[None], len(c.t), axis=0)
    k = int(round(0.5 / dt))  # start at rest
    pose = c.rest.copy()
    while k < len(c.t):
        hold = max(1, int(round(c.rep.uniform(0.25, 0.6) / dt)))
        pose = np.clip(pose + c.rep.normal(0.0, 0.1, pose.size), c.rest - 0.4, c.rest + 0.4)
        goal = np.where(arm, pose + c.rep.uniform(-0.12, 0.12, pose.size), c.rest)
        q[k : k + hold] = np.clip(goal, lo, hi)
        k += hold
    return q


def _backward_forward(c: _Ctx, spec: dict) -> np.ndarray:
    ws = c.params.workspace
    center = np.asarray(ws["circle_center"], float) + c.offset3()
    reach = ws["reach"] * (1 + c.rep.uniform(-1, 1) * c.params.variation["amplitude"])
    t_in = min(1.5, 0.2 * c.duration)
    cycles = max(1, round((c.duration - t_in) / 5.0))
    s = np.clip((c.t - t_in) / (c.duration - t_in), 0, 1)
    x = reach * np.sin(2 * np.pi * cycles * _min_jerk(s))
    pts = center + np.stack([x, np.zeros_like(x), 0.3 * np.abs(x)], 1)
    q_path = c.ik_path(pts)
    w = _min_jerk(c.t / t_in)[:, None]
    return c.rest + w * (q_path - c.rest)


def _gripper(c: _Ctx, q: np.ndarray, value: float) -> np.ndarray:
    q = q.copy()
    for g in c.platform.gripper_indices:
        q[g] = value
    return q


def _pick_place(c: _Ctx, spec: dict) -> tuple[np.ndarray, float, float]:
    ws = c.params.workspace
    pick = np.asarray(ws["pick"], float) + c.offset3()
    place = np.asarray(ws["place"], float) + c.offset3()
    up = np.array([0.0, 0.0, ws.get("hover", 0.06)])  # worlds from before the key: 6 cm
    qs = c.ik_points([pick + up, pick, pick + up, place + up, place, place + up])
    opened, closed = ws["gripper_open"], ws["gripper_closed"]
    rest = _gripper(c, c.rest, opened)
    poses = [rest, _gripper(c, qs[0], opened), _gripper(c, qs[1], opened),
             _gripper(c, qs[1], closed), _gripper(c, qs[2], closed), _gripper(c, qs[3], closed),
             _gripper(c, qs[4], closed), _gripper(c, qs[4], opened), _gripper(c, qs[5], opened),
             rest]
    frac = np.array([0, 0.12, 0.22, 0.30, 0.40, 0.58, 0.68, 0.76, 0.86, 1.0])
    times = list(frac * c.duration)
    # Carried from grasp (jaw closed) to release (jaw starts opening); the object sits
    # between the jaws from the pick pose until the jaw is open again at the place pose.
    return _through_waypoints(times, poses, c.t), (times[3], times[6]), (times[2], times[7])


def _lift_hold(c: _Ctx, spec: dict) -> np.ndarray:
    ws = c.params.workspace
    lift = np.asarray(ws["lift"], float) + c.offset3()
    (q_up,) = c.ik_points([lift])
    closed = ws["gripper_closed"]
    start = _gripper(c, c.rest, closed)
    times = [0.0, 0.1 * c.duration, 0.4 * c.duration]
    return _through_waypoints(times, [start, start, _gripper(c, q_up, closed)], c.t)


def _push(c: _Ctx, spec: dict) -> tuple[np.ndarray, np.ndarray]:
    ws = c.params.workspace
    pose = np.asarray(ws["push_pose"], float) + c.offset3()
    (q_p,) = c.ik_points([pose])
    t_in = min(1.5, 0.2 * c.duration)
    # NAD pushes are made with the gripper shut throughout (the OMX files: the aperture sits
    # at its closed end from the first frame).
    closed = ws["gripper_closed"]
    q = _through_waypoints([0.0, t_in], [_gripper(c, c.rest, closed), _gripper(c, q_p, closed)],
                           c.t)
    # Force schedule: pushes with raised-cosine ramps in the hold phase.
    k = int(spec.get("pushes", 3))
    fmin, fmax = spec.get("force_min", 3.0), spec.get("force_max", 9.0)
    axis = "xyz".index(spec["axis"])
    mag = np.zeros_like(c.t)
    slot = (c.duration - t_in - 0.5) / k
    for i in range(k):
        start = t_in + 0.5 + i * slot + c.rep.uniform(0.0, 0.25) * slot
        ramp = min(0.3, 0.2 * slot)
        hold = c.rep.uniform(0.35, 0.55) * slot
        level = c.rep.uniform(fmin, fmax)
        u = c.t - start
        up = 0.5 - 0.5 * np.cos(np.pi * np.clip(u / ramp, 0, 1))
        down = 0.5 - 0.5 * np.cos(np.pi * np.clip((u - ramp - hold) / ramp, 0, 1))
        mag += level * (up - down)
    force = np.zeros((c.t.size, 3))
    force[:, axis] = spec["sign"] * mag
    return q, force


def _bam(c: _Ctx, spec: dict) -> tuple[np.ndarray, np.ndarray]:
    t = c.t
    on = np.ones_like(t)
    prof = spec["profile"]
    if prof == "sin_sin":
        g = (np.pi / 2) * np.sin(t) + 0.5 * np.sin(5 * t) * np.sin(2 * t)
    elif prof == "lift_and_drop":
        s = np.clip(t / 2.0, 0, 1)
        g = -np.pi / 2 * (3 * s**2 - 2 * s**3)
        on = (t < 2.0).astype(float)
    elif prof == "up_and_down":
        s1, s2 = np.clip(t / 3.0, 0, 1), np.clip((t - 3.0) / 3.0, 0, 1)
        cubic = lambda s: 3 * s**2 - 2 * s**3  # noqa: E731
        g = np.pi / 2 * cubic(s1) - 0.2 * np.pi / 2 * cubic(s2)
    elif prof == "sin_time_square":
        g = np.sin(t**2)
    elif prof == "random_sines":
        # Not one of BAM's: a different goal every repetition (three sines of random
        # amplitude, frequency and phase, starting from 0), for commands a model never saw.
        g = np.zeros_like(t)
        for _ in range(3):
            amp, hz, phase = c.rep.uniform(0.15, 0.5), c.rep.uniform(0.2, 1.2), \
                c.rep.uniform(0, 2 * np.pi)
            g += amp * (np.sin(2 * np.pi * hz * t + phase) - np.sin(phase))
    else:
        raise WorldError(f"task {spec.get('name')!r}: unknown bam profile {prof!r}; expected "
                         "sin_sin | lift_and_drop | up_and_down | sin_time_square | "
                         "random_sines")
    return g[:, None], on


# --------------------------------------------------------------------------- planning


def plan_episode(
    platform: Platform,
    params: WorldParams,
    kin: Kinematics | None,
    task: str,
    rep: int,
    seed: int,
    seconds: float | None = None,
) -> EpisodePlan:
    """The commanded motion and labels of repetition ``rep`` of ``task``."""
    if task not in params.tasks:
        raise WorldError(f"unknown task {task!r}; this world has {sorted(params.tasks)}")
    spec = dict(params.tasks[task], name=task)
    kind = spec["kind"]
    # A matched no-contact run repeats its push task's motion exactly: same seeds.
    motion_name = task[: -len("_ref")] if spec.get("ref") and task.endswith("_ref") else task
    var = params.variation
    base = task_seed(seed, motion_name, 0)
    rep_rng = task_seed(seed, motion_name, 1, rep)
    scale = rep_rng.uniform(*var["time_scale"]) if kind != "bam" else 1.0
    duration = float(seconds if seconds is not None else spec["seconds"]) * scale
    dt = platform.control_dt
    frames = max(2, int(round(duration / dt)))
    t = np.arange(frames) * dt
    n = platform.n
    rest = np.asarray(params.workspace["rest_pose"], float)
    shaft = params.motor_array("transmission")  # joint units per servo-shaft rad
    rest = rest + rep_rng.normal(0, var["joint_offset"], n) * shaft * (kind != "bam")
    if kin is not None and var.get("posture", 0.0) > 0 and kind != "bam":
        # The same gripper position held differently each repetition (NAD operators vary
        # elbow_flex and wrist_flex together by ~0.25 rad); the IK is pulled toward it.
        dirs = kin.posture_directions(rest)
        rest = rest + rep_rng.normal(0, var["posture"], len(dirs)) @ dirs
    ctx = _Ctx(platform, params, kin, rest, t, frames * dt, base, rep_rng)

    force = np.zeros((frames, 3))
    label = np.full((frames, 3), np.nan)
    mass = float(spec.get("payload_g", 0.0)) / 1000.0
    held = np.zeros(frames, dtype=bool)
    between_jaws = np.zeros(frames, dtype=bool)
    torque = np.ones((frames, n))
    kp = None
    if kind == "circle":
        q = _circle(ctx, spec)
    elif kind == "sweep":
        q = _sweep(ctx, spec)
    elif kind == "backward_forward":
        q = _backward_forward(ctx, spec)
    elif kind == "pick_place":
        q, (t_grab, t_release), (t_in, t_out) = _pick_place(ctx, spec)
        held = (t >= t_grab) & (t < t_release)
        between_jaws = (t >= t_in) & (t < t_out)
    elif kind == "perturb":
        q = _perturb(ctx, spec)
        held[:] = mass > 0  # a payload, if any, hangs for the whole episode
    elif kind in ("lift_hold", "hold"):
        q = _lift_hold(ctx, spec)
        held[:] = True
        between_jaws[:] = True
    elif kind == "push":
        q, push_force = _push(ctx, spec)
        if spec.get("ref"):
            label[:] = 0.0
        else:
            force, label = push_force, push_force.copy()
    elif kind == "bam":
        q, on = _bam(ctx, spec)
        torque = np.repeat(on[:, None], n, axis=1)
        kps = spec.get("kp_values") or []
        kp = float(kps[rep % len(kps)]) if kps else None
    else:  # validated earlier; kept for a clear message if a new kind is half-added
        raise WorldError(f"task {task!r}: no planner for kind {kind!r}")
    if kind != "bam":
        # Tremor and start offsets are servo-shaft angles: through the transmission on a
        # finger slide (OMX; 1 on revolute joints).
        q = q + _tremor(rep_rng, frames, n, var["tremor"], var["tremor_cutoff"], dt) * shaft
    q = np.clip(q, [c.limit_lower for c in platform.channels],
                [c.limit_upper for c in platform.channels])
    if mass > 0:
        force[held, 2] += -mass * G
        label[held, 2] = -mass * G
    payload = np.where(held, mass, 0.0)
    # Only a real object stops the jaw ("empty" tasks close on nothing); worlds recorded
    # before the grasp model existed have no grasp keys and no stop.
    jaw = float(params.workspace.get("grasp_jaw", np.nan))
    stops = mass > 0 and params.workspace.get("grasp_stiffness", 0.0) > 0
    grasp = np.where(between_jaws & stops, jaw, np.nan)
    condition = np.ones((frames, n))
    band = bool(spec.get("degrade", False))
    if band:
        condition[:, params.band["channel"]] = 0.0
    meta = {"task_kind": kind, "repetition": rep, "time_scale": float(scale),
            "payload_kg": mass, "band": band}
    if kp is not None:
        meta["kp"] = kp
    fault = _fault(platform, params, spec, frames, dt)
    if fault is not None:
        condition[fault["onset_frame"]:, fault["channel"]] = 0.0
        meta["fault"] = dict(fault, channel_name=platform.channel_names[fault["channel"]],
                             onset_s=fault["onset_frame"] * dt)
    return EpisodePlan(task, q, force, label, payload, condition, torque, grasp, band, kp,
                       meta=meta, fault=fault)


def _fault(platform: Platform, params: WorldParams, spec: dict, frames: int,
           dt: float) -> dict | None:
    """The mid-run fault of an ``onset`` task (None for any other task).

    The onset is in seconds from the first logged frame (not scaled with the repetition's
    speed), so every repetition's label switches at the same, known frame."""
    if "onset" not in spec:
        return None
    ch = spec.get("fault_channel")
    channel = platform.channel_names.index(ch) if ch is not None else params.band["channel"]
    if channel < 0:
        raise WorldError(f"task {spec['name']!r}: platform {platform.name!r} has no band "
                         "channel; give fault_channel")
    onset = min(frames - 1, int(round(float(spec["onset"]) / dt)))
    return {"kind": str(spec.get("fault", "band")), "channel": int(channel),
            "onset_frame": int(onset), "wear": float(spec.get("wear", 1.0))}
