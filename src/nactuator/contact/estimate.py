"""Detection, link isolation and point/force localisation from an external joint torque.

``tau_ext`` (T, n) is any estimate of the joint torque the environment applies: the
residual of a motor-torque source against the nominal arm's inverse dynamics
(:func:`external_torque`). Detection is a
per-joint threshold calibrated on no-contact frames; isolation is the last (most distal)
joint whose residual crosses it (a force on link k moves no joint beyond k); localisation is a
contact-particle-filter-style search over the sampled surface points of the isolated link (and
the next one: a force through the next joint's axis leaves that joint silent), each fitted by
non-negative least squares on a friction-pyramid basis, ``J_p^T D lam = tau_ext``, lam >= 0.

A :class:`ContactCalibration` (``nactuator contact calibrate``, a JSON file) holds what the
per-frame estimate (:func:`estimate_frame`) needs besides the torque: the thresholds of one
torque model and the tare rule. ``infer --contact`` runs it over recordings
(:func:`episode_residual`, :func:`estimate_frames`), ``live --contact`` one frame per cycle
(:class:`ContactStream`); both are causal, so they agree frame by frame.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from nactuator.atomic import write_json
from nactuator.errors import UserError
from nactuator.model_files import resolve_model_path
from nactuator.platforms import Platform
from nactuator.sim.dynamics import ArmDynamics, ee_force_from_joint_torques

from .surface import LinkSurfaces, load_contact_config

__all__ = ["CALIBRATION_FORMAT", "ContactCalibration", "ContactEstimate", "ContactStream",
           "calibrate_threshold", "check_calibration", "detect", "episode_residual",
           "ContactFilter", "FilterSettings", "estimate_frame",
           "estimate_frames", "estimate_recording", "estimator_settings", "external_torque",
           "filter_frames", "isolate", "localise", "localise_window", "model_sha256",
           "nnls_gram", "nnls_small", "residual_ee_force", "smoothed_velocity", "tare",
           "tare_frames", "tare_offset"]

CALIBRATION_FORMAT = "nactuator-contact-calibration/1"
# Frames at the start of a recording the residual is not trusted on: the model's window
# (L - 1 = 8 zero-padded frames) and the velocity filter are still filling.
EDGE_FRAMES = 10
SMOOTH_FRAMES = 5  # trailing mean of qd before its difference gives qdd


def smoothed_velocity(qd: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Causal ``qd`` (T, n) smoothing and acceleration: each frame's mean of its last
    :data:`SMOOTH_FRAMES` frames (fewer at the start) and the backward difference of that
    (0 on frame 0). Row t depends on rows t - SMOOTH_FRAMES .. t only, so a live stream gets
    the offline rows by running this on its last SMOOTH_FRAMES + 1 frames."""
    qd = np.asarray(qd, np.float64)
    pad = np.zeros((SMOOTH_FRAMES - 1, *qd.shape[1:]))
    window = np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, qd]),
                                                      SMOOTH_FRAMES, axis=0)
    count = np.minimum(np.arange(1, qd.shape[0] + 1), SMOOTH_FRAMES).astype(float)
    qd_s = window.sum(axis=-1) / count.reshape(-1, *([1] * (qd.ndim - 1)))
    qdd = np.zeros_like(qd_s)
    qdd[1:] = (qd_s[1:] - qd_s[:-1]) / dt
    return qd_s, qdd


def external_torque(dyn: ArmDynamics, q: np.ndarray, qd: np.ndarray, tau_motor: np.ndarray,
                    dt: float) -> np.ndarray:
    """tau_ext = ID(q, qd, qdd) - tau_motor per frame (T, n), causal: qd smoothed by a
    trailing 5-frame mean and qdd its backward difference (:func:`smoothed_velocity`), so
    ``live`` computes each frame as ``infer`` does, with no look-ahead."""
    qd_s, qdd = smoothed_velocity(qd, dt)
    with torch.inference_mode():  # no autograd bookkeeping: ~25 % of this call in `live`
        tau_id = dyn.inverse_dynamics(torch.as_tensor(np.asarray(q, np.float64)),
                                      torch.as_tensor(qd_s), torch.as_tensor(qdd)).numpy()
    return tau_id - tau_motor


def residual_ee_force(dyn: ArmDynamics, q: np.ndarray, qd: np.ndarray, tau_motor: np.ndarray,
                      dt: float, damping: np.ndarray | None = None) -> np.ndarray:
    """(T, 3) the end-effector force read from a learned *motor* torque through physics:
    ``tau_ext = ID(q, qd, qdd) + damping * qd - tau_motor`` (:func:`external_torque`, the
    nominal arm, causal velocity filter; ``damping`` (n,) the simulator's viscous joint
    damping, the platform's ``damping``, which the model's torque was trained through and
    the rigid-body ID leaves out; None: 0) projected on the end-effector point by least
    squares over the end effector's chain
    (:func:`nactuator.sim.dynamics.ee_force_from_joint_torques`). Linear in the external
    joint torque: a payload of m held still reads ``-m g`` on z if ``tau_motor`` is the
    motor's share alone (a model trained with ``model.external_torque``; a net-torque
    model's residual is ~0 under a load it reproduces). Not tared: a payload may be held
    from the first frame on. Causal: row t uses frames up to t only, as ``infer``/``live`` can."""
    tau_ext = external_torque(dyn, q, qd, tau_motor, dt)
    if damping is not None:
        tau_ext = tau_ext + np.asarray(damping, np.float64) * smoothed_velocity(qd, dt)[0]
    return ee_force_from_joint_torques(dyn, q, tau_ext, dyn.kin.ee_ancestors)


