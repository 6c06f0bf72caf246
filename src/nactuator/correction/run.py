"""``nactuator correct fit | eval``: learn the residual through the model, judge it in the world.

``fit`` reads the training targets from the world's task plans (``data.synth.task_targets``:
what a planner intends, no simulation), trains :class:`ResidualPolicy` through the frozen
counterfactual model + simulator and writes ``residual.pt``. ``eval`` takes held-out
targets (other repetitions, another task seed), replays each target as sent and its
corrected commands in the hidden world (:func:`nactuator.data.synth.replay_commands`, on an
arm seed of its own, with each payload of the config: the model never saw one) and reports
the joint tracking error in degrees per trajectory, mean and spread, and the reduction.
``eval --port`` (:func:`evaluate_bus`) plays the same held-out commands, uncorrected and
corrected, on a servo bus (the emulated SO-101 behind the real wire protocol, or a real arm)
through the guarded replay of ``collect`` (:func:`nactuator.hardware.collector.
replay_sequences`) and scores them on the bus's own position telemetry; torque is off at the
end however it ends.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from nactuator.atomic import atomic_path, json_safe, write_json, write_png, write_text
from nactuator.correction.residual import (
    CorrectionError,
    ResidualPolicy,
    fit_residual,
    model_tracking,
)
from nactuator.models import load_actuator
from nactuator.platforms import Platform, conf_dir, load_platform
from nactuator.progress import progress_bar

__all__ = ["evaluate", "evaluate_bus", "fit", "load_config"]


def load_config(path: str | os.PathLike | None) -> dict:
    """The correction YAML (default conf/correction/so101.yaml), checked for what fit and
    eval read."""
    path = Path(path) if path is not None else conf_dir() / "correction" / "so101.yaml"
    if not path.is_file():
        raise CorrectionError(f"correction config {path} does not exist")
    cfg = yaml.safe_load(path.read_text()) or {}
    for key in ("platform", "seconds", "train", "eval"):
        if key not in cfg:
            raise CorrectionError(f"{path}: missing field '{key}'")
    for section, fields in (("train", ("tasks", "reps", "seed")),
                            ("eval", ("tasks", "reps", "seed", "world_seed", "payloads_kg"))):
        for f in fields:
            if f not in cfg[section]:
                raise CorrectionError(f"{path}: missing field '{section}.{f}'")
        reps = cfg[section]["reps"]
        if not (isinstance(reps, list) and len(reps) == 2 and reps[1] > reps[0]):
            raise CorrectionError(f"{path}: '{section}.reps' must be [first, end) with "
                                  f"end > first, got {reps!r}")
    return cfg


def _targets(platform: Platform, cfg: dict, section: str) -> tuple[np.ndarray, list[str]]:
    """(B, T, n) targets of a config section, all cut to the shortest; their labels."""
    from nactuator.data.synth import task_targets

    s = cfg[section]
    plans = task_targets(platform, list(s["tasks"]), range(*s["reps"]), int(s["seed"]),
                         float(cfg["seconds"]), cfg.get("world"))
    length = min(q.shape[0] for _, _, q in plans)
    return (np.stack([q[:length] for _, _, q in plans]),
            [f"{task}#{rep}" for task, rep, _ in plans])


def _load(ckpt: str | os.PathLike, platform_name: str, device: str):
    from nactuator.sim import Simulator

    actuator, meta = load_actuator(ckpt, map_location=device)
    if meta["platform"] != platform_name:
        raise CorrectionError(f"checkpoint {ckpt} is for {meta['platform']}, the config for "
                              f"{platform_name}")
    platform = load_platform(platform_name)
    return actuator, platform, Simulator(platform, device=device)


def fit(config: str | os.PathLike | None, ckpt: str | os.PathLike, out: str | os.PathLike,
        device: str = "cpu") -> str:
    """Train the residual; write ``out/residual.pt`` and ``out/fit.json``. Returns a summary."""
    cfg = load_config(config)
    tr = cfg["train"]
    actuator, platform, sim = _load(ckpt, cfg["platform"], device)
    targets, labels = _targets(platform, cfg, "train")
    t0 = time.perf_counter()
    iterations = int(tr.get("iterations", 60))
    with progress_bar(total=iterations, desc="correct fit", unit="it") as bar:
        def step(k: int, total: int, loss: float) -> None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.2e}")

        policy, losses = fit_residual(
            actuator, sim, targets, iterations=iterations, lr=float(tr.get("lr", 3e-3)),
            batch=int(tr.get("batch", 4)), smoothness=float(tr.get("smoothness", 1e-2)),
            hidden=int(tr.get("hidden", 64)), max_delta=float(tr.get("max_delta", 0.3)),
            joints=_joints(platform, cfg), seed=int(tr["seed"]), progress=step)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "residual.pt", suffix=".pt") as tmp:
        torch.save({"state_dict": policy.state_dict(), "n": policy.n,
                    "offsets": list(policy.offsets), "hidden": int(tr.get("hidden", 64)),
                    "max_delta": policy.max_delta, "joints": policy.joints,
                    "platform": cfg["platform"],
                    "checkpoint": str(ckpt)}, tmp)
    before = model_tracking(actuator, sim, None, targets, policy.joints)
    after = model_tracking(actuator, sim, policy, targets, policy.joints)
    report = {"checkpoint": str(ckpt), "config": str(config), "targets": labels,
              "frames": int(targets.shape[1]), "iterations": iterations, "losses": losses,
              "wall_time_s": time.perf_counter() - t0,
              "model_train_error_deg": {"uncorrected": float(np.degrees(before.mean())),
                                        "corrected": float(np.degrees(after.mean()))}}
    write_json(out / "fit.json", json_safe(report))
    e = report["model_train_error_deg"]
    return (f"residual trained on {len(labels)} targets in {report['wall_time_s']:.0f} s; "
            f"model + sim tracking error on them {e['uncorrected']:.2f} -> "
            f"{e['corrected']:.2f} deg; wrote {out / 'residual.pt'}")


def load_policy(path: str | os.PathLike) -> ResidualPolicy:
    path = Path(path)
    if not path.is_file():
        raise CorrectionError(f"residual file {path} does not exist (run `nactuator correct "
                              "fit` first)")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    policy = ResidualPolicy(int(blob["n"]), blob["offsets"], int(blob["hidden"]),
                            float(blob["max_delta"]), blob["joints"])
    policy.load_state_dict(blob["state_dict"])
    return policy.eval()


def _joints(platform: Platform, cfg: dict) -> list[int]:
    """The channel indices of the config's ``joints`` (default: every channel)."""
    names = cfg.get("joints") or platform.channel_names
    unknown = [j for j in names if j not in platform.channel_names]
    if unknown:
        raise CorrectionError(f"correction config: unknown joint(s) {unknown} in 'joints'; "
                              f"{platform.name} has {platform.channel_names}")
    return [platform.channel_names.index(j) for j in names]


