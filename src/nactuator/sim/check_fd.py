"""Gradient checks of the simulator (``nactuator sim-check``): directional central finite
differences of a 64-step replay loss along random directions in torque space and in
initial-state space (:func:`directional_fd`); the same with a small network closing the
loop on the simulated state (:func:`closed_loop_fd`: along the analytic gradient and along
3 random directions in weight space) and with every joint held inside its penalty limit
(:func:`limit_fd`). Gate: analytic / FD in ``FD_GATE`` = [0.99, 1.01].
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nactuator.platforms import Platform
from nactuator.sim.check_trajectories import _bounds, start_states, tracking_torques
from nactuator.sim.simulator import Simulator

FD_GATE = (0.99, 1.01)
CLOSED_LOOP_DIRECTIONS = 3
CLOSED_LOOP_GATE = 1e-2  # relative error of the gradient's random projections
FD_STEPS = 64
FD_EPS = 3e-2


def _loss_weights(platform: Platform, shape: tuple[int, ...], seed: int, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1)
    lo, hi = _bounds(platform)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) / (hi - lo).double()).to(device)


def _replay_loss(sim: Simulator, taus, q0, qd0, weights) -> torch.Tensor:
    q, qd = sim.replay(q0, qd0, taus)
    # Sum in float64 so the loss itself adds no float32 round-off to the differences.
    return (weights * q.double()).sum() + 0.1 * (weights * qd.double()).sum()


def _fd(f, eps: float) -> float:
    with torch.no_grad():
        return float((f(eps) - f(-eps)) / (2 * eps))


def _directional(sim: Simulator, taus, q0, qd0, weights, d_tau, d_q, d_qd,
                 eps: float) -> dict[str, float]:
    taus_g, q0_g, qd0_g = (x.clone().requires_grad_(True) for x in (taus, q0, qd0))
    _replay_loss(sim, taus_g, q0_g, qd0_g, weights).backward()
    analytic_tau = float((taus_g.grad * d_tau).sum())
    analytic_state = float((q0_g.grad * d_q).sum() + (qd0_g.grad * d_qd).sum())
    fd_tau = _fd(lambda e: _replay_loss(sim, taus + e * d_tau, q0, qd0, weights), eps)
    fd_state = _fd(lambda e: _replay_loss(sim, taus, q0 + e * d_q, qd0 + e * d_qd, weights), eps)
    a, f = np.array([analytic_tau, analytic_state]), np.array([fd_tau, fd_state])
    return {
        "ratio_torques": analytic_tau / fd_tau,
        "ratio_initial_state": analytic_state / fd_state,
        "cosine": float(a @ f / (np.linalg.norm(a) * np.linalg.norm(f))),
        "grad_norm_torques": float(taus_g.grad.norm()),
    }


def _directions(sim: Simulator, taus: torch.Tensor, seed: int):
    gen = torch.Generator().manual_seed(seed + 2)
    lo, hi = _bounds(sim.platform)
    span = (hi - lo).to(sim.device)
    torque_scale = 0.05 * sim.torque_max
    d_tau = torch.randn(taus.shape, generator=gen).to(sim.device) * torque_scale
    d_tau = d_tau / d_tau.norm() * torque_scale.norm()
    shape = (taus.shape[0], taus.shape[2])
    # Small state directions: an open-loop arm under gravity (Franka) amplifies an initial
    # offset ~20x in 1 s, and the check must stay in the linear regime.
    d_q = 0.01 * span * torch.randn(shape, generator=gen).to(sim.device)
    d_qd = 0.01 * span * torch.randn(shape, generator=gen).to(sim.device)
    return d_tau, d_q, d_qd


def directional_fd(sim: Simulator, batch: int = 2, steps: int = FD_STEPS, seed: int = 0,
                   eps: float = FD_EPS) -> dict[str, float]:
    """Analytic / central-FD ratios of d(loss) along one random torque direction and one
    random initial-state direction, on a tracked ``steps``-step replay; ``cosine`` compares
    the two (analytic, FD) pairs."""
    q0, qd0 = (x.to(sim.device) for x in start_states(sim.platform, batch, seed))
    taus = tracking_torques(sim, q0, qd0, steps, seed)
    weights = _loss_weights(sim.platform, tuple(taus.shape), seed, sim.device)
    return _directional(sim, taus, q0, qd0, weights, *_directions(sim, taus, seed), eps)


def closed_loop_net(platform: Platform, seed: int = 0) -> torch.nn.Module:
    """The small MLP (2n -> 32 -> n, tanh) of :func:`closed_loop_fd`, seeded."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(2 * platform.n, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, platform.n))


