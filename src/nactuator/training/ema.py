"""Exponential moving average of a module's parameters.

The EMA copy is what validation, test and export use: it is smoother than the raw weights
that the optimiser is still moving. Only floating-point parameters are averaged; buffers
(e.g. normalisation statistics) are never trained, so they are taken as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class EMA:
    """``shadow ← decay · shadow + (1 − decay) · param`` after every optimiser step.

    The effective decay ramps up as ``min(decay, (1 + n) / (10 + n))`` over the first
    updates, so early averages are not dominated by the random initialisation.
    """

    def __init__(self, module: nn.Module, decay: float = 0.999) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay!r}")
        self.decay = decay
        self.num_updates = 0
        self.shadow: dict[str, torch.Tensor] = {
            name: p.detach().clone() for name, p in module.named_parameters()
        }

    def current_decay(self) -> float:
        n = self.num_updates
        return min(self.decay, (1.0 + n) / (10.0 + n))

    @torch.no_grad()
    def update(self, module: nn.Module) -> None:
        decay = self.current_decay()
        for name, p in module.named_parameters():
            shadow = self.shadow[name]
            if shadow.device != p.device:
                shadow = self.shadow[name] = shadow.to(p.device)
            shadow.lerp_(p.detach(), 1.0 - decay)
        self.num_updates += 1

    @torch.no_grad()
    def copy_to(self, module: nn.Module) -> None:
        for name, p in module.named_parameters():
            p.copy_(self.shadow[name])

    @torch.no_grad()
    def swap_in(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Load the EMA weights into ``module``; returns the raw weights for :meth:`restore`."""
        raw = {name: p.detach().clone() for name, p in module.named_parameters()}
        self.copy_to(module)
        return raw

    @staticmethod
    @torch.no_grad()
    def restore(module: nn.Module, raw: dict[str, torch.Tensor]) -> None:
        for name, p in module.named_parameters():
            p.copy_(raw[name])

    @contextmanager
    def swapped_in(self, module: nn.Module) -> Iterator[None]:
        """Temporarily load the EMA weights into ``module``, restoring the raw ones after."""
        raw = self.swap_in(module)
        try:
            yield
        finally:
            self.restore(module, raw)

    def averaged_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """``module.state_dict()`` with every parameter replaced by its EMA (CPU tensors)."""
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        for name, value in self.shadow.items():
            state[name] = value.detach().cpu().clone()
        return state

    def state_dict(self) -> dict:
        return {
            "decay": self.decay,
            "num_updates": self.num_updates,
            "shadow": {k: v.detach().cpu().clone() for k, v in self.shadow.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.shadow) - set(state["shadow"])
        unexpected = set(state["shadow"]) - set(self.shadow)
        if missing or unexpected:
            raise ValueError(
                f"EMA state does not match the model: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
        self.decay = float(state["decay"])
        self.num_updates = int(state["num_updates"])
        for name, value in state["shadow"].items():
            target = self.shadow[name]
            if target.shape != value.shape:
                raise ValueError(
                    f"EMA tensor '{name}' has shape {tuple(value.shape)}, "
                    f"model expects {tuple(target.shape)}"
                )
            self.shadow[name] = value.to(device=target.device, dtype=target.dtype).clone()
