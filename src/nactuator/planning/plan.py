"""Planning through the model: which commands make the arm follow a target trajectory?

Sending the target itself as the goal leaves a position servo behind it: the P law needs an
error to make torque, gravity sags the arm, the motor saturates and lags. A counterfactual
actuator model (docs/counterfactual.md) predicts the joint torque for *any* command
sequence from what is known before execution, and the simulator turns torque into motion,
both differentiably. So the commands ``u`` (T, n) are optimised by gradient descent (Adam)::

    J(u) = mean_t,j (q_sim(u)[t] - q_target[t])^2 + smoothness * mean_t,j (u[t+1] - u[t])^2

where ``q_sim(u)`` is the one whole-episode rollout (:func:`nactuator.rollout.rollout_episodes`)
started at rest at the target's first point, with the model reading the commands, the
simulated state and the exogenous inputs (gain, supply voltage, temperature before the
motion). The search starts from ``u = target``.

With ``world`` given, both command sequences (the target as sent, and the optimised one) are
replayed in the hidden ground-truth world (:func:`nactuator.data.synth.replay_commands`) and the
*real* tracking errors are reported: the model's own prediction is not evidence.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nactuator.atomic import atomic_path, json_safe, write_json, write_png, write_text
from nactuator.errors import UserError
from nactuator.models import load_actuator
from nactuator.platforms import Platform, load_platform
from nactuator.rollout import rollout_episodes

__all__ = ["PlanError", "PlanResult", "optimise_commands", "plan", "read_target"]

TIME_TOLERANCE = 1e-3  # s: target times must sit on the control grid within this


class PlanError(UserError, ValueError):
    """The plan cannot be made; the message says why."""


@dataclass
class PlanResult:
    """Commands and the model's predictions, (T, n) float64 arrays."""

    target: np.ndarray
    commands: np.ndarray  # optimised
    predicted_naive: np.ndarray  # the model's q for u = target
    predicted_plan: np.ndarray  # the model's q for the optimised u
    objective: list[float] = field(default_factory=list)  # J per iteration

    @property
    def model_mae_naive(self) -> float:
        return float(np.abs(self.predicted_naive[1:] - self.target[1:]).mean())

    @property
    def model_mae_plan(self) -> float:
        return float(np.abs(self.predicted_plan[1:] - self.target[1:]).mean())


def read_target(path: str | os.PathLike, platform: Platform) -> np.ndarray:
    """A target CSV -> (T, n) joint positions on the platform's control grid.

    Columns: ``time`` (s, from 0 in steps of the platform's ``control_dt``) and one column per
    channel name (``platform.channel_names``)."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"target file {path} does not exist")
    try:
        table = pd.read_csv(path)
    except (ValueError, pd.errors.ParserError) as err:
        raise PlanError(f"{path}: not a CSV file ({err})") from err
    missing = [c for c in ["time", *platform.channel_names] if c not in table.columns]
    if missing:
        raise PlanError(f"{path}: missing column(s) {missing}; expected 'time' and one column "
                        f"per channel {platform.channel_names}")
    if len(table) < 2:
        raise PlanError(f"{path}: {len(table)} row(s); a target needs at least 2")
    t = table["time"].to_numpy(np.float64)
    grid = np.arange(len(t)) * platform.control_dt
    if not np.isfinite(t).all() or np.abs(t - t[0] - grid).max() > TIME_TOLERANCE:
        raise PlanError(f"{path}: 'time' must advance by the control step {platform.control_dt}"
                        f" s per row ({platform.name}); resample the target onto that grid")
    q = table[platform.channel_names].to_numpy(np.float64)
    if not np.isfinite(q).all():
        row = int(np.argwhere(~np.isfinite(q))[0, 0])
        raise PlanError(f"{path}: non-finite target value at data row {row + 1}")
    return q


def _frames(commands: torch.Tensor, target: torch.Tensor,
            exogenous: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One episode's frames: the commands (with gradient) and what is fixed beforehand."""
    length = commands.shape[0]
    frames = {
        "q_cmd": commands,
        "q_cmd_next": torch.cat([commands[1:], commands[-1:]]),
        "torque_enable": torch.ones_like(commands),
        "q": target,  # frame 0 is the start state; the rollout simulates the rest
        "qd": torch.zeros_like(target),
    }
    for key, value in exogenous.items():
        frames[key] = value.reshape(1, -1).expand(length, -1)
    return frames


