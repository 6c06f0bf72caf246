"""The learning-rate schedule: linear warm-up from 0, then a cosine down to a floor."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["warmup_cosine"]


def warmup_cosine(warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0
                  ) -> Callable[[int], float]:
    """The factor on the peak learning rate at optimiser step ``step``: ``(step + 1) /
    (warmup + 1)`` during the warm-up, then a half cosine from 1 to ``min_lr_ratio`` at
    ``total_steps``, and the floor after it."""
    total = max(int(total_steps), 1)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = min((step - warmup_steps) / max(total - warmup_steps, 1), 1.0)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
