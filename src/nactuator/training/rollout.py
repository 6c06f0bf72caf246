"""Closed-loop rollout of the neural actuator through the differentiable simulator.

One batch of Contract 2 holds ``T = history + H + 1`` recorded frames ``[s − history, s + H]``
per segment. Step ``i`` builds the model's window from the frames ``[s + i − history, s + i]``:
commands and telemetry are the *recorded* ones, while the state slots (``q``, ``qd``; the
tracking error is derived from them by the feature builder) hold the *simulated* state —
frames before the rollout start keep their recorded state, since nothing was simulated
there. The predicted effort drives one simulator step, whose result becomes the newest
state. Gradients therefore flow back through every step (BPTT), both through the
simulator and through the history windows of later steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Recorded channels that go into a window as they are (Contract 1 keys).
RECORDED_KEYS = ("q_cmd", "effort", "voltage", "temperature")

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
ActuatorFn = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class NonFiniteRollout(RuntimeError):
    """The model produced a NaN/inf effort; the simulator must not be stepped with it."""


@dataclass
class Rollout:
    """Everything one rollout produced; time axis 1 has H steps unless noted."""

    q: torch.Tensor  # (B, H + 1, n) simulated positions, frame s (the start) .. s + H
    qd: torch.Tensor  # (B, H + 1, n) simulated velocities, same frames
    tau: torch.Tensor  # (B, H, n) predicted efforts (before the simulator's clip)
    force: torch.Tensor  # (B, H, 3) force estimate at frames s .. s + H − 1
    gate_logit: torch.Tensor  # (B, H, 1)
    condition_logit: torch.Tensor  # (B, H, n)


def rollout(
    actuator: ActuatorFn,
    step: StepFn,
    batch: dict[str, torch.Tensor],
    history: int,
    horizon: int,
    q0: torch.Tensor | None = None,
    qd0: torch.Tensor | None = None,
) -> Rollout:
    """Roll ``horizon`` control steps from frame ``s`` (batch time index ``history``).

    ``q0``/``qd0`` (B, n) replace the recorded start state (e.g. with noise added); by
    default the rollout starts from the recorded state at frame ``s``.
    """
    length = history + 1
    frames = batch["q"].shape[1]
    if frames < history + horizon + 1:
        raise ValueError(
            f"batch has {frames} frames, a rollout of horizon {horizon} with history "
            f"{history} needs {history + horizon + 1} (Contract 2: T = history + H + 1)"
        )
    # States per frame, starting at s − history; recorded before s, simulated from s on.
    qs = list(batch["q"][:, :history].unbind(1))
    qds = list(batch["qd"][:, :history].unbind(1))
    qs.append(batch["q"][:, history] if q0 is None else q0)
    qds.append(batch["qd"][:, history] if qd0 is None else qd0)

    taus, forces, gates, conditions = [], [], [], []
    for i in range(horizon):
        window = {key: batch[key][:, i : i + length] for key in RECORDED_KEYS}
        window["q"] = torch.stack(qs[i : i + length], dim=1)
        window["qd"] = torch.stack(qds[i : i + length], dim=1)
        if "pad" in batch:
            window["pad"] = batch["pad"][:, i : i + length]
        out = actuator(window)
        if not torch.isfinite(out["tau"]).all():
            raise NonFiniteRollout(f"non-finite effort predicted at rollout step {i}")
        q_next, qd_next = step(qs[-1], qds[-1], out["tau"])
        qs.append(q_next)
        qds.append(qd_next)
        taus.append(out["tau"])
        forces.append(out["force"])
        gates.append(out["gate_logit"].reshape(out["force"].shape[0], 1))
        conditions.append(out["condition_logit"])

    return Rollout(
        q=torch.stack(qs[history:], dim=1),
        qd=torch.stack(qds[history:], dim=1),
        tau=torch.stack(taus, dim=1),
        force=torch.stack(forces, dim=1),
        gate_logit=torch.stack(gates, dim=1),
        condition_logit=torch.stack(conditions, dim=1),
    )
