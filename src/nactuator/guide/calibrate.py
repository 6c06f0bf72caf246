"""``nactuator calibrate-arm``: from a connected arm to a live force sensor, guided.

Built on the commands that exist, in one resumable sequence (``OUT/calibrate.json``):

1. **check** the leader and the follower: the port, every servo ID and model number (what
   ``TelemetryBus.connect`` checks), the calibration file (``port.load_calibration``), a
   complete telemetry frame, and every joint inside its range (a calibration that does not
   match the arm reads joints far outside). Torque stays off.
2. **record** the protocol of ``conf/calibrate/<platform>.yaml`` with
   :func:`nactuator.hardware.recorder.record` (``--payload-g`` labels), one dataset per step
   under ``OUT/recordings/``, the instructions printed before each step. A step counts as
   done only when all its episodes were saved whole; Ctrl-C ends it as it ends ``record``
   (episode saved, torque off), and a rerun records that step again from its start.
3. **adapt** the pretrained bundle (:func:`nactuator.experiments.adapt.adapt`) on every
   train recording, its optimiser steps scaled to the minutes recorded, and score it on the
   held-out last run: joints against command following, force against a linear regression
   fitted on the same recordings (``nactuator eval``).
4. **bundle**: the adapted model's EMA weights as ``OUT/actuator.pt``, for ``live --ckpt``.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from nactuator.atomic import write_text
from nactuator.guide.protocol import (
    CalibrateError,
    State,
    Step,
    adapt_steps,
    load_protocol,
    plan_digest,
    plan_steps,
    resolve_weights,
    weights_advice,
)

__all__ = ["Interrupted", "calibrate_arm", "check_arm"]

BUNDLE = "actuator.pt"
Prompt = Callable[[Step, int, int], None]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) ended a step; what was finished is kept for the rerun."""


def _say(text: str = "") -> None:
    print(text, flush=True)


def _terminal() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()


def wait_for_enter(step: Step, index: int, total: int) -> None:
    """The default prompt: the step's instructions, then Enter (only on a terminal)."""
    what = "no weight" if step.payload_g == 0 else f"{step.payload_g:g} g"
    _say(f"\n[{index}/{total}] {step.key}: {step.episodes} run(s) of {step.seconds:g} s, "
         f"{what}{', held out' if step.split == 'test' else ''}")
    _say("  " + step.prompt)
    if _terminal():
        input("  Press Enter to start recording (Ctrl-C stops; rerun to resume) ")
    else:
        _say("  (not a terminal: starting now)")


def check_arm(platform: Any, leader: str, follower: str, leader_calibration: str | None = None,
              follower_calibration: str | None = None, limit_tolerance: float = 0.35
              ) -> dict[str, Any]:
    """Open both buses with torque off, read one frame, check it; returns what was read.
    Raises ``BusError`` (port, servos, calibration file) or :class:`CalibrateError`."""
    from nactuator.hardware.open import open_bus

    lo = np.array([c.limit_lower for c in platform.channels])
    hi = np.array([c.limit_upper for c in platform.channels])
    report: dict[str, Any] = {}
    for role, port, cal in (("leader", leader, leader_calibration),
                            ("follower", follower, follower_calibration)):
        with open_bus(platform, port, cal, torque=False) as bus:
            frame = bus.wait_ready()
            if not frame.valid.all():
                bad = [f"{bus.ids[k]} ({bus.names[k]})" for k in np.flatnonzero(~frame.valid)]
                raise CalibrateError(f"{role} on {port}: no telemetry from servo(s) "
                                     f"{', '.join(bad)} within 1 s: check its cable and power")
            off = np.maximum(lo - frame.q, frame.q - hi)
            far = np.flatnonzero(off > limit_tolerance)
            if far.size:
                k = int(far[0])
                c = platform.channels[k]
                hint = (f"the calibration file {cal} does not match this arm" if cal else
                        "no calibration file was given (--" + role + "-calibration)")
                raise CalibrateError(
                    f"{role} on {port}: joint {c.name} reads {frame.q[k]:.2f}, "
                    f"{off[k]:.2f} outside its range [{c.limit_lower:.2f}, {c.limit_upper:.2f}]"
                    f" ({platform.source}): {hint}; recalibrate (docs/hardware.md)")
            report[role] = {"port": port, "calibration": cal, "servos": list(bus.ids),
                            "q": frame.q.tolist(),
                            "voltage_v": float(np.nanmedian(frame.voltage)),
                            "temperature_c": float(np.nanmax(frame.temperature))}
    return report


