"""Demonstrations: the scripted expert over the demo payloads, with the frozen actuator
model running on every frame as it will at evaluation.

``make_demos`` writes two things under ``out``:

- ``dataset/``: a nactuator dataset (LeRobot v3.0 layout, :class:`nactuator.data.DatasetWriter`)
  with ``action`` = the commanded joints, the telemetry, ``observation.environment_state`` =
  the frozen model's [f̂, gate] the policy saw at that frame (one control period old, as in
  ``sensing``), ``observation.ee_force`` = the true payload force and
  ``observation.payload_mass``, one task string per (task, payload);
- ``demos.npz``: per task, the policy features of every condition (``sensing``) and the
  command offsets, (T, episodes, ·), the arrays ``policy fit`` trains on.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from nactuator.atomic import write_bytes
from nactuator.data import DatasetWriter
from nactuator.models import load_model
from nactuator.platforms import load_platform
from nactuator.progress import progress_bar
from nactuator.world import load_world

from .expert import ScriptedExpert
from .sensing import CONDITIONS, ForceSensor, condition_features
from .task_world import TASKS, EpisodeLog, Observation, TaskWorld

__all__ = ["Recorder", "make_demos"]


class Recorder:
    """Wraps a controller: logs the features of every condition the step it decides."""

    def __init__(self, controller, sensor: ForceSensor) -> None:
        self.controller, self.sensor = controller, sensor
        self.features: dict[str, list[np.ndarray]] = {c: [] for c in CONDITIONS}
        self.estimates: list[np.ndarray] = []

    def __call__(self, obs: Observation) -> np.ndarray:
        tel = obs.telemetry
        for c in CONDITIONS:
            self.features[c].append(condition_features(c, tel["q"], self.sensor.estimate,
                                                       tel["effort"], obs.force_true))
        self.estimates.append(self.sensor.estimate.copy())
        return self.controller(obs)

    def after_step(self, obs: Observation, q_cmd: np.ndarray) -> None:
        self.sensor.push(obs.telemetry, q_cmd)


def _seeds(base: int, task: str, payload_g: int, count: int) -> list[int]:
    return [base + 100000 * TASKS.index(task) + 1000 * payload_g + i for i in range(count)]


def make_demos(config: Mapping, out: str | Path) -> str:
    """Run the expert over ``config['demos']`` and write ``out``; returns a summary line."""
    out = Path(out)
    p = load_platform(config["platform"])
    params = load_world(p, config.get("world"), 0)
    actuator, meta = load_model(config["actuator"], expect_platform=p.name)
    d = config["demos"]
    jobs = [(t, g) for t in TASKS for g in d["payloads_g"]]
    arrays: dict[str, list] = {}
    logs: list[tuple[str, int, EpisodeLog]] = []
    bar = progress_bar(total=len(jobs), desc="policy demos", unit="batch")
    for task, g in jobs:
        seeds = _seeds(int(d["seed"]), task, g, int(d["episodes"]))
        secs = float(config["tasks"][task]["seconds"])
        tw = TaskWorld(p, params, task, g / 1000.0, config, seeds)
        rng = np.random.default_rng(seeds[0])
        rec = Recorder(ScriptedExpert(tw, seeds, secs, config["expert"], rng),
                       ForceSensor(actuator, meta, len(seeds), p.n))
        log = tw.run(rec, secs, tw.start_pose(seeds), after_step=rec.after_step)
        log.frames["environment_state"] = np.stack(rec.estimates)  # (T, episodes, 4)
        logs.append((task, g, log))
        for c in CONDITIONS:
            arrays.setdefault(f"{task}/{c}", []).append(np.stack(rec.features[c]))
        arrays.setdefault(f"{task}/command", []).append(log.frames["q_cmd"].astype(np.float32))
        arrays.setdefault(f"{task}/success", []).append(log.success)
        bar.update(1)
    bar.close()
    out.mkdir(parents=True, exist_ok=True)
    stacked = {k: np.concatenate(v, axis=1 if v[0].ndim > 1 else 0) for k, v in arrays.items()}
    buf = io.BytesIO()
    np.savez(buf, **stacked)
    write_bytes(out / "demos.npz", buf.getvalue())
    _write_dataset(out / "dataset", p, logs)
    rates = ", ".join(f"{t} {g} g {log.success.mean():.0%}" for t, g, log in logs)
    return (f"policy demos: {sum(len(log.success) for _, _, log in logs)} episodes in {out} "
            f"(expert success: {rates})")


def _write_dataset(root: Path, platform, logs) -> None:
    if root.exists():
        shutil.rmtree(root)
    with DatasetWriter(root, platform, fps=platform.fps, declared=("environment_state",),
                       metadata={"source": "nactuator policy demos", "synthetic": True}) as w:
        for task, g, log in logs:
            f = log.frames
            for e in range(f["q"].shape[1]):
                frames = {k: f[k][:, e] for k in ("q_cmd", "q", "qd", "effort", "voltage",
                                                   "temperature", "current", "torque_enable",
                                                   "environment_state")}
                frames["force"] = f["force"][:, e]
                frames["payload_mass"] = np.where(f["attached"][:, e], g / 1000.0, 0.0)
                w.add_episode(frames, task=f"{task}_{g}g", split="train",
                              episode_meta={"payload_g": g,
                                            "success": bool(log.success[e])})
