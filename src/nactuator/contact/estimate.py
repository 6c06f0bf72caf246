"""Detection, link isolation and point/force localisation from an external joint torque.

``tau_ext`` (T, n) is any estimate of the joint torque the environment applies
(the residual of a torque model against inverse dynamics, :mod:`.residual`). Detection is a
per-joint threshold calibrated on no-contact frames; isolation is the last (most distal)
joint whose residual crosses it (a force on link k moves no joint beyond k); localisation is a
contact-particle-filter-style search over the sampled surface points of the isolated link (and
the next one: a force through the next joint's axis leaves that joint silent), each fitted by
non-negative least squares on a friction-pyramid basis, ``J_p^T D lam = tau_ext``, lam >= 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from .surface import LinkSurfaces

__all__ = ["ContactEstimate", "calibrate_threshold", "detect", "isolate", "localise"]


def calibrate_threshold(tau_idle: np.ndarray, quantile: float = 0.999,
                        margin: float = 1.2) -> np.ndarray:
    """(n,) per-joint thresholds: ``margin`` x the ``quantile`` of |tau_ext| on no-contact
    frames (T, n), so about 1 - quantile of idle frames cross it on each joint."""
    a = np.abs(np.asarray(tau_idle, float))
    a = a[np.isfinite(a).all(axis=1)]
    if a.shape[0] < 10:
        raise ValueError(f"need at least 10 finite no-contact frames, got {a.shape[0]}")
    return margin * np.quantile(a, quantile, axis=0)


def detect(tau_ext: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """(T,) bool: a contact on frames where any joint's |tau_ext| crosses its threshold."""
    return (np.abs(tau_ext) > threshold).any(axis=-1)


def isolate(tau_ext: np.ndarray, threshold: np.ndarray) -> int:
    """Index of the last joint whose |tau_ext| (n,) crosses its threshold (-1: none)."""
    hit = np.flatnonzero(np.abs(tau_ext) > threshold)
    return int(hit[-1]) if hit.size else -1


def _pyramid(normal: np.ndarray, mu: float) -> np.ndarray:
    """(3, 4) edges of the friction pyramid of a push *into* the surface (along -normal)."""
    t1 = np.cross(normal, [1.0, 0.0, 0.0] if abs(normal[0]) < 0.9 else [0.0, 1.0, 0.0])
    t1 /= np.linalg.norm(t1)
    t2 = np.cross(normal, t1)
    return np.stack([-normal + mu * t1, -normal - mu * t1, -normal + mu * t2,
                     -normal - mu * t2], axis=1)


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
        for i in range(pts.shape[0]):
            J = surfaces.point_jacobian(d, k, pts[i])
            D = _pyramid(nrm[i], mu)
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
