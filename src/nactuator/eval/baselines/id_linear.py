"""Family 2: ID-Linear, ``tau_ext = tau_ID(q, qd, qdd) - (Kt * u + b)``.

Rigid-body inverse dynamics of our platform model (``signals.tau_id``: qdd from the causal
velocity filter) minus the motor torque of the linear current-to-torque calibration, both
through the same causal low-pass (``signals``: filtered dynamics), so the estimate is the
external torque low-passed and delayed by that filter. No friction model: whatever friction
the motor fights shows up as external torque.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nactuator.eval.baselines.calibration import TorqueCalibration
from nactuator.eval.baselines.signals import EpisodeSignals

__all__ = ["IDLinear"]


@dataclass
class IDLinear:
    calibration: TorqueCalibration
    name: str = "id-linear"

    @classmethod
    def fit(cls, train: Sequence[EpisodeSignals], min_correlation: float = 0.3) -> IDLinear:
        return cls(TorqueCalibration.fit(train, min_correlation))

    def joint_torques(self, sig: EpisodeSignals) -> np.ndarray:
        """External joint torque estimate (T, n)."""
        return sig.tau_id - self.calibration.torque(sig.u_f)