def _world_errors(platform: Platform, targets: np.ndarray, commands: np.ndarray, cfg: dict,
                  payload_kg: float, joints: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(B,) world tracking MAE [deg] over ``joints`` of each command sequence, and the
    world q (B, T, n)."""
    from nactuator.data.synth import replay_commands

    # One replay per target: each starts at rest at its own first point.
    qs = []
    for b in range(len(targets)):
        logs = replay_commands(platform, commands[b][None], targets[b, 0], cfg.get("world"),
                               int(cfg["eval"]["world_seed"]), payload_kg=payload_kg)
        qs.append(logs["q"][0])
    q = np.stack(qs)
    err = np.abs(q[:, 1:] - targets[:, 1:])[..., joints]
    return np.degrees(err.mean(axis=(1, 2))), q


def _stats(x: np.ndarray) -> dict:
    return {"mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "min": float(x.min()), "max": float(x.max())}


def _row(judge: str, payload: float | None, naive: np.ndarray, corr: np.ndarray) -> dict:
    """One table row: per-target errors [deg] uncorrected and corrected, their stats and the
    reduction of the mean (and its per-target range)."""
    per = 100 * (1 - corr / naive)
    return {"judge": judge, "payload_kg": payload, "uncorrected": _stats(naive),
            "corrected": _stats(corr), "per_target_deg": {"uncorrected": naive.tolist(),
                                                          "corrected": corr.tolist()},
            "reduction_pct": float(100 * (1 - corr.mean() / naive.mean())),
            "reduction_min_pct": float(per.min()), "reduction_max_pct": float(per.max())}


def _plot(platform: Platform, target: np.ndarray, naive: np.ndarray, corrected: np.ndarray,
          commands: np.ndarray, title: str, path: Path, judge: str = "world") -> Path:
    from matplotlib.figure import Figure

    n = target.shape[1]
    t = np.arange(len(target)) * platform.control_dt
    fig = Figure(figsize=(10, 1.9 * n + 0.8))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for j, ax in enumerate(axes):
        ax.plot(t, np.degrees(target[:, j]), color="k", lw=1.4, label="target")
        ax.plot(t, np.degrees(commands[:, j]), color="tab:green", lw=0.8, ls="--",
                label="corrected command")
        ax.plot(t, np.degrees(naive[:, j]), color="tab:orange", lw=1.0,
                label=f"{judge}: target sent")
        ax.plot(t, np.degrees(corrected[:, j]), color="tab:blue", lw=1.0,
                label=f"{judge}: corrected")
        ax.set_ylabel(f"{platform.channel_names[j]} [deg]", fontsize=7)
        ax.tick_params(labelsize=7)
    axes[0].set_title(title, fontsize=8)
    axes[0].legend(fontsize=6, loc="upper right", ncol=2)
    axes[-1].set_xlabel("time [s]", fontsize=8)
    fig.tight_layout()
    return write_png(path, fig)


def _markdown(report: dict) -> str:
    if "port" in report:
        head = ["# Residual action correction, judged on a servo bus", "",
                f"residual `{report['residual']}`, {len(report['targets'])} held-out targets "
                f"of {report['frames']} frames played on `{report['port']}` (uncorrected and "
                f"corrected, alternating which goes first); tracking error from the bus's "
                f"position telemetry over {', '.join(report['joints'])}; "
                f"{report['overruns']} slot(s) lost to overruns, "
                f"{report['invalid_reads']} missing read(s).", ""]
    else:
        head = ["# Residual action correction, judged in the hidden world", "",
                f"checkpoint `{report['checkpoint']}`, {len(report['targets'])} held-out "
                f"targets of {report['frames']} frames, world seed {report['world_seed']}; "
                f"tracking error over {', '.join(report['joints'])}.", ""]
    lines = [*head,
             "| payload | judged by | uncorrected [deg] | corrected [deg] | reduction |",
             "|---|---|---|---|---|"]
    for row in report["rows"]:
        u, c = row["uncorrected"], row["corrected"]
        load = ("not told" if row["payload_kg"] is None else f"{row['payload_kg']:.2f} kg")
        lines.append(f"| {load} | {row['judge']} | {u['mean']:.2f} ± "
                     f"{u['std']:.2f} | {c['mean']:.2f} ± {c['std']:.2f} | "
                     f"{row['reduction_pct']:.0f} % ({row['reduction_min_pct']:.0f} … "
                     f"{row['reduction_max_pct']:.0f} %) |")
    lines += ["", "mean ± sample std over the targets; the reduction is of the mean error, "
              "its range the per-target reductions."]
    return "\n".join(lines) + "\n"


def evaluate(config: str | os.PathLike | None, ckpt: str | os.PathLike,
             residual: str | os.PathLike, out: str | os.PathLike | None = None,
             world_seed: int | None = None, device: str = "cpu") -> str:
    """Held-out targets, uncorrected vs corrected, in the world per payload (and the model's
    own prediction for reference). Writes eval.json, eval.md and correction.png to ``out``.
    ``world_seed`` replaces the config's ``eval.world_seed`` (another hidden arm)."""
    cfg = load_config(config)
    if world_seed is not None:
        cfg["eval"]["world_seed"] = int(world_seed)
    actuator, platform, sim = _load(ckpt, cfg["platform"], device)
    policy = load_policy(residual).to(sim.device)
    targets, labels = _targets(platform, cfg, "eval")
    with torch.no_grad():
        commands = np.stack([policy.corrected(t) for t in targets])
    rows = []
    row = _row
    rows.append(row("model + sim (no payload)", 0.0,
                    np.degrees(model_tracking(actuator, sim, None, targets, policy.joints)),
                    np.degrees(model_tracking(actuator, sim, policy, targets, policy.joints))))
    shown = None
    for payload in cfg["eval"]["payloads_kg"]:
        naive, q_naive = _world_errors(platform, targets, targets, cfg, float(payload),
                                       policy.joints)
        corr, q_corr = _world_errors(platform, targets, commands, cfg, float(payload),
                                     policy.joints)
        rows.append(row("hidden world", float(payload), naive, corr))
        if shown is None or payload > shown[0]:
            shown = (float(payload), q_naive, q_corr)
    report = {"checkpoint": str(ckpt), "residual": str(residual), "config": str(config),
              "targets": labels, "frames": int(targets.shape[1]),
              "world_seed": int(cfg["eval"]["world_seed"]),
              "joints": [platform.channel_names[j] for j in policy.joints], "rows": rows}
    if out is not None:
        out = Path(out)
        payload, q_naive, q_corr = shown
        report["plot"] = _plot(platform, targets[0], q_naive[0], q_corr[0], commands[0],
                               f"{labels[0]}, payload {payload:.2f} kg (hidden world)",
                               out / "correction.png").name
        write_json(out / "eval.json", json_safe(report))
        write_text(out / "eval.md", _markdown(report))
    return _markdown(report)


def _bus_errors(targets: np.ndarray, replays: list[dict], joints: list[int]) -> np.ndarray:
    """(B,) mean |q_bus - target| [deg] over ``joints`` and frames 1..T-1 the bus reported
    (a frame lost to an overrun or a missing read does not count)."""
    errs = []
    for target, r in zip(targets, replays, strict=True):
        e = np.abs(r["q"][1:] - target[1:])[:, joints]
        if not np.isfinite(e).any():
            raise CorrectionError("the bus reported no position for any scored frame")
        errs.append(np.degrees(np.nanmean(e)))
    return np.array(errs)


def evaluate_bus(config: str | os.PathLike | None, residual: str | os.PathLike, port: str,
                 out: str | os.PathLike | None = None, calibration: str | None = None,
                 settle_s: float | None = None, progress: bool = True,
                 platform: Platform | None = None, limit_margin: float | None = None) -> str:
    """The config's held-out targets played on the bus at ``port``: each target as sent
    and corrected, alternately first, through the guarded replay of ``collect``. Scores
    the bus's own position telemetry; writes eval.json, eval.md and correction.png to
    ``out``. The payload, if any, is the arm's: the client is not told. ``platform``: the
    config's platform with other hardware settings (timeouts, ramp), default as named.
    ``limit_margin``: the joint-limit margin of the safety checks (default: the platform's
    ``hardware.collect``), as a fraction of each joint's range."""
    from nactuator.hardware.collector import SafetyLimits, replay_sequences

    cfg = load_config(config)
    platform = platform or load_platform(cfg["platform"])
    if platform.name != cfg["platform"]:
        raise CorrectionError(f"the config is for {cfg['platform']}, the bus for "
                              f"{platform.name}")
    policy = load_policy(residual)
    if policy.n != platform.n:
        raise CorrectionError(f"residual {residual} corrects {policy.n} channels; "
                              f"{platform.name} has {platform.n}")
    targets, labels = _targets(platform, cfg, "eval")
    commands = np.stack([policy.corrected(t) for t in targets])
    sequences, names, slots = [], [], []
    for b, label in enumerate(labels):
        pair = [(targets[b], "uncorrected"), (commands[b], "corrected")]
        for seq, kind in (pair if b % 2 == 0 else pair[::-1]):
            sequences.append(seq)
            names.append(f"{label} {kind}")
            slots.append((b, kind))
    t0 = time.perf_counter()
    limits = SafetyLimits.from_platform(platform, limit_margin=limit_margin)
    replays = replay_sequences(platform, port, sequences, limits=limits,
                               calibration=calibration, settle_s=settle_s, progress=progress,
                               labels=names)
    by = {slot: r for slot, r in zip(slots, replays, strict=True)}
    naive_runs = [by[(b, "uncorrected")] for b in range(len(labels))]
    corr_runs = [by[(b, "corrected")] for b in range(len(labels))]
    naive = _bus_errors(targets, naive_runs, policy.joints)
    corr = _bus_errors(targets, corr_runs, policy.joints)
    report = {"residual": str(residual), "config": str(config), "port": port,
              "targets": labels, "frames": int(targets.shape[1]),
              "joints": [platform.channel_names[j] for j in policy.joints],
              "limit_margin": limits.limit_margin,
              "overruns": int(sum(r["overruns"] for r in replays)),
              # reads missing on played slots (a lost slot has no read at all)
              "invalid_reads": int(sum((~r["valid"]).sum() - r["overruns"] * platform.n
                                       for r in replays)),
              "wall_time_s": time.perf_counter() - t0,
              "rows": [_row("servo bus", None, naive, corr)]}
    if out is not None:
        out = Path(out)
        report["plot"] = _plot(platform, targets[0], naive_runs[0]["q"], corr_runs[0]["q"],
                               commands[0], f"{labels[0]} on the bus {port}",
                               out / "correction.png", judge="bus").name
        report["q_bus"] = {"uncorrected": [r["q"].tolist() for r in naive_runs],
                           "corrected": [r["q"].tolist() for r in corr_runs]}
        write_json(out / "eval.json", json_safe(report))
        write_text(out / "eval.md", _markdown(report))
    return _markdown(report)
