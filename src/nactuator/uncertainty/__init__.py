"""Calibrated force intervals (issue 18 item 3): pure functions, no room above them.

Three pieces, each a plain function of arrays or tensors:

- :func:`beta_nll`: the β-NLL loss (Seitzer et al., ICLR 2022) a heteroscedastic head is
  trained with: the Gaussian NLL of every element weighted by ``stop_grad(σ²)^β``, so the
  mean is not neglected where the predicted variance is large (β = 0: the plain NLL;
  β = 1: the mean's gradient is that of the squared error).
- :func:`conformal_scale`: split-conformal recalibration **by episode**. Frames of a time
  series are not exchangeable, episodes are: each calibration episode's normalised scores
  ``|f − f̂| / σ`` give its miscoverage curve ``L_e(s) = mean(score > s)``, and the scale is
  the smallest ``s`` whose mean over episodes (each episode one unit, as in conformal risk
  control, Angelopoulos et al. 2024) meets the nominal level. With ``n`` calibration
  episodes the finite-sample guarantee needs ``(n / (n + 1)) mean L + 1 / (n + 1) ≤ α``,
  which exists only for ``n ≥ 1/α − 1`` (9 episodes at 90 %); with fewer the plain
  empirical mean is used and the result says ``guarantee: False``.
- :func:`gate_scales`: the same calibration done apart for the frames the model's own
  contact gate calls contact and for the rest (Mondrian conformal prediction, Vovk et al.
  2005: a guarantee per group). One scale for all frames leaves the interval too narrow in
  contact and too wide out of it when σ does not grow enough in contact; the gate is known
  at run time, so the interval can pick its scale by it.
- :func:`coverage_metrics`: empirical coverage, mean width, and the same split by any
  boolean frame masks (contact / no contact, seen / unseen task).

The interval of one force axis is ``f̂ ± s·σ``; an uncalibrated model uses the Gaussian
``s = z_0.95 = 1.645`` (:data:`GAUSSIAN_Z90`); a gate-conditional calibration uses
``s_contact`` where the gate is ≥ :data:`GATE_CONTACT` and ``s_free`` elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "GATE_CONTACT",
    "GAUSSIAN_Z90",
    "LOG_VAR_MAX",
    "LOG_VAR_MIN",
    "NOMINAL_LEVEL",
    "beta_nll",
    "calibration_record",
    "conformal_scale",
    "coverage_metrics",
    "cross_fold_coverage",
    "episode_coverage",
    "gate_scales",
    "scale_per_element",
    "normalised_scores",
]

NOMINAL_LEVEL = 0.9
# Φ⁻¹(0.95): the half-width, in σ, of a central 90 % Gaussian interval.
GAUSSIAN_Z90 = 1.6448536269514722
# The head's log-variance is clamped to [e^-12, e^6] N²: σ from 2.5 mN to 20 N.
LOG_VAR_MIN, LOG_VAR_MAX = -12.0, 6.0
# A frame whose contact gate is at least this is a "contact" frame for the gate-conditional
# scales (the gate's own decision threshold).
GATE_CONTACT = 0.5


def beta_nll(mean: torch.Tensor, log_var: torch.Tensor, target: torch.Tensor,
             mask: torch.Tensor | None = None, beta: float = 0.5) -> torch.Tensor:
    """β-NLL: ``mean over elements of stop_grad(σ²)^β · ½ (log σ² + (y − μ)² / σ²)``.

    ``mean``, ``log_var`` and ``target`` have one shape (e.g. (B, T, 3)); ``mask`` is
    broadcast onto it from the left (a (B, T) frame mask or a full mask). The constant
    ½ log 2π is left out. An empty mask gives 0 (still in the graph)."""
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    var = log_var.exp()
    per = 0.5 * (log_var + (target - mean).square() / var)
    if beta > 0:
        per = per * var.detach().pow(beta)
    if mask is None:
        return per.mean()
    while mask.dim() < per.dim():
        mask = mask.unsqueeze(-1)
    weight = mask.expand_as(per).to(per.dtype)
    return (per * weight).sum() / weight.sum().clamp(min=1.0)


def normalised_scores(estimate: np.ndarray, sigma: np.ndarray,
                      truth: np.ndarray) -> np.ndarray:
    """``|truth − estimate| / σ`` elementwise (the conformity score), float64."""
    estimate, sigma, truth = (np.asarray(x, dtype=np.float64) for x in (estimate, sigma, truth))
    return np.abs(truth - estimate) / np.maximum(sigma, 1e-12)


def episode_coverage(scores: Sequence[np.ndarray], scale: float) -> np.ndarray:
    """Per episode: the fraction of its elements with score ≤ ``scale`` (covered)."""
    return np.array([float(np.mean(np.asarray(s) <= scale)) for s in scores])


def conformal_scale(scores: Sequence[np.ndarray], level: float = NOMINAL_LEVEL,
                    finite_sample: bool = True) -> dict[str, Any]:
    """The smallest scale ``s`` at which the mean over calibration episodes of their
    coverage reaches ``level`` (the episode is the unit; see the module docstring).

    ``scores``: one 1-D array of normalised scores per calibration episode (every labelled
    frame and axis). Returns ``{"scale", "level", "episodes", "guarantee", "target"}``:
    ``target`` is the mean episode coverage the scale was chosen to reach (the conformal
    risk control bound when ``guarantee``, else ``level`` itself). ``finite_sample=False``
    aims at ``level`` whatever ``n`` (no guarantee: what a diagnostic at the nominal level
    wants, not a calibration)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    episodes = [np.asarray(s, dtype=np.float64).reshape(-1) for s in scores]
    episodes = [s[np.isfinite(s)] for s in episodes]
    episodes = [s for s in episodes if s.size]
    n = len(episodes)
    if n == 0:
        raise ValueError("conformal_scale needs at least one calibration episode with scores")
    alpha = 1.0 - level
    bound = ((n + 1) * alpha - 1.0) / n  # CRC with losses in [0, 1]: mean L <= bound
    # 1 - 0.9 is 0.0999...98 in floating point: n = 9 at 90 % must still count as enough.
    guarantee = finite_sample and bound >= -1e-9
    bound = max(bound, 0.0)
    allowed_miss = bound if guarantee else alpha
    target = 1.0 - allowed_miss
    # Mean coverage is a step function of s that jumps only at the scores: check them all.
    candidates = np.unique(np.concatenate(episodes))
    sorted_eps = [np.sort(s) for s in episodes]
    mean_cov = np.zeros(candidates.size)
    for s in sorted_eps:
        mean_cov += np.searchsorted(s, candidates, side="right") / s.size
    mean_cov /= n
    reached = np.nonzero(mean_cov >= target - 1e-12)[0]
    scale = float(candidates[reached[0]]) if reached.size else float(candidates[-1])
    return {"scale": scale, "level": level, "episodes": n, "guarantee": bool(guarantee),
            "target": float(target)}


