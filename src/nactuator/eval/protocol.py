"""The published evaluation protocol (nad-format.md §8.2): one open-loop rollout per episode.

For every episode: the simulator starts at q = q[0] (the recorded position), qd = 0, with a
zero-padded window. Step i builds the model's window ending at frame i from the recorded
commands and telemetry, with the state slots (q, qd; the error follows from them) replaced
by the *simulated* states, feeds the predicted torque through one simulator step and
compares the simulated q with the recorded q[i+1] (:func:`nactuator.rollout.rollout_episodes`,
the rollout validation runs). Nothing is ever reset to the recording, so errors accumulate
exactly as they would when the model drives a simulation.

All episodes of a split roll out together as one batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from nactuator.constants import GRAVITY
from nactuator.data import Episode
from nactuator.data.references import LinearForceReference, command_following
from nactuator.eval import metrics as M
from nactuator.eval.episodes import (
    check_inputs,
    condition_labels,
    force_labels,
    is_no_contact,
)
from nactuator.rollout import STATE_KEYS, Rollout, model_inputs, rollout_episodes

__all__ = ["FORCE_LABEL_OFFSET", "episode_rollouts", "known_load_torque", "score_episode"]

# Step i (window ending at frame i) is scored against frame i + 1 for the joints (the
# protocol); its force, gate and condition describe the window's current frame i, exactly
# as training supervises them (training/losses.py), so they are scored against frame i.
FORCE_LABEL_OFFSET = 0


def known_load_torque(sim, episodes: Sequence[Episode]) -> torch.Tensor:
    """(B, T_max, n) each episode's labelled end-effector force (NaN: 0 N) as its joint
    torque ``J_ee(q)^T f`` at the recorded pose, row i = frame i (0 past an episode's end):
    the load a simulation of the recording is told about (``eval --known-load``)."""
    rows = max(ep.length for ep in episodes)
    out = torch.zeros(len(episodes), rows, sim.n, dtype=torch.float64)
    for b, ep in enumerate(episodes):
        f = torch.as_tensor(np.nan_to_num(force_labels(ep), nan=0.0), device=sim.device)
        q = torch.as_tensor(np.asarray(ep.frames["q"], np.float64), device=sim.device)
        with torch.no_grad():
            out[b, :ep.length] = sim.kinematics.ee_torque(q, f).cpu()
    return out


def episode_rollouts(actuator, sim, episodes: Sequence[Episode],
                     device: str = "cpu", known_load: bool = False) -> list[Rollout]:
    """Open-loop rollouts of all ``episodes`` at once (see the module docstring), one
    per-episode :class:`~nactuator.rollout.Rollout` of numpy arrays each: the recorded
    :class:`Episode` view of :func:`~nactuator.rollout.rollout_episodes`, with the check
    that they record every channel the model reads.

    The actuator runs in eval mode (no dropout) and without autograd; its mode is restored.
    ``known_load``: each step also gets the episode's labelled end-effector force as joint
    torque (:func:`known_load_torque`), as a model trained with ``model.external_torque``
    was trained; off (the protocol): the simulator sees the model's torque alone.
    """
    check_inputs(episodes, model_inputs(actuator), simulated=STATE_KEYS)
    batch = rollout_episodes(actuator, sim.step, [ep.frames for ep in episodes], device=device,
                             tau_ext=known_load_torque(sim, episodes) if known_load else None)
    return [batch.episode(j, ep.length) for j, ep in enumerate(episodes)]


G = GRAVITY  # the payload labels' gravity (NAD: f_z = -m g)


def payload_estimates(ep: Episode, f_label: np.ndarray,
                      estimates: dict[str, np.ndarray | None]) -> dict | None:
    """The held payload read from the force: over the carry frames (a payload is recorded
    and the force label's z is below -0.01 N), the mass each estimate implies
    (-mean f_z / g, in grams) beside the label's, and the error."""
    mass = ep.frames.get("payload_mass")
    if mass is None:
        return None
    steps = len(f_label)
    held = np.nan_to_num(np.asarray(mass, np.float64).reshape(-1)[:steps], nan=0.0) > 0
    carry = held & (np.nan_to_num(f_label[:, 2], nan=0.0) < -M.CONTACT_THRESHOLD_N)
    if not carry.any():
        return None
    true_g = float(-f_label[carry, 2].mean() / G * 1000.0)
    out: dict = {"carry_frames": int(carry.sum()), "true_g": true_g}
    for name, force in estimates.items():
        if force is not None:
            grams = float(-force[carry, 2].mean() / G * 1000.0)
            out[name] = {"mass_g": grams, "abs_error_g": abs(grams - true_g)}
    return out


def score_episode(ep: Episode, ro: Rollout, scales: np.ndarray,
                  linear: LinearForceReference | None = None,
                  horizons: Sequence[int] = M.HORIZONS,
                  causal: dict[str, np.ndarray] | None = None) -> dict:
    """Every metric of one episode's rollout, in reported units (deg / mm / N).

    ``causal`` (the ``infer`` path's per-frame ``force``/``gate`` on recorded state) adds
    the model's deployment-mode force rows (``model_causal``) beside the rollout's, and,
    where it holds ``force_residual`` (the end-effector force read from the model's torque
    through the nominal inverse dynamics, :func:`nactuator.contact.residual_ee_force`),
    the ``model_residual`` rows."""
    q_true = ep.frames["q"][1:].astype(np.float64)
    steps = len(q_true)
    out: dict = {"task": ep.task, "episode_index": ep.index, "episodes": 1, "steps": steps}
    out["joints"] = {
        "model": {k: v.tolist() for k, v in
                  M.prefix_mae(np.abs(ro.q[1:] - q_true) * scales, horizons).items()},
        "command_following": {k: v.tolist() for k, v in M.prefix_mae(
            np.abs(command_following(ep) - q_true) * scales, horizons).items()},
    }

    # Force, gate and condition labels of the frames the steps are scored against.
    o = FORCE_LABEL_OFFSET
    f_label = force_labels(ep)[o:o + steps]
    out["force"] = {"model": M.force_block(ro.force, f_label, horizons)}
    residual = None if causal is None else causal.get("force_residual")
    if causal is not None:
        out["force"]["model_causal"] = M.force_block(causal["force"][:steps], f_label, horizons)
    if residual is not None:
        residual = residual[:steps]
        out["force"]["model_residual"] = M.force_block(residual, f_label, horizons)
    f_lin = None
    if linear is not None:
        f_lin = linear.predict(ep)[:steps]
        out["force"]["linear_regression"] = M.force_block(f_lin, f_label, horizons)

    payload = payload_estimates(ep, f_label, {"model": ro.force, "linear_regression": f_lin,
                                              "model_causal": None if causal is None
                                              else causal["force"][:steps],
                                              "model_residual": residual})
    if payload is not None:
        out["payload"] = payload

    labelled = np.isfinite(f_label).any(axis=1)
    magnitude = np.linalg.norm(np.nan_to_num(f_label, nan=0.0), axis=1)
    if labelled.any():
        out["gate"] = M.binary_metrics(ro.gate[labelled],
                                       magnitude[labelled] > M.CONTACT_THRESHOLD_N,
                                       M.GATE_THRESHOLD)
    no_contact_run = is_no_contact(ep)
    quiet = np.ones(steps, bool) if no_contact_run else labelled & (
        magnitude <= M.CONTACT_THRESHOLD_N)
    out["false_contact"] = M.no_contact_metrics(ro.gate[quiet], ro.force[quiet])
    if not no_contact_run:
        # Unlabelled frames of a labelled run (SO-101 outside the carry): 0 N by the
        # reference convention, though nobody measured it; reported apart from the above.
        out["unlabelled_frames"] = M.no_contact_metrics(ro.gate[~labelled], ro.force[~labelled])
    if no_contact_run:
        out["no_contact_run"] = {"model": M.no_contact_metrics(ro.gate, ro.force)}
        if causal is not None:
            out["no_contact_run"]["model_causal"] = M.no_contact_metrics(
                causal["gate"][:steps], causal["force"][:steps])
        if f_lin is not None:
            lin = M.no_contact_metrics(np.zeros(steps), f_lin)
            out["no_contact_run"]["linear_regression"] = {
                "mean_force_norm": lin["mean_force_norm"],
                "mean_abs_force": lin["mean_abs_force"]}

    c_label = condition_labels(ep, ro.condition.shape[1])[o:o + steps]
    known = np.isfinite(c_label)
    if known.any():
        # Positive class = degraded (label 0); the model says degraded when c < 0.5.
        out["condition"] = M.binary_metrics(1.0 - ro.condition[known], c_label[known] < 0.5,
                                            1.0 - M.DEGRADED_THRESHOLD)
    return out