def tare_frames(dt: float, seconds: float) -> int:
    """Frames of the tare window (0: no tare); the offset is the mean of frames
    :data:`EDGE_FRAMES` .. that count - 1."""
    if seconds <= 0:
        return 0
    stop = int(round(seconds / dt))
    if stop <= EDGE_FRAMES + 1:
        raise UserError(f"tare over {seconds} s needs more than {EDGE_FRAMES + 1} frames "
                        f"({stop} at {dt:.4f} s)")
    return stop


def tare_offset(head: np.ndarray) -> np.ndarray:
    """The tare offset (1, ...) from the residual's first :func:`tare_frames` rows."""
    return head[EDGE_FRAMES:].mean(0, keepdims=True)


def tare(tau_ext: np.ndarray, dt: float, seconds: float) -> np.ndarray:
    """``tau_ext`` (T, ...) minus its mean over the recording's first ``seconds`` (after the
    warm-up's edge frames), as a force sensor is tared: assumes no contact then. Causal: the
    frames of the tare window themselves are NaN (not tared yet), as in a live stream."""
    stop = tare_frames(dt, seconds)
    if stop == 0:
        return tau_ext
    if stop > tau_ext.shape[0]:
        raise UserError(f"tare over {seconds} s needs a recording at least {stop} frames "
                        f"long ({tau_ext.shape[0]} frames at {dt:.4f} s)")
    out = tau_ext - tare_offset(tau_ext[:stop])
    out[:stop] = np.nan
    return out


def episode_residual(dyn: ArmDynamics, q: np.ndarray, qd: np.ndarray, tau_motor: np.ndarray,
                     dt: float, tare_seconds: float) -> np.ndarray:
    """What the detector sees per frame of one recording (T, n): the tared
    :func:`external_torque`, NaN on the first :data:`EDGE_FRAMES` frames (the model's window
    and the velocity filter warming up) and within the tare window. :class:`ContactStream`
    gives the same rows one frame at a time."""
    r = tare(external_torque(dyn, q, qd, tau_motor, dt), dt, tare_seconds)
    r[:EDGE_FRAMES] = np.nan
    return r


def calibrate_threshold(tau_idle: np.ndarray, quantile: float = 0.999,
                        margin: float = 1.2) -> np.ndarray:
    """(n,) per-joint thresholds: ``margin`` x the ``quantile`` of |tau_ext| on no-contact
    frames (T, n), so about 1 - quantile of idle frames cross it on each joint."""
    a = np.abs(np.asarray(tau_idle, float))
    a = a[np.isfinite(a).all(axis=1)]
    if a.shape[0] < 10:
        raise ValueError(f"need at least 10 finite no-contact frames, got {a.shape[0]}")
    return margin * np.quantile(a, quantile, axis=0)