def gate_scales(scores: Sequence[np.ndarray], contact: Sequence[np.ndarray],
                level: float = NOMINAL_LEVEL, finite_sample: bool = True) -> dict[str, Any]:
    """:func:`conformal_scale` fitted apart on the frames each episode's gate calls contact
    and on the rest (``scores`` (T, 3) and ``contact`` (T,) bool per episode; an episode
    counts in a group when it has frames there). A group no episode has frames in gets the
    other group's scale (``fallback`` names it). Returns ``{"free": fit, "contact": fit,
    "fallback": None | "free" | "contact"}``; ``finite_sample`` as in
    :func:`conformal_scale`."""
    groups: dict[str, list[np.ndarray]] = {"free": [], "contact": []}
    for s, c in zip(scores, contact, strict=True):
        s = np.asarray(s, dtype=np.float64)
        c = np.asarray(c, dtype=bool).reshape(-1)
        if s.shape[0] != c.shape[0]:
            raise ValueError(f"scores of {s.shape[0]} frames but a gate of {c.shape[0]}")
        for name, keep in (("contact", c), ("free", ~c)):
            if keep.any():
                groups[name].append(s[keep])
    if not groups["free"] and not groups["contact"]:
        raise ValueError("gate_scales needs at least one calibration episode with scores")
    fits = {name: conformal_scale(eps, level, finite_sample)
            for name, eps in groups.items() if eps}
    fallback = None
    for name, other in (("free", "contact"), ("contact", "free")):
        if name not in fits:
            fits[name], fallback = dict(fits[other]), name
    return {**fits, "fallback": fallback}


def scale_per_element(scale: float, contact: np.ndarray | None = None,
                      by_gate: Mapping[str, float] | None = None) -> np.ndarray | float:
    """The interval's scale of each frame: ``scale`` everywhere, or with ``by_gate``
    (``{"free": s_f, "contact": s_c}``) ``s_c`` on ``contact`` frames and ``s_f`` elsewhere,
    as (T, 1) for (T, 3) scores."""
    if by_gate is None or contact is None:
        return scale
    c = np.asarray(contact, dtype=bool).reshape(-1, 1)
    return np.where(c, float(by_gate["contact"]), float(by_gate["free"]))


