"""``nactuator sim-check``: is the simulator's gradient right, and does it agree with MuJoCo?

Three checks, each with the gate the tests use:

- directional central finite differences of a 64-step rollout loss along random directions
  in torque space and in initial-state space: analytic / FD in [0.99, 1.01];
- the same kind of check with the stock (unpatched) solver on :func:`stale_factor_variant`
  of the arm, where the shared scratch-buffer bug is visible (physics.md §3): it must be
  wrong by more than 1 % while the patched solver stays right;
- MuJoCo parity over 2 s of smooth efforts at the same dt: max joint deviation from MuJoCo
  Euler within 2x of MuJoCo's own Euler-vs-RK4 gap on that trajectory (physics.md §7).

Trajectories come from a PD + gravity-compensation tracker run in the simulator itself, so
they are smooth, stay well inside the joint limits (limits are penalty springs whose kinks
would spoil finite differences) and can be replayed open loop.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import torch

from nactuator.platforms import Platform, load_platform
from nactuator.sim.simulator import Simulator

__all__ = [
    "FD_GATE",
    "PARITY_GATE",
    "closed_loop_fd",
    "directional_fd",
    "stale_factor_variant",
    "stock_solver_error",
    "mujoco_parity",
    "run_sim_check",
    "start_states",
    "tracking_torques",
]

FD_GATE = (0.99, 1.01)
PARITY_GATE = 2.0
FD_STEPS = 64
FD_EPS = 3e-2
_TRACK_OMEGA = 2 * math.pi * 1.5  # tracker bandwidth [rad/s]: slow next to every substep


def _bounds(platform: Platform) -> tuple[torch.Tensor, torch.Tensor]:
    lo = torch.tensor([c.limit_lower for c in platform.channels], dtype=torch.float32)
    hi = torch.tensor([c.limit_upper for c in platform.channels], dtype=torch.float32)
    return lo, hi


def start_states(platform: Platform, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Poses in the middle 30 % of every joint range and small velocities, (B, n) each."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = _bounds(platform)
    span = hi - lo
    q0 = (lo + hi) / 2 + 0.3 * span * (torch.rand(batch, platform.n, generator=gen) - 0.5)
    qd0 = 0.02 * span * torch.randn(batch, platform.n, generator=gen)
    return q0.float(), qd0.float()


def tracking_torques(sim: Simulator, q0: torch.Tensor, qd0: torch.Tensor, steps: int,
                     seed: int) -> torch.Tensor:
    """Efforts (B, T, n) from a PD + gravity tracker of a smooth reference around ``q0``."""
    platform = sim.platform
    gen = torch.Generator().manual_seed(seed)
    lo, hi = _bounds(platform)
    span = (hi - lo).to(sim.device)
    batch, n = q0.shape
    t = torch.arange(steps, dtype=torch.float32, device=sim.device)[:, None, None]
    t = t * platform.control_dt
    freq = (0.2 + 0.6 * torch.rand(batch, n, generator=gen)).to(sim.device)
    phase = (2 * math.pi * torch.rand(batch, n, generator=gen)).to(sim.device)
    amp = 0.08 * span
    reference = q0 + amp * (torch.sin(2 * math.pi * freq * t + phase) - torch.sin(phase))
    noise_freq = (0.5 + 1.5 * torch.rand(batch, n, generator=gen)).to(sim.device)
    noise_phase = (2 * math.pi * torch.rand(batch, n, generator=gen)).to(sim.device)
    noise = 0.02 * sim.effort_max * torch.sin(2 * math.pi * noise_freq * t + noise_phase)
    with torch.no_grad():
        inertia = sim.kinematics.joint_inertia(q0.double()).float()
        kp, kd = inertia * _TRACK_OMEGA**2, 2.0 * inertia * _TRACK_OMEGA
        q, qd, taus = q0, qd0, []
        for k in range(steps):
            tau = sim.gravity_torque(q) + kp * (reference[k] - q) - kd * qd + noise[k]
            # 90 % of the bounds: a recorded effort sitting exactly on the simulator's clip
            # would make the rollout one-sidedly non-differentiable there.
            tau = torch.clamp(tau, 0.9 * sim.effort_min, 0.9 * sim.effort_max)
            taus.append(tau)
            q, qd = sim.step(q, qd, tau)
    return torch.stack(taus, 1)


def _loss_weights(platform: Platform, shape: tuple[int, ...], seed: int, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1)
    lo, hi = _bounds(platform)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) / (hi - lo).double()).to(device)


def _rollout_loss(sim: Simulator, taus, q0, qd0, weights) -> torch.Tensor:
    q, qd = sim.rollout(q0, qd0, taus)
    # Sum in float64 so the loss itself adds no float32 round-off to the differences.
    return (weights * q.double()).sum() + 0.1 * (weights * qd.double()).sum()


def _fd(f, eps: float) -> float:
    with torch.no_grad():
        return float((f(eps) - f(-eps)) / (2 * eps))


def _directional(sim: Simulator, taus, q0, qd0, weights, d_tau, d_q, d_qd,
                 eps: float) -> dict[str, float]:
    taus_g, q0_g, qd0_g = (x.clone().requires_grad_(True) for x in (taus, q0, qd0))
    _rollout_loss(sim, taus_g, q0_g, qd0_g, weights).backward()
    analytic_tau = float((taus_g.grad * d_tau).sum())
    analytic_state = float((q0_g.grad * d_q).sum() + (qd0_g.grad * d_qd).sum())
    fd_tau = _fd(lambda e: _rollout_loss(sim, taus + e * d_tau, q0, qd0, weights), eps)
    fd_state = _fd(lambda e: _rollout_loss(sim, taus, q0 + e * d_q, qd0 + e * d_qd, weights), eps)
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
    effort_scale = 0.05 * sim.effort_max
    d_tau = torch.randn(taus.shape, generator=gen).to(sim.device) * effort_scale
    d_tau = d_tau / d_tau.norm() * effort_scale.norm()
    shape = (taus.shape[0], taus.shape[2])
    # Small state directions: an open-loop arm under gravity (Franka) amplifies an initial
    # offset ~20x in 1 s, and the check must stay in the linear regime.
    d_q = 0.01 * span * torch.randn(shape, generator=gen).to(sim.device)
    d_qd = 0.01 * span * torch.randn(shape, generator=gen).to(sim.device)
    return d_tau, d_q, d_qd


def directional_fd(sim: Simulator, batch: int = 2, steps: int = FD_STEPS, seed: int = 0,
                   eps: float = FD_EPS) -> dict[str, float]:
    """Analytic / central-FD ratios of d(loss) along one random torque direction and one
    random initial-state direction, on a tracked ``steps``-step rollout; ``cosine`` compares
    the two (analytic, FD) pairs."""
    q0, qd0 = (x.to(sim.device) for x in start_states(sim.platform, batch, seed))
    taus = tracking_torques(sim, q0, qd0, steps, seed)
    weights = _loss_weights(sim.platform, tuple(taus.shape), seed, sim.device)
    return _directional(sim, taus, q0, qd0, weights, *_directions(sim, taus, seed), eps)


def closed_loop_fd(sim: Simulator, batch: int = 2, steps: int = 32, seed: int = 0,
                   eps: float = FD_EPS) -> dict[str, float]:
    """A small MLP produces the torque from the simulated state at every step (gravity
    compensation + a bounded correction); analytic / FD ratio of d(loss)/d(weights) along a
    random direction in weight space."""
    platform = sim.platform
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(2 * platform.n, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, platform.n)).to(sim.device)
    q0, qd0 = (x.to(sim.device) for x in start_states(platform, batch, seed))
    lo, hi = _bounds(platform)
    centre, span = ((lo + hi) / 2).to(sim.device), (hi - lo).to(sim.device)
    scale = 0.05 * sim.effort_max
    weights = _loss_weights(platform, (batch, steps, platform.n), seed, sim.device)
    params = list(net.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach()
    gen = torch.Generator().manual_seed(seed + 3)
    direction = torch.randn(flat.shape, generator=gen).to(sim.device)
    direction = direction / direction.norm()

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
    analytic = float(grad @ direction)

    def shifted(e: float) -> torch.Tensor:
        torch.nn.utils.vector_to_parameters(flat + e * direction, params)
        return loss()

    numeric = _fd(shifted, eps)
    torch.nn.utils.vector_to_parameters(flat, params)
    return {"ratio_weights": analytic / numeric}


def stale_factor_variant(platform: Platform) -> Platform:
    """The arm with 2 % of its armature, damping and limit gains (kept stable by the same
    rule) and one control step of 32 substeps: the mass matrix then changes a lot within one
    recorded step, which is what exposes the stock solver's stale factor. With the real
    armature (up to 50x the link inertia) the mass matrix hardly moves within a 4-8 substep
    replay, and the bug shrinks to ~1e-4..1e-3 relative."""
    from nactuator.sim.builder import sim_settings

    settings = sim_settings(platform)
    channels = tuple(dataclasses.replace(c, armature=0.02 * c.armature, damping=0.02 * c.damping)
                     for c in platform.channels)
    sim = dict(platform.sim, limit_ke=0.02 * settings.limit_ke, limit_kd=0.02 * settings.limit_kd)
    return dataclasses.replace(platform, channels=channels, sim=sim, substeps=32,
                               control_dt=32 * platform.substep_dt,
                               name=f"{platform.name}-stale-factor")


def stock_solver_error(platform: Platform, device: str = "cpu", seed: int = 0) -> dict[str, float]:
    """Worst |analytic / FD - 1| of the torque and initial-state directional derivatives over
    one fast control step of :func:`stale_factor_variant` (arm swinging from mid-range at
    3 rad/s, gravity held), for the stock solver and for ours."""
    variant = stale_factor_variant(platform)
    out = {}
    for label, fix in (("stock", False), ("patched", True)):
        sim = Simulator(variant, device, gradient_fix=fix)
        q0, _ = (x.to(sim.device) for x in start_states(variant, 2, seed))
        signs = torch.tensor([(-1.0) ** i for i in range(variant.n)], device=sim.device)
        revolute = torch.tensor([float(c.kind == "revolute") for c in variant.channels],
                                device=sim.device)
        qd0 = (3.0 * signs * revolute).expand_as(q0).contiguous()
        taus = sim.gravity_torque(q0).detach()[:, None, :]
        weights = _loss_weights(variant, tuple(taus.shape), seed, sim.device)
        d_tau, d_q, d_qd = _directions(sim, taus, seed)
        # Leave light prismatic fingers alone: a push on 3 g over 32 substeps hits the limits.
        d_tau, d_q, d_qd = d_tau * revolute, d_q * revolute, d_qd * revolute
        res = _directional(sim, taus, q0, qd0, weights, d_tau, d_q, d_qd, FD_EPS)
        out[label] = max(abs(res["ratio_torques"] - 1.0), abs(res["ratio_initial_state"] - 1.0))
    return out


def mujoco_parity(sim: Simulator, seconds: float = 2.0, batch: int = 2,
                  seed: int = 0) -> dict[str, float]:
    """Newton vs MuJoCo under the same efforts at the same dt, against MuJoCo's own
    Euler-vs-RK4 gap on that trajectory.

    The matched reference is MuJoCo Euler with explicit damping (``eulerdamp`` off), which
    is Featherstone's scheme; MuJoCo's default Euler (implicit damping) is reported too.
    Revolute channels give the figures (rad); prismatic channels (m) enter ``ratio`` on
    their own where their gap exceeds 1 um."""
    from nactuator.sim.parity import mujoco_rollout

    platform = sim.platform
    steps = int(round(seconds / platform.control_dt))
    q0, qd0 = (x.to(sim.device) for x in start_states(platform, batch, seed))
    taus = tracking_torques(sim, q0, qd0, steps, seed)
    with torch.no_grad():
        q_newton, _ = sim.rollout(q0, qd0, taus)
    q_newton = q_newton.cpu().double().numpy()
    q0n, qd0n, tn = (x.cpu().double().numpy() for x in (q0, qd0, taus))

    def mujoco(integrator: str) -> np.ndarray:
        return np.stack([mujoco_rollout(platform, q0n[b], qd0n[b], tn[b], integrator)
                         for b in range(batch)])

    explicit, implicit, rk4 = mujoco("euler_explicit_damping"), mujoco("euler"), mujoco("rk4")
    worst = lambda a, b: np.abs(a - b).max(axis=(0, 1))  # noqa: E731  per channel
    dev, gap = worst(q_newton, explicit), worst(explicit, rk4)
    revolute = np.array([c.kind == "revolute" for c in platform.channels])
    ratios = [dev[revolute].max() / gap[revolute].max()]
    if (~revolute).any() and gap[~revolute].max() > 1e-6:
        ratios.append(dev[~revolute].max() / gap[~revolute].max())
    return {
        "max_dev": float(dev[revolute].max()),
        "euler_rk4_gap": float(gap[revolute].max()),
        "ratio": float(max(ratios)),
        "per_joint_dev": dev.tolist(),
        "per_joint_gap": gap.tolist(),
        "max_dev_vs_implicit_euler": float(worst(q_newton, implicit)[revolute].max()),
        "max_dev_vs_rk4": float(worst(q_newton, rk4)[revolute].max()),
        "implicit_euler_rk4_gap": float(worst(implicit, rk4)[revolute].max()),
    }


def run_sim_check(platform: str, device: str = "cpu") -> dict:
    """Run every check on one platform; ``passed`` is True only if every gate holds."""
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    plat = load_platform(platform)
    sim = Simulator(plat, device)
    timings["build_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    fd = directional_fd(sim)
    timings["fd_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    stock = stock_solver_error(plat, device) if plat.n > 1 else None
    timings["stock_solver_s"] = time.perf_counter() - clock

    clock = time.perf_counter()
    parity = mujoco_parity(sim)
    timings["parity_s"] = time.perf_counter() - clock

    lo, hi = FD_GATE
    gates = {
        "fd_torques": lo <= fd["ratio_torques"] <= hi,
        "fd_initial_state": lo <= fd["ratio_initial_state"] <= hi,
        "parity": parity["ratio"] <= PARITY_GATE,
    }
    if stock is not None:
        # A 1-DoF arm has a constant mass matrix, so there the bug cannot show.
        gates["stock_solver_differs"] = stock["stock"] > 1e-2 and stock["patched"] < 1e-2
    passed = all(gates.values())
    lines = [
        f"sim-check {plat.name} on {device}: {'PASSED' if passed else 'FAILED'}",
        f"  FD ratio, torques        {fd['ratio_torques']:.5f}  (gate {lo}..{hi})",
        f"  FD ratio, initial state  {fd['ratio_initial_state']:.5f}  (gate {lo}..{hi})",
        f"  FD cosine                {fd['cosine']:.6f}",
        "  stock solver rel. error  "
        + ("n/a (1 DoF: constant mass matrix)" if stock is None else
           f"{stock['stock']:.3g} vs patched {stock['patched']:.3g} (stale-factor variant)"),
        f"  MuJoCo parity, 2 s       max |dq| vs MuJoCo Euler (explicit damping) "
        f"{parity['max_dev']:.3g} rad; MuJoCo Euler-RK4 gap {parity['euler_rk4_gap']:.3g} rad: "
        f"ratio {parity['ratio']:.3g} (gate <= {PARITY_GATE})",
        f"                           (vs MuJoCo default Euler, implicit damping: "
        f"{parity['max_dev_vs_implicit_euler']:.3g} rad; vs RK4: {parity['max_dev_vs_rk4']:.3g})",
        "  timings [s]              " + ", ".join(f"{k} {v:.2f}" for k, v in timings.items()),
    ]
    return {
        "platform": plat.name,
        "device": device,
        "passed": passed,
        "gates": gates,
        "summary": "\n".join(lines),
        "fd_ratio_torques": fd["ratio_torques"],
        "fd_ratio_initial_state": fd["ratio_initial_state"],
        "fd_cosine": fd["cosine"],
        "parity_max_dev": parity["max_dev"],
        "parity_mujoco_euler_rk4_gap": parity["euler_rk4_gap"],
        "parity_ratio": parity["ratio"],
        "parity_per_joint_dev": parity["per_joint_dev"],
        "parity_dev_vs_implicit_euler": parity["max_dev_vs_implicit_euler"],
        "parity_dev_vs_rk4": parity["max_dev_vs_rk4"],
        "stock_solver_rel_error": None if stock is None else stock["stock"],
        "patched_solver_rel_error": None if stock is None else stock["patched"],
        "stability": sim.stability,
        "timings": timings,
    }
