"""Contact estimation measured in the hidden world: held-out runs, cross-validated by episode.

Each run holds a random posture (the servo position loop holds it; the world's perturbed
links, friction and telemetry as everywhere else). A contact run presses once on one of the
configured links at a random surface point, into the surface inside the friction cone,
1-10 N with raised-cosine ramps; its no-contact twin holds the same posture. The external
torque residual ``tau_ext = ID(q, qd, qdd) - tau_motor`` uses the nominal arm's inverse
dynamics (:mod:`nactuator.sim.dynamics`) and one of these motor-torque sources:

- ``oracle``: the world's true joint torque (separates estimator error from model error);
- ``current_id``: the classical residual, a per-joint affine map of the servo's telemetry
  (current, else the effort signal) fitted to ID torque on the training folds' twins;
- a learned actuator model (``--ckpt NAME=PATH``): its torque on every causal window of the
  run, the path ``nactuator infer`` runs (input filters, :func:`nactuator.rollout.causal_outputs`);
  ``{fold}`` in PATH names a per-fold model (e.g. adapted on that fold's training twins).

``tip_only`` is today's estimate: the residual projected onto an end-effector force;
``exact`` is the labelled contact's own joint torque (the estimator's best case);
``exact_friction`` is that torque off by a share of the servos' dry friction, as a held
gearbox takes it (:func:`_friction_share`), judged with the true torque's thresholds: what
a perfect motor-torque model would give. Each source's ``torque_err_nm`` (median over presses
of the largest joint's error of the hold's mean residual against the contact's torque) and
``within_friction`` (the share of presses whose error is within the world's dry-friction
level on every joint) say how far the residual is from the contact's torque. A source with a
motor torque is scored three ways: the residual as is, tared (``_tared``: minus its mean over
the run's first second) and the momentum observer fed the same motor torque
(``_observer_tared``: :func:`nactuator.sim.dynamics.observer_torque`, gain
``observer_gain`` of the contact config, tared the same way), which needs no acceleration. Every
source is scored twice: one estimate per press (the hold's mean residual at its mean
posture) and the contact filter (:class:`~nactuator.contact.estimate.ContactFilter`) run
causally over the press's frames (``filter_*`` keys). ``--motion sweep`` presses an arm
that moves (:func:`run_world`).

    PYTHONPATH=src python -m nactuator.contact.experiment --pairs 40 --folds 5 --out runs/contact \
        --ckpt learned=pretrained/so101
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from nactuator.atomic import write_json, write_png
from nactuator.data.commands import command_channels
from nactuator.data.writer import DatasetWriter
from nactuator.errors import UserError
from nactuator.input_filters import filter_inputs
from nactuator.models import load_model
from nactuator.platforms import load_platform
from nactuator.rollout import causal_outputs
from nactuator.sim.dynamics import ArmDynamics, momentum_residual, observer_terms
from nactuator.world import World, load_world

from .estimate import (
    EDGE_FRAMES,
    ContactFilter,
    FilterSettings,
    _pyramid,
    calibrate_threshold,
    detect,
    external_torque,
    isolate,
    localise,
)
from .surface import LinkSurfaces, load_contact_config

__all__ = ["evaluate", "model_torque", "run_world", "write_dataset"]

RECORDED = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "current", "pwm")
# The world's hidden truth per frame (never a residual source's input): the servo's delivered
# joint torque (the oracle source) and its dry-friction level (the torque error's yardstick).
HIDDEN = ("torque_true", "friction_true")


def _schedule(t: np.ndarray, start: float, ramp: float, hold: float) -> np.ndarray:
    u = t - start
    up = 0.5 - 0.5 * np.cos(np.pi * np.clip(u / ramp, 0, 1))
    down = 0.5 - 0.5 * np.cos(np.pi * np.clip((u - ramp - hold) / ramp, 0, 1))
    return up - down


MOTIONS = ("hold", "sweep")


def _sweep(t: np.ndarray, start: float, duration: float) -> np.ndarray:
    """0 -> 1 -> 0 raised cosine over [start, start + duration], 0 outside."""
    u = np.clip((t - start) / duration, 0.0, 1.0)
    return 0.5 - 0.5 * np.cos(2 * np.pi * u)


def run_world(platform: str, pairs: int, seed: int, seconds: float = 5.0,
              press_link: str | None = None, magnitude: float | None = None,
              motion: str = "hold") -> dict:
    """Simulate ``pairs`` contact runs and their twins; returns per-frame arrays.

    ``press_link`` / ``magnitude`` press every run on that link / with that peak force [N] instead
    of the drawn ones (the draws are made anyway, so every other choice stays the same).
    ``motion``: ``hold`` (the posture is held; the push direction is set into the surface at
    the current pose every frame) or ``sweep`` (a person pushing a moving arm: while the
    press is on, the command of 3 of the first 4 joints goes out and back by 0.2-0.4 rad,
    a raised cosine over ramp + hold + ramp, kept 0.1 rad inside the joint ranges, the twin
    with the same commands; the push
    direction is fixed in the base frame at the press's first frame, the point fixed on the
    link). The sweep's draws come after every ``hold`` draw, so both share postures, links,
    points, forces and timing."""
    if motion not in MOTIONS:
        raise UserError(f"motion {motion!r}: one of {', '.join(MOTIONS)}")
    p = load_platform(platform)
    cfg = load_contact_config(p)
    surf = LinkSurfaces.build(p, cfg)
    params = load_world(p, seed=seed)
    rng = np.random.default_rng(seed)
    n, K = p.n, len(surf.names)
    rest = np.asarray(params.workspace["rest_pose"], float)
    arm = np.array([j not in p.gripper_indices for j in range(n)])
    postures = rest + arm * rng.normal(0, 0.25, (pairs, n))
    link = rng.integers(0, K, pairs)
    point_idx = np.array([rng.integers(len(surf.points[k])) for k in link])
    mag = rng.uniform(1.0, 10.0, pairs)
    start = rng.uniform(1.5, 2.5, pairs)
    tang = rng.uniform(-1, 1, (pairs, 4)) * float(cfg["friction"]) * 0.9
    if press_link is not None:
        if press_link not in surf.names:
            raise UserError(f"link {press_link!r}: not a contact link of {p.name} "
                            f"(conf/contact/{p.name}.yaml: {', '.join(surf.names)})")
        link = np.full(pairs, surf.names.index(press_link))
        point_idx = np.array([rng.integers(len(surf.points[k])) for k in link])
    if magnitude is not None:
        mag = np.full(pairs, float(magnitude))
    frames = int(round(seconds / p.control_dt))
    t = np.arange(frames) * p.control_dt
    sched = np.stack([_schedule(t, s, 0.2, 1.2) for s in start], 1) * mag  # (T, pairs)
    offset = np.zeros((frames, 2 * pairs, n))  # the command's excursion from the posture
    if motion == "sweep":
        amp = np.zeros((pairs, n))
        for e in range(pairs):
            js = rng.choice(4, 3, replace=False)
            amp[e, js] = rng.uniform(0.2, 0.4, 3) * rng.choice([-1.0, 1.0], 3)
        prof = np.stack([_sweep(t, s, 0.2 + 1.2 + 0.2) for s in start], 1)  # (T, pairs)
        offset = np.concatenate([prof[..., None] * amp] * 2, axis=1)
        # Inside the joint ranges (0.1 rad off the stops: a stop pressing back is a contact)
        lo, hi = surf.model.jnt_range[:n].T
        limited = surf.model.jnt_limited[:n].astype(bool)
        goal = np.concatenate([postures, postures])[None] + offset
        goal = np.where(limited, np.clip(goal, lo + 0.1, hi - 0.1), goal)
        offset = goal - np.concatenate([postures, postures])[None]

    world = World(p, params, seed=list(range(2 * pairs)), n_envs=2 * pairs)
    q0 = np.concatenate([postures, postures])
    world.reset(q0)
    world.step(float(params.physics["settle_seconds"]))
    logs = {k: np.zeros((frames, 2 * pairs, n)) for k in (*RECORDED, *HIDDEN)}
    f_world = np.zeros((frames, pairs, 3))
    local = np.stack([surf.points[k][i] for k, i in zip(link, point_idx, strict=True)])
    normal_local = np.stack([surf.normals[k][i] for k, i in zip(link, point_idx, strict=True)])
    bodies = np.concatenate([surf.bodies[link], np.full(pairs, -1)])
    frozen = np.full((pairs, 3), np.nan)  # sweep: the push direction once the press is on
    for k in range(frames):
        if motion != "hold":
            world.set_goal(q0 + offset[k])
        tel = world.telemetry()
        tel["q_cmd"] = world.goal()  # held: the posture
        # The gearbox's dry-friction level at this instant (Coulomb + Stribeck + load), per
        # joint: how much torque the servo's friction can hold without the joint moving.
        tel["friction_true"] = world.servo.friction_budget(world.qd / world.trans) / world.trans
        for key in logs:
            logs[key][k] = tel[key]
        # The push direction in the base frame, into the surface at the current pose.
        dirs = np.zeros((2 * pairs, 3))
        for e in range(pairs):
            d = world.datas[e]
            R = d.xmat[bodies[e]].reshape(3, 3)
            D = _pyramid(R @ normal_local[e], float(cfg["friction"]))
            w = np.array([1.0, 1.0, 1.0, 1.0]) + tang[e]
            v = D @ (w / w.sum())
            dirs[e] = v / np.linalg.norm(v)
            if motion != "hold":
                if sched[k, e] > 0 and np.isnan(frozen[e, 0]):
                    frozen[e] = dirs[e]
                if not np.isnan(frozen[e, 0]):
                    dirs[e] = frozen[e]
        force = dirs * np.concatenate([sched[k], np.zeros(pairs)])[:, None]
        f_world[k] = force[:pairs]
        world.set_link_contact(np.where(np.abs(force).sum(1) > 0, bodies, -1),
                               np.concatenate([local, local]), force)
        world.step(p.control_dt)
    kp = np.asarray(world.servo.p["kp"], dtype=float).reshape(-1)[:n]
    return {"logs": logs, "force": f_world, "link": link, "local": local, "t": t,
            "control_dt": p.control_dt, "platform": p.name, "kp": kp,
            "bodies": surf.bodies[link], "seed": seed, "motion": motion}


def _run_frames(data: dict, e: int) -> dict[str, np.ndarray]:
    """Run ``e``'s recorded channels (T, n) plus the derived command channels."""
    frames = {k: data["logs"][k][:, e].astype(np.float32) for k in RECORDED}
    return {**frames, **command_channels(frames, {"kp": [float(x) for x in data["kp"]]},
                                         f"contact run {e}")}