def coverage_metrics(estimate: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     truth: np.ndarray,
                     groups: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Coverage (fraction of elements with lo ≤ truth ≤ hi), mean width (hi − lo) and
    the mean |truth − estimate| over (steps, axes) arrays; ``groups`` adds the same per
    named boolean step mask (a group with no step gives None)."""
    estimate, lo, hi, truth = (np.asarray(x, dtype=np.float64) for x in (estimate, lo, hi,
                                                                         truth))

    def block(keep: np.ndarray | None) -> dict[str, Any] | None:
        sl = slice(None) if keep is None else np.asarray(keep, bool)
        t, a, b = truth[sl], lo[sl], hi[sl]
        if t.size == 0:
            return None
        covered = (a <= t) & (t <= b)
        return {"coverage": float(covered.mean()),
                "coverage_per_axis": covered.reshape(-1, covered.shape[-1]).mean(0).tolist(),
                "width": float((b - a).mean()), "mae": float(np.abs(t - estimate[sl]).mean()),
                "elements": int(t.size)}

    out = {"all": block(None)}
    for name, keep in (groups or {}).items():
        out[name] = block(keep)
    return out


def cross_fold_coverage(fold_scores: Sequence[Sequence[np.ndarray]],
                        level: float = NOMINAL_LEVEL,
                        fold_contact: Sequence[Sequence[np.ndarray]] | None = None
                        ) -> list[dict[str, Any]]:
    """Leave-one-fold-out conformal calibration of a cross-validation: for fold ``f``, the
    scale from the held-out episodes of every *other* fold (each scored by its own fold's
    model: the pooled out-of-fold episodes), then the coverage of fold ``f``'s held-out
    episodes at that scale. Returns per fold ``{"scale", "episodes" (calibration),
    "guarantee", "coverage" (element-weighted), "coverage_episode_mean", "test_episodes"}``.

    With ``fold_contact`` (per episode the (T,) frames its gate calls contact) the scales
    are :func:`gate_scales` and each row adds ``"by_gate": {"free": s_f, "contact": s_c}``;
    ``"scale"`` is then the free frames' scale."""
    rows = []
    for f, test in enumerate(fold_scores):
        calibration = [s for g, scores in enumerate(fold_scores) if g != f for s in scores]
        if not calibration or not test:
            rows.append({"scale": None, "episodes": len(calibration), "guarantee": False,
                         "coverage": None, "coverage_episode_mean": None,
                         "test_episodes": len(test), "by_gate": None})
            continue
        by_gate, test_contact = None, [None] * len(test)
        if fold_contact is None:
            fit = conformal_scale(calibration, level)
        else:
            cal_contact = [c for g, cs in enumerate(fold_contact) if g != f for c in cs]
            fits = gate_scales(calibration, cal_contact, level)
            fit = fits["free"]
            by_gate = {"free": fits["free"]["scale"], "contact": fits["contact"]["scale"]}
            test_contact = list(fold_contact[f])
        covered = [np.asarray(s) <= scale_per_element(fit["scale"], c, by_gate)
                   for s, c in zip(test, test_contact, strict=True)]
        flat = np.concatenate([c.reshape(-1) for c in covered])
        rows.append({"scale": fit["scale"], "episodes": fit["episodes"],
                     "guarantee": fit["guarantee"], "coverage": float(np.mean(flat)),
                     "coverage_episode_mean": float(np.mean([c.mean() for c in covered])),
                     "test_episodes": len(test), "by_gate": by_gate})
    return rows


def calibration_record(fit: Mapping[str, Any], source: str,
                       by_gate: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a bundle stores as its interval calibration (``bundle["uncertainty"]``);
    ``by_gate`` (``{"free": s_f, "contact": s_c}``) adds the gate-conditional scales the
    model then uses instead of ``scale``."""
    def checked(value: Any, what: str) -> float:
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"a calibration {what} must be a finite number > 0, got {value!r}")
        return value

    record = {"level": float(fit.get("level", NOMINAL_LEVEL)),
              "scale": checked(fit["scale"], "scale"),
              "episodes": int(fit.get("episodes", 0)), "guarantee": bool(fit.get("guarantee")),
              "source": str(source)}
    if by_gate is not None:
        record["by_gate"] = {name: checked(by_gate[name], f"{name} scale")
                             for name in ("free", "contact")}
    return record
