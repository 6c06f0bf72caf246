"""`nactuator pretrain` (`make pretrain PLATFORM=...`): the shipped pretrained actuators.

One recipe per platform in ``conf/pretrain/<platform>.yaml``:

1. domain-randomised synthetic worlds, one dataset per seed (``data synth``; seeds run
   side by side, ``--jobs``);
2. the real NAD files beside the checkout, imported as they are (``data import-nad``; their
   validation episodes are never trained on);
3. one training on all of them (``train`` with the recipe's arguments);
4. the linked checkpoint scored on the held-out NAD episodes and on one synthetic world's
   validation episodes (``eval``), with the trivial references beside it;
5. the bundle (EMA weights only, no optimiser state: what ``infer``, ``live``, ``adapt`` and
   ``--model.init_from`` read) written to ``pretrained/<platform>.pt`` with its model card
   ``pretrained/<platform>.md``: data, recipe, figures, wall time, the firmware settings it
   assumes and the file's SHA-256.

Every step is a child process (:mod:`nactuator.child`) whose output lands in
``OUT/logs/``; a step whose result exists is skipped, so an interrupted run resumes.
``--ckpt pretrained/<platform>`` then loads the bundle from anywhere
(:func:`nactuator.model_files.resolve_model_path`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from nactuator.atomic import write_json, write_text
from nactuator.child import run_nactuator
from nactuator.errors import UserError
from nactuator.model_files import pretrained_dir
from nactuator.paths import conf_dir, project_root
from nactuator.platforms import load_platform

__all__ = ["load_pretrain_config", "model_card", "pretrain", "write_pretrained_bundle"]

_TIMES_LOCK = threading.Lock()
_KNOWN = {"platform", "world", "seeds", "trajectories_per_task", "seconds", "tasks", "nad",
          "train_args", "description"}


def load_pretrain_config(platform: str, path: str | os.PathLike | None = None
                         ) -> tuple[dict[str, Any], Path]:
    """The recipe (``conf/pretrain/<platform>.yaml`` unless ``path``), checked."""
    path = Path(path) if path else conf_dir() / "pretrain" / f"{platform}.yaml"
    if not path.is_file():
        raise UserError(f"pretrain recipe {path} does not exist (one per platform in "
                        "conf/pretrain/)")
    cfg = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(cfg) - _KNOWN)
    if unknown:
        raise UserError(f"{path}: unknown keys {unknown}; known: {sorted(_KNOWN)}")
    if cfg.get("platform", platform) != platform:
        raise UserError(f"{path} is a recipe for {cfg['platform']!r}, not {platform!r}")
    seeds = cfg.get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise UserError(f"{path}: seeds must be a non-empty list of integers, got {seeds!r}")
    if not isinstance(cfg.get("train_args", []), list):
        raise UserError(f"{path}: train_args must be a list of `nactuator train` arguments")
    return cfg, path


def _resolve(path: str) -> Path:
    """A recipe path: absolute, or relative to the project root (where conf/ lies)."""
    p = Path(path)
    return p if p.is_absolute() else project_root() / p


def _step(name: str, args: list[str], log_dir: Path, done: Path) -> float:
    """Run one child step unless ``done`` exists; its wall time, kept in
    ``LOGS/times.json`` so a resumed run still reports what each step took."""
    times_file = log_dir / "times.json"
    times = json.loads(times_file.read_text()) if times_file.exists() else {}
    if done.exists():
        print(f"[pretrain] {name}: done before ({done}), skipped", flush=True)
        return float(times.get(name, 0.0))
    print(f"[pretrain] {name} ...", flush=True)
    t0 = time.perf_counter()
    log = log_dir / f"{name}.log"
    if run_nactuator(args, log) != 0:
        raise UserError(f"pretrain step {name!r} failed; see {log}")
    elapsed = time.perf_counter() - t0
    # Steps run side by side (the synthetic worlds): re-read before writing.
    with _TIMES_LOCK:
        times = json.loads(times_file.read_text()) if times_file.exists() else {}
        write_json(times_file, {**times, name: elapsed})
    return elapsed


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_pretrained_bundle(ckpt: str | os.PathLike, out: str | os.PathLike,
                            extra: dict[str, Any] | None = None) -> Path:
    """The checkpoint's bundle with the EMA weights as its only weights (half the file, no
    optimiser state), ``extra`` added under ``extra``; written atomically."""
    import torch

    from nactuator.models import load_actuator, save_bundle

    obj = torch.load(ckpt, map_location="cpu", weights_only=True)
    bundle = dict(obj.get("nactuator", obj))
    load_actuator(bundle)  # refuse a file that would not load, before writing it
    if bundle.get("ema_state_dict") is not None:
        bundle["state_dict"], bundle["ema_state_dict"] = bundle["ema_state_dict"], None
    bundle["extra"] = {**(bundle.get("extra") or {}), **(extra or {})}
    return save_bundle(bundle, out)


def _figures(metrics_path: Path) -> dict[str, float | None]:
    from nactuator.experiments.cv import fold_row

    metrics = json.loads(metrics_path.read_text())
    row = fold_row(metrics)
    row["episodes"] = int(metrics["episodes"])
    verdict = metrics.get("verdict") or {}
    row["verdict"] = verdict.get("line")
    return row


def _table(figures: dict[str, Any]) -> list[str]:
    lines = ["| metric | value |", "|---|---|"]
    for key, value in figures.items():
        # "contact/" repeats the whole-episode rows on runs that are all contact.
        if key in ("verdict", "episodes") or value is None or key.startswith("contact/"):
            continue
        digits = 1 if "%" in key else 3 if "(N)" in key else 2
        lines.append(f"| {key} | {value:.{digits}f} |")
    return lines


def model_card(report: dict[str, Any]) -> str:
    """The markdown card shipped beside the bundle."""
    p = report["platform"]
    lines = [f"# Pretrained actuator: `{p}`", "",
             f"`--ckpt pretrained/{p}` (or the file `{report['bundle']}`), "
             f"SHA-256 `{report['sha256']}`, {report['bytes'] / 1024:.0f} KiB, "
             f"{report['parameters']:,} parameters ({report['model']}).", "",
             report.get("description", "").strip(), "",
             "## Data", ""]
    for d in report["data"]:
        lines.append(f"- {d}")
    lines += ["", "## Recipe", "",
              f"`make pretrain PLATFORM={p}` = `nactuator pretrain --platform {p}` with "
              f"`{report['recipe']}`:", "", "```yaml", report["recipe_text"].rstrip(), "```",
              "", f"Time {report['wall_s'] / 60:.1f} min of child processes on this machine "
              f"({report['cores']} cores; synthesis {report['times']['synth_s']:.0f} s "
              "summed over the worlds, "
              f"import {report['times']['import_s']:.0f} s, training "
              f"{report['times']['train_s']:.0f} s, scoring {report['times']['eval_s']:.0f} s)"
              f"; linked epoch: `{report['checkpoint']}`.", ""]
    for name, block in report["scores"].items():
        lines += [f"## {name} ({block['episodes']} episodes never trained on)", "",
                  f"{block['verdict']}", ""] + _table(block["figures"]) + [""]
    lines += ["These are held-out episodes of one split, not a cross-validation of the recipe "
              "(docs/results.md, \"Synthetic pretraining and adaptation\", has the "
              "cross-validated effect of starting the real-data recipe from synthetic "
              "pretraining).", "",
              "## What it assumes", ""]
    for line in report["assumes"]:
        lines.append(f"- {line}")
    lines += ["", "## Use", "", "```sh",
              f"nactuator infer --ckpt pretrained/{p} --data YOUR_DATASET --out forces.csv",
              f"nactuator adapt --ckpt pretrained/{p} --data YOUR_DATASET --out runs/adapt",
              f"nactuator train --platform {p} --data YOUR_DATASET "
              f"--model.init_from=pretrained/{p}", "```", ""]
    return "\n".join(lines)


def _assumptions(platform: str) -> list[str]:
    p = load_platform(platform)
    hw = p.hardware or {}
    lines = [f"platform `{p.name}` ({Path(p.source).name}): {p.n} channels "
             f"({', '.join(p.channel_names)}), {p.fps:g} Hz, effort telemetry "
             f"`{p.effort_signal}`, servo `{hw.get('servo', '?')}` on a `{hw.get('bus', '?')}` "
             "bus"]
    world = conf_dir() / "world" / f"{platform}.yaml"
    servo = (yaml.safe_load(world.read_text()) or {}).get("servo", {}) if world.is_file() else {}
    gains = {k: servo[k] for k in ("kp", "ki", "kd", "pwm_limit", "current_limit")
             if k in servo}
    if gains:
        lines.append(f"the servo firmware's position loop as configured by LeRobot / the NAD "
                     f"arms ({Path(world).name}: {gains}); other gains change the "
                     "command-to-torque map, so adapt (or retrain) after changing them")
    lines.append("the arm's calibration maps raw ticks to the same joint zero as NAD's "
                 "recordings (docs/hardware.md)")
    return lines


def pretrain(platform: str, out: str | os.PathLike, config: str | os.PathLike | None = None,
             bundle: str | os.PathLike | None = None, jobs: int = 2,
             extra_train_args: Sequence[str] = ()) -> dict[str, Any]:
    """Run the recipe (module docstring); returns the report the card is written from."""
    cfg, cfg_path = load_pretrain_config(platform, config)
    out = Path(out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    bundle = Path(bundle) if bundle else pretrained_dir() / f"{platform}.pt"
    times = {"synth_s": 0.0, "import_s": 0.0, "train_s": 0.0, "eval_s": 0.0}

    world = str(_resolve(cfg["world"])) if cfg.get("world") else None
    synth_dirs = [out / "data" / f"synth-{seed}" for seed in cfg["seeds"]]

    def synth(seed: int, folder: Path) -> float:
        args = ["data", "synth", "--platform", platform, "--seed", str(seed), "--out",
                str(folder), "--trajectories-per-task", str(cfg.get("trajectories_per_task", 4))]
        if world:
            args += ["--world", world]
        if cfg.get("seconds"):
            args += ["--seconds", str(cfg["seconds"])]
        if cfg.get("tasks"):
            args += ["--tasks", *cfg["tasks"]]
        return _step(f"synth-{seed}", args, logs, folder / "meta" / "info.json")

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        # Side by side: the steps' sum over-counts the wall time, their max under-counts it.
        times["synth_s"] = sum(pool.map(synth, cfg["seeds"], synth_dirs))

    data = [str(d) for d in synth_dirs]
    described = [f"{len(synth_dirs)} domain-randomised synthetic worlds "
                 f"(`{cfg.get('world')}`, seeds {cfg['seeds']}, "
                 f"{cfg.get('trajectories_per_task', 4)} runs per task"
                 + (f" of {cfg['seconds']:g} s" if cfg.get("seconds") else "") + ")"]
    nad_dir = None
    if cfg.get("nad"):
        src = _resolve(cfg["nad"])
        if src.exists():
            nad_dir = out / "data" / "nad"
            times["import_s"] = _step("import-nad", ["data", "import-nad", str(src), "--out",
                                                     str(nad_dir), "--platform", platform],
                                      logs, nad_dir / "meta" / "info.json")
            data.append(str(nad_dir))
            described.append(f"the real NAD recordings in `{cfg['nad']}` (their train split; "
                             "the validation episodes are held out and scored below)")
        else:
            described.append(f"no real data: `{cfg['nad']}` does not exist on this machine")
            print(f"[pretrain] {src} does not exist: synthetic worlds only", flush=True)

    run_dir = out / "train"
    train_args = ["train", "--platform", platform, "--data", ",".join(data),
                  *[str(a) for a in cfg.get("train_args", [])], *extra_train_args,
                  f"--trainer.default_root_dir={run_dir}"]
    times["train_s"] = _step("train", train_args, logs, run_dir / "done.json")
    if not (run_dir / "done.json").exists():
        write_json(run_dir / "done.json", {"args": train_args})
    ckpt = run_dir / "best.ckpt"
    if not ckpt.exists():
        raise UserError(f"pretrain: the training left no {ckpt}; see {logs / 'train.log'}")

    scores: dict[str, dict[str, Any]] = {}
    targets = [("NAD validation", nad_dir)] if nad_dir else []
    targets.append((f"synthetic validation (seed {cfg['seeds'][0]})", synth_dirs[0]))
    from nactuator.data import read_dataset

    for name, folder in targets:
        if not any(ep.split == "validation" for ep in read_dataset(folder).episodes):
            print(f"[pretrain] {folder} has no validation episodes: not scored", flush=True)
            continue
        key = "nad" if folder == nad_dir else "synth"
        eval_out = out / "eval" / key
        args = ["eval", "--ckpt", str(ckpt), "--data", str(folder), "--split", "validation",
                "--out", str(eval_out)]
        times["eval_s"] += _step(f"eval-{key}", args, logs, eval_out / "metrics.json")
        figures = _figures(eval_out / "metrics.json")
        scores[name] = {"episodes": figures.pop("episodes"), "verdict": figures.pop("verdict"),
                        "figures": figures}

    from nactuator.models import load_actuator

    linked = os.path.realpath(ckpt)
    write_pretrained_bundle(ckpt, bundle, extra={"pretrain_recipe": str(cfg_path.name),
                                                 "pretrain_checkpoint": Path(linked).name})
    actuator, meta = load_actuator(bundle)
    report = {
        "platform": platform, "sha256": _sha256(bundle),
        "bundle": str(bundle.resolve().relative_to(project_root()))
        if bundle.resolve().is_relative_to(project_root()) else str(bundle),
        "bytes": bundle.stat().st_size,
        "parameters": sum(p.numel() for p in actuator.parameters()),
        "model": f"{meta['model_config'].get('arch', 'transformer')}, "
                 f"features {meta['features']}",
        "description": cfg.get("description", ""), "data": described,
        "recipe": str(cfg_path.relative_to(project_root()) if cfg_path.is_relative_to(
            project_root()) else cfg_path),
        "recipe_text": cfg_path.read_text(), "checkpoint": Path(linked).name,
        "times": times, "wall_s": sum(times.values()), "cores": os.cpu_count(),
        "scores": scores, "assumes": _assumptions(platform),
    }
    write_json(out / "pretrain.json", report)
    write_text(bundle.with_suffix(".md"), model_card(report))
    print(f"[pretrain] wrote {bundle} ({report['bytes'] / 1024:.0f} KiB, sha256 "
          f"{report['sha256'][:12]}…) and {bundle.with_suffix('.md')}", flush=True)
    return report