def model_torque(ckpt: str, data: dict) -> np.ndarray:
    """(T, runs, n) the actuator model's torque on every run: the causal path of ``infer``
    (the bundle's input filters, then every window through the network)."""
    actuator, meta = load_model(ckpt, expect_platform=data["platform"])
    if actuator.mode != "telemetry":
        raise UserError(f"{ckpt}: a {actuator.mode} model; the contact residual needs the "
                        "motor torque read from telemetry (a telemetry-mode model)")
    runs = data["logs"]["q"].shape[1]
    recs = [filter_inputs(_run_frames(data, e), meta["input_filters"])[0] for e in range(runs)]
    return np.stack([o["tau"] for o in causal_outputs(actuator, recs)], 1)


def write_dataset(data: dict, root: str | Path, folds: int = 5, fold: int | None = None,
                  presses: bool = False) -> Path:
    """The runs as a nactuator dataset with per-frame contact labels (docs/contact.md).

    Tasks ``contact_press`` and ``no_contact`` (the twins: ``ee_force`` labelled 0 N). With
    ``fold`` only the twins, that fold's held-out ones in split test and the rest in train
    (what ``nactuator adapt`` fine-tunes on: the user's contact-free calibration runs);
    ``presses`` adds the presses the same way (labelled presses to train a motor torque on:
    ``model.external_torque``).
    """
    p = load_platform(data["platform"])
    pairs = data["link"].size
    fold_of = np.arange(pairs) % folds
    T = data["logs"]["q"].shape[0]
    with DatasetWriter(root, p, fps=p.fps, metadata={"contact_experiment": {
            "pairs": int(pairs), "folds": folds, "fold": fold, "seed": int(data["seed"])}}) as w:
        for e in range(2 * pairs):
            pair, press = e % pairs, e < pairs
            if fold is not None and press and not presses:
                continue
            frames = {k: data["logs"][k][:, e] for k in RECORDED}
            frames["payload_mass"] = np.zeros(T)
            link = np.full(T, np.nan)
            point, force = np.full((T, 3), np.nan), np.full((T, 3), np.nan)
            if press:
                on = np.linalg.norm(data["force"][:, pair], axis=1) > 0
                link[on] = data["bodies"][pair]
                point[on] = data["local"][pair]
                force[on] = data["force"][on, pair]
            else:
                frames["force"] = np.zeros((T, 3))
            frames.update(contact_link=link, contact_point=point, contact_force=force)
            split = ("test" if fold_of[pair] == (fold if fold is not None else folds - 1)
                     else "train")
            w.add_episode(frames, "contact_press" if press else "no_contact", split,
                          episode_meta={"kp": [float(x) for x in data["kp"]],
                                        "contact_pair": int(pair), "fold": int(fold_of[pair])})
    return Path(root)