@dataclass
class ContactCalibration:
    """What the per-frame estimate needs besides the torque: written by ``nactuator contact
    calibrate`` from no-contact runs of the user's arm with one torque model."""

    platform: str
    threshold: list[float]  # per contact joint [N m]
    tare_seconds: float  # 0: the raw residual
    model: str  # the torque model the thresholds belong to (as given)
    model_sha256: str
    quantile: float
    margin: float
    frames: int  # no-contact frames calibrated on
    data: list[str]

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(path, {"format": CALIBRATION_FORMAT, **asdict(self)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> ContactCalibration:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"{p}: no contact calibration file (make one with `nactuator "
                            "contact calibrate --ckpt MODEL --data NO_CONTACT_RUNS --out FILE`)")
        try:
            raw = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{p}: not JSON ({e})") from None
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        if got != CALIBRATION_FORMAT:
            raise UserError(f"{p}: field 'format' is {got!r}, expected {CALIBRATION_FORMAT!r}")
        fields = [f for f in cls.__dataclass_fields__]
        missing = [f for f in fields if f not in raw]
        if missing:
            raise UserError(f"{p}: missing field(s) {', '.join(missing)}")
        thr = np.asarray(raw["threshold"], dtype=float)
        if thr.ndim != 1 or thr.size == 0 or not (np.isfinite(thr) & (thr > 0)).all():
            raise UserError(f"{p}: field 'threshold' must be positive numbers, one per joint, "
                            f"got {raw['threshold']!r}")
        tare_s = raw["tare_seconds"]
        if not isinstance(tare_s, int | float) or not np.isfinite(tare_s) or tare_s < 0:
            raise UserError(f"{p}: field 'tare_seconds' must be a number >= 0, got {tare_s!r}")
        return cls(**{f: raw[f] for f in fields})


def detect(tau_ext: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """(T,) bool: a contact on frames where any joint's |tau_ext| crosses its threshold."""
    return (np.abs(tau_ext) > threshold).any(axis=-1)


def isolate(tau_ext: np.ndarray, threshold: np.ndarray) -> int:
    """Index of the last joint whose |tau_ext| (n,) crosses its threshold (-1: none)."""
    hit = np.flatnonzero(np.abs(tau_ext) > threshold)
    return int(hit[-1]) if hit.size else -1


def _pyramids(normals: np.ndarray, mu: float) -> np.ndarray:
    """(P, 3, 4) edges of the friction pyramids of pushes *into* the surfaces with outward
    ``normals`` (P, 3) (along -normal, half-width ``mu``)."""
    nrm = np.asarray(normals, float).reshape(-1, 3)
    ref = np.where((np.abs(nrm[:, :1]) < 0.9), [[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]])
    t1 = np.cross(nrm, ref)
    t1 /= np.linalg.norm(t1, axis=1, keepdims=True)
    t2 = np.cross(nrm, t1)
    return np.stack([-nrm + mu * t1, -nrm - mu * t1, -nrm + mu * t2, -nrm - mu * t2], axis=2)


def _pyramid(normal: np.ndarray, mu: float) -> np.ndarray:
    """(3, 4) edges of the friction pyramid of one push into the surface."""
    return _pyramids(normal, mu)[0]


@dataclass
class ContactEstimate:
    link: int  # index into LinkSurfaces.names (-1: no contact)
    point_local: np.ndarray  # (3,) in the link's body frame
    point_world: np.ndarray  # (3,) base frame
    force: np.ndarray  # (3,) base frame, environment on robot
    fit_residual: float  # |J^T f - tau_ext| [N m]


# The non-empty subsets of a friction pyramid's 4 edges with at most 3 members: the pyramid
# spans 3-D, so any force in it needs at most 3 edges (Caratheodory), and so does the best fit
# (nnls_small). Their least-squares solutions are stacked as 4 singles, 6 pairs x 2 and
# 4 triples x 3 = 28 numbers per point; _SCATTER puts each at its edge in the 14 x 4 grid of
# candidates.
_PAIRS = list(itertools.combinations(range(4), 2))
_TRIPLES = np.array(list(itertools.combinations(range(4), 3)))
_SUBSETS = [(i,) for i in range(4)] + _PAIRS + [tuple(t) for t in _TRIPLES]
_SCATTER = np.zeros((28, len(_SUBSETS), 4))
for _row, (_s, _i) in enumerate((s, i) for s, c in enumerate(_SUBSETS) for i in c):
    _SCATTER[_row, _s, _i] = 1.0
_SCATTER = _SCATTER.reshape(28, -1)
_PAIR_I, _PAIR_J = np.array(_PAIRS).T


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a x b over the last axis of length 3, without np.cross's per-call axis handling
    (which costs more than the arithmetic at the surface search's sizes)."""
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    return np.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)


def _subset_solutions(gram: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """(P, 28) least-squares solutions of every subset of :data:`_SUBSETS` from the normal
    equations (gram (P, 4, 4), rhs (P, 4)), in closed form: 1 x 1, 2 x 2 and 3 x 3 (by the
    adjugate). A singular subset gives inf or NaN, which the caller treats as infeasible."""
    P = gram.shape[0]
    diag = np.diagonal(gram, axis1=1, axis2=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        single = rhs / diag
        a, c, d = diag[:, _PAIR_I], gram[:, _PAIR_I, _PAIR_J], diag[:, _PAIR_J]
        ri, rj = rhs[:, _PAIR_I], rhs[:, _PAIR_J]
        det = a * d - c * c
        pair = np.stack([(d * ri - c * rj) / det, (a * rj - c * ri) / det], axis=-1)
        m = gram[:, _TRIPLES[:, :, None], _TRIPLES[:, None, :]]  # (P, 4, 3, 3)
        r0, r1, r2 = m[..., 0, :], m[..., 1, :], m[..., 2, :]
        c0, c1, c2 = _cross(r1, r2), _cross(r2, r0), _cross(r0, r1)
        v = rhs[:, _TRIPLES]
        triple = ((c0 * v[..., :1] + c1 * v[..., 1:2] + c2 * v[..., 2:])
                  / (r0 * c0).sum(-1, keepdims=True))
    return np.concatenate([single, pair.reshape(P, -1), triple.reshape(P, -1)], axis=1)


def nnls_small(A: np.ndarray, b: np.ndarray, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min ||A x - b||, x >= 0, exactly, for a batch of pyramid fits: A (P, m, 4) = J^T D,
    b (m,), D (P, 3, 4) the pyramid edges. Returns x (P, 4) and the residual norms (P,).

    An active-set enumeration instead of P calls of ``scipy.optimize.nnls``: an optimum
    exists whose non-zero entries are linearly independent columns of A (at most 3, since
    A = J^T D has rank <= 3), and on those columns it is their least-squares solution. So
    the best feasible least-squares fit over the 14 subsets of at most 3 edges (and x = 0) is
    the optimum. Where several fit equally well (fewer joint equations than force axes), the
    one with the smallest force ||D x|| is kept: the minimum-effort prior :func:`localise`
    also applies across points."""
    b = np.asarray(b, float)
    P = A.shape[0]
    At = np.swapaxes(A, 1, 2)
    sol = _subset_solutions(At @ A, At @ b)  # (P, 28)
    scale = max(float(np.linalg.norm(b)), 1e-12)
    bad = ~(np.isfinite(sol) & (sol >= -1e-9 * scale))  # negative, or a singular subset
    x = np.zeros((P, len(_SUBSETS) + 1, 4))  # candidate 0: x = 0
    x[:, 1:] = (np.where(bad, 0.0, np.maximum(sol, 0.0)) @ _SCATTER).reshape(P, -1, 4)
    infeasible = (bad @ _SCATTER).reshape(P, -1, 4).any(-1)
    fit = x @ At - b  # (P, 15, m)
    res = np.sqrt(np.einsum("psm,psm->ps", fit, fit))
    res[:, 1:][infeasible] = np.inf
    push = x @ np.swapaxes(D, 1, 2)  # (P, 15, 3)
    force = np.sqrt(np.einsum("psi,psi->ps", push, push))
    tied = res <= res.min(1, keepdims=True) + 1e-6 * scale
    pick = np.argmin(np.where(tied, force, np.inf), axis=1)
    rows = np.arange(P)
    return x[rows, pick], res[rows, pick]


def localise(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray, joint: int,
             mu: float, tie_tolerance: float = 0.005) -> ContactEstimate:
    """The surface point and force that best explain ``tau_ext`` (n,) at ``q``.

    Candidate links: those moved last by ``joint`` (the isolated joint) or by the next one.
    Every sampled point of the candidate links is fitted in one batch (:func:`nnls_small`).
    """
    links = [k for k, j in enumerate(surfaces.last_joint) if joint <= j <= joint + 1]
    if not links:  # the isolated joint is proximal to every contact link: try the first
        links = [0]
    tau_ext = np.asarray(tau_ext, float)
    tol = tie_tolerance * max(float(np.linalg.norm(tau_ext)), 1e-12)
    # Every candidate link's points in one batch (one call instead of one per link).
    frames = surfaces.kinematics(q)
    pts, nrm, _ = zip(*(surfaces.world_points(q, k, data=frames) for k in links), strict=True)
    jac = [surfaces.point_jacobians(frames, k, p) for k, p in zip(links, pts, strict=True)]
    D = _pyramids(np.concatenate(nrm), mu)  # (P, 3, 4)
    lam, res = nnls_small(np.swapaxes(np.concatenate(jac), 1, 2) @ D, tau_ext, D)
    force = (D @ lam[..., None])[..., 0]
    best: ContactEstimate | None = None
    start = 0
    for k, p in zip(links, pts, strict=True):  # proximal first: the next link only if this
        at = slice(start, start + len(p))       # one cannot explain tau_ext
        start = at.stop
        # Fewer joints than unknowns (3 force axes + 2 surface coordinates) leave many points
        # that explain tau_ext equally well: of those, the smallest force (a minimum-effort
        # prior).
        near = res[at] <= res[at].min() + tol
        i = int(np.argmin(np.where(near, np.linalg.norm(force[at], axis=1), np.inf)))
        pick = ContactEstimate(k, surfaces.points[k][i].copy(), p[i].copy(),
                               force[at][i].copy(), float(res[at][i]))
        if best is None or pick.fit_residual < best.fit_residual - tol:
            best = pick
        if best.fit_residual <= tol:
            break
    return best


def estimate_frame(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray,
                   threshold: np.ndarray, mu: float) -> ContactEstimate:
    """One frame: detection, isolation and localisation of ``tau_ext`` (n,) at ``q`` (the
    joints beyond the thresholds' are ignored). No contact (or a non-finite residual, e.g.
    a warm-up frame): link -1, NaN point and force."""
    threshold = np.asarray(threshold, float)
    n_thr = threshold.size
    tau = np.zeros(np.shape(q)[0])
    tau[:n_thr] = np.nan_to_num(np.asarray(tau_ext, float)[:n_thr], nan=0.0)
    if not detect(tau[:n_thr], threshold):
        nan = np.full(3, np.nan)
        return ContactEstimate(-1, nan, nan.copy(), nan.copy(), float("nan"))
    return localise(surfaces, np.asarray(q, float), tau, isolate(tau[:n_thr], threshold), mu)


def estimate_frames(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray,
                    threshold: np.ndarray, mu: float) -> dict[str, np.ndarray]:
    """:func:`estimate_frame` on every frame of ``tau_ext`` (T, n) at ``q`` (T, nq).

    Returns ``link`` (T,) int (index into ``surfaces.names``; -1 no contact),
    ``point_local`` (T, 3) in that link's body frame, ``point`` (T, 3) in the base frame and
    ``force`` (T, 3) [N] in the base frame, environment on robot (NaN where no contact).
    """
    threshold = np.asarray(threshold, float)
    T = tau_ext.shape[0]
    out = {"link": np.full(T, -1, dtype=np.int64), "point_local": np.full((T, 3), np.nan),
           "point": np.full((T, 3), np.nan), "force": np.full((T, 3), np.nan)}
    # Only the flagged frames can be contacts (estimate_frame says -1 for the others).
    flagged = detect(np.nan_to_num(tau_ext[:, :threshold.size], nan=0.0), threshold)
    for t in np.flatnonzero(flagged):
        est = estimate_frame(surfaces, q[t], tau_ext[t], threshold, mu)
        out["link"][t] = est.link
        out["point_local"][t] = est.point_local
        out["point"][t] = est.point_world
        out["force"][t] = est.force
    return out



# --- Multi-posture estimate: a contact particle filter over the surface samples -----------

def nnls_gram(gram: np.ndarray, rhs: np.ndarray, bb: float, D: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nnls_small` from accumulated normal equations: min ||A x - b||^2 over x >= 0
    where only ``gram`` = A^T A (P, 4, 4), ``rhs`` = A^T b (P, 4) and ``bb`` = b.b are kept
    (stacked frames: sums of each frame's). Returns x (P, 4) and the squared residuals (P,).
    Ties (within 1e-9 of the best) go to the smallest force ||D x||."""
    P = gram.shape[0]
    sol = _subset_solutions(gram, rhs)
    scale = max(float(np.sqrt(bb)), 1e-12)
    bad = ~(np.isfinite(sol) & (sol >= -1e-9 * scale))
    x = np.zeros((P, len(_SUBSETS) + 1, 4))
    x[:, 1:] = (np.where(bad, 0.0, np.maximum(sol, 0.0)) @ _SCATTER).reshape(P, -1, 4)
    infeasible = (bad.astype(float) @ _SCATTER).reshape(P, -1, 4).any(-1)
    quad = ((x @ gram) * x).sum(-1) - 2 * np.einsum("psi,pi->ps", x, rhs)
    res2 = np.maximum(quad + bb, 0.0)
    res2[:, 1:][infeasible] = np.inf
    push = x @ np.swapaxes(D, 1, 2)
    force = np.sqrt(np.einsum("psi,psi->ps", push, push))
    tied = res2 <= res2.min(1, keepdims=True) + 1e-9 * bb
    pick = np.argmin(np.where(tied, force, np.inf), axis=1)
    rows = np.arange(P)
    return x[rows, pick], res2[rows, pick]


@dataclass
class FilterSettings:
    """``conf/contact/<platform>.yaml`` key ``filter`` (docs/contact.md, "The estimator"
    step 5; the values measured in docs/results.md "Presses while the arm moves")."""

    tie_tolerance: float = 0.005  # near-best fits (relative to the residual's norm) tie
    release_frames: int = 3  # unflagged frames in a row that end a contact (reset)
    forget: float = 1.0  # per-frame decay of the particles' accumulated fit (1: none)
    link_tolerance: float = 0.0  # a more distal link must fit better by this x |threshold|
    whiten: bool = False  # weigh each joint's equation by 1 / its threshold
    beyond: int = 1  # links tried: moved by the isolated joint or the next `beyond` joints
    change_ratio: float = 0.0  # |tau_ext| changed by more than this over change_frames: the
    change_frames: int = 5     # push changed size (a ramp): restart the fit (0: never)

    @classmethod
    def from_config(cls, cfg: dict) -> FilterSettings:
        raw = dict(cfg.get("filter") or {})
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise UserError(f"contact config: unknown filter key(s) {sorted(unknown)}")
        return cls(**raw)


def _candidates(surfaces: LinkSurfaces, joint: int, beyond: int = 1) -> list[int]:
    """The links tried for isolated ``joint``: those moved last by it or by the ``beyond``
    next joints (1: :func:`localise`'s; the first link where none is)."""
    links = [k for k, j in enumerate(surfaces.last_joint) if joint <= j <= joint + beyond]
    return links or [0]


def _pick(surfaces: LinkSurfaces, cost: np.ndarray, effort: np.ndarray, stats: tuple,
          tie_tolerance: float, links: list[int], link_margin: float = 0.0
          ) -> tuple[int, int]:
    """(link, sample) of the best accumulated fit ``cost`` (P,, squared) on ``links``
    (:func:`_candidates`): proximal first, a more distal link only where it fits better by
    more than the tolerance; within a link, of the samples within the tolerance of its best,
    the smallest force ``effort`` (the minimum-effort prior of :func:`localise`). A more
    distal link must also beat the proximal one by ``link_margin`` [N m per frame] (the
    residual's noise: a distal link has more joints to fit it with).

    ``stats`` = (b.b, the sum of the frames' tau_ext, their count; decayed alike). The fits
    are compared as :func:`localise` compares one frame's: the cost less what no force at
    one posture explains (the frames' scatter about their mean, or the best candidate's
    cost where lower), per frame, against the tolerance x |mean tau_ext|; at one posture
    this is :func:`localise` on the mean residual."""
    bb, total, count = stats
    mean = total / count
    starts = np.cumsum([0] + [len(p) for p in surfaces.points])
    # The scatter about the mean is the floor at one posture; moving, the best fit can be
    # lower (the scatter is then signal), and the best candidate sets it.
    best_cost = min(float(cost[starts[k]:starts[k + 1]].min()) for k in links)
    floor = min(bb - count * float(mean @ mean), best_cost)
    tol = tie_tolerance * max(float(np.linalg.norm(mean)), 1e-12)
    fit = np.sqrt(np.maximum(cost - floor, 0.0) / count)
    best: tuple[int, int, float] | None = None
    for k in links:
        at = slice(int(starts[k]), int(starts[k + 1]))
        near = fit[at] <= fit[at].min() + tol
        i = int(np.argmin(np.where(near, effort[at], np.inf)))
        if best is None or fit[at][i] < best[2] - tol - link_margin:
            best = (k, i, float(fit[at][i]))
    return best[0], best[1]


def _no_contact() -> ContactEstimate:
    nan = np.full(3, np.nan)
    return ContactEstimate(-1, nan, nan.copy(), nan.copy(), float("nan"))


class ContactFilter:
    """Causal multi-posture contact estimate: a contact particle filter (Manuelli & Tedrake
    2016) whose particles are every surface sample of every contact link, with one force
    per contact, constant in the base frame and inside the friction pyramid of the
    contact's first frame's pose.

    Each flagged frame adds, for every particle, that frame's equations ``J_p(q)^T D lam =
    tau_ext`` to the particle's normal equations (a 4 x 4 Gram matrix, its right-hand side
    and b.b); the particle's cost (2 sigma^2 times minus its log-weight, for a residual
    noise sigma equal on every joint) is the NNLS residual of all its frames so far
    (:func:`nnls_gram`). So the arm's postures during one contact add equations for the
    shared point and force, which one frame of a 5-DoF arm cannot give (docs/contact.md
    "Identifiability"). A contact ends (reset) after ``release_frames`` unflagged frames;
    ``forget`` < 1 decays old frames; the fit restarts (the point search only: isolation
    and the pyramids stay the contact's) when ``|tau_ext|`` changes by more than
    ``change_ratio`` over ``change_frames`` frames, as while a push ramps up. The
    estimate: the links of :func:`localise` for the joint isolated on the contact's mean
    residual, the particle of :func:`_pick` on them,
    and the force of this frame's NNLS at that particle. With a particle on every sample
    (about 0.8 cm apart at 240 per link) the filter needs no resampling or diffusion: it is
    deterministic and equals the batch fit of one point over the contact's frames
    (:func:`localise_window`)."""

    def __init__(self, surfaces: LinkSurfaces, threshold: np.ndarray, mu: float,
                 settings: FilterSettings | None = None) -> None:
        self.surfaces, self.mu = surfaces, float(mu)
        self.threshold = np.asarray(threshold, float)
        self.settings = settings or FilterSettings()
        self.sizes = np.cumsum([0] + [len(p) for p in surfaces.points])
        self.link_margin = self.settings.link_tolerance * float(np.linalg.norm(self.threshold))
        self.weight = (1.0 / self.threshold if self.settings.whiten
                       else np.ones(self.threshold.size))
        if self.settings.whiten:  # fits compared in units of the thresholds
            self.link_margin = self.settings.link_tolerance * np.sqrt(self.threshold.size)
        self.reset()

    def reset(self) -> None:
        """Forget the contact (no particle statistics)."""
        self.D: np.ndarray | None = None
        self.gram = self.rhs = None
        self.bb = 0.0
        self.tau_sum = np.zeros(self.threshold.size)
        self.count = 0.0  # frames, decayed as the fit
        self.norms: list[float] = []  # |tau_ext| of the contact's recent frames
        self.contact_sum = np.zeros(self.threshold.size)  # the whole contact's residual
        self.contact_frames = 0
        self.frames = 0
        self.quiet = 0

    def _restart(self) -> None:
        """Drop the accumulated fit (the push changed size), keep the contact going."""
        self.gram = self.rhs = None
        self.bb, self.count, self.frames = 0.0, 0.0, 0
        self.tau_sum = np.zeros(self.threshold.size)

    def _equations(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, m, 4) every particle's J^T D at q, and the world points (P, 3)."""
        m = self.threshold.size
        frames = self.surfaces.kinematics(np.asarray(q, float))
        K = len(self.surfaces.names)
        pts, nrm, _ = zip(*(self.surfaces.world_points(q, k, data=frames) for k in range(K)),
                          strict=True)
        if self.D is None:  # the contact's first frame fixes the friction pyramids
            self.D = _pyramids(np.concatenate(nrm), self.mu)
        jac = np.concatenate([self.surfaces.point_jacobians(frames, k, p)
                              for k, p in enumerate(pts)])[:, :, :m]
        return (np.swapaxes(jac, 1, 2) * self.weight[:, None]) @ self.D, np.concatenate(pts)

    def update(self, q: np.ndarray, tau_ext: np.ndarray) -> ContactEstimate:
        """Push one frame (``tau_ext`` (>= m,); NaN, e.g. a warm-up frame, counts as 0)."""
        m = self.threshold.size
        tau = np.nan_to_num(np.asarray(tau_ext, float)[:m], nan=0.0)
        if not detect(tau, self.threshold):
            self.quiet += 1
            if self.quiet >= self.settings.release_frames:
                self.reset()
            return _no_contact()
        self.quiet = 0
        n = float(np.linalg.norm(tau))
        self.norms = [*self.norms[-(self.settings.change_frames - 1):], n] \
            if self.settings.change_frames > 1 else [n]
        ratio = self.settings.change_ratio
        if (ratio > 0 and self.frames and len(self.norms) == self.settings.change_frames
                and abs(n - self.norms[0]) > ratio * self.norms[0]):
            self._restart()
        A, pts = self._equations(q)
        b = tau * self.weight
        self.contact_sum += b
        self.contact_frames += 1
        At = np.swapaxes(A, 1, 2)
        g = self.settings.forget if self.frames else 0.0
        self.gram = At @ A + (g * self.gram if self.frames else 0.0)
        self.rhs = At @ b + (g * self.rhs if self.frames else 0.0)
        self.bb = float(b @ b) + g * self.bb
        self.tau_sum = b + g * self.tau_sum
        self.count = 1.0 + g * self.count
        self.frames += 1
        lam, cost = nnls_gram(self.gram, self.rhs, self.bb, self.D)
        force = (self.D @ lam[..., None])[..., 0]
        # Isolation on the whole contact's mean residual (restarts of the fit aside): the
        # residual's noise of a moving arm (friction) averages out over the contact.
        links = _candidates(self.surfaces, isolate(self.contact_sum / self.contact_frames,
                                                   self.threshold * self.weight),
                            self.settings.beyond)
        k, i = _pick(self.surfaces, cost, np.linalg.norm(force, axis=1),
                     (self.bb, self.tau_sum, self.count), self.settings.tie_tolerance, links,
                     self.link_margin)
        return self._estimate(k, i, A, pts, b)

    def _estimate(self, k: int, i: int, A: np.ndarray, pts: np.ndarray, b: np.ndarray
                  ) -> ContactEstimate:
        """Particle (k, i)'s point, and this frame's own NNLS force there (a push may vary
        in size during the contact; the point does not)."""
        j = int(self.sizes[k]) + i
        lam, _ = nnls_small(A[j:j + 1], b, self.D[j:j + 1])
        fit = (A[j] @ lam[0] - b) / self.weight
        return ContactEstimate(k, self.surfaces.points[k][i].copy(), pts[j].copy(),
                               (self.D[j] @ lam[0]).copy(), float(np.linalg.norm(fit)))


def localise_window(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray,
                    threshold: np.ndarray, mu: float, settings: FilterSettings | None = None
                    ) -> ContactEstimate:
    """The batch form of :class:`ContactFilter` on one contact's window: the frames of
    ``q`` (T, nq), ``tau_ext`` (T, >= m) that cross ``threshold`` stacked into one NNLS per
    surface sample (one shared point and force). Equals the filter's estimate after those
    frames when neither a ``release_frames`` gap nor a ``change_ratio`` restart falls inside
    the window (tests/test_contact.py)."""
    filt = ContactFilter(surfaces, threshold, mu, settings)
    m = filt.threshold.size
    tau = np.nan_to_num(np.asarray(tau_ext, float)[:, :m], nan=0.0)
    on = np.flatnonzero(detect(tau, filt.threshold))
    if not on.size:
        return _no_contact()
    eqs = [filt._equations(q[t]) for t in on]
    A = np.concatenate([e[0] for e in eqs], axis=1)  # (P, m T, 4): every frame stacked
    b = (tau[on] * filt.weight).reshape(-1)
    decay = filt.settings.forget ** np.arange(on.size)[::-1]
    if filt.settings.forget != 1.0:
        w = np.repeat(np.sqrt(decay), m)
        A, b = A * w[:, None], b * w
    lam, res = nnls_small(A, b, filt.D)
    force = (filt.D @ lam[..., None])[..., 0]
    total, count = (decay[:, None] * tau[on] * filt.weight).sum(0), float(decay.sum())
    k, i = _pick(surfaces, res ** 2, np.linalg.norm(force, axis=1),
                 (float(b @ b), total, count), filt.settings.tie_tolerance,
                 _candidates(surfaces, isolate(tau[on].mean(0) * filt.weight,
                                               filt.threshold * filt.weight),
                             filt.settings.beyond),
                 filt.link_margin)
    A_last, pts = eqs[-1]
    return filt._estimate(k, i, A_last, pts, tau[on[-1]] * filt.weight)


def filter_frames(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray,
                  threshold: np.ndarray, mu: float, settings: FilterSettings | None = None
                  ) -> dict[str, np.ndarray]:
    """:class:`ContactFilter` over the frames of one recording (``tau_ext`` (T, n) at ``q``
    (T, nq)), frame by frame: what ``live --contact`` reports at each frame. Same keys as
    :func:`estimate_frames`."""
    T = tau_ext.shape[0]
    out = {"link": np.full(T, -1, dtype=np.int64), "point_local": np.full((T, 3), np.nan),
           "point": np.full((T, 3), np.nan), "force": np.full((T, 3), np.nan)}
    filt = ContactFilter(surfaces, threshold, mu, settings)
    for t in range(T):
        est = filt.update(q[t], tau_ext[t])
        out["link"][t] = est.link
        out["point_local"][t] = est.point_local
        out["point"][t] = est.point_world
        out["force"][t] = est.force
    return out


def estimator_settings(cfg: dict) -> FilterSettings | None:
    """The contact config's estimator: :class:`FilterSettings` for ``estimator: filter``
    (the default), None for ``frame`` (each frame alone, :func:`estimate_frame`)."""
    kind = cfg.get("estimator", "filter")
    if kind not in ("filter", "frame"):
        raise UserError(f"contact config: estimator {kind!r}: one of filter, frame")
    return FilterSettings.from_config(cfg) if kind == "filter" else None


def estimate_recording(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray,
                       threshold: np.ndarray, mu: float, settings: FilterSettings | None
                       ) -> dict[str, np.ndarray]:
    """Per frame of one recording with the configured estimator (:func:`estimator_settings`):
    :func:`filter_frames` or, with None, :func:`estimate_frames`."""
    if settings is None:
        return estimate_frames(surfaces, q, tau_ext, threshold, mu)
    return filter_frames(surfaces, q, tau_ext, threshold, mu, settings)


def model_sha256(path: str | os.PathLike) -> str:
    """The model file's SHA-256: which torque model a calibration's thresholds belong to."""
    h = hashlib.sha256()
    with open(resolve_model_path(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_platform(path: str | os.PathLike, calib: ContactCalibration,
                   platform: Platform) -> None:
    """The calibration's platform is the model's (before its contact links are built)."""
    if calib.platform != platform.name:
        raise UserError(f"{path}: field 'platform' is {calib.platform!r}, the model is for "
                        f"{platform.name!r}; calibrate with this model "
                        "(nactuator contact calibrate)")


def check_calibration(path: str | os.PathLike, calib: ContactCalibration, platform: Platform,
                      model: str | os.PathLike, surfaces: LinkSurfaces) -> ContactCalibration:
    """``calib`` (read from ``path``) belongs to ``model`` on ``platform``; a
    :class:`UserError` naming the file and the field otherwise (``infer --contact`` and
    ``live --contact``)."""
    check_platform(path, calib, platform)
    sha = model_sha256(model)
    if sha != calib.model_sha256:
        raise UserError(f"{path}: field 'model_sha256': thresholds of model {calib.model} "
                        f"(SHA-256 {calib.model_sha256[:12]}), not of {model} ({sha[:12]}); "
                        "calibrate again with this model (nactuator contact calibrate)")
    need = int(surfaces.last_joint.max()) + 1
    if len(calib.threshold) != need:
        raise UserError(f"{path}: field 'threshold' has {len(calib.threshold)} values, the "
                        f"contact links of {platform.name} need {need}")
    return calib


class ContactStream:
    """The per-frame contact estimate of a live stream: :meth:`push` each frame's measured
    (input-filtered) ``q``, ``qd`` and the model's causal ``tau``; get that frame's
    :class:`ContactEstimate`. Frame t's estimate is :func:`estimate_frame` of row t of
    :func:`episode_residual` over the frames pushed so far (what ``infer --contact``
    computes for the recording): the residual runs :func:`external_torque` on the last
    :data:`SMOOTH_FRAMES` + 1 frames, the tare offset is :func:`tare_offset` of the first
    :func:`tare_frames` rows. Assumes one frame per control period (``platform.control_dt``),
    as ``infer`` does for a recording."""

    def __init__(self, platform: Platform, calibration: ContactCalibration,
                 surfaces: LinkSurfaces, mu: float, settings: FilterSettings | None = None
                 ) -> None:
        self.platform, self.surfaces, self.mu = platform, surfaces, float(mu)
        self.threshold = np.asarray(calibration.threshold, float)
        # settings: the contact filter over frames (estimator: filter); None: each frame alone
        self.filter = (None if settings is None
                       else ContactFilter(surfaces, self.threshold, self.mu, settings))
        self.dyn = ArmDynamics.for_platform(platform)
        self.dt = platform.control_dt
        self.stop = tare_frames(self.dt, calibration.tare_seconds)
        self.count = 0
        self._recent: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._head: list[np.ndarray] = []  # raw residual rows of the tare window
        self.offset: np.ndarray | None = None if self.stop else np.zeros((1, platform.n))

    @classmethod
    def open(cls, path: str | os.PathLike, platform: Platform, model: str | os.PathLike,
             estimator: str | None = None) -> ContactStream:
        """The stream of calibration file ``path``, checked against ``model``/``platform``;
        ``estimator`` (``frame`` / ``filter``) overrides the contact config's."""
        calib = ContactCalibration.load(path)
        check_platform(path, calib, platform)  # before the platform's contact config is read
        cfg = load_contact_config(platform)
        if estimator is not None:
            cfg = {**cfg, "estimator": estimator}
        surfaces = LinkSurfaces.build(platform, cfg)
        check_calibration(path, calib, platform, model, surfaces)
        return cls(platform, calib, surfaces, float(cfg["friction"]), estimator_settings(cfg))

    def residual(self, q: np.ndarray, qd: np.ndarray, tau: np.ndarray) -> np.ndarray:
        """This frame's row of :func:`episode_residual` (n,)."""
        self._recent.append((np.asarray(q), np.asarray(qd), np.asarray(tau)))
        del self._recent[: -(SMOOTH_FRAMES + 1)]
        q_w, qd_w, tau_w = (np.stack(x) for x in zip(*self._recent, strict=True))
        raw = external_torque(self.dyn, q_w, qd_w, tau_w, self.dt)[-1:]
        t, self.count = self.count, self.count + 1
        if self.offset is None:  # still in the tare window
            self._head.append(raw[0])
            if len(self._head) == self.stop:
                self.offset = tare_offset(np.stack(self._head))
                self._head = []
            return np.full(raw.shape[1], np.nan)
        if t < EDGE_FRAMES:
            return np.full(raw.shape[1], np.nan)
        return (raw - self.offset)[0]

    def push(self, q: np.ndarray, qd: np.ndarray, tau: np.ndarray) -> ContactEstimate:
        r = self.residual(q, qd, tau)
        if self.filter is not None:
            return self.filter.update(np.asarray(q, float), r)
        return estimate_frame(self.surfaces, np.asarray(q, float), r, self.threshold, self.mu)
