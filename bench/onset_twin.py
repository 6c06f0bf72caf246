"""How much a mid-run fault changes what the servo reports: each ``onset`` task of a world
file run twice, as written and with its onset moved to the run's end (the same task names,
hence the same seeds and trajectories), and the faulted motor's effort compared frame by frame.

What it answers: can a detector see the fault within a second of its onset, and against how
large a swing of the motion's own effort (docs/results.md §6.3.6, "Why the band is late").

    .venv/bin/python bench/onset_twin.py --world conf/world/omx_onset.yaml [--out twin.png]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import yaml
from matplotlib.figure import Figure

from nactuator.atomic import write_png
from nactuator.data.synth import run_tasks
from nactuator.platforms import load_platform
from nactuator.world import load_world

WINDOWS_S = (0.25, 0.5, 1.0, 2.0)  # after the onset: the mean |Δ effort| over each


def twin_config(cfg: dict) -> dict:
    """``cfg`` with every onset task's onset moved to 0.1 s before its run ends."""
    tasks = {name: dict(spec, onset=float(spec["seconds"]) - 0.1) if "onset" in spec else spec
             for name, spec in cfg["tasks"].items()}
    return {**cfg, "tasks": tasks}


def compare(world: str, reps: int, seed: int = 0) -> list[dict]:
    """Per onset episode: its task, repetition, faulted motor, onset frame, the faulted
    motor's effort as written and in the twin, the mean |Δ| over :data:`WINDOWS_S` and the
    twin's effort range over the run."""
    cfg = yaml.safe_load(Path(world).read_text())
    platform = load_platform(cfg["platform"])
    onset_tasks = [name for name, spec in cfg["tasks"].items() if "onset" in spec]
    with tempfile.TemporaryDirectory() as tmp:
        twin_path = Path(tmp) / "twin.yaml"
        twin_path.write_text(yaml.safe_dump(twin_config(cfg)))
        runs = {}
        for label, path in (("fault", world), ("twin", twin_path)):
            params = load_world(platform, path, seed)
            runs[label] = run_tasks(platform, params, onset_tasks, reps, seed)
    rows = []
    for (task, faulted, _), (_, twin, _) in zip(runs["fault"], runs["twin"], strict=True):
        label = np.asarray(faulted["condition"])
        onset, channel = (int(x) for x in np.argwhere(label < 0.5)[0])
        a, b = faulted["effort"][:, channel], twin["effort"][:, channel]
        if not np.allclose(faulted["q_cmd"][:onset], twin["q_cmd"][:onset]):
            raise RuntimeError(f"{task}: the twin's commands differ before the onset")
        diff = np.abs(a - b)
        rows.append({"task": task, "channel": channel, "onset": onset, "effort": a,
                     "twin_effort": b,
                     "delta": [float(diff[onset:onset + max(1, round(s / platform.control_dt))]
                                     .mean()) for s in WINDOWS_S],
                     "range": float(np.ptp(b)), "dt": platform.control_dt,
                     "channel_name": platform.channel_names[channel]})
    return rows


def plot(rows: list[dict], path: str) -> None:
    fig = Figure(figsize=(10, 2.2 * len(rows)))
    axes = np.atleast_1d(fig.subplots(len(rows), 1))
    for ax, r in zip(axes, rows, strict=True):
        t = np.arange(r["effort"].size) * r["dt"]
        ax.plot(t, r["twin_effort"], lw=0.8, label="no fault (twin)")
        ax.plot(t, r["effort"], lw=0.8, label="fault")
        ax.axvline(r["onset"] * r["dt"], color="k", ls="--", label="onset")
        ax.set(ylabel=f"effort, {r['channel_name']}", title=r["task"])
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time [s]")
    fig.tight_layout()
    write_png(path, fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", required=True, help="a world file with onset tasks")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="PNG of effort vs time, fault and twin")
    a = ap.parse_args(argv)
    rows = compare(a.world, a.reps, a.seed)
    heads = " | ".join(f"first {s:g} s" for s in WINDOWS_S)
    print(f"| task | motor | mean abs Δ effort: {heads} | the twin's effort range |")
    print("|---|---|" + "---|" * len(WINDOWS_S) + "---|")
    for r in rows:
        cells = " | ".join(f"{d:.3f}" for d in r["delta"])
        print(f"| {r['task']} | {r['channel_name']} | {cells} | {r['range']:.3f} |")
    if a.out:
        plot(rows, a.out)
        print(f"written: {a.out}")


if __name__ == "__main__":
    main()