def labelled_joint_torque(data: dict, surf: LinkSurfaces) -> np.ndarray:
    """(T, pairs, n) the joint torque J_p(q)^T f of every press run's labelled contact at
    its recorded pose (0 where no press): what a labelled press tells a torque model."""
    logs = data["logs"]
    T, pairs = data["force"].shape[:2]
    out = np.zeros((T, pairs, logs["q"].shape[2]))
    links = [int(np.flatnonzero(surf.bodies == b)[0]) for b in data["bodies"]]
    for e in range(pairs):
        for t in np.flatnonzero(np.abs(data["force"][:, e]).sum(1) > 0):
            pts, _, d = surf.world_points(logs["q"][t, e], links[e], local=data["local"][e])
            out[t, e] = surf.point_jacobian(d, links[e], pts[0]).T @ data["force"][t, e]
    return out


def _friction_share(data: dict) -> np.ndarray | None:
    """(T, runs, n) for the source ``exact_friction``: on each press's frames, a constant
    per run and joint drawn uniformly within +- the world's dry-friction level over the
    press's hold (``friction_true``; seeded by the world seed); 0 elsewhere and on the twins.
    A held servo's gearbox takes an unknown share of a contact's torque up to that level
    without moving, so a perfect motor-torque model would still see the contact's torque off
    by this much. None for runs saved before the friction level was logged."""
    budget = data["logs"].get("friction_true")
    if budget is None:
        return None
    pairs = data["force"].shape[1]
    mag = np.linalg.norm(data["force"], axis=2)  # (T, pairs)
    rng = np.random.default_rng([int(data["seed"]), 23])
    out = np.zeros_like(budget)
    for e in range(pairs):
        on = mag[:, e] > 0
        if on.any():
            level = budget[mag[:, e] >= 0.999 * mag[:, e].max(), e].mean(0)  # the hold's
            out[on, e] = rng.uniform(-1.0, 1.0, level.size) * level
    return out


