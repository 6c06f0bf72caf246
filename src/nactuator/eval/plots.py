"""PNG plots of one episode's rollout: joints (simulated vs recorded) and force with gate."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# The object API with no pyplot: no global figure state and no display backend, ever.
from matplotlib.figure import Figure

from nactuator.atomic import write_png
from nactuator.data import Episode
from nactuator.eval.episodes import force_labels
from nactuator.eval.protocol import FORCE_LABEL_OFFSET
from nactuator.rollout import Rollout

__all__ = ["CLASSICAL_FORCE_NAMES", "episode_seconds", "plot_force", "plot_joints"]

# Legend names and colours of the classical force baselines (`eval --baselines`).
CLASSICAL_FORCE_NAMES = {"id-linear": "ID-Linear", "id-friction": "ID-Friction",
                         "gmo": "momentum observer", "gmo-friction": "momentum obs. + friction"}
_CLASSICAL_COLOURS = {"id-linear": "tab:blue", "id-friction": "tab:cyan", "gmo": "tab:orange",
                      "gmo-friction": "tab:brown"}


def episode_seconds(ep: Episode, dt: float) -> np.ndarray:
    """(T,) seconds since the episode's first frame: its recorded timestamps (irregular on
    real data), or frame × ``dt`` where they are missing or not increasing."""
    t = ep.frames.get("timestamp")
    if t is not None and len(t) == ep.length and np.isfinite(t).all() and (
            np.diff(t) > 0).all():
        return np.asarray(t, dtype=np.float64) - float(t[0])
    return np.arange(ep.length) * dt


def plot_joints(ep: Episode, ro: Rollout, names: list[str], scales: np.ndarray,
                units: list[str], path: Path, dt: float) -> Path:
    """One panel per channel: recorded q, simulated q and the command, in reported units,
    over time in seconds (``dt``: the control period, if the episode has no timestamps)."""
    t = episode_seconds(ep, dt)
    n = len(names)
    fig = Figure(figsize=(9, 1.7 * n + 0.6))
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)
    for j, ax in enumerate(axes[:, 0]):
        s = scales[j]
        ax.plot(t, ep.frames["q_cmd"][:, j] * s, color="0.6", lw=0.8, ls="--", label="command")
        ax.plot(t, ep.frames["q"][:, j] * s, color="k", lw=1.0, label="recorded")
        ax.plot(t, ro.q[:, j] * s, color="tab:red", lw=1.0, label="simulated (model)")
        ax.set_ylabel(f"{names[j]}\n[{units[j]}]", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=3)
    axes[0, 0].set_title(f"{ep.task} · episode {ep.index}: open-loop rollout", fontsize=9)
    axes[-1, 0].set_xlabel("time [s]")
    fig.tight_layout()
    return write_png(path, fig)


def plot_force(ep: Episode, ro: Rollout, path: Path, dt: float,
               linear: np.ndarray | None = None,
               classical: dict[str, np.ndarray] | None = None) -> Path:
    """Predicted vs labelled force per axis (unlabelled frames left blank) and the gate,
    over time in seconds. ``linear``: the linear regression's (T, 3) force; ``classical``:
    the classical baselines' (T, 3) forces by method (``eval --baselines``), thin lines."""
    steps = ep.length - 1
    frames = np.arange(steps) + FORCE_LABEL_OFFSET
    t = episode_seconds(ep, dt)[frames]
    label = force_labels(ep)[FORCE_LABEL_OFFSET:FORCE_LABEL_OFFSET + steps]
    fig = Figure(figsize=(9, 7.4))
    axes = fig.subplots(4, 1, sharex=True)
    for a, axis_name in enumerate("xyz"):
        ax = axes[a]
        ax.plot(t, label[:, a], color="k", lw=1.2, label="label")
        for method, force in (classical or {}).items():
            ax.plot(t, force[frames, a], color=_CLASSICAL_COLOURS.get(method, "0.5"), lw=0.7,
                    alpha=0.8, label=CLASSICAL_FORCE_NAMES.get(method, method))
        if linear is not None:
            ax.plot(t, linear[:steps, a], color="tab:green", lw=0.8, alpha=0.8,
                    label="linear regression")
        ax.plot(t, ro.force[:, a], color="tab:red", lw=1.0, label="model")
        ax.set_ylabel(f"f{axis_name} [N]", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].legend(loc="lower left", bbox_to_anchor=(0, 1.08), fontsize=7, ncol=4,
                   frameon=False)
    axes[0].set_title(f"{ep.task} · episode {ep.index}: force (NaN labels not drawn)",
                      fontsize=9, loc="right")
    axes[3].plot(t, ro.gate, color="tab:purple", lw=1.0, label="gate")
    axes[3].axhline(0.5, color="0.6", lw=0.6, ls=":")
    axes[3].set_ylim(-0.05, 1.05)
    axes[3].set_ylabel("gate", fontsize=8)
    axes[3].set_xlabel("time [s]")
    fig.tight_layout()
    return write_png(path, fig)