def _recorded_whole(folder: Path, step: Step) -> tuple[bool, float, int]:
    """Whether ``folder`` holds the step's episodes, none cut short; their seconds; the
    frames of the shortest."""
    from nactuator.data import read_dataset

    if not (folder / "meta" / "info.json").is_file():
        return False, 0.0, 0
    ds = read_dataset(folder)
    whole = [ep for ep in ds.episodes if not ep.meta.get("interrupted")]
    seconds = sum(ep.length for ep in ds.episodes) / ds.fps
    shortest = min((ep.length for ep in ds.episodes), default=0)
    return len(whole) == step.episodes == len(ds.episodes), seconds, shortest


def fit_horizon(schedule: int | dict, shortest_frames: int) -> dict[int, int]:
    """The adapt recipe's horizon curriculum ({epoch: H}), each H capped so that the
    shortest recording still holds a training window (H + 1 frames)."""
    items = schedule.items() if isinstance(schedule, dict) else [(0, schedule)]
    cap = max(1, shortest_frames - 1)
    return {int(e): min(int(h), cap) for e, h in sorted(items, key=lambda x: int(x[0]))}


def _figure(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return None if v is None or not math.isfinite(v) else float(v)


def held_out_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures printed at the end, from ``adapt.json``: the held-out run scored with
    the pretrained bundle as it is (N = 0) and adapted, beside the trivial references."""
    first, last = result["points"][0]["metrics"], result["points"][-1]["metrics"]
    keys = {"joints_deg": "arm mean (deg), model",
            "joints_command_deg": "arm mean (deg), command following",
            "force_n": "force 3-axis (N), model rollout",
            "force_reference_n": "force 3-axis (N), linear regression"}
    out = {"episodes": result["held_out"]["episodes"],
           "pretrained": {k: _figure(first, v) for k, v in keys.items()},
           "adapted": {k: _figure(last, v) for k, v in keys.items()}}
    # N = 0 scores a dataset of the held-out run alone: no train split to fit a regression
    # on, so both columns share the one fitted on the recordings.
    for k in ("joints_command_deg", "force_reference_n"):
        out["pretrained"][k] = out["pretrained"][k] or out["adapted"][k]
    return out


def format_summary(s: dict[str, Any]) -> str:
    def f(x: float | None, unit: str, digits: int) -> str:
        return "—" if x is None else f"{x:.{digits}f} {unit}"

    p, a = s["pretrained"], s["adapted"]
    lines = [f"held-out run ({', '.join(s['episodes'])}; never trained on):",
             f"  {'':26}{'pretrained':>12}{'adapted':>12}   reference",
             f"  {'joints, arm mean error':26}{f(p['joints_deg'], '°', 2):>12}"
             f"{f(a['joints_deg'], '°', 2):>12}   command following "
             f"{f(a['joints_command_deg'], '°', 2)}",
             f"  {'force, 3-axis error':26}{f(p['force_n'], 'N', 3):>12}"
             f"{f(a['force_n'], 'N', 3):>12}   linear regression on your recordings "
             f"{f(a['force_reference_n'], 'N', 3)}"]
    from nactuator.data.references import verdict

    figures = {k: v for k, v in a.items() if v is not None}
    if {"joints_deg", "joints_command_deg"} - set(figures):
        figures.pop("joints_deg", None)
    if {"force_n", "force_reference_n"} - set(figures):
        figures.pop("force_n", None)
    lines.append("  adapted: " + verdict(figures, "linear regression"))
    return "\n".join(lines)


def calibrate_arm(platform: str | Any, leader: str, follower: str, out: str | Path,
                  weights_g: str | None = None, leader_calibration: str | None = None,
                  follower_calibration: str | None = None, ckpt: str | None = None,
                  protocol: str | Path | None = None, episode_seconds: float | None = None,
                  steps: int | None = None, prompt: Prompt | None = None,
                  ask: Callable[[str], str] | None = None, progress: bool = True,
                  extra_args: list[str] | None = None) -> str:
    """Run (or resume) the guided calibration of one arm into ``out``; returns the last
    lines it printed (the held-out figures and the ``live`` command).

    ``weights_g``: "100,200" (else asked for on a terminal, or those of the run resumed).
    ``episode_seconds``: replaces every step's episode length; ``steps``: the fine-tune's
    optimiser steps instead of the protocol's scaling (both for a quick trial and tests).
    ``prompt(step, i, total)``: shows a step's instructions and returns when the user is
    ready (default: print, then wait for Enter on a terminal). ``extra_args`` go to the
    fine-tune's ``train``."""
    from nactuator.hardware.signals import sigterm_as_interrupt
    from nactuator.platforms import Platform, load_platform

    p = platform if isinstance(platform, Platform) else load_platform(platform)
    proto = load_protocol(p.name, protocol)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = State(out)
    if not any(k.startswith("record/") for k in state.data["steps"]):
        state.data.pop("weights_g", None)  # nothing recorded yet: weights and plan may change
        state.data.pop("plan", None)
    weights = resolve_weights(weights_g, state, proto, ask if ask is not None else (
        input if _terminal() else None))
    advice = weights_advice(weights, proto)
    if advice and weights_g is not None:  # asked on a terminal, the advice came with the question
        print(advice)
    plan = plan_steps(proto, weights, episode_seconds)
    digest = plan_digest(plan)
    if state.get("plan") not in (None, digest):
        raise CalibrateError(f"{state.path}: started with another protocol, weights or episode "
                             "length (its steps differ); rerun with the same options, or give "
                             "another --out to start over")
    state.set(platform=p.name, weights_g=weights, plan=digest, protocol=proto["source"],
              leader=leader, follower=follower)
    prompt = prompt or wait_for_enter
    recordings = out / "recordings"
    t_start = time.perf_counter()

    with sigterm_as_interrupt():
        pending = [s for s in plan if not state.done(f"record/{s.key}")]
        if pending:
            _say(f"checking the arm: leader {leader}, follower {follower} ...")
            report = check_arm(p, leader, follower, leader_calibration, follower_calibration,
                               float(proto["check"]["limit_tolerance_rad"]))
            state.mark("check", **report)
            f = report["follower"]
            _say(f"  both arms answer: servos {f['servos']}, supply {f['voltage_v']:.1f} V, "
                 f"hottest {f['temperature_c']:.0f} °C, every joint inside its range")
            if p.hardware.get("bus") == "feetech" and not follower_calibration:
                _say("  note: no --follower-calibration: each joint's zero is the servo's "
                     "centre (raw 2048); on a real SO-101 give LeRobot's calibration file")
        for i, step in enumerate(plan, 1):
            key = f"record/{step.key}"
            folder = recordings / step.key
            if state.done(key):
                _say(f"[{i}/{len(plan)}] {step.key}: recorded earlier, kept")
                continue
            prompt(step, i, len(plan))
            shutil.rmtree(folder, ignore_errors=True)  # a step cut short starts again whole
            _record_step(p, leader, follower, step, folder, leader_calibration,
                         follower_calibration, progress)
            whole, seconds, shortest = _recorded_whole(folder, step)
            if not whole:
                raise Interrupted(f"step {step.key} was stopped before its {step.episodes} "
                                  "run(s) ended (saved, not used); torque is off. Rerun the "
                                  "same command to record it again and go on")
            state.mark(key, dataset=str(folder), seconds=seconds, shortest_frames=shortest,
                       payload_g=step.payload_g,
                       split=step.split, task=step.task)

    train = [s for s in plan if s.split == "train"]
    recorded = {s.key: state.data["steps"][f"record/{s.key}"] for s in plan}
    train_s = sum(recorded[s.key]["seconds"] for s in train)
    if not state.done("adapt"):
        start = ckpt or proto["pretrained"]
        info = _adapt_step(start, proto, [recorded[s.key]["dataset"] for s in plan],
                           n_train=sum(s.episodes for s in train), train_s=train_s,
                           shortest=min(recorded[s.key]["shortest_frames"] for s in train),
                           steps=steps, out=out, extra_args=extra_args or [])
        state.mark("adapt", **info)
    adapted = state.data["steps"]["adapt"]
    bundle = out / BUNDLE
    if not state.done("bundle") or not bundle.is_file():
        _write_bundle(adapted["checkpoint"], bundle, extra={
            "calibrate_arm": {"pretrained": adapted["pretrained"], "weights_g": weights,
                              "train_seconds": train_s, "steps": adapted["steps"],
                              "held_out": adapted["summary"]}})
        state.mark("bundle", path=str(bundle))
    text = format_summary(adapted["summary"])
    port = follower
    cal = f" --calibration {follower_calibration}" if follower_calibration else ""
    lines = [text, "", f"wrote {bundle} (adapted from {adapted['pretrained']} on "
             f"{train_s / 60:.1f} min of your recordings, {adapted['steps']} steps); "
             f"report {out / 'adapt' / 'adapt.md'}",
             "your live force sensor:",
             f"  nactuator live --ckpt {bundle} --platform {p.name} --port {port}{cal}"]
    write_text(out / "calibrate.md", "\n".join(["# calibrate-arm", "", "```", *lines, "```", ""]))
    state.set(finished_s=time.perf_counter() - t_start)
    return "\n".join(lines)


# The three heavy steps, each a function of its own (the fast tests replace them).


def _record_step(p: Any, leader: str, follower: str, step: Step, folder: Path,
                 leader_calibration: str | None, follower_calibration: str | None,
                 progress: bool) -> None:
    """``nactuator record`` of one protocol step (Ctrl-C: episode saved, torque off)."""
    from nactuator.hardware.recorder import record

    record(platform=p, leader=leader, follower=follower, task=step.task,
           episodes=step.episodes, seconds=step.seconds, out=folder, payload_g=step.payload_g,
           split=step.split, leader_calibration=leader_calibration,
           follower_calibration=follower_calibration, progress=progress)


def _adapt_step(start: str, proto: dict[str, Any], data: list[str], n_train: int,
                train_s: float, shortest: int, steps: int | None, out: Path,
                extra_args: list[str]) -> dict[str, Any]:
    """``nactuator adapt`` of ``start`` on every train recording, scored on the held-out
    run; its optimiser steps scaled to ``train_s`` seconds of recordings (or ``steps``),
    its horizon capped to the ``shortest`` recording. Returns what the state file keeps."""
    import json

    from nactuator.experiments.adapt import adapt, load_adapt_config

    n_steps = steps if steps is not None else adapt_steps(train_s, proto)
    path = Path(proto["adapt"]["config"])
    cfg = load_adapt_config(path if path.is_absolute() else _project(str(path)))
    per_epoch = max(1, int(cfg["train"]["data"]["samples_per_epoch"])
                    // int(cfg["train"]["data"]["batch_size"]))
    epochs = max(1, math.ceil(n_steps / per_epoch))
    config = _adapt_config(cfg, out / "adapt-config.yaml")
    horizon = fit_horizon(cfg["train"]["data"]["horizon"], shortest)
    _say(f"\nadapting {start} on {n_train} recorded run(s), {train_s / 60:.1f} min: "
         f"{epochs * per_epoch} optimiser steps ({epochs} epochs) ...")
    adapt(start, data, episodes=[n_train], out=out / "adapt", held_out="test",
          held_out_runs=0, config=config,
          extra_args=[f"--trainer.max_epochs={epochs}", f"--data.horizon={horizon}",
                      *extra_args])
    result = json.loads((out / "adapt" / "adapt.json").read_text())
    return {"checkpoint": result["points"][-1]["checkpoint"], "steps": epochs * per_epoch,
            "train_seconds": train_s, "pretrained": str(start),
            "summary": held_out_summary(result), "wall_s": result["wall_time_s"]}


def _write_bundle(ckpt: str, bundle: Path, extra: dict[str, Any]) -> None:
    """The adapted checkpoint's EMA weights as a bundle ``live --ckpt`` loads."""
    from nactuator.experiments.pretrain import write_pretrained_bundle

    write_pretrained_bundle(ckpt, bundle, extra=extra)


def _project(path: str) -> Path:
    from nactuator.paths import project_root

    return project_root() / path


def _adapt_config(cfg: dict[str, Any], path: Path) -> Path:
    """The adapt config with no per-epoch time curve (one fine-tune, scored once)."""
    import yaml

    settings = {**cfg["adapt"], "time_curve": "none"}
    write_text(path, f"# from {cfg['source']}, time_curve none (calibrate-arm)\n"
               + yaml.safe_dump({"adapt": settings, "train": cfg["train"]}, sort_keys=False))
    return path