@contextmanager
def frozen(module: torch.nn.Module) -> Iterator[None]:
    """The module's weights out of autograd inside the block: only the commands are optimised."""
    for p in module.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in module.parameters():
            p.requires_grad_(True)


def _rollout(actuator, sim, commands: torch.Tensor, target: torch.Tensor,
             exogenous: dict[str, torch.Tensor]) -> torch.Tensor:
    r = rollout_episodes(actuator, sim.step, [_frames(commands, target, exogenous)], grad=True)
    return r.q[0]


def optimise_commands(actuator, sim, target: np.ndarray, exogenous: dict[str, np.ndarray],
                      iterations: int = 200, lr: float = 0.02,
                      smoothness: float = 1e-3) -> PlanResult:
    """Gradient descent on the command sequence (see the module docstring)."""
    if actuator.mode != "counterfactual":
        raise PlanError(f"the checkpoint reads recorded telemetry ({actuator.inputs}), which "
                        "does not exist for commands never executed: plan with a "
                        "counterfactual model (docs/counterfactual.md)")
    needed = [k for k in ("kp", "supply_voltage", "initial_temperature") if k in actuator.inputs]
    absent = [k for k in needed if k not in exogenous]
    if absent:
        flags = {"kp": "--kp", "supply_voltage": "--supply-voltage",
                 "initial_temperature": "--temperature"}
        raise PlanError(f"the model reads {absent}, known before execution: give "
                        f"{', '.join(flags[k] for k in absent)} (or --world to read them)")
    device = sim.device
    tgt = torch.tensor(np.asarray(target), dtype=torch.float32, device=device)
    exo = {k: torch.as_tensor(np.broadcast_to(exogenous[k], (tgt.shape[1],)).copy(),
                              dtype=torch.float32, device=device) for k in needed}
    commands = tgt.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([commands], lr=lr)
    objective: list[float] = []
    with frozen(actuator):
        with torch.no_grad():
            naive = _rollout(actuator, sim, tgt, tgt, exo)
        best, best_value = tgt.clone(), float(((naive[1:] - tgt[1:]) ** 2).mean())
        for _ in range(iterations):
            q = _rollout(actuator, sim, commands, tgt, exo)
            tracking = ((q[1:] - tgt[1:]) ** 2).mean()
            value = tracking + smoothness * ((commands[1:] - commands[:-1]) ** 2).mean()
            objective.append(float(value.detach()))
            if float(tracking.detach()) < best_value:  # keep the best commands seen, not the last
                best_value, best = float(tracking.detach()), commands.detach().clone()
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
        with torch.no_grad():
            planned = _rollout(actuator, sim, best, tgt, exo)
    as_np = lambda t: t.detach().cpu().numpy().astype(np.float64)  # noqa: E731
    return PlanResult(target=np.asarray(target, np.float64), commands=as_np(best),
                      predicted_naive=as_np(naive), predicted_plan=as_np(planned),
                      objective=objective)