def closed_loop_fd(sim: Simulator, batch: int = 2, steps: int = FD_STEPS, seed: int = 0,
                   eps: float = 1e-2, directions: int = CLOSED_LOOP_DIRECTIONS,
                   eps_random: float = 5e-2,
                   net: torch.nn.Module | None = None) -> dict[str, float | list[float]]:
    """A small MLP (``net``, default :func:`closed_loop_net`) produces the torque from the
    simulated state at every step (gravity compensation + a bounded correction); analytic /
    central-FD ratios of d(loss)/d(weights).

    ``ratio_weights`` is along the analytic gradient's own direction (eps = 1e-2): it
    catches a gradient of the wrong size, but an error orthogonal to the true gradient only
    moves it by the error's norm squared (10 % -> 1.01). So the gradient is also projected
    on ``directions`` seeded random unit directions in weight space (eps = 5e-2), where
    such an error shows at its full relative size: ``random_rel_error`` = |a - f| / |f| of
    the analytic and FD projections (<= ``CLOSED_LOOP_GATE`` = 1e-2; measured
    <= 5e-4), ``ratio_random`` their per-direction ratios (reported: a direction that
    happens to be nearly orthogonal to the gradient has a small projection, and its ratio
    carries the float32 noise of the 64-step loss, 0.997-1.002 measured)."""
    platform = sim.platform
    net = (closed_loop_net(platform, seed) if net is None else net).to(sim.device)
    q0, qd0 = (x.to(sim.device) for x in start_states(platform, batch, seed))
    lo, hi = _bounds(platform)
    centre, span = ((lo + hi) / 2).to(sim.device), (hi - lo).to(sim.device)
    scale = 0.05 * sim.torque_max
    weights = _loss_weights(platform, (batch, steps, platform.n), seed, sim.device)
    params = list(net.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach()

    def loss() -> torch.Tensor:
        q, qd, qs = q0, qd0, []
        for _ in range(steps):
            x = torch.cat([(q - centre) / span, qd / span], -1)
            tau = sim.gravity_torque(q) + scale * torch.tanh(net(x))
            q, qd = sim.step(q, qd, tau)
            qs.append(q)
        return (weights * torch.stack(qs, 1).double()).sum()

    net.zero_grad()
    loss().backward()
    grad = torch.nn.utils.parameters_to_vector([p.grad for p in params])

    def derivative(direction: torch.Tensor, e: float) -> float:
        """Central FD of the loss along the unit vector ``direction`` in weight space."""
        def shifted(step: float) -> torch.Tensor:
            torch.nn.utils.vector_to_parameters(flat + step * direction, params)
            return loss()

        return _fd(shifted, e)

    ratio = float(grad.norm()) / derivative(grad / grad.norm(), eps)
    gen = torch.Generator().manual_seed(seed + 3)
    analytic, numeric = [], []
    for _ in range(directions):
        direction = torch.randn(flat.shape, generator=gen, dtype=flat.dtype).to(sim.device)
        direction = direction / direction.norm()
        analytic.append(float(grad @ direction))
        numeric.append(derivative(direction, eps_random))
    torch.nn.utils.vector_to_parameters(flat, params)
    a, f = np.array(analytic), np.array(numeric)
    return {"ratio_weights": ratio, "ratio_random": (a / f).tolist(),
            "random_rel_error": float(np.linalg.norm(a - f) / np.linalg.norm(f))}


def limit_fd(sim: Simulator, batch: int = 2, steps: int = 32, seed: int = 0,
             eps: float = FD_EPS) -> dict[str, float]:
    """Directional FD with every joint INSIDE its upper penalty limit the whole time.

    Each joint starts half a "depth" past its upper limit (depth = the penetration at which
    the limit spring balances a push of 50 % of the torque bound) and is pushed by gravity
    compensation + that push modulated +-30 % at 2 Hz, so it moves but never leaves the
    limit region (``min_penetration`` > 0, in depths, says so). The loss weights and the
    directions are positive (push harder, start deeper): along a random-sign direction the
    derivative of a stiff spring's small motion cancels down to float32 noise."""
    platform = sim.platform
    gen = torch.Generator().manual_seed(seed + 4)
    lo, hi = (x.to(sim.device) for x in _bounds(platform))
    push = 0.5 * sim.torque_max
    depth = push / sim.settings.limit_ke
    q0 = (hi + 0.5 * depth).expand(batch, platform.n).contiguous()
    qd0 = torch.zeros_like(q0)
    t = torch.arange(steps, device=sim.device)[:, None] * platform.control_dt
    phase = (2 * math.pi * torch.rand(batch, 1, platform.n, generator=gen)).to(sim.device)
    wave = 1 + 0.3 * torch.sin(2 * math.pi * 2.0 * t + phase)
    taus = sim.gravity_torque(q0).detach()[:, None] + push * wave

    def positive(*shape: int) -> torch.Tensor:
        return (0.5 + torch.rand(*shape, generator=gen)).to(sim.device)

    weights = positive(batch, steps, platform.n).double() / (hi - lo).double()
    d_tau = 0.2 * push * positive(batch, steps, platform.n)
    d_q = 0.2 * depth * positive(batch, platform.n)
    d_qd = 0.2 * depth / platform.control_dt * positive(batch, platform.n)
    with torch.no_grad():
        q, _ = sim.replay(q0, qd0, taus)
    res = _directional(sim, taus, q0, qd0, weights, d_tau, d_q, d_qd, eps)
    res["min_penetration"] = float(((q - hi) / depth).min())
    return res


def closed_loop_passes(res: dict) -> bool:
    """The gate of :func:`closed_loop_fd`: the ratio along the gradient in ``FD_GATE`` and
    the random projections within the same 1 %."""
    lo, hi = FD_GATE
    return lo <= res["ratio_weights"] <= hi and res["random_rel_error"] <= CLOSED_LOOP_GATE
