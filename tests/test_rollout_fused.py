"""The frame-wise rollout (each frame's token built once) against the step-wise definition
(every window sliced and normalised from the channels): the same rollout, bit for bit
forward, and the same gradients to float rounding, through the real simulator."""

from __future__ import annotations

import pytest
import torch

from nactuator.models import NeuralActuator
from nactuator.models.config import resolve_model_config
from nactuator.rollout import RECORDED_KEYS, closed_loop_rollout, closed_loop_rollout_stepwise
from nactuator.sim import Simulator

N, L, STEPS, B = 6, 9, 12, 3


def _actuator(features: list[str]) -> NeuralActuator:
    torch.manual_seed(0)
    keys = ["q_cmd", "q", "qd", "effort", "voltage", "temperature", "error",
            "torque_enable", "supply_voltage", "initial_temperature"]
    stats = {k: {"mean": [0.1 * i for i in range(N)], "std": [0.5 + 0.1 * i for i in range(N)]}
             for k in keys}
    config = resolve_model_config("transformer", L, 16, 1, {"head_hidden": 8, "dropout": 0.0})
    actuator = NeuralActuator(features, N, stats, config)
    with torch.no_grad():  # a visible torque, so the simulated path depends on the model
        actuator.net.heads.torque_readout.weight.mul_(30.0)
    return actuator


def _block(seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    frames = L - 1 + STEPS + 1
    block = {k: 0.3 * torch.randn(B, frames, N, generator=gen) for k in RECORDED_KEYS}
    block["q"] = 0.3 * torch.randn(B, frames, N, generator=gen)
    block["qd"] = 0.5 * torch.randn(B, frames, N, generator=gen)
    block["pad"] = torch.zeros(B, frames, dtype=torch.bool)
    block["pad"][0, :5] = True  # one row starts at an episode's first frames
    return block


@pytest.fixture(scope="module")
def sim() -> Simulator:
    return Simulator("so101")


@pytest.mark.parametrize("features", [["command", "state", "telemetry", "error"],
                                      ["state", "enable", "supply"]])
def test_frame_wise_rollout_is_the_stepwise_rollout(features, sim):
    actuator = _actuator(features)
    assert actuator.frame_wise
    results, grads = [], []
    for rollout in (closed_loop_rollout, closed_loop_rollout_stepwise):
        actuator.zero_grad()
        block = _block()
        q0 = block["q"][:, L - 1].clone().requires_grad_(True)
        r = rollout(actuator, sim.step, block, L, q0=q0)
        loss = (r.q ** 2).sum() + r.force.sum() + r.condition_logit.sum()
        loss.backward()
        results.append(r)
        grads.append([q0.grad.clone()] + [p.grad.clone() for p in actuator.parameters()])
    fused, stepwise = results
    assert fused.q.shape == (B, STEPS + 1, N) and fused.tau.shape == (B, STEPS, N)
    for key in ("q", "qd", "tau", "force", "gate", "gate_logit", "condition",
                "condition_logit"):
        assert torch.equal(getattr(fused, key), getattr(stepwise, key)), key
    assert (fused.q[:, -1] - fused.q[:, 0]).abs().max() > 1e-3  # the arm moved
    for g_fused, g_step in zip(*grads, strict=True):
        scale = g_step.abs().max().clamp_min(1e-12)
        assert (g_fused - g_step).abs().max() / scale < 1e-4


def test_a_physics_actuator_takes_the_stepwise_path(monkeypatch):
    actuator = _actuator(["command", "state"])
    monkeypatch.setattr(actuator, "physics", torch.nn.Identity())  # reads the raw window
    assert not actuator.frame_wise