def _plot(result: PlanResult, world: dict | None, names: list[str], dt: float,
          path: Path) -> Path:
    from matplotlib.figure import Figure

    n = result.target.shape[1]
    t = np.arange(len(result.target)) * dt
    fig = Figure(figsize=(10, 2.6 * n + 0.6))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for j, ax in enumerate(axes):
        ax.plot(t, result.target[:, j], color="k", lw=1.4, label="target")
        ax.plot(t, result.commands[:, j], color="tab:green", lw=0.8, ls="--",
                label="optimised command")
        if world is not None:
            ax.plot(t, world["naive"][:, j], color="tab:orange", lw=1.0,
                    label="world: target sent as command")
            ax.plot(t, world["plan"][:, j], color="tab:blue", lw=1.0,
                    label="world: optimised command")
        else:
            ax.plot(t, result.predicted_naive[:, j], color="tab:orange", lw=1.0,
                    label="model: target sent as command")
            ax.plot(t, result.predicted_plan[:, j], color="tab:blue", lw=1.0,
                    label="model: optimised command")
        ax.set_ylabel(f"{names[j]}", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time [s]", fontsize=8)
    fig.tight_layout()
    return write_png(path, fig)


def _markdown(result: dict) -> str:
    lines = ["# Planning through the counterfactual model", "",
             f"checkpoint `{result['checkpoint']}`, target `{result['target']}` "
             f"({result['frames']} frames), {result['iterations']} iterations "
             f"in {result['wall_time_s']:.0f} s.", "",
             "| tracking MAE [mrad or mm] | target sent as command | optimised commands | "
             "ratio |", "|---|---|---|---|"]
    for where in ("model", "world"):
        row = result.get(where)
        if row:
            lines.append(f"| {row['label']} | {1000 * row['naive']:.2f} | "
                         f"{1000 * row['plan']:.2f} | {row['ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


def plan(ckpt: str | os.PathLike, target: str | os.PathLike, out: str | os.PathLike | None = None,
         iterations: int = 200, lr: float = 0.02, smoothness: float = 1e-3,
         kp: float | None = None, supply_voltage: float | None = None,
         temperature: float | None = None, world: str | None = None, world_seed: int = 0,
         device: str = "cpu") -> str:
    """``nactuator plan``: optimise, optionally replay in the hidden world, write the results.

    ``world`` (a world YAML, or ``"default"``) also supplies what the flags leave out: the
    world's gain, and the supply voltage and temperature read before the motion."""
    from nactuator.data.synth import replay_commands
    from nactuator.sim import Simulator

    t0 = time.perf_counter()
    actuator, meta = load_actuator(ckpt, map_location=device)
    platform = load_platform(meta["platform"])
    q_target = read_target(target, platform)
    world_file = None if world in (None, "default") else world
    exogenous: dict[str, np.ndarray] = {}
    if world is not None:
        before = replay_commands(platform, q_target[None, :1], q_target[0], world_file,
                                 world_seed, kp=kp, temperature=temperature)
        exogenous = {"kp": before["kp"], "supply_voltage": before["voltage"][0, 0],
                     "initial_temperature": before["temperature"][0, 0]}
    for key, value in (("kp", kp), ("supply_voltage", supply_voltage),
                       ("initial_temperature", temperature)):
        if value is not None:
            exogenous[key] = np.full(platform.n, float(value))
    sim = Simulator(platform, device=device)
    result = optimise_commands(actuator, sim, q_target, exogenous, iterations, lr, smoothness)
    report: dict = {
        "checkpoint": str(ckpt), "target": str(target), "frames": len(q_target),
        "iterations": iterations, "lr": lr, "smoothness": smoothness,
        "exogenous": {k: np.asarray(v).tolist() for k, v in exogenous.items()},
        "model": {"label": "model (simulated)", "naive": result.model_mae_naive,
                  "plan": result.model_mae_plan,
                  "ratio": result.model_mae_naive / max(result.model_mae_plan, 1e-12)},
    }
    world_q = None
    if world is not None:
        logs = replay_commands(platform, np.stack([q_target, result.commands]), q_target[0],
                               world_file, world_seed, kp=kp, temperature=temperature)
        world_q = {"naive": logs["q"][0], "plan": logs["q"][1]}
        naive = float(np.abs(world_q["naive"][1:] - q_target[1:]).mean())
        planned = float(np.abs(world_q["plan"][1:] - q_target[1:]).mean())
        report["world"] = {"label": f"hidden world (seed {world_seed})", "naive": naive,
                           "plan": planned, "ratio": naive / max(planned, 1e-12),
                           "source": world or "default"}
    report["wall_time_s"] = time.perf_counter() - t0
    if out is not None:
        out = Path(out)
        columns = {"time": np.arange(len(q_target)) * platform.control_dt}
        columns.update({name: result.commands[:, j]
                        for j, name in enumerate(platform.channel_names)})
        with atomic_path(out / "commands.csv", suffix=".csv") as tmp:
            pd.DataFrame(columns).to_csv(tmp, index=False, float_format="%.6f")
        report["plot"] = _plot(result, world_q, platform.channel_names, platform.control_dt,
                               out / "plan.png").name
        report["objective"] = result.objective
        write_json(out / "plan.json", json_safe(report))
        write_text(out / "plan.md", _markdown(report))
    return _markdown(report)
