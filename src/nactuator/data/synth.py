"""Synthetic nactuator datasets from the hidden ground-truth world (:mod:`nactuator.world`).

For every task of the world file, ``trajectories_per_task`` repetitions of the commanded
motion run in lock-step (one :class:`~nactuator.world.World` with one arm per repetition) and
are logged at the platform's control period, exactly as a teleoperation recorder would: each
frame reads the telemetry registers, then writes the next goal. Repetitions are split 8:1:1
(train/validation/test) by trajectory.

The dataset is written to a temporary sibling folder and moved into place only when complete,
so a failure never leaves a half-written or damaged dataset at ``out``. The resolved world
parameters go into ``meta/info.json`` (``nactuator.metadata.world``) so the exact robot can be
rebuilt with ``WorldParams.from_dict``. Same seed, same arguments -> byte-identical files.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from nactuator.constants import GRAVITY
from nactuator.data.schema import REQUIRED_KEYS, DataFormatError
from nactuator.data.writer import DatasetWriter
from nactuator.platforms import Platform, conf_dir, load_platform
from nactuator.progress import progress_bar
from nactuator.world import World, WorldError, WorldParams, load_world
from nactuator.world.tasks import Kinematics, plan_episode, task_seed

__all__ = ["MAX_ARMS_PER_BATCH", "replay_commands", "run_tasks", "split_for", "synthesize",
           "true_joint_states"]

# Arms simulated in one lock-step batch: amortises the per-step numpy work over many arms
# while bounding memory (logs are t_max x arms x n doubles per channel).
MAX_ARMS_PER_BATCH = 120


def split_for(rep: int, reps: int) -> str:
    """8:1:1 by trajectory: the last tenth is test, the tenth before it validation.

    With fewer than 10 trajectories each of validation and test still gets one as soon as
    there are 3 (2 -> train + validation, 1 -> train only).
    """
    n_test = max(1, round(0.1 * reps)) if reps >= 3 else 0
    n_val = max(1, round(0.1 * reps)) if reps >= 2 else 0
    if rep >= reps - n_test:
        return "test"
    if rep >= reps - n_test - n_val:
        return "validation"
    return "train"


def run_tasks(
    platform: Platform,
    params: WorldParams,
    tasks: list[str],
    reps: int,
    seed: int,
    seconds: float | None = None,
    kin: Kinematics | None = None,
    progress: Callable[[int, int], None] | None = None,
    true_state: bool = False,
) -> list[tuple[str, dict[str, np.ndarray], dict]]:
    """Simulate ``reps`` repetitions of each task, all arms in one lock-step batch.

    Returns (task, Contract-1 frames, episode meta) per episode, tasks in order. An arm's data
    depend only on the seed, its task and its repetition (per-arm noise streams), not on which
    other tasks share the batch. ``progress(frame, frames)`` is called after every frame.
    ``true_state``: the frames also hold ``q_true`` (T, n), the arm's exact joint positions
    (MuJoCo ``qpos``) at the instant the telemetry was read, before the encoder quantised them:
    what a camera sees. It is not a Contract-1 key (the writer refuses it).
    """
    kin = kin or (Kinematics(platform) if platform.n > 1 else None)
    jobs = [(task, r) for task in tasks for r in range(reps)]
    plans = [plan_episode(platform, params, kin, task, r, seed, seconds) for task, r in jobs]
    n, n_envs = platform.n, len(jobs)
    arm_seeds = [int(task_seed(seed, task, 2, r).integers(2**31)) for task, r in jobs]
    world = World(platform, params, seed=arm_seeds, n_envs=n_envs)
    if any(p.kp is not None for p in plans):
        kp = np.array([[p.kp if p.kp is not None else np.nan] * n for p in plans])
        world.servo.p = dict(world.servo.p, kp=np.where(np.isnan(kp), world.motors["kp"], kp))

    lo, hi = params.thermal["initial_rise"]
    temps = np.stack([params.thermal["ambient"] + task_seed(seed, task, 3, r).uniform(lo, hi, n)
                      for task, r in jobs])
    world.reset(np.stack([p.q_goal[0] for p in plans]), temperature=temps)
    bands = np.array([p.band for p in plans])
    if bands.any():
        world.set_band(bands)
    onsets = _fault_onsets(plans)
    world.step(float(params.physics["settle_seconds"]))

    lengths = np.array([p.frames for p in plans])
    t_max = int(lengths.max())
    # Commands padded by holding the last frame, so every arm can step together.
    def padded(name: str) -> np.ndarray:
        out = []
        for p in plans:
            a = getattr(p, name)
            out.append(np.concatenate([a, np.repeat(a[-1:], t_max - a.shape[0], axis=0)]))
        return np.stack(out, axis=1)  # (t_max, n_envs, w)

    goals, enables, forces = padded("q_goal"), padded("torque_enable") > 0.5, padded("force")
    grasps = np.stack([np.concatenate([p.grasp, np.repeat(p.grasp[-1:], t_max - p.frames)])
                       for p in plans], axis=1)  # (t_max, n_envs)
    keys = (*REQUIRED_KEYS, "pwm", "current")
    logs = {k: np.zeros((t_max, n_envs, n)) for k in keys}
    q_true = np.zeros((t_max, n_envs, n)) if true_state else None
    for k in range(t_max):
        if k in onsets:
            _switch_faults_on(world, plans, onsets[k])
        if q_true is not None:
            q_true[k] = world.joint_positions()
        tel = world.telemetry()  # read the registers, then write the next goal
        world.set_goal(goals[k])
        world.set_torque_enabled(enables[k])
        world.set_external_force(forces[k])
        world.set_grasp(grasps[k])
        logs["q_cmd"][k] = world.goal()
        for key in keys[1:]:
            logs[key][k] = tel[key]
        world.step(platform.control_dt)
        if progress is not None:
            progress(k + 1, t_max)

    episodes = []
    for e, ((task, r), p) in enumerate(zip(jobs, plans, strict=True)):
        L = p.frames
        frames = {key: logs[key][:L, e] for key in keys}
        frames.update(
            force=p.force_label,
            payload_mass=p.payload_mass,
            condition=p.condition,
            telemetry_valid=np.ones((L, n)),
            torque_enable=p.torque_enable,
            timestamp=np.arange(L) * platform.control_dt,
        )
        if q_true is not None:
            frames["q_true"] = q_true[:L, e]
        meta = dict(p.meta, split=split_for(r, reps), synthetic=True,
                    initial_temperature=[round(float(x), 3) for x in temps[e]])
        episodes.append((task, frames, meta))
    return episodes


def _fault_onsets(plans: list) -> dict[int, list[int]]:
    """Onset frame -> the arms whose mid-run fault starts there."""
    out: dict[int, list[int]] = {}
    for e, p in enumerate(plans):
        if p.fault is not None:
            out.setdefault(p.fault["onset_frame"], []).append(e)
    return out


def _switch_faults_on(world: World, plans: list, arms: list[int]) -> None:
    """Switch the faults of ``arms`` on at onset frame k, before its registers are read: the
    fault acts on the physics from frame k on, so frame k (labelled first degraded) is read
    nominal and frame k + 1 is the first that can show it."""
    band = [e for e in arms if plans[e].fault["kind"] == "band"]
    if band:
        new = np.zeros(world.n_envs, dtype=bool)
        new[band] = True
        channel = world.band_channel.copy()
        for e in band:
            channel[e] = plans[e].fault["channel"]
        rows = np.arange(world.n_envs)
        rest = np.where(new, world.q[rows, channel] + world.params.band["rest_offset"],
                        world.band_rest)
        world.set_band(world.band_enabled | new, rest=rest, channel=channel)
    for e in arms:
        f = plans[e].fault
        if f["kind"] == "wear":
            world.wear_gearbox([e], f["channel"], f["wear"])


def replay_commands(platform: Platform, commands: np.ndarray, q0: np.ndarray,
                    world: str | None = None, seed: int = 0, kp: float | None = None,
                    temperature: float | None = None,
                    payload_kg: float = 0.0) -> dict[str, np.ndarray]:
    """Run command sequences in the hidden world and log them as :func:`run_tasks` does.

    ``commands`` (S, T, n): S sequences of T goals, all started at rest at ``q0`` (n,) after
    the world's settle time, each on its own arm with the same noise stream. ``world`` is a
    world YAML (default ``conf/world/<platform>.yaml``) resolved with ``seed``. ``kp`` sets
    the Position P gain register of every motor (default: the world's); ``temperature`` the
    motors' starting temperature (default: ambient + the middle of ``initial_rise``);
    ``payload_kg`` hangs a mass at the end effector for the whole run (its weight, -m g along
    base z, as the world's payload tasks apply it). Frame
    k holds the telemetry read just before goal k is written, so ``q[:, k + 1]`` is the
    response to ``commands[:, k]``. Returns (S, T, n) arrays q, qd, voltage, temperature,
    effort, q_cmd, and ``kp`` (n,): the gain that ran.
    """
    params = load_world(platform, world, seed)
    if params.controller != "position_pid":
        raise WorldError(f"world {params.source} is not a position-controlled servo world")
    commands = np.asarray(commands, dtype=np.float64)
    if commands.ndim != 3 or commands.shape[2] != platform.n or commands.shape[1] < 1:
        raise WorldError(f"commands must have shape (sequences, frames, {platform.n}), "
                         f"got {commands.shape}")
    sequences, frames, n = commands.shape
    world = World(platform, params, seed=[int(seed)] * sequences, n_envs=sequences)
    if kp is not None:
        world.servo.p = dict(world.servo.p, kp=np.full(n, float(kp)))
    if temperature is None:
        lo, hi = params.thermal["initial_rise"]
        temperature = float(params.thermal["ambient"]) + 0.5 * (lo + hi)
    world.reset(np.broadcast_to(np.asarray(q0, dtype=np.float64), (sequences, n)),
                temperature=temperature)
    if payload_kg:
        world.set_external_force([0.0, 0.0, -float(payload_kg) * GRAVITY])
    world.step(float(params.physics["settle_seconds"]))
    keys = ("q", "qd", "voltage", "temperature", "effort")
    logs = {k: np.zeros((sequences, frames, n)) for k in (*keys, "q_cmd")}
    for k in range(frames):
        tel = world.telemetry()
        world.set_goal(commands[:, k])
        logs["q_cmd"][:, k] = world.goal()
        for key in keys:
            logs[key][:, k] = tel[key]
        world.step(platform.control_dt)
    logs["kp"] = np.asarray(world.servo.p["kp"], dtype=np.float64).reshape(-1)[:n].copy()
    return logs


def true_joint_states(dataset, episodes: list[int]) -> dict[int, np.ndarray]:
    """The exact joint positions (T, n) of synthetic episodes, regenerated from the world the
    dataset's ``meta/info.json`` records (``nactuator.metadata``: world, seed, tasks,
    trajectories per task, seconds). ``dataset``: a :class:`~nactuator.data.schema.Dataset`.

    Each episode's task is re-run with all its repetitions (an arm depends only on the seed,
    its task and its repetition) and the regenerated telemetry must equal the stored ``q``
    bit for bit, so a dataset edited after synthesis, or written by another version of the
    world, is refused instead of silently getting another arm's truth.
    """
    meta = dataset.info.get("nactuator", {}).get("metadata", {}) or {}
    where = f"{dataset.root}/meta/info.json"
    if not meta.get("synthetic") or "world" not in meta:
        raise DataFormatError(f"{where}: not a synthetic dataset (no nactuator.metadata.world); "
                              "its true joint state is unknown (use the stored q instead)")
    plat = load_platform(dataset.platform)
    params = WorldParams.from_dict(meta["world"])
    reps, seed, seconds = int(meta["trajectories_per_task"]), int(meta["seed"]), meta["seconds"]
    by_task: dict[str, list[int]] = {}
    for i in episodes:
        by_task.setdefault(dataset.episodes[i].task, []).append(i)
    out: dict[int, np.ndarray] = {}
    kin = Kinematics(plat) if plat.n > 1 else None
    for task, idx in by_task.items():
        runs = run_tasks(plat, params, [task], reps, seed, seconds, kin, true_state=True)
        for i in idx:
            ep = dataset.episodes[i]
            rep = ep.meta.get("repetition")
            if not isinstance(rep, int) or not 0 <= rep < len(runs):
                raise DataFormatError(f"{dataset.root}: episode {ep.index} ({task}): episode "
                                      f"meta 'repetition' {rep!r} is not one of 0..{reps - 1}")
            frames = runs[rep][1]
            q = frames["q"].astype(np.float32)
            if q.shape != ep.frames["q"].shape or not np.array_equal(q, ep.frames["q"]):
                raise DataFormatError(
                    f"{dataset.root}: episode {ep.index} ({task}, repetition {rep}): the world "
                    "regenerated from meta/info.json does not reproduce the stored q (edited "
                    "dataset or another version of the world); use the stored q instead")
            out[i] = frames["q_true"]
    return out


def task_targets(platform: Platform, tasks: list[str], reps: range, seed: int,
                 seconds: float | None = None,
                 world: str | None = None) -> list[tuple[str, int, np.ndarray]]:
    """The commanded joint trajectories (T, n) of the world's task plans, no simulation.

    One per (task, repetition): what a task planner intends the joint to do, e.g. the
    targets a residual correction learns to reach (``nactuator correct``)."""
    params = load_world(platform, world, seed)
    kin = Kinematics(platform) if platform.n > 1 else None
    return [(task, r, plan_episode(platform, params, kin, task, r, seed, seconds).q_goal)
            for task in tasks for r in reps]


def _portable_source(source: str) -> str:
    """World file path relative to conf/ when it lives there (keeps info.json portable)."""
    try:
        return str(Path(source).resolve().relative_to(conf_dir().resolve()))
    except ValueError:
        return source


def _check_out(out: Path) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise DataFormatError(f"{out}: exists and is not a folder; expected a dataset folder")
    if not any(out.iterdir()):
        return
    info = out / "meta" / "info.json"
    try:
        synthetic = json.loads(info.read_text())["nactuator"]["metadata"].get("synthetic")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        synthetic = False
    if not synthetic:
        raise DataFormatError(
            f"{out}: folder exists and is not a synthetic nactuator dataset; refusing to "
            "replace it (choose an empty or new --out)"
        )


def synthesize(
    platform: str,
    out: str,
    seed: int = 0,
    world: str | None = None,
    trajectories_per_task: int = 10,
    seconds: float | None = None,
    tasks: list[str] | None = None,
) -> str:
    """Generate a synthetic dataset at ``out``; returns a one-paragraph summary.

    ``world`` is a world YAML (default ``conf/world/<platform>.yaml``); ``seconds`` overrides
    every task's length; ``tasks`` selects a subset by name. An existing *synthetic* dataset
    at ``out`` is replaced once the new one is complete; any other non-empty folder is refused.
    """
    started = time.perf_counter()
    plat = load_platform(platform)
    if not isinstance(trajectories_per_task, int) or trajectories_per_task < 1:
        raise WorldError(f"trajectories_per_task must be a positive integer, "
                         f"got {trajectories_per_task!r}")
    if seconds is not None and not (seconds > 0 and np.isfinite(seconds)):
        raise WorldError(f"seconds must be a positive number, got {seconds!r}")
    params = load_world(plat, world, seed)
    names = list(params.tasks) if not tasks else list(tasks)
    unknown = [t for t in names if t not in params.tasks]
    if unknown:
        raise WorldError(f"unknown task(s) {unknown} for world {params.source}; "
                         f"expected some of {sorted(params.tasks)}")
    out_path = Path(out)
    _check_out(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.parent / f".{out_path.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)

    resolved = params.to_dict()
    resolved["source"] = _portable_source(params.source)
    metadata = {
        "synthetic": True,
        "generator": "nactuator.data.synth",
        "seed": int(seed),
        "trajectories_per_task": trajectories_per_task,
        "seconds": seconds,
        "tasks": names,
        "world": resolved,
    }
    kin = Kinematics(plat) if plat.n > 1 else None
    frames_total = 0
    try:
        writer = DatasetWriter(tmp, plat, fps=plat.fps, metadata=metadata)
        per_batch = max(1, MAX_ARMS_PER_BATCH // trajectories_per_task)
        batches = [names[i:i + per_batch] for i in range(0, len(names), per_batch)]
        with progress_bar(total=float(len(batches)), desc=f"synth {plat.name}", unit="batch",
                          bar_format="{l_bar}{bar}| {n:.2f}/{total:.0f} batches "
                                     "[{elapsed}<{remaining}]", disable=None) as bar:
            for b, batch in enumerate(batches):
                def progress(k: int, frames: int, b: int = b) -> None:
                    if k % 20 == 0 or k == frames:
                        bar.n = b + k / frames
                        bar.refresh()

                for task, frames, meta in run_tasks(plat, params, batch, trajectories_per_task,
                                                    seed, seconds, kin, progress):
                    writer.add_episode(frames, task, meta["split"], episode_meta=meta)
                    frames_total += frames["q"].shape[0]
        writer.close()
        _replace_dir(tmp, out_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    elapsed = time.perf_counter() - started
    sim_s = frames_total * plat.control_dt
    per_split = [split_for(r, trajectories_per_task) for r in range(trajectories_per_task)]
    split_text = " / ".join(f"{per_split.count(s)} {s}" for s in ("train", "validation", "test"))
    return (
        f"synthesized {len(names) * trajectories_per_task} episodes ({len(names)} tasks x "
        f"{trajectories_per_task} trajectories: {split_text} per task), {frames_total} frames "
        f"({sim_s:.0f} s at {1 / plat.control_dt:.1f} Hz) for {plat.name} into {out_path}; "
        f"world {resolved['source']} seed {seed}; took {elapsed:.1f} s"
    )


def _replace_dir(new: Path, dest: Path) -> None:
    """Move ``new`` to ``dest``; an old ``dest`` is removed only after the move succeeded."""
    if not dest.exists():
        os.replace(new, dest)
        return
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.replace(dest, old)
    try:
        os.replace(new, dest)
    except BaseException:
        os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)