def evaluate(data: dict, folds: int = 5, models: dict[str, str] | None = None) -> dict:
    p = load_platform(data["platform"])
    cfg = load_contact_config(p)
    surf = LinkSurfaces.build(p, cfg)
    dyn = ArmDynamics.for_platform(p)
    logs, dt = data["logs"], data["control_dt"]
    pairs = data["link"].size
    envs = 2 * pairs
    signal = "current" if np.isfinite(logs["current"]).all() else "effort"
    tau_id = np.stack([external_torque(dyn, logs["q"][:, e], logs["qd"][:, e],
                                       np.zeros_like(logs["q"][:, e]), dt)
                       for e in range(envs)], 1)
    models = models or {}
    # A model shared by every fold runs once; a per-fold one ({fold} in its path) per fold.
    learned = {nm: model_torque(path, data) for nm, path in models.items() if "{fold}" not in path}
    press_torque = labelled_joint_torque(data, surf)  # (T, pairs, n)
    friction_share = _friction_share(data)
    # The momentum observer's state terms depend on the recorded states alone: once per run.
    terms = [observer_terms(dyn, logs["q"][:, e], logs["qd"][:, e]) for e in range(envs)]
    steps = np.full(logs["q"].shape[0], dt)
    gain = float(cfg.get("observer_gain", 10.0))

    def observed(tau_motor: np.ndarray) -> np.ndarray:
        """(T, runs, n) the momentum observer fed ``tau_motor`` on every run."""
        return np.stack([momentum_residual(*terms[e], tau_motor[:, e], steps, gain)
                         for e in range(envs)], 1)

    fold_of = np.arange(pairs) % folds
    mag = np.linalg.norm(data["force"], axis=2)  # (T, pairs)
    q_quant, margin = float(cfg["threshold_quantile"]), float(cfg["threshold_margin"])
    rows: dict[str, list[dict]] = {}
    tare = slice(10, int(round(1.0 / dt)))  # the first second: no press starts before 1.5 s
    for f in range(folds):
        train = np.flatnonzero(fold_of != f)
        test = np.flatnonzero(fold_of == f)
        twins_train = pairs + train
        # Classical torque: tau = a u + b per joint, fitted on the training twins (no contact).
        u = logs[signal][:, twins_train].reshape(-1, p.n)
        y = tau_id[:, twins_train].reshape(-1, p.n)
        coef = [np.polyfit(u[:, j], y[:, j], 1) for j in range(p.n)]
        # The same fit given what a motor-torque model trained with model.external_torque
        # is given: the training presses too, with their labelled contact's joint torque
        # taken out of the target (ID = motor + external).
        u_all = logs[signal][:, np.concatenate([train, twins_train])].reshape(-1, p.n)
        y_all = np.concatenate([tau_id[:, train] - press_torque[:, train],
                                tau_id[:, twins_train]], axis=1).reshape(-1, p.n)
        coef_all = [np.polyfit(u_all[:, j], y_all[:, j], 1) for j in range(p.n)]
        sources = {
            "oracle": logs["torque_true"],
            "current_id": np.stack([np.polyval(coef[j], logs[signal][..., j])
                                    for j in range(p.n)], -1),
            "current_id_presses": np.stack([np.polyval(coef_all[j], logs[signal][..., j])
                                            for j in range(p.n)], -1),
        }
        for nm, path in models.items():
            sources[nm] = (learned[nm] if nm in learned
                           else model_torque(path.format(fold=f), data))
        # exact: the labelled contact's own joint torque J_p(q)^T f at the recorded pose (no
        # torque model, no dynamics error; 0 on the twins): what the estimator can do at best.
        sources["exact"] = None
        if friction_share is not None:
            sources["exact_friction"] = None
        thresholds = {}
        # Only the joints that move a contact link (the gripper's jaw joint carries none of
        # these contacts).
        joints = int(surf.last_joint.max()) + 1
        # Each torque source three ways: the raw residual ID - motor, tared, and the momentum
        # observer fed the same motor torque (no acceleration; tared too). exact* only raw.
        for (name, tau_motor), way in [(s, w) for s in sources.items()
                                       for w in ("raw", "tared", "observer")
                                       if not (s[0].startswith("exact") and w != "raw")]:
            if tau_motor is None:
                res = np.concatenate([press_torque, np.zeros_like(press_torque)], axis=1)
                res = res[..., :joints]
                if name == "exact_friction":
                    res = res + friction_share[..., :joints]
            elif way == "observer":
                res = observed(tau_motor)[..., :joints]
            else:  # ID - motor (tau_id holds ID(q, qd, qdd))
                res = (tau_id - tau_motor)[..., :joints]
            if way != "raw":  # zeroed on the run's first contact-free second, as a tared sensor
                res = res - res[tare].mean(0, keepdims=True)
                name = f"{name}_tared" if way == "tared" else f"{name}_observer_tared"
            skip = EDGE_FRAMES
            thr = calibrate_threshold(res[skip:-skip, twins_train].reshape(-1, res.shape[-1]),
                                      q_quant, margin)
            if name == "exact_friction":  # its twins are 0: judged with the true torque's
                thr = thresholds["oracle_tared"]
            thresholds[name] = thr
            rows.setdefault(name, []).append(
                _score(res, thr, test, pairs, mag, data, surf, cfg, dyn, skip, f, press_torque))
    summary = {}
    for name, rs in rows.items():
        keys = [k for k in rs[0] if k != "fold"]
        summary[name] = {k: {"mean": float(np.nanmean([r[k] for r in rs])),
                             "std": float(np.nanstd([r[k] for r in rs])),
                             "per_fold": [r[k] for r in rs]} for k in keys}
    summary["meta"] = {"pairs": int(pairs), "folds": folds, "signal": signal,
                       "frames": int(logs["q"].shape[0]), "control_dt": dt, "models": models}
    return summary


