"""Family 4: the generalized momentum observer (De Luca & Mattone, ICRA 2005).

With ``p = M(q) qd`` and ``Mdot = C + C^T`` the arm obeys
``pdot = tau_motor + C(q, qd)^T qd - g(q) + tau_ext``, which needs no acceleration. The
residual

    r(t) = K_O * ( p(t) - p(0) - integral_0^t (tau_motor + C^T qd - g + r) ds )

follows ``rdot = K_O (tau_ext - r)``: a first-order low-pass of the external torque with
time constant ``1 / K_O``. ``tau_motor`` is the linear current-to-torque calibration
(``Kt * u + b``, as for ID-Linear: method ``gmo``, the paper's) or ID-Friction's motor model
with friction and dead zone (method ``gmo-friction``); ``K_O`` is ``momentum_observer.gain`` in
``conf/eval/baselines.yaml`` (10 1/s: 0.1 s time constant, slow enough to average the
quantised velocity of the SO-101, fast enough to follow a 1-2 s payload carry).

Discrete form over the recorded frame steps, r(0) = 0: the measured part of the integrand
(tau_motor - beta, known at both ends of a step) by the trapezoid rule, the residual's own
feedback by forward Euler. Only frames up to the current one are used (causal); it is stable
for ``K_O * dt < 2``. (Forward Euler on the measured part too lags it by one frame, which on
a 1 Hz, 0.8 rad motion of the SO-101 leaves a residual as large as the whole C^T qd term.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from nactuator.eval.baselines.calibration import TorqueCalibration
from nactuator.eval.baselines.id_friction import FrictionModel
from nactuator.eval.baselines.signals import EpisodeSignals
from nactuator.eval.episodes import EvalDataError

__all__ = ["MomentumObserver", "momentum_residual"]


def momentum_residual(p: np.ndarray, beta: np.ndarray, tau_motor: np.ndarray,
                      step_dt: np.ndarray, gain: float) -> np.ndarray:
    """r (T, n) from momentum p, beta = g - C^T qd, motor torque (all (T, n)) and the frame
    steps ``step_dt`` (T,) (``step_dt[k]`` = time from frame k-1 to k)."""
    if np.any(gain * step_dt[1:] >= 2.0):
        raise EvalDataError(f"momentum_observer.gain = {gain} 1/s is unstable at frame steps "
                            f"up to {step_dt[1:].max():.4f} s (needs gain * dt < 2)")
    r = np.zeros_like(p)
    integral = np.zeros(p.shape[1])
    known = tau_motor - beta  # both measured at their frame: a trapezoid over each step
    for k in range(1, len(p)):
        integral += (0.5 * (known[k - 1] + known[k]) + r[k - 1]) * step_dt[k]
        r[k] = gain * (p[k] - p[0] - integral)
    return r


@dataclass
class MomentumObserver:
    """``motor(sig)`` -> (T, n) motor torque at the joints from the recorded effort."""

    motor: Callable[[EpisodeSignals], np.ndarray]
    gain: float
    dynamics: object  # nactuator.sim.dynamics.ArmDynamics
    name: str = "gmo"

    @classmethod
    def linear(cls, calibration: TorqueCalibration, gain: float, dynamics) -> MomentumObserver:
        """The paper's observer: the linear current-to-torque map."""
        return cls(lambda sig: calibration.torque(sig.u), gain, dynamics, "gmo")

    @classmethod
    def with_friction(cls, friction: FrictionModel, gain: float, dynamics) -> MomentumObserver:
        """The observer fed ID-Friction's motor model (friction and dead zone)."""
        return cls(lambda sig: friction.motor_torque(sig.u, sig.qd), gain, dynamics,
                   "gmo-friction")

    def joint_torques(self, sig: EpisodeSignals) -> np.ndarray:
        """External joint torque estimate (T, n): the observer residual."""
        q, qd = torch.from_numpy(sig.q), torch.from_numpy(sig.qd)
        with torch.no_grad():
            p = self.dynamics.momentum(q, qd).numpy()
            beta = (self.dynamics.gravity_torque(q)
                    - self.dynamics.coriolis_transpose_qd(q, qd)).numpy()
        return momentum_residual(p, beta, self.motor(sig), sig.step_dt, self.gain)
