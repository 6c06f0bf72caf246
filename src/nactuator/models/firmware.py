"""The servo firmware's position law, as documented: what duty the servo *commands* for a goal.

DYNAMIXEL/Feetech position mode, P only (BAM's XL330 logs fit it to within a few PWM
counts; ``../shared/data/bam/README.md``)::

    PWM [counts] = kp * (goal - position) [encoder counts] / kp_divisor,  |PWM| <= pwm_limit
    duty = PWM / pwm_limit  in [-1, 1];  0 while torque is off

Everything in it is known before the motion runs: the gain register, the goal and, in a
rollout, the *simulated* angle. A model fed this duty instead of a raw tracking error sees
one input whose meaning does not change with the gain, which is what lets it extrapolate to
a gain it never saw (docs/counterfactual.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch

__all__ = ["FirmwareLaw"]


@dataclass(frozen=True)
class FirmwareLaw:
    """Constants of the position law (``hardware.firmware`` in conf/platform/*.yaml)."""

    counts_per_rev: float = 4096.0
    kp_divisor: float = 256.0
    pwm_limit: float = 885.0

    @classmethod
    def from_config(cls, config: Mapping | None, where: str = "firmware") -> FirmwareLaw:
        if not isinstance(config, Mapping):
            raise ValueError(f"{where}: the commanded-duty feature and the DC-motor actuator "
                             "need the servo's firmware constants (counts_per_rev, kp_divisor, "
                             f"pwm_limit: hardware.firmware in the platform YAML), got {config!r}")
        unknown = sorted(set(config) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; expected "
                             f"{sorted(cls.__dataclass_fields__)}")
        values = {k: float(v) for k, v in config.items()}
        bad = {k: v for k, v in values.items() if not (v > 0 and math.isfinite(v))}
        if bad:
            raise ValueError(f"{where}: firmware constants must be positive numbers, got {bad}")
        return cls(**values)

    def to_config(self) -> dict[str, float]:
        return asdict(self)

    @property
    def duty_per_rad(self) -> float:
        """Duty per radian of error per unit of gain: counts/rad / divisor / PWM limit."""
        return self.counts_per_rev / (2.0 * math.pi) / self.kp_divisor / self.pwm_limit

    def duty(self, goal: torch.Tensor, q: torch.Tensor, kp: torch.Tensor,
             enable: torch.Tensor) -> torch.Tensor:
        """Commanded duty in [-1, 1] (any matching shapes); 0 where ``enable`` is 0."""
        raw = kp * self.duty_per_rad * (goal - q)
        return raw.clamp(-1.0, 1.0) * (enable > 0.5).to(raw.dtype)
