"""Horizon curriculum: short rollouts first, longer ones once the model is stable.

Backpropagating through hundreds of simulator steps from a random model explodes or
vanishes; starting short and lengthening the rollout is what the reference trainer does
(SPEC §5: 128 → 256 → 320 control steps). The schedule maps the first epoch of each stage
to its horizon, e.g. ``{0: 128, 20: 256, 40: 320}``.
"""

from __future__ import annotations

from collections.abc import Mapping


class HorizonCurriculum:
    def __init__(self, schedule: Mapping[int, int]) -> None:
        if not schedule:
            raise ValueError("data.horizon is an empty schedule: expected a number or e.g. "
                             "{0: 128, 20: 256}")
        stages: list[tuple[int, int]] = []
        for epoch, horizon in schedule.items():
            epoch, horizon = _as_int(epoch, "epoch"), _as_int(horizon, "horizon")
            if epoch < 0:
                raise ValueError(f"data.horizon: epoch must be >= 0, got {epoch}")
            if horizon < 1:
                raise ValueError(f"data.horizon: horizon at epoch {epoch} must be >= 1, "
                                 f"got {horizon}")
            stages.append((epoch, horizon))
        stages.sort()
        if stages[0][0] != 0:
            raise ValueError(
                f"data.horizon must start at epoch 0, got first epoch {stages[0][0]} "
                f"in {dict(stages)}"
            )
        self.stages = stages

    def horizon_at(self, epoch: int) -> int:
        """The horizon for ``epoch`` (0-based): that of the last stage started by then."""
        horizon = self.stages[0][1]
        for start, h in self.stages:
            if epoch >= start:
                horizon = h
        return horizon

    @property
    def max_horizon(self) -> int:
        return max(h for _, h in self.stages)

    @property
    def changes(self) -> bool:
        return len({h for _, h in self.stages}) > 1

    def __repr__(self) -> str:
        return f"HorizonCurriculum({dict(self.stages)})"


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"data.horizon: {what} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError as e:
        raise ValueError(f"data.horizon: {what} must be an integer, got {value!r}") from e
