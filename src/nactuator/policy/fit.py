"""``policy fit``: behaviour cloning of the demonstrations, one policy per task and input
condition, each a :class:`PolicyModule` trained with Lightning on one core.

A training sample is the ``history`` feature frames ending at step k (frames before the
episode start repeat its first frame, as the controller's buffer does at the start of a
rollout), each with the episode phase appended (``sensing.phase``), and the expert's
command at k (absolute joint goals, as ACT predicts them: an
offset from the measured q would make the closed loop integrate every bias of the offset
into a drift). Features and commands are normalised with the demonstrations' mean and
standard deviation, stored in the policy file.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from nactuator.atomic import atomic_path
from nactuator.errors import UserError
from nactuator.platforms import load_platform

from .network import PolicyModule
from .sensing import CONDITIONS, phase
from .task_world import TASKS

__all__ = ["POLICY_FORMAT", "fit_policies", "history_windows", "policy_path"]

POLICY_FORMAT = "nactuator-policy/1"


def policy_path(folder: str | Path, task: str, condition: str) -> Path:
    return Path(folder) / f"{task}-{condition}.pt"


def history_windows(features: np.ndarray, history: int) -> np.ndarray:
    """(T, E, d) -> (T * E, history, d): at step k frames k − history + 1 .. k, the first
    frame repeated before the start."""
    T = features.shape[0]
    idx = np.clip(np.arange(T)[:, None] - history + 1 + np.arange(history), 0, None)
    win = features[idx]  # (T, history, E, d)
    return np.ascontiguousarray(win.transpose(0, 2, 1, 3).reshape(-1, history,
                                                                  features.shape[-1]))


def _stats(x: np.ndarray) -> dict[str, np.ndarray]:
    flat = x.reshape(-1, x.shape[-1])
    return {"mean": flat.mean(0), "std": np.maximum(flat.std(0), 1e-4)}


def fit_one(features: np.ndarray, actions: np.ndarray, cfg: Mapping, task: str,
            condition: str, out: Path) -> dict:
    """Train one policy on (T, E, d) features and (T, E, n) commands; write ``out``."""
    pc = cfg["policy"]
    h = int(pc["history"])
    seconds = float(cfg["tasks"][task]["seconds"])
    dt = load_platform(cfg["platform"]).control_dt  # the demos' frame period
    clock = phase(np.arange(features.shape[0]) * dt, seconds)
    features = np.concatenate([features, np.broadcast_to(
        clock[:, None, None], (*features.shape[:2], 1))], axis=2)
    fs, as_ = _stats(features), _stats(actions)
    x = history_windows((features - fs["mean"]) / fs["std"], h).astype(np.float32)
    y = ((actions - as_["mean"]) / as_["std"]).reshape(-1, actions.shape[-1]).astype(np.float32)
    torch.manual_seed(int(pc["seed"]))
    gen = torch.Generator().manual_seed(int(pc["seed"]))
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                        batch_size=int(pc["batch_size"]), shuffle=True, generator=gen)
    hp = dict(d_in=x.shape[-1], n_out=y.shape[-1], history=h, width=int(pc["width"]),
              depth=int(pc["depth"]), heads=int(pc["heads"]), lr=float(pc["lr"]),
              weight_decay=float(pc["weight_decay"]), max_steps=int(pc["max_steps"]))
    module = PolicyModule(**hp)
    trainer = L.Trainer(max_steps=hp["max_steps"], accelerator="cpu", devices=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    started = time.perf_counter()
    trainer.fit(module, loader)
    with torch.no_grad():
        module.eval()
        pick = torch.from_numpy(x[:: max(1, len(x) // 4096)])
        target = torch.from_numpy(y[:: max(1, len(y) // 4096)])
        loss = float(torch.nn.functional.mse_loss(module.net(pick), target))
    payload = {"format": POLICY_FORMAT, "task": task, "condition": condition,
               "platform": cfg["platform"], "hparams": hp,
               "seconds_per_episode": float(cfg["tasks"][task]["seconds"]),
               "feature_stats": {k: v.tolist() for k, v in fs.items()},
               "action_stats": {k: v.tolist() for k, v in as_.items()},
               "state_dict": module.net.state_dict(), "train_mse": loss,
               "seconds": time.perf_counter() - started, "samples": len(x)}
    with atomic_path(out) as tmp:
        torch.save(payload, tmp)
    return payload


def fit_policies(cfg: Mapping, demos: str | Path, out: str | Path,
                 tasks: Sequence[str] = TASKS,
                 conditions: Sequence[str] = CONDITIONS) -> str:
    """Fit every (task, condition) policy from ``demos`` (``policy demos``' folder)."""
    path = Path(demos) / "demos.npz"
    if not path.is_file():
        raise UserError(f"{path}: no demonstrations (run `nactuator policy demos` first)")
    data = np.load(path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for task in tasks:
        for c in conditions:
            key = f"{task}/{c}"
            if key not in data:
                raise UserError(f"{path}: no features {key!r}")
            r = fit_one(data[key], data[f"{task}/command"], cfg, task, c,
                        policy_path(out, task, c))
            lines.append(f"{task}/{c}: train mse {r['train_mse']:.3f} in {r['seconds']:.0f} s")
    return "policy fit: " + "; ".join(lines) + f"; policies in {out}"