def _score(res, thr, test, pairs, mag, data, surf, cfg, dyn, skip, fold, press_torque) -> dict:
    dt = data["control_dt"]
    mu = float(cfg["friction"])
    budget = data["logs"].get("friction_true")  # absent in runs saved before it was logged
    torque_err, within = [], []
    idle = res[skip:-skip, pairs + test]
    false_alarm = float(detect(idle.reshape(-1, idle.shape[-1]), thr).mean())
    det, delays, iso, iso_tip, err_cm, err_tip_cm, ferr, ferr_tip = [], [], [], [], [], [], [], []
    pressed, iso_f, err_f, ferr_f = [], [], [], []
    settings = FilterSettings.from_config(cfg)
    for e in test:
        on = np.flatnonzero(mag[:, e] > 0)
        hold = np.flatnonzero(mag[:, e] >= 0.999 * mag[:, e].max())
        if mag[:, e].max() < 2.0:
            continue
        hits = detect(res[on, e], thr)
        det.append(bool(hits.any()))
        if hits.any():
            delays.append(float(np.argmax(hits)) * dt * 1000.0)
        # One estimate per press: the hold phase's mean residual at its mean posture.
        q = data["logs"]["q"][hold, e].mean(0)
        tau = np.zeros(q.size)
        tau[: res.shape[-1]] = res[hold, e].mean(0)
        j = isolate(tau[: thr.size], thr)
        est = localise(surf, q, tau, j, mu)
        # How far this residual is from the contact's own joint torque over the hold, per
        # joint, and whether the servos' dry friction could hold that much (then no torque
        # model, however exact, could see it from the motor side).
        err = np.abs(res[hold, e].mean(0) - press_torque[hold, e, : res.shape[-1]].mean(0))
        torque_err.append(float(err.max()))
        if budget is not None:
            within.append(bool((err <= budget[hold, e, : res.shape[-1]].mean(0)).all()))
        k = int(data["link"][e])
        p_true, _, _ = surf.world_points(q, k, data["local"][e])
        f_true = data["force"][hold, e].mean(0)
        iso.append(est.link == k)
        pressed.append(k)
        err_cm.append(100 * float(np.linalg.norm(est.point_world - p_true[0])))
        ferr.append(float(abs(np.linalg.norm(est.force) - np.linalg.norm(f_true))))
        # Today's tip-only estimate: the residual as an end-effector force at the EE point.
        with torch.no_grad():
            qt = torch.as_tensor(q[None], dtype=torch.float64)
            J = dyn.ee_jacobian(qt)[0].numpy()
            p_ee = dyn.kin.ee_position(qt)[0].numpy()
        f_tip = np.linalg.lstsq(J.T, tau, rcond=None)[0]
        iso_tip.append(k == len(surf.names) - 1)
        err_tip_cm.append(100 * float(np.linalg.norm(p_ee - p_true[0])))
        ferr_tip.append(float(abs(np.linalg.norm(f_tip) - np.linalg.norm(f_true))))
        # The contact filter, causally over the press's frames from its onset to the end of
        # the hold (one point and force over the postures; estimate.ContactFilter).
        # The last frame's estimate; where that frame is not flagged, the latest flagged
        # frame's (what a user's display holds), at that frame's posture.
        filt = ContactFilter(surf, thr, mu, settings)
        est_f, t_f = filt.update(data["logs"]["q"][on[0], e], res[on[0], e]), on[0]
        for t in range(on[0] + 1, hold[-1] + 1):
            est = filt.update(data["logs"]["q"][t, e], res[t, e])
            if est.link >= 0 or est_f.link < 0:
                est_f, t_f = est, t
        q_end = data["logs"]["q"][t_f, e]
        p_end, _, _ = surf.world_points(q_end, k, data["local"][e])
        iso_f.append(est_f.link == k)
        err_f.append(100 * float(np.linalg.norm(est_f.point_world - p_end[0]))
                     if est_f.link >= 0 else np.nan)
        ferr_f.append(float(abs(np.linalg.norm(est_f.force)
                                - np.linalg.norm(data["force"][t_f, e])))
                      if est_f.link >= 0 else np.nan)
    return {"fold": fold, "detection": float(np.mean(det)), "false_alarm": false_alarm,
            "delay_ms": float(np.median(delays)) if delays else float("nan"),
            "isolation": float(np.mean(iso)), "localisation_cm": float(np.median(err_cm)),
            "force_err_n": float(np.median(ferr)), "tip_isolation": float(np.mean(iso_tip)),
            "tip_localisation_cm": float(np.median(err_tip_cm)),
            "tip_force_err_n": float(np.median(ferr_tip)), "events": len(det),
            "torque_err_nm": float(np.median(torque_err)),
            "within_friction": float(np.mean(within)) if within else float("nan"),
            "filter_isolation": float(np.mean(iso_f)),
            "filter_localisation_cm": float(np.nanmedian(err_f)),
            "filter_force_err_n": float(np.nanmedian(ferr_f)),
            # per pressed link (NaN where the fold pressed it on no run >= 2 N)
            **{f"isolation_{nm}": (float(np.mean([i for i, kk in zip(iso, pressed, strict=True)
                                                   if kk == k])) if k in pressed else np.nan)
               for k, nm in enumerate(surf.names)},
            **{f"filter_isolation_{nm}": (float(np.mean([i for i, kk in zip(iso_f, pressed,
                                                                            strict=True)
                                                          if kk == k]))
                                          if k in pressed else np.nan)
               for k, nm in enumerate(surf.names)}}


