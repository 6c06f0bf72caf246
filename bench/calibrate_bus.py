"""§12's curve through the emulated bus, end to end (issue 26 item 3; docs/results.md §12.3):
`calibrate-arm` on an unseen SO-101 world, its follower the hidden world arm on an emulated
STS3215 bus, then `live` from the bundle it wrote.

    PYTHONPATH=src .venv/bin/python bench/calibrate_bus.py --out runs/calibrate-bus \
        --held-out runs/cc160/seed_7/held_out --synth runs/cc160 --minutes 1 2 5 \
        --bus-held-out runs/calibrate-bus-heldout

Per N minutes (``--leader script``, the real user path, in this process as
tests/test_calibrate_arm.py runs it):

1. two emulated arms on pseudo-terminals: a leader (``ScriptedLeader``, torque off, moved by
   a sum of sines) and a follower running the world of conf/bench/calibrate_curve.yaml
   (``conf/world/so101_worn.yaml``, ``--seed``), stepped in real time (``--lockstep``: one
   frame of physics per telemetry read instead);
2. :func:`nactuator.guide.calibrate.calibrate_arm` with the protocol of
   conf/calibrate/so101.yaml and weights 200 + 400 g: the bus check, one ``record`` per step
   (each prompt puts that step's weight between the follower's jaws as `data synth` holds
   it: ``WorldArm.set_payload(kg, grasp=True)``, its weight hung while they press it),
   every run ``N × 60 / (train runs)`` seconds long so that the train recordings last N minutes; the
   same command again once everything is recorded (the emulators stopped) adapts from
   pretrained/so101 with the protocol's steps, scores its held-out run, writes the bundle;
3. the adapted checkpoint scored on §12's held-out runs of that seed (``--held-out``: the
   21 ``data synth`` test runs of every task), the linear force regression fitted on the
   same bus recordings (``nactuator eval`` on [recordings, held-out]);
4. ``live`` from the bundle on a fresh emulated follower holding the last frame of the
   held-out lift-and-hold run with the heaviest weight (object between the jaws, its
   weight hung, torque switched on through the bus first); the same for ``--synth``'s checkpoint
   of that point and, once, the bundle as shipped.

``--leader replay``: the leader instead plays the commands of ``--synth``'s own train runs
of that point into ``record`` (one call per run, its weight between the jaws and labelled),
adapted as bench/calibrate_curve.py adapts: the synth point's data, through the bus. Before
each run the follower is brought to the run's first command through the bus and held there
``--preposition-s`` (4 s), torque on, as a person starts a run with the arm in place.
``--bus-held-out DIR``: also record --held-out's runs through the bus (replay leader) and
score every point, ``--synth``'s point and the bundle as shipped on them.

Also measured per N, from what the bus delivered: frames dropped by the recorder's pacing,
incomplete telemetry, frame-period jitter, the physics clock's slip (emulator), and the
telemetry's quantisation. Resumable: calibrate-arm resumes itself (a finished step is not
recorded again), a replayed run with its done.json is kept, a finished point
(``m_N/point.json``) is not run again, and evaluations are kept. Writes bus.json and bus.md
into --out.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from nactuator.atomic import write_json, write_text
from nactuator.errors import UserError
from nactuator.paths import conf_dir, project_root

KEYS = {"joints": "arm mean (deg), model", "command following": "arm mean (deg), command following",
        "force": "force 3-axis (N), model rollout",
        "linear": "force 3-axis (N), linear regression"}


def episode_seconds(minutes: float, protocol: dict[str, Any], weights: list[float]) -> float:
    """Run length that makes the protocol's train recordings last ``minutes`` in all."""
    from nactuator.guide.protocol import plan_steps

    runs = sum(s.episodes for s in plan_steps(protocol, weights) if s.split == "train")
    return minutes * 60.0 / runs


def frame_timing(timestamps: np.ndarray, fps: float) -> dict[str, float]:
    """Frame periods of one episode against the nominal 1/fps: the slots lost (a period
    of k slots loses k - 1), the p50/p99/max deviation of a period from its slots (ms)."""
    dt = np.diff(np.asarray(timestamps, dtype=float))
    if dt.size == 0:
        return {"frames": int(len(timestamps)), "lost_slots": 0, "dev_p50_ms": math.nan,
                "dev_p99_ms": math.nan, "dev_max_ms": math.nan}
    slots = np.maximum(1, np.rint(dt * fps))
    dev = np.abs(dt - slots / fps) * 1e3
    return {"frames": int(len(timestamps)), "lost_slots": int((slots - 1).sum()),
            "dev_p50_ms": float(np.percentile(dev, 50)),
            "dev_p99_ms": float(np.percentile(dev, 99)), "dev_max_ms": float(dev.max())}


