"""Per task of a split: the model's causal force head against the force read from its torque
through physics (:func:`nactuator.contact.residual_ee_force`, as ``eval``'s ``model_residual``
rows, with the platform's joint damping) and one combination of the two, with the payload
each reads while carried (docs/results.md §12.4).

    PYTHONPATH=src .venv/bin/python bench/residual_readout.py CKPT DATA --split test

``head, resid when still``: the residual where the arm is still (every arm joint's filtered
|qd| < ``--still`` rad/s) and the head's gate says contact, the head elsewhere (causal).
Also ``resid_gated``: the residual times the head's gate. Prints one markdown table.

``--affine`` (no model): the same readout from a classical motor torque instead, per joint
``a effort + b + c sign(qd)`` (``c`` with ``--friction``) fitted by least squares on the
train split of DATA with the labelled payload taken out of its target
(``ID + damping qd - J_ee^T f``): a torque that is affine in the current by construction.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from nactuator.constants import GRAVITY
from nactuator.contact import external_torque, residual_ee_force
from nactuator.contact.estimate import smoothed_velocity
from nactuator.eval import metrics as M
from nactuator.eval.episodes import (
    force_labels,
    load_episodes,
    load_filtered,
    predict_episodes,
)
from nactuator.platforms import load_platform
from nactuator.sim.dynamics import ArmDynamics, ee_force_from_joint_torques


def estimates(ckpt: str, data: str, split: str, still: float
              ) -> dict[str, dict[str, list[float]]]:
    """Per task, per estimate: the 3-axis force MAE of each episode and (key ``g:<name>``)
    the payload it reads while carried, in grams."""
    actuator, _, platform, episodes = load_filtered(ckpt, data, split)
    preds = predict_episodes(actuator, episodes)
    dyn = ArmDynamics.for_platform(platform)
    dt = platform.control_dt
    damping = np.array([c.damping for c in platform.channels])
    arm = list(platform.arm_indices)
    rows: dict[str, dict[str, list[float]]] = {}
    for ep, out in zip(episodes, preds, strict=True):
        q = np.asarray(ep.frames["q"], np.float64)
        qd = np.asarray(ep.frames["qd"], np.float64)
        resid = residual_ee_force(dyn, q, qd, np.asarray(out["tau"], np.float64), dt, damping)
        head, gate = out["force"], out["gate"] > M.GATE_THRESHOLD
        still_now = np.abs(smoothed_velocity(qd, dt)[0][:, arm]).max(axis=1) < still
        combined = head.copy()
        use = still_now & gate
        combined[use] = resid[use]
        forms = {"head": head, "resid": resid, "resid_gated": resid * gate[:, None],
                 "head, resid when still": combined}
        _score(rows.setdefault(ep.task, {}), ep, forms)
    return rows


def _dynamics_terms(dyn: ArmDynamics, ep, dt: float, damping: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, filtered qd, ID + damping qd) of one episode, and the labelled load J^T f."""
    q = np.asarray(ep.frames["q"], np.float64)
    qd = np.asarray(ep.frames["qd"], np.float64)
    qd_s = smoothed_velocity(qd, dt)[0]
    need = external_torque(dyn, q, qd, np.zeros_like(q), dt) + damping * qd_s
    with torch.no_grad():
        jac = dyn.kin.ee_jacobian(torch.as_tensor(q)).numpy()
    load = np.einsum("tkn,tk->tn", jac, np.nan_to_num(force_labels(ep), nan=0.0))
    return qd_s, need, load


def affine_estimates(data: str, split: str, friction: bool
                     ) -> dict[str, dict[str, list[float]]]:
    """:func:`estimates` for the classical affine current map (``--affine``)."""
    platform = load_platform("so101")
    dyn = ArmDynamics.for_platform(platform)
    dt = platform.control_dt
    damping = np.array([c.damping for c in platform.channels])
    arm = list(platform.arm_indices)

    def design(effort: np.ndarray, qd_s: np.ndarray, j: int) -> np.ndarray:
        cols = [effort[:, j], np.ones(len(effort))]
        return np.stack(cols + ([np.sign(qd_s[:, j])] if friction else []), 1)

    train = []
    for ep in load_episodes(data, platform, "train"):
        qd_s, need, load = _dynamics_terms(dyn, ep, dt, damping)
        train.append((np.asarray(ep.frames["effort"], np.float64), qd_s, need - load))
    coef = {j: np.linalg.lstsq(np.concatenate([design(u, v, j) for u, v, _ in train]),
                               np.concatenate([y[:, j] for _, _, y in train]), rcond=None)[0]
            for j in arm}
    rows: dict[str, dict[str, list[float]]] = {}
    for ep in load_episodes(data, platform, split):
        qd_s, need, _ = _dynamics_terms(dyn, ep, dt, damping)
        effort = np.asarray(ep.frames["effort"], np.float64)
        tau = np.zeros_like(need)
        for j in arm:
            tau[:, j] = design(effort, qd_s, j) @ coef[j]
        q = np.asarray(ep.frames["q"], np.float64)
        force = ee_force_from_joint_torques(dyn, q, need - tau, dyn.kin.ee_ancestors)
        _score(rows.setdefault(ep.task, {}), ep, {"affine current map": force})
    return rows


def _score(row: dict[str, list[float]], ep, forms: dict[str, np.ndarray]) -> None:
    label = force_labels(ep)
    mass = np.nan_to_num(np.asarray(ep.frames.get("payload_mass", np.zeros(ep.length)),
                                    np.float64).reshape(-1), nan=0.0)
    carry = (mass > 0) & (np.nan_to_num(label[:, 2], nan=0.0) < -M.CONTACT_THRESHOLD_N)
    for name, force in forms.items():
        row.setdefault(name, []).append(float(M.force_errors(force, label).mean()))
        if carry.any():
            row.setdefault(f"g:{name}", []).append(
                float(-force[carry, 2].mean() / GRAVITY * 1000.0))


def table(rows: dict[str, dict[str, list[float]]]) -> str:
    names = [k for k in next(iter(rows.values())) if not k.startswith("g:")]
    lines = ["| task | " + " | ".join(f"{n} N" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    means: dict[str, list[float]] = {n: [] for n in names}
    for task, row in sorted(rows.items()):
        cells = []
        for n in names:
            means[n].append(float(np.mean(row[n])))
            grams = f" ({np.mean(row[f'g:{n}']):.0f} g)" if f"g:{n}" in row else ""
            cells.append(f"{np.mean(row[n]):.3f}{grams}")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines.append("| mean of the tasks | " + " | ".join(f"{np.mean(means[n]):.3f}"
                                                     for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", help="the model (ignored with --affine: give any path)")
    ap.add_argument("data")
    ap.add_argument("--split", default="test")
    ap.add_argument("--still", type=float, default=0.1,
                    help="rad/s: the arm counts as still below this on every arm joint")
    ap.add_argument("--affine", action="store_true",
                    help="the classical affine current map instead of the model")
    ap.add_argument("--friction", action="store_true", help="--affine with a sign(qd) term")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = (affine_estimates(a.data, a.split, a.friction) if a.affine
            else estimates(a.ckpt, a.data, a.split, a.still))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
