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
per-frame estimate (:func:`estimate_frames`, ``infer --contact``) needs besides the torque:
the thresholds of one torque model and the tare rule.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import nnls

from nactuator.atomic import write_json
from nactuator.errors import UserError
from nactuator.sim.dynamics import ArmDynamics

from .surface import LinkSurfaces

__all__ = ["CALIBRATION_FORMAT", "ContactCalibration", "ContactEstimate", "calibrate_threshold",
           "detect", "estimate_frames", "external_torque", "isolate", "localise", "tare"]

CALIBRATION_FORMAT = "nactuator-contact-calibration/1"
EDGE_FRAMES = 10  # frames at each end of a recording the centred qdd filter cannot trust


def external_torque(dyn: ArmDynamics, q: np.ndarray, qd: np.ndarray, tau_motor: np.ndarray,
                    dt: float) -> np.ndarray:
    """tau_ext = ID(q, qd, qdd) - tau_motor per frame (T, n); qd smoothed by a centred
    5-frame mean and qdd its gradient (2 frames of look-ahead: an offline estimate)."""
    k = np.ones(5) / 5
    qd_s = np.apply_along_axis(lambda x: np.convolve(x, k, mode="same"), 0, qd)
    qdd = np.gradient(qd_s, dt, axis=0)
    with torch.no_grad():
        tau_id = dyn.inverse_dynamics(torch.as_tensor(q, dtype=torch.float64),
                                      torch.as_tensor(qd_s, dtype=torch.float64),
                                      torch.as_tensor(qdd, dtype=torch.float64)).numpy()
    return tau_id - tau_motor


def tare(tau_ext: np.ndarray, dt: float, seconds: float) -> np.ndarray:
    """``tau_ext`` (T, ...) minus its mean over the recording's first ``seconds`` (after the
    filter's edge frames), as a force sensor is tared: assumes no contact then."""
    if seconds <= 0:
        return tau_ext
    stop = int(round(seconds / dt))
    if stop <= EDGE_FRAMES + 1 or stop > tau_ext.shape[0]:
        raise UserError(f"tare over {seconds} s needs more than {EDGE_FRAMES + 1} frames and "
                        f"a recording at least that long ({tau_ext.shape[0]} frames at "
                        f"{dt:.4f} s)")
    return tau_ext - tau_ext[EDGE_FRAMES:stop].mean(0, keepdims=True)


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


def localise(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray, joint: int,
             mu: float, tie_tolerance: float = 0.005) -> ContactEstimate:
    """The surface point and force that best explain ``tau_ext`` (n,) at ``q``.

    Candidate links: those moved last by ``joint`` (the isolated joint) or by the next one.
    """
    links = [k for k, j in enumerate(surfaces.last_joint) if joint <= j <= joint + 1]
    if not links:  # the isolated joint is proximal to every contact link: try the first
        links = [0]
    tol = tie_tolerance * max(float(np.linalg.norm(tau_ext)), 1e-12)
    best: ContactEstimate | None = None
    for k in links:  # proximal first: the next link only if this one cannot explain tau_ext
        fits = []
        pts, nrm, d = surfaces.world_points(q, k)
        pyramids = _pyramids(nrm, mu)
        for i in range(pts.shape[0]):
            J = surfaces.point_jacobian(d, k, pts[i])
            D = pyramids[i]
            lam, res = nnls(J.T @ D, tau_ext, maxiter=50)
            fits.append(ContactEstimate(k, surfaces.points[k][i].copy(), pts[i].copy(),
                                        D @ lam, float(res)))
        # Fewer joints than unknowns (3 force axes + 2 surface coordinates) leave many points
        # that explain tau_ext equally well: of those, the smallest force (a minimum-effort
        # prior).
        low = min(f.fit_residual for f in fits)
        near = [f for f in fits if f.fit_residual <= low + tol]
        pick = min(near, key=lambda f: float(np.linalg.norm(f.force)))
        if best is None or pick.fit_residual < best.fit_residual - tol:
            best = pick
        if best.fit_residual <= tol:
            break
    return best


def estimate_frames(surfaces: LinkSurfaces, q: np.ndarray, tau_ext: np.ndarray,
                    threshold: np.ndarray, mu: float) -> dict[str, np.ndarray]:
    """Per frame: detection, isolation and localisation of ``tau_ext`` (T, n) at ``q``.

    Returns ``link`` (T,) int (index into ``surfaces.names``; -1 no contact),
    ``point_local`` (T, 3) in that link's body frame, ``point`` (T, 3) in the base frame and
    ``force`` (T, 3) [N] in the base frame, environment on robot (NaN where no contact).
    Frames with a non-finite residual (a filter's edge) are reported as no contact.
    """
    threshold = np.asarray(threshold, float)
    T = tau_ext.shape[0]
    out = {"link": np.full(T, -1, dtype=np.int64), "point_local": np.full((T, 3), np.nan),
           "point": np.full((T, 3), np.nan), "force": np.full((T, 3), np.nan)}
    n_thr = threshold.size
    for t in np.flatnonzero(detect(np.nan_to_num(tau_ext[:, :n_thr], nan=0.0), threshold)):
        tau = np.zeros(q.shape[1])
        tau[:n_thr] = tau_ext[t, :n_thr]
        est = localise(surfaces, q[t], tau, isolate(tau[:n_thr], threshold), mu)
        out["link"][t] = est.link
        out["point_local"][t] = est.point_local
        out["point"][t] = est.point_world
        out["force"][t] = est.force
    return out
