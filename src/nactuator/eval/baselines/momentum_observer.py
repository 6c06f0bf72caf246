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

The observer itself (discrete form, stability) is :func:`nactuator.sim.dynamics.
observer_torque`, which the contact residual uses too (docs/contact.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nactuator.eval.baselines.calibration import TorqueCalibration
from nactuator.eval.baselines.id_friction import FrictionModel
from nactuator.eval.baselines.signals import EpisodeSignals
from nactuator.eval.episodes import EvalDataError
from nactuator.sim.dynamics import observer_torque

__all__ = ["MomentumObserver"]


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
        try:
            return observer_torque(self.dynamics, sig.q, sig.qd, self.motor(sig), sig.step_dt,
                                   self.gain)
        except ValueError as e:  # an unstable gain for these frame steps
            raise EvalDataError(f"momentum_observer.gain: {e}") from None
