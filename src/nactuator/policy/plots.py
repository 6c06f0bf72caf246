"""Figures of ``policy eval``: success per condition with Wilson intervals, and one
rollout per condition (end-effector height, payload force and its estimate, current)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from nactuator.atomic import write_png  # noqa: E402

__all__ = ["plot_rollouts", "plot_success", "plot_tolerance", "success_at"]


def plot_success(results: Sequence[Mapping], path: Path) -> Path:
    cases = list(dict.fromkeys(f"{r['task']} {r['payload_g']} g" for r in results))
    conditions = list(dict.fromkeys(r["condition"] for r in results))
    fig, ax = plt.subplots(figsize=(2.2 + 2.0 * len(cases), 3.6))
    width = 0.8 / len(conditions)
    for j, c in enumerate(conditions):
        rows = {f"{r['task']} {r['payload_g']} g": r for r in results if r["condition"] == c}
        x = np.arange(len(cases)) + (j - (len(conditions) - 1) / 2) * width
        rate = np.array([100 * rows[k]["success_rate"] for k in cases])
        lo = np.array([100 * rows[k]["wilson95"][0] for k in cases])
        hi = np.array([100 * rows[k]["wilson95"][1] for k in cases])
        ax.bar(x, rate, width, label=c, yerr=[rate - lo, hi - rate], capsize=3)
    ax.set_xticks(np.arange(len(cases)), cases)
    ax.set_ylabel("success [%] (Wilson 95 %)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="lower left")
    n = results[0]["episodes"] if results else 0
    ax.set_title(f"closed loop in the hidden world, {n} episodes per bar", fontsize=9)
    fig.tight_layout()
    return write_png(path, fig)


def plot_rollouts(traces: Mapping[str, Mapping], path: Path) -> Path:
    keys = list(traces)
    fig, axes = plt.subplots(3, len(keys), figsize=(2.6 * len(keys), 6.4), squeeze=False,
                             sharex="col")
    for j, k in enumerate(keys):
        tr = traces[k]
        t = np.arange(len(tr["ee"])) * tr["dt"]
        ax = axes[0, j]
        ax.plot(t, 100 * tr["ee"][:, 2], lw=1)
        ax.axhline(100 * tr["target"][2], ls="--", c="k", lw=0.7)
        ax.set_title(f"{k}\n{'success' if tr['success'] else 'failure'}", fontsize=7)
        axes[1, j].plot(t, tr["force"][:, 2], lw=1, label="true")
        axes[1, j].plot(t, tr["estimate"][:, 2], lw=1, label="f̂ (frozen model)")
        axes[2, j].plot(t, np.abs(tr["current"]).max(axis=1), lw=1)
        axes[2, j].axhline(tr["trip_A"], ls="--", c="r", lw=0.7)  # the protection
        axes[2, j].set_xlabel("s")
    axes[0, 0].set_ylabel("end effector z [cm]")
    axes[1, 0].set_ylabel("f_z [N]")
    axes[1, 0].legend(fontsize=6)
    axes[2, 0].set_ylabel("max |current| [A]")
    fig.tight_layout()
    return write_png(path, fig)


def success_at(row: Mapping, tolerance: float) -> float:
    """Success rate of one result row had the distance tolerance been ``tolerance`` [m]."""
    err = np.array([np.inf if e is None else e for e in row["final_error_m"]])
    return float((np.asarray(row["episode_other_ok"]) & (err <= tolerance)).mean())


def plot_tolerance(results: Sequence[Mapping], path: Path) -> Path:
    """Success against the distance tolerance, per case and condition (the configured
    tolerance is one point of each curve; the others show how close the failures came)."""
    cases = list(dict.fromkeys((r["task"], r["payload_g"]) for r in results))
    fig, axes = plt.subplots(1, len(cases), figsize=(3.2 * len(cases), 3.2), squeeze=False)
    tol = np.linspace(0.0, 0.08, 81)
    for ax, (task, grams) in zip(axes[0], cases, strict=True):
        for r in results:
            if (r["task"], r["payload_g"]) == (task, grams):
                ax.plot(100 * tol, [100 * success_at(r, x) for x in tol], label=r["condition"])
        ax.set_title(f"{task} {grams} g", fontsize=8)
        ax.set_xlabel("distance tolerance [cm]")
    axes[0, 0].set_ylabel("success [%]")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return write_png(path, fig)