def quantum(x: np.ndarray) -> float:
    """The smallest nonzero step between distinct values of a channel (its resolution as
    seen in the data); NaN if it never changes."""
    v = np.unique(np.asarray(x, dtype=float)[np.isfinite(x)])
    d = np.diff(v)
    d = d[d > 1e-12]
    return float(d.min()) if d.size else math.nan


def bus_quality(folders: list[Path], fps: float) -> dict[str, Any]:
    """What the bus delivered, from the recordings on disk (so a resumed point has it)."""
    from nactuator.data import read_dataset

    frames = lost = overruns = incomplete = 0
    devs: list[dict[str, float]] = []
    q_steps: list[np.ndarray] = []
    load_steps: list[np.ndarray] = []
    seconds = 0.0
    for folder in folders:
        ds = read_dataset(folder)
        for ep in ds.episodes:
            ft = frame_timing(ep.frames["timestamp"], fps)
            devs.append(ft)
            frames += ft["frames"]
            lost += ft["lost_slots"]
            overruns += int(ep.meta.get("overruns", 0))
            incomplete += int(ep.meta.get("invalid_frames", 0))
            seconds += ep.length / ds.fps
            q_steps.append([quantum(ep.frames["q"][:, k]) for k in range(ep.frames["q"].shape[1])])
            if "effort" in ep.frames:
                load_steps.append([quantum(ep.frames["effort"][:, k])
                                   for k in range(ep.frames["effort"].shape[1])])
    out = {"frames": frames, "seconds": seconds, "lost_slots": lost,
           "recorder_overruns": overruns, "incomplete_frames": incomplete,
           "period_dev_p50_ms": float(np.median([d["dev_p50_ms"] for d in devs])),
           "period_dev_p99_ms": float(np.max([d["dev_p99_ms"] for d in devs])),
           "period_dev_max_ms": float(np.max([d["dev_max_ms"] for d in devs])),
           "q_quantum_deg": float(np.degrees(np.nanmin(np.array(q_steps), axis=0)).max())}
    if load_steps:
        out["effort_quantum"] = float(np.nanmin(np.array(load_steps), axis=0).max())
    return out