def _plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in summary if k != "meta"]
    keys = [("detection", "detection (>=2 N)"), ("false_alarm", "false alarms (idle)"),
            ("isolation", "link isolation")]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.4))
    x = np.arange(len(keys))
    w = 0.8 / (len(names) + 1)
    for i, nm in enumerate(names):
        ax[0].bar(x + w * i, [summary[nm][k]["mean"] for k, _ in keys], w,
                  yerr=[summary[nm][k]["std"] for k, _ in keys], label=nm)
    ax[0].bar(x[2] + w * len(names), summary["oracle"]["tip_isolation"]["mean"], w,
              label="tip-only")
    ax[0].set_xticks(x + 0.4, [lbl for _, lbl in keys])
    ax[0].legend(fontsize=7)
    loc = [summary[nm]["localisation_cm"]["mean"] for nm in names] + \
          [summary["oracle"]["tip_localisation_cm"]["mean"]]
    ax[1].bar([*names, "tip-only"], loc)
    ax[1].tick_params(axis="x", labelsize=7, rotation=20)
    ax[1].axhline(3.0, color="k", ls="--", lw=0.8)
    ax[1].set_ylabel("median point error [cm]")
    fig.tight_layout()
    write_png(path, fig)


def _runs(a: argparse.Namespace, path: Path) -> dict:
    """The world runs: simulated, or read back from ``path`` (``--reuse``, same arguments)."""
    key = [a.platform, a.pairs, a.seed, a.seconds] + ([] if a.motion == "hold" else [a.motion])
    if a.reuse and path.is_file():
        z = np.load(path, allow_pickle=False)
        if [str(x) for x in z["key"]] == [str(x) for x in key]:
            logs = {k.removeprefix("log_"): z[k] for k in z.files if k.startswith("log_")}
            return {"logs": logs, **{k: z[k] for k in ("force", "link", "local", "t", "kp",
                                                     "bodies")},
                    "control_dt": float(z["control_dt"]), "platform": str(z["platform"]),
                    "seed": int(z["seed"]), "motion": a.motion}
        print(f"{path}: made with {list(z['key'])}, not {key}; simulating again")
    data = run_world(a.platform, a.pairs, a.seed, a.seconds, motion=a.motion)
    np.savez(path, key=np.array([str(x) for x in key]),
             **{f"log_{k}": v for k, v in data["logs"].items()},
             **{k: v for k, v in data.items() if k != "logs"})
    return data


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="so101")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default="runs/contact")
    ap.add_argument("--motion", choices=MOTIONS, default="hold",
                    help="hold: each run holds its posture; sweep: the arm's command moves "
                         "through postures while pressed (run_world)")
    ap.add_argument("--ckpt", action="append", default=[], metavar="NAME=PATH",
                    help="a learned residual source: the actuator model at PATH (a checkpoint, "
                         "bundle or pretrained/NAME; '{fold}' in PATH: one model per fold); "
                         "repeatable")
    ap.add_argument("--dataset", default=None, metavar="DIR",
                    help="also write the runs as a dataset with contact labels (DIR/all) and "
                         "each fold's twins (DIR/fold_K: train = its training twins)")
    ap.add_argument("--dataset-presses", action="store_true",
                    help="with --dataset: DIR/fold_K also holds that fold's presses (train: "
                         "its training presses; test: its held-out ones), for a model trained "
                         "with the contacts' joint torque in the simulator "
                         "(conf/contact/adapt_motor.yaml)")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse OUT/runs.npz from an earlier call with the same world arguments")
    a = ap.parse_args(argv)
    models = {}
    for item in a.ckpt:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            ap.error(f"--ckpt {item!r}: expected NAME=PATH")
        models[name] = path
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = _runs(a, out / "runs.npz")
    if a.dataset:
        write_dataset(data, Path(a.dataset) / "all", a.folds)
        for f in range(a.folds):
            write_dataset(data, Path(a.dataset) / f"fold_{f}", a.folds, fold=f,
                          presses=a.dataset_presses)
    summary = evaluate(data, a.folds, models)
    write_json(out / "summary.json", summary)
    _plot(summary, out / "contact.png")
    print(json.dumps({k: {m: round(v["mean"], 4) for m, v in s.items()}
                      for k, s in summary.items() if k != "meta"}, indent=1))


if __name__ == "__main__":
    main()
