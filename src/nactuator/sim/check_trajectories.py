"""The trajectories ``nactuator sim-check`` runs: start states well inside the joint ranges,
and torques from a PD + gravity-compensation tracker run in the simulator itself, so they
are smooth, stay well inside the joint limits (limits are penalty springs whose kinks would
spoil finite differences) and can be replayed open loop. ``bench/`` uses the same starts.
"""

from __future__ import annotations

import math

import torch

from nactuator.platforms import Platform
from nactuator.sim.simulator import Simulator

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
    noise = 0.02 * sim.torque_max * torch.sin(2 * math.pi * noise_freq * t + noise_phase)
    with torch.no_grad():
        inertia = sim.kinematics.joint_inertia(q0.double()).float()
        kp, kd = inertia * _TRACK_OMEGA**2, 2.0 * inertia * _TRACK_OMEGA
        q, qd, taus = q0, qd0, []
        for k in range(steps):
            tau = sim.gravity_torque(q) + kp * (reference[k] - q) - kd * qd + noise[k]
            # 90 % of the bounds: a recorded torque sitting exactly on the simulator's clip
            # would make the replay one-sidedly non-differentiable there.
            tau = torch.clamp(tau, 0.9 * sim.torque_min, 0.9 * sim.torque_max)
            taus.append(tau)
            q, qd = sim.step(q, qd, tau)
    return torch.stack(taus, 1)
