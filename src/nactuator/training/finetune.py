"""Fine-tuning: starting a run from another run's actuator (``model.init_from``, what
``nactuator adapt`` runs) and moving its encoder more slowly than its heads
(``backbone_lr_scale``; 0 freezes it).

The pretrained actuator keeps its architecture, its normalisation statistics (the backbone
learned on inputs normalised with them; new statistics would shift every input the first
layer sees) and its EMA weights; the new data's statistics are only compared with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from nactuator.models import NeuralActuator, load_actuator
from nactuator.models.actuator import upgrade_model_config
from nactuator.training.checkpoints import InitFromError


def load_pretrained(source: str, run_config: dict[str, Any],
                    check: Callable[..., None]) -> tuple[NeuralActuator, dict[str, Any]]:
    """The actuator of ``source`` (EMA weights, raw if the bundle has none) in train mode and
    its model config, after ``check(where, platform, features, config, InitFromError)``
    accepted it; logs which of this run's model settings (``run_config``) are not used."""
    where = f"model.init_from={source}"
    actuator, meta = load_actuator(source, use_ema=True)
    config = upgrade_model_config(actuator.model_config)
    check(where, meta["platform"], list(meta["features"]), config, InitFromError)
    ignored = sorted(k for k in set(config) | set(run_config)
                     if k in run_config and run_config[k] != config.get(k))
    note = (f"; this run's {ignored} are not used (the architecture is the checkpoint's)"
            if ignored else "")
    rank_zero_info(f"[nactuator] {where}: {meta['weights']} weights, architecture "
                   f"{config}{note}")
    return actuator.train(), config


def log_normalisation_shift(source: str, actuator: NeuralActuator, datamodule: Any) -> None:
    """One line: how far the new data's train-split means lie from the checkpoint's
    statistics (the largest shift, in checkpoint standard deviations)."""
    if datamodule is None or getattr(datamodule, "norm_stats", None) is None:
        return
    key, shift = largest_shift(actuator.feature_builder.norm_stats(), datamodule.norm_stats)
    rank_zero_info(f"[nactuator] model.init_from={source}: normalising with the checkpoint's "
                   f"statistics; the new data's train-split mean differs from them by at most "
                   f"{shift:.2f} checkpoint std ({key})")


def largest_shift(reference: dict, other: dict) -> tuple[str, float]:
    """The input channel whose mean moved most from ``reference`` to ``other``, in
    ``reference`` standard deviations (the units the network sees)."""
    worst, where = 0.0, "none"
    for key, ref in reference.items():
        if key not in other:
            continue
        mean = torch.tensor(ref["mean"], dtype=torch.float64)
        std = torch.tensor(ref["std"], dtype=torch.float64).abs().clamp_min(1e-6)
        new = torch.tensor(other[key]["mean"], dtype=torch.float64)
        if new.shape != mean.shape:
            continue
        shift = ((new - mean).abs() / std).nan_to_num(0.0)
        if shift.numel() and float(shift.max()) > worst:
            worst, where = float(shift.max()), f"{key}[{int(shift.argmax())}]"
    return where, worst


def parameter_groups(actuator: NeuralActuator, lr: float, backbone_lr_scale: float = 1.0,
                     physics_lr: float | None = None,
                     condition_lr: float | None = None) -> list[dict[str, Any]]:
    """AdamW parameter groups: the heads at ``lr`` first; then the encoder (backbone) at
    ``lr * backbone_lr_scale`` when that scale is not 1; then a physics actuator's
    constants at ``physics_lr`` (no weight decay) when it is set; then the pooled condition
    head at ``condition_lr`` when it is set. Without any option there is one group, as
    before they existed, so older checkpoints resume with their optimiser state."""
    physics = getattr(actuator, "physics", None)
    physics_params = (list(physics.parameters())
                      if physics is not None and physics_lr is not None else [])
    head = getattr(actuator, "condition_head", None)
    condition_params = (list(head.parameters())
                        if head is not None and condition_lr is not None else [])
    backbone = list(actuator.net.encoder.parameters()) if backbone_lr_scale != 1.0 else []
    taken = {id(p) for p in backbone + physics_params + condition_params}
    heads = [p for p in actuator.parameters() if id(p) not in taken]
    groups = [{"name": "heads" if backbone else "all", "params": heads, "lr": lr}]
    if backbone:
        groups.append({"name": "backbone", "params": backbone, "lr": lr * backbone_lr_scale})
    if physics_params:
        groups.append({"name": "physics", "params": physics_params, "lr": physics_lr,
                       "weight_decay": 0.0})
    if condition_params:
        groups.append({"name": "condition", "params": condition_params, "lr": condition_lr})
    return groups