def live_summary(csv_path: Path, fps: float, payload_kg: float) -> dict[str, Any]:
    """Cycles, rate, slots lost and incomplete cycles of ``live``'s CSV, and its mean
    predicted z force over the last half (the hung payload reads -m g)."""
    from nactuator.hardware.recorder import G

    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    t = np.array([float(r["t"]) for r in rows])
    ft = frame_timing(t, fps)
    fz = np.array([float(r["fz"]) for r in rows])
    half = fz[len(fz) // 2:]
    return {"cycles": len(rows), "rate_hz": float((len(t) - 1) / (t[-1] - t[0])),
            "lost_slots": ft["lost_slots"], "start_dev_p99_ms": ft["dev_p99_ms"],
            "incomplete_cycles": int(sum(1 - int(float(r["valid"])) for r in rows)),
            "fz_mean_n": float(np.mean(half)), "fz_expected_n": -payload_kg * G}


def _metrics(row: dict[str, Any]) -> dict[str, float | None]:
    out = {}
    for k, v in KEYS.items():
        x = row.get(v)
        out[k] = None if x is None or not math.isfinite(x) else float(x)
    return out


def run_point(minutes: float, a: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One N: calibrate-arm through the bus, the score on §12's held-out runs, live."""
    from nactuator.eval import evaluate
    from nactuator.experiments.cv import fold_row
    from nactuator.guide import calibrate as cal
    from nactuator.guide.protocol import load_protocol, parse_weights, plan_steps
    from nactuator.hardware.emulator import Emulator
    from nactuator.hardware.emulator.world_arm import WorldArm
    from nactuator.platforms import load_platform

    p = load_platform(a.platform)
    proto = load_protocol(p.name)
    weights = parse_weights(a.weights_g, proto)
    seconds = episode_seconds(minutes, proto, weights)
    plan = plan_steps(proto, weights, seconds)
    world = project_root() / a.world
    arm = WorldArm(p, seed=a.seed, world=world)
    step = 1.0 / p.fps if a.lockstep else None
    leader = Emulator("feetech", p, seed=a.leader_seed, leader=True, step_per_read=step)
    follower = Emulator("feetech", p, seed=a.seed, arm=arm, step_per_read=step)

    def hang(grams: float) -> None:
        with follower._lock:  # between steps: the emulator thread steps the same world
            arm.set_payload(grams / 1000.0, grasp=True)  # between the jaws

    def prompt(s, i, total):
        cal.wait_for_enter(s, i, total)  # prints the step; not a terminal: starts now
        hang(s.payload_g)

    class _Recorded(Exception):
        pass

    def stop_before_adapt(*args, **kwargs):
        raise _Recorded

    run = dict(weights_g=a.weights_g, episode_seconds=seconds, steps=a.adapt_steps,
               prompt=prompt, progress=a.progress)
    t0 = time.perf_counter()
    emu: dict[str, Any] = {}
    # Recording, with both emulated arms; calibrate-arm stops where it would adapt.
    state = json.loads((folder / "calibrate.json").read_text()) \
        if (folder / "calibrate.json").is_file() else {"steps": {}}
    if not all(state["steps"].get(f"record/{s.key}", {}).get("done") for s in plan):
        saved = cal._adapt_step
        cal._adapt_step = stop_before_adapt
        try:
            with leader, follower:
                try:
                    cal.calibrate_arm(p, leader.port, follower.port, folder, **run)
                except _Recorded:
                    pass
                emu = {"leader": dict(leader.stats), "follower": dict(follower.stats),
                       "wall_s": time.perf_counter() - t0}
        finally:
            cal._adapt_step = saved
        state = json.loads((folder / "calibrate.json").read_text())
    # The same command again: every step is recorded, so it adapts, scores and writes the
    # bundle without touching the bus (the emulators are stopped: no CPU taken from adapt).
    text = cal.calibrate_arm(p, state["leader"], state["follower"], folder, **run)
    print(text, flush=True)
    state = json.loads((folder / "calibrate.json").read_text())
    recorded = {s.key: state["steps"][f"record/{s.key}"] for s in plan}
    train = [Path(recorded[s.key]["dataset"]) for s in plan if s.split == "train"]
    adapt = json.loads((folder / "adapt" / "adapt.json").read_text())
    tuned = adapt["points"][-1]
    ckpt = Path(state["steps"]["adapt"]["checkpoint"])
    score_dir = folder / "score_section12"
    if not (score_dir / "metrics.json").is_file():
        evaluate(ckpt, [*map(str, train), str(a.held_out)], split="test", out=score_dir)
    score = fold_row(json.loads((score_dir / "metrics.json").read_text()))
    # calibrate-arm's own held-out run (through the bus), as it printed it
    own = state["steps"]["adapt"]["summary"]
    return {"minutes": minutes, "seed": a.seed, "world": a.world, "weights_g": weights,
            "episode_seconds": seconds, "lockstep": a.lockstep,
            "runs": sum(s.episodes for s in plan if s.split == "train"),
            "record_minutes": sum(recorded[s.key]["seconds"] for s in plan
                                  if s.split == "train") / 60.0,
            "steps": state["steps"]["adapt"]["steps"],
            "adapt_fit_s": tuned.get("fit_s"), "adapt_fit_cpu_s": tuned.get("fit_cpu_s"),
            "held_out": str(a.held_out),
            "adapted": _metrics(score), "own_held_out": own,
            "bus": bus_quality([Path(recorded[s.key]["dataset"]) for s in plan], p.fps),
            "emulator": emu}


class ReplayLeader:
    """A leader arm (torque off) that plays recorded commands: one frame of ``q_cmd`` per
    telemetry read (its emulator runs with ``step_per_read = 1 / fps``), so frame k of an
    episode reads ``q_cmd[k]`` however long the recorder's ramp to the first pose took.
    Until :meth:`load` and after the last frame it holds the first / last pose."""

    def __init__(self, n: int, fps: float, supply_voltage: float = 12.0,
                 ambient: float = 30.0) -> None:
        self.n, self.dt, self.fps = n, 1.0 / fps, fps
        self.q_cmd = np.zeros((1, n))
        self.k = 0
        self.supply, self.ambient = supply_voltage, ambient

    def load(self, q_cmd: np.ndarray, reads_before: int = 1) -> None:
        """Play ``q_cmd`` (T, n); the first ``reads_before`` reads (``record``'s
        ``wait_ready``) still see frame 0."""
        self.q_cmd = np.asarray(q_cmd, dtype=float)
        self.k = -int(reads_before)

    def set_goal(self, q_goal: np.ndarray) -> None:
        pass

    def set_torque_enabled(self, enabled: np.ndarray) -> None:
        pass

    def step(self, dt: float) -> None:
        self.k += 1

    def state(self):
        from nactuator.hardware.emulator import ArmState

        T = len(self.q_cmd)
        k = min(max(self.k, 0), T - 1)
        q = self.q_cmd[k]
        qd = (self.q_cmd[min(k + 1, T - 1)] - q) * self.fps
        zero = np.zeros(self.n)
        return ArmState(q=q.copy(), qd=qd, current=zero, load=zero, pwm=zero,
                        voltage=np.full(self.n, self.supply),
                        temperature=np.full(self.n, self.ambient))


def preposition(p: Any, port: str, q_first: np.ndarray, seconds: float) -> None:
    """Bring the follower to a replayed run's first command through the bus and leave it
    holding there, torque on, before ``record`` opens it: a person starts a run with the
    arm at its start, and ``data synth`` starts each run settled at its first goal. Between
    runs ``record`` switches the follower's torque off and the worn arm, weight in hand,
    drops; its own ramp (1 s, settle <= 2 s) then leaves it 0.17-0.9 rad off (§12.3), a
    transient no synth run has. Same ramp as ``record``'s (its code), a longer settle."""
    from nactuator.hardware.open import open_bus
    from nactuator.hardware.recorder import _ramp_to

    if seconds <= 0:
        return
    with open_bus(p, port, torque_off_on_close=False) as bus:
        bus.write_goal(bus.wait_ready().q)  # hold where it is, then torque on (as record)
        bus.set_torque(True)
        ramp_s = float(p.hardware.get("record_ramp_s", 1.0))
        end = time.monotonic() + ramp_s + seconds
        _ramp_to(bus, np.asarray(q_first, float), ramp_s, p.fps, seconds,
                 float(p.hardware.get("record_settle_tolerance", 0.05)))
        while time.monotonic() < end:  # within tolerance or not, hold it the full time:
            bus.write_goal(np.asarray(q_first, float))
            time.sleep(1.0 / p.fps)


def play(emu: Any, lead: ReplayLeader, q_cmd: np.ndarray) -> None:
    """Load ``q_cmd`` into the replay leader of ``emu`` and refresh its registers at once
    (in lockstep the emulator refreshes them only after a physics step)."""
    with emu._lock:
        lead.load(q_cmd)
        emu._sync_registers()


def replay_point(minutes: float, a: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One N of §12's `data synth` point, through the bus: the very train runs it fine-tuned
    on (``--synth``'s ``seed_S/w200-400/adapt/data/n_NNN``) replayed by the leader into
    ``record`` (one call per run, its weight between the jaws and labelled), then `adapt` as
    bench/calibrate_curve.py adapts (same recipe, steps, horizon), scored on --held-out."""
    from nactuator.data import read_dataset
    from nactuator.experiments.adapt import adapt, load_adapt_config
    from nactuator.guide.calibrate import _adapt_config, fit_horizon
    from nactuator.guide.protocol import adapt_steps, load_protocol
    from nactuator.platforms import load_platform

    design = yaml.safe_load((conf_dir() / "bench" / "calibrate_curve.yaml").read_text())
    p = load_platform(a.platform)
    n = max(1, round(minutes * 60.0 / design["run_seconds"]))
    subset = Path(a.synth) / f"seed_{a.seed}" / "w200-400" / "adapt" / "data" / f"n_{n:03d}"
    runs = [ep for ep in read_dataset(subset).episodes if ep.split == "train"]
    if len(runs) != n:
        raise UserError(f"{subset}: expected {n} train runs, found {len(runs)}")
    folders = [folder / "runs" / f"{i:03d}" for i in range(len(runs))]
    t0 = time.perf_counter()
    stats = replay_runs(a, runs, folders, split="train", label="")
    emu = {**stats, "wall_s": time.perf_counter() - t0}
    if a.labels == "synth":
        folders = [synth_labelled(f, ep) for f, ep in zip(folders, runs, strict=True)]
    proto = load_protocol(p.name)
    cfg = load_adapt_config(project_root() / proto["adapt"]["config"])
    config = _adapt_config(cfg, folder / "adapt-config.yaml")
    per_epoch = cfg["train"]["data"]["samples_per_epoch"] // cfg["train"]["data"]["batch_size"]
    steps = a.adapt_steps or adapt_steps(n * design["run_seconds"], proto)
    epochs = max(1, math.ceil(steps / per_epoch))
    horizon = fit_horizon(cfg["train"]["data"]["horizon"],
                          math.floor(design["run_seconds"] * p.fps))
    adapt(design["pretrained"], [*map(str, folders), str(a.held_out)], episodes=[n],
          out=folder / "adapt", held_out="test", held_out_runs=0, config=config,
          extra_args=[f"--trainer.max_epochs={epochs}", f"--data.horizon={horizon}"])
    res = json.loads((folder / "adapt" / "adapt.json").read_text())
    tuned = res["points"][-1]
    seconds = sum(read_dataset(f).episodes[0].length for f in folders) / p.fps
    return {"minutes": minutes, "seed": a.seed, "world": a.world, "leader": "replay",
            "labels": a.labels, "lockstep": a.lockstep, "runs": n, "record_minutes": seconds / 60.0,
            "steps": epochs * per_epoch, "adapt_fit_s": tuned.get("fit_s"),
            "adapt_fit_cpu_s": tuned.get("fit_cpu_s"), "held_out": res["held_out"]["episodes"],
            "adapted": _metrics(tuned["metrics"]), "pretrained": _metrics(
                res["points"][0]["metrics"]),
            "bus": bus_quality(folders, p.fps), "emulator": emu}


def synth_labelled(run_dir: Path, synth_ep: Any) -> Path:
    """A replayed recording with the force and payload labels of the synth run it replays
    (``--labels synth``). ``record --payload-g`` labels every frame -m g, as the prompts ask
    a person to keep the weight in the gripper; the synth pick-and-place commands set the
    object down (jaw open) before the grasp and after the release, where ``data synth``
    labels the force unknown and, since the grasp fix, the emulated arm carries nothing.
    Frame k of the recording is the replay's frame k (the leader advances one frame per
    read), so the labels align frame for frame. Telemetry is the bus's, untouched."""
    from nactuator.data import DatasetWriter, read_dataset
    from nactuator.platforms import load_platform

    dest = run_dir / "synth_labels"
    if (dest / "meta" / "info.json").is_file():
        return dest
    ds = read_dataset(run_dir)
    [ep] = ds.episodes
    T = ep.length
    if T > synth_ep.length:
        raise UserError(f"{run_dir}: {T} frames, more than the replayed run's {synth_ep.length}")
    frames = dict(ep.frames)
    frames["force"] = np.asarray(synth_ep.frames["force"][:T], dtype=float)
    frames["payload_mass"] = np.asarray(synth_ep.frames["payload_mass"][:T], dtype=float)
    meta = {k: v for k, v in ep.meta.items() if k != "split"}
    with DatasetWriter(dest, load_platform(ds.platform), fps=ds.fps) as writer:
        writer.add_episode(frames, ep.task, ep.split, episode_meta=meta)
    return dest


POSE = ("the last frame of the held-out lift-and-hold run with the heaviest weight: its q, "
        "its command, the object between the jaws")


def hold_pose(held_out: Path, grams: float) -> tuple[np.ndarray, np.ndarray]:
    """Where ``live`` holds the arm: the last frame (q, q_cmd) of the first held-out
    lift-and-hold run of that weight (a hold §12's held-out runs score)."""
    from nactuator.data import read_dataset

    task = f"go_up_and_stay_still_{grams:g}g"
    for ep in read_dataset(held_out).episodes:
        if ep.task == task:
            return (np.asarray(ep.frames["q"][-1], dtype=float),
                    np.asarray(ep.frames["q_cmd"][-1], dtype=float))
    raise UserError(f"{held_out}: no {task} run to take live's hold pose from")


def live_check(a: argparse.Namespace, ckpt: Path, csv_path: Path) -> dict[str, Any]:
    """``live`` from ``ckpt`` on a fresh emulated follower (the same world arm) carrying the
    heaviest weight at :data:`POSE`, its torque switched on holding there (as the arm would
    be, driven by your own program; ``live`` itself never switches torque on)."""
    from nactuator.control.live import run_live
    from nactuator.hardware.emulator import Emulator
    from nactuator.hardware.emulator.world_arm import WorldArm
    from nactuator.hardware.open import open_bus
    from nactuator.platforms import load_platform

    p = load_platform(a.platform)
    grams = max(float(g) for g in a.weights_g.split(","))
    kg = grams / 1000.0
    q, q_cmd = hold_pose(Path(a.held_out), grams)
    arm = WorldArm(p, seed=a.seed, world=project_root() / a.world, q0=q)
    with Emulator("feetech", p, seed=a.seed, arm=arm) as follower:
        with open_bus(p, follower.port, torque=False, torque_off_on_close=False) as bus:
            bus.wait_ready()
            bus.write_goal(q_cmd)
            with follower._lock:  # the weight in the gripper: between the jaws, held
                arm.set_payload(kg, grasp=True)
            bus.set_torque(True)
        time.sleep(1.0)  # the servos settle under the weight
        text = run_live(ckpt, p, follower.port, out=csv_path, seconds=a.live_seconds,
                        quiet=True)
        stats = dict(follower.stats)
    print(text, flush=True)
    return {**live_summary(csv_path, p.fps, kg), "ckpt": str(ckpt), "pose": POSE,
            "torque": "on, holding", "text": text, "emulator": stats}


def record_held_out(a: argparse.Namespace, out: Path) -> list[Path]:
    """§12's held-out runs (every test run of --held-out) recorded again through the bus:
    the replay leader plays each run's commands into ``record`` (split test) with its
    weight between the jaws and labelled, as :func:`replay_point` records the train runs.
    Resumable."""
    from nactuator.data import read_dataset

    runs = [ep for ep in read_dataset(a.held_out).episodes if ep.split == "test"]
    folders = [out / "held_out_bus" / f"{i:03d}" for i in range(len(runs))]
    if all((f / "done.json").is_file() for f in folders):
        return folders
    replay_runs(a, runs, folders, split="test", label="held out ")
    return folders


def replay_runs(a: argparse.Namespace, runs: list[Any], folders: list[Path], split: str,
                label: str) -> dict[str, Any]:
    """Record each of ``runs`` through the bus into its folder: the replay leader plays the
    run's commands into ``record`` (``split``), the follower (the unseen world arm) holds the
    run's weight between its jaws and is first brought to the run's first command. A folder
    with its done.json is kept (resumable). Returns both emulators' statistics."""
    import shutil

    from nactuator.hardware.emulator import Emulator
    from nactuator.hardware.emulator.world_arm import WorldArm
    from nactuator.hardware.recorder import record
    from nactuator.platforms import load_platform

    p = load_platform(a.platform)
    arm = WorldArm(p, seed=a.seed, world=project_root() / a.world)
    lead = ReplayLeader(p.n, p.fps)
    leader = Emulator("feetech", p, seed=a.leader_seed, arm=lead, step_per_read=1.0 / p.fps)
    follower = Emulator("feetech", p, seed=a.seed, arm=arm,
                        step_per_read=1.0 / p.fps if a.lockstep else None)
    with leader, follower:
        for i, (ep, run_dir) in enumerate(zip(runs, folders, strict=True)):
            if (run_dir / "done.json").is_file():
                continue
            kg = float(ep.meta["payload_kg"])
            with follower._lock:  # the object between the jaws (its weight while pressed)
                arm.set_payload(kg, grasp=True)
            play(leader, lead, ep.frames["q_cmd"])
            preposition(p, follower.port, ep.frames["q_cmd"][0], a.preposition_s)
            shutil.rmtree(run_dir, ignore_errors=True)
            text = record(p, leader.port, follower.port, task=ep.task, episodes=1,
                          seconds=ep.length / p.fps, out=run_dir, payload_g=kg * 1000.0,
                          split=split, progress=a.progress)
            print(f"[{label}{i + 1}/{len(runs)}] {text}", flush=True)
            write_json(run_dir / "done.json", {"episode": i,
                                               "source": ep.meta.get("adapt_source")})
        return {"leader": dict(leader.stats), "follower": dict(follower.stats)}


def synth_train(root: Path, seed: int, runs: int, out: Path) -> Path:
    """The train runs of a `data synth` point alone (its data folder also holds §12's
    held-out runs), for a regression fitted on exactly them."""
    from nactuator.data import DatasetWriter, read_dataset
    from nactuator.platforms import load_platform

    dest = out / f"synth_train_n{runs:03d}"
    if (dest / "meta" / "info.json").is_file():
        return dest
    src = root / f"seed_{seed}" / "w200-400" / "adapt" / "data" / f"n_{runs:03d}"
    ds = read_dataset(src)
    with DatasetWriter(dest, load_platform(ds.platform), fps=ds.fps) as writer:
        for ep in ds.episodes:
            if ep.split == "train":
                meta = {k: v for k, v in ep.meta.items() if k != "split"}
                writer.add_episode(dict(ep.frames), ep.task, "train", episode_meta=meta)
    return dest


def score_on(ckpt: Path, data: list[Path], out: Path) -> dict[str, float | None]:
    """``nactuator eval`` of ``ckpt`` on the test runs among ``data`` (kept for a rerun)."""
    from nactuator.eval import evaluate
    from nactuator.experiments.cv import fold_row

    if not (out / "metrics.json").is_file():
        evaluate(ckpt, [str(d) for d in data], split="test", out=out)
    return _metrics(fold_row(json.loads((out / "metrics.json").read_text())))


def train_folders(folder: Path, leader: str) -> list[Path]:
    """A point's train recordings (calibrate-arm's train steps, or the replayed runs)."""
    if leader == "replay":  # with --labels synth, the relabelled copy is what it trained on
        return [d / "synth_labels" if (d / "synth_labels").is_dir() else d
                for d in sorted(d for d in (folder / "runs").iterdir() if d.is_dir())]
    state = json.loads((folder / "calibrate.json").read_text())
    return [Path(v["dataset"]) for k, v in sorted(state["steps"].items())
            if k.startswith("record/") and v.get("split") == "train"]


def adapted_ckpt(folder: Path, leader: str) -> Path:
    """The model a point adapted: calibrate-arm's bundle, or the replay's last checkpoint."""
    from nactuator.guide import calibrate as cal

    if leader == "script":
        return folder / cal.BUNDLE
    res = json.loads((folder / "adapt" / "adapt.json").read_text())
    return Path(res["points"][-1]["checkpoint"])


def synth_checkpoint(root: Path | None, seed: int, minutes: float) -> Path | None:
    """The `data synth` point's adapted checkpoint (its last epoch), if it is there."""
    if root is None:
        return None
    row = synth_point(root, seed, minutes)
    if row is None:
        return None
    ckpts = sorted((root / f"seed_{seed}" / "w200-400" / "adapt" / f"n_{row['runs']:03d}")
                   .rglob("ft-epoch=*.ckpt"))
    return ckpts[-1] if ckpts else None


def synth_point(root: Path | None, seed: int, minutes: float) -> dict[str, Any] | None:
    """The `data synth` point of bench/calibrate_curve.py at these minutes (200 + 400 g)."""
    if root is None:
        return None
    f = root / f"seed_{seed}" / "points" / f"s{seed}_w200-400_m{minutes:g}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _f(x: float | None, d: int) -> str:
    return "—" if x is None else f"{x:.{d}f}"


def _held(m: dict[str, Any] | None) -> str:
    if not m:
        return "—"
    return f"{_f(m['joints'], 2)}, {_f(m['force'], 3)}, {_f(m['linear'], 3)}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| path | minutes | runs | steps | joints ° adapted | command following | "
             "force N adapted | linear regression | adapt fit CPU s | frames dropped / "
             "incomplete of recorded, period p99 off | live (fz N: 400 g held is -3.92) | "
             "bus-recorded held-out: joints °, force N, regression N |",
             "|---" * 12 + "|"]
    for r in rows:
        b, s = r["bus"], r.get("synth")
        lv = r.get("live")
        a = r["adapted"]
        live = (f"{lv['rate_hz']:.1f} Hz, {lv['lost_slots']} lost, {lv['incomplete_cycles']} "
                f"incomplete; fz {lv['fz_mean_n']:.2f}" if lv else "—")
        lines.append(
            f"| bus, {r.get('leader', 'script')} | {r['record_minutes']:.2f} | {r['runs']} | "
            f"{r['steps']} | {_f(a['joints'], 2)} | {_f(a['command following'], 2)} | "
            f"{_f(a['force'], 3)} | {_f(a['linear'], 3)} | {_f(r['adapt_fit_cpu_s'], 0)} | "
            f"{b['recorder_overruns']} / {b['incomplete_frames']} of {b['frames']}, "
            f"{b['period_dev_p99_ms']:.0f} ms | {live} | {_held(r.get('bus_held_out'))} |")
        if s:
            sa = s["adapted"]
            lines.append(
                f"| synth | {s['record_minutes']:.2f} | {s['runs']} | {s['steps']} | "
                f"{_f(sa['joints'], 2)} | {_f(sa['command following'], 2)} | "
                f"{_f(sa['force'], 3)} | {_f(sa['linear'], 3)} | "
                f"{_f(s.get('adapt_fit_cpu_s'), 0)} | — | "
                + (f"fz {r['live_synth']['fz_mean_n']:.2f}" if r.get("live_synth") else "—")
                + f" | {_held(r.get('synth_bus_held_out'))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/calibrate-bus")
    ap.add_argument("--minutes", type=float, nargs="+", default=[1.0, 2.0])
    design = yaml.safe_load((conf_dir() / "bench" / "calibrate_curve.yaml").read_text())
    ap.add_argument("--platform", default=design["platform"])
    ap.add_argument("--world", default=design["world"])
    ap.add_argument("--seed", type=int, default=7, help="the world arm's seed (§12: 7, 8)")
    ap.add_argument("--leader-seed", type=int, default=1, help="the scripted leader's motion")
    ap.add_argument("--weights-g", default="200,400")
    ap.add_argument("--held-out", required=True,
                    help="§12's held-out dataset of this seed (bench/calibrate_curve.py's "
                         "OUT/seed_S/held_out)")
    ap.add_argument("--synth", help="a bench/calibrate_curve.py --out folder: its points at "
                                    "the same minutes go beside these")
    ap.add_argument("--leader", choices=["script", "replay"], default="script",
                    help="script: calibrate-arm's protocol with a scripted human on the "
                         "leader, then live; replay: the leader plays --synth's own train "
                         "runs of that point into `record`")
    ap.add_argument("--bus-held-out", metavar="DIR",
                    help="also record --held-out's runs through the bus (replay leader) into "
                         "DIR/held_out_bus and score every point (and --synth's) on them")
    ap.add_argument("--labels", choices=["record", "synth"], default="record",
                    help="replay: train on record's labels (-m g on every frame), or on the "
                         "replayed synth run's own (unknown where the object is set down)")
    ap.add_argument("--preposition-s", type=float, default=4.0,
                    help="replay: hold the follower at each run's first command this long "
                         "(through the bus) before its `record` (0: record's ramp alone)")
    ap.add_argument("--lockstep", action="store_true",
                    help="one frame of physics per telemetry read, not real time")
    ap.add_argument("--live-seconds", type=float, default=10.0)
    ap.add_argument("--adapt-steps", type=int,
                    help="fixed optimiser steps (a quick trial), not the protocol's scaling")
    ap.add_argument("--progress", action="store_true", help="progress bars while recording")
    a = ap.parse_args(argv)
    if a.leader == "replay" and not a.synth:
        raise UserError("--leader replay plays the runs of --synth's points: give --synth")
    if not (Path(a.held_out) / "meta" / "info.json").is_file():
        raise UserError(f"--held-out {a.held_out}: not a dataset (make it with "
                        "bench/calibrate_curve.py --seeds 7)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for m in a.minutes:
        folder = out / f"m_{m:g}"
        done = folder / "point.json"
        if done.is_file():
            row = json.loads(done.read_text())
        else:
            print(f"--- {m:g} min through the emulated bus -> {folder}", flush=True)
            row = (run_point if a.leader == "script" else replay_point)(m, a, folder)
            write_json(done, row)
        if (row.get("live") or {}).get("pose") != POSE:
            if row.get("live") and row["live"].get("torque") is None:
                row["live_torque_off"] = row["live"]  # an earlier version: torque left off
            row["live"] = live_check(a, adapted_ckpt(folder, a.leader), folder / "live.csv")
            write_json(done, row)
        synth_ckpt = synth_checkpoint(Path(a.synth) if a.synth else None, a.seed, m)
        synth_live = (row.get("live_synth") or {}).get("pose")
        if synth_ckpt and a.leader == "script" and synth_live != POSE:
            row["live_synth"] = live_check(a, synth_ckpt, folder / "live_synth.csv")
            write_json(done, row)
        row.setdefault("leader", "script")
        row["synth"] = synth_point(Path(a.synth) if a.synth else None, a.seed, m)
        rows.append(row)
        print(json.dumps({k: row.get(k) for k in ("minutes", "record_minutes", "runs", "steps",
                                                  "adapted", "adapt_fit_cpu_s", "bus", "live")}),
              flush=True)
    if a.bus_held_out:
        held_bus = record_held_out(a, Path(a.bus_held_out))
        for r in rows:
            folder = out / f"m_{r['minutes']:g}"
            ckpt = adapted_ckpt(folder, r["leader"])
            if a.leader == "script":  # the bundle's source checkpoint: eval reads EMA weights
                state = json.loads((folder / "calibrate.json").read_text())
                ckpt = Path(state["steps"]["adapt"]["checkpoint"])
            r["bus_held_out"] = score_on(ckpt, [*train_folders(folder, r["leader"]), *held_bus],
                                         folder / "score_bus_held_out")
            if r.get("synth") and a.synth and a.leader == "script":  # once, beside the script's
                s_ckpt = synth_checkpoint(Path(a.synth), a.seed, r["minutes"])
                train = synth_train(Path(a.synth), a.seed, r["synth"]["runs"], out)
                r["synth_bus_held_out"] = score_on(s_ckpt, [train, *held_bus],
                                                   folder / "score_synth_bus_held_out")
            write_json(folder / "point.json", {k: v for k, v in r.items() if k != "synth"})
        shipped_ckpt = project_root() / "src" / "nactuator" / "pretrained" / f"{a.platform}.pt"
        shipped_score = score_on(shipped_ckpt, held_bus, out / "score_shipped_bus_held_out")
        print("bus-recorded held-out runs, bundle as shipped:", json.dumps(shipped_score))
    shipped = out / "live_shipped.json"
    if not shipped.is_file() or json.loads(shipped.read_text()).get("pose") != POSE:
        write_json(shipped, live_check(a, project_root() / "src" / "nactuator" / "pretrained"
                                       / f"{a.platform}.pt", out / "live_shipped.csv"))
    result = {"rows": rows, "live_shipped": json.loads(shipped.read_text()), "command": " ".join(
        ["PYTHONPATH=src .venv/bin/python", "bench/calibrate_bus.py",
         *(argv if argv is not None else sys.argv[1:])])}
    write_json(out / "bus.json", result)
    text = table(rows)
    write_text(out / "bus.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
