"""The one ``nactuator`` command. Thin: parse, call one function in its room, print.

Each subcommand imports its room lazily so ``nactuator --help`` stays fast and a user who
only records data never pays for importing Warp or Lightning.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nactuator.distributed import Backend


def _sim_check(a: argparse.Namespace) -> int:
    from nactuator.sim.check import run_sim_check

    report = run_sim_check(a.platform, device=a.device)
    print(json.dumps(report, indent=2) if a.json else report["summary"])
    return 0 if report["passed"] else 1


def _data_import_nad(a: argparse.Namespace) -> int:
    from nactuator.data.importers import import_nad

    print(import_nad(a.src, a.out, platform=a.platform, allow_duplicates=a.allow_duplicates,
                     task=a.task, split=a.split))
    return 0


def _data_import_bam(a: argparse.Namespace) -> int:
    from nactuator.data.importers import import_bam

    print(import_bam(a.src, a.out, allow_duplicates=a.allow_duplicates, grid=a.grid))
    return 0


def _data_synth(a: argparse.Namespace) -> int:
    from nactuator.data.synth import synthesize

    print(synthesize(a.platform, a.out, seed=a.seed, world=a.world,
                     trajectories_per_task=a.trajectories_per_task, seconds=a.seconds,
                     tasks=a.tasks))
    return 0


def _data_info(a: argparse.Namespace) -> int:
    from nactuator.data.info import describe

    print(describe(a.path))
    return 0


def _data_show(a: argparse.Namespace) -> int:
    from nactuator.data import read_dataset
    from nactuator.viewer import show_episode

    print(show_episode(read_dataset(a.dataset), a.episode, rrd=a.rrd, display=a.display))
    return 0


def _lightning(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.training.cli import lightning_main

    lightning_main([a.command, *rest])
    return 0


def _train(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.training.cli import train

    train(a.platform, data=a.data, extra_args=rest)
    return 0


def _policy(a: argparse.Namespace) -> int:
    from nactuator.policy.commands import run_policy_command

    print(run_policy_command(a.policy_command, a))
    return 0


def _policy_run(a: argparse.Namespace) -> int:
    _check_model_paths(a.actuator)
    from nactuator.policy.deploy import run_policy

    print(run_policy(a.ckpt, a.actuator, a.port, seconds=a.seconds, episodes=a.episodes,
                     calibration=a.calibration))
    return 0


def _check_model_paths(*paths: str | None) -> None:
    """A missing --ckpt, or a folder given for one, is refused before the room's (slow)
    imports; the loader decides the rest."""
    from nactuator.model_files import model_kind

    for path in paths:
        if path is not None:
            model_kind(path)


def _eval(a: argparse.Namespace) -> int:
    from nactuator.errors import UserError

    if len(a.ckpt) != len(a.out):
        raise UserError(f"eval: {len(a.ckpt)} --ckpt value(s) but {len(a.out)} --out "
                        "folder(s); give one output folder per model")
    if a.compare is not None and len(a.ckpt) > 1:
        raise UserError("eval: --compare goes with a single --ckpt")
    _check_model_paths(*a.ckpt, a.compare)
    from nactuator.eval import evaluate

    cv = None if a.cv_folds is None else (a.cv_folds, a.cv_fold)
    # Several models in one process share the imports and the compiled simulator (`cv`
    # scores best and last of a fold this way: one start-up instead of two).
    for ckpt, out in zip(a.ckpt, a.out, strict=True):
        print(evaluate(ckpt, a.data, split=a.split, out=out, device=a.device, cv=cv,
                       baselines=a.baselines, baselines_config=a.baselines_config,
                       compare=a.compare, residual_force=a.residual_force,
                       known_load=a.known_load))
    return 0


def _backend(a: argparse.Namespace) -> Backend:
    """The backend of `cv`/`sweep`/`adapt` (checked before any work starts)."""
    from nactuator.distributed import make_backend

    return make_backend(a.backend, jobs=a.jobs, address=a.address, num_cpus=a.task_cpus,
                        num_gpus=a.task_gpus)


def _calibrate_intervals(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.eval.intervals import calibrate

    cv = None if a.cv_folds is None else (a.cv_folds, a.cv_fold)
    print(calibrate(a.ckpt, a.data, split=a.split, out=a.out, level=a.level, scale=a.scale,
                    cv=cv, by_gate=a.by_gate, contact_scale=a.contact_scale))
    return 0


def _cv(a: argparse.Namespace, rest: list[str]) -> int:
    backend = _backend(a)
    from nactuator.experiments.cv import run_cv

    print(run_cv(a.platform, a.data, folds=a.folds, max_folds=a.max_folds, out=a.out,
                 extra_args=[x for x in rest if x != "--"], backend=backend))
    return 0


def _adapt(a: argparse.Namespace, rest: list[str]) -> int:
    backend = _backend(a)
    from nactuator.experiments.adapt import adapt

    print(adapt(a.ckpt, a.data, episodes=a.episodes, out=a.out, held_out=a.held_out,
                held_out_runs=a.held_out_runs, config=a.config,
                extra_args=[x for x in rest if x != "--"], backend=backend))
    return 0


def _bench_bam(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.experiments.bam import bench_bam

    print(bench_bam(a.src, a.out, ckpt=a.ckpt, config=a.config, device=a.device,
                    extra_args=[x for x in rest if x != "--"]))
    return 0


def _plan(a: argparse.Namespace) -> int:
    from nactuator.planning import plan

    print(plan(a.ckpt, a.target, out=a.out, iterations=a.iterations, lr=a.lr,
               smoothness=a.smoothness, kp=a.kp, supply_voltage=a.supply_voltage,
               temperature=a.temperature, world=a.world, world_seed=a.world_seed,
               device=a.device))
    return 0


def _correct(a: argparse.Namespace) -> int:
    from nactuator.errors import UserError

    if a.port is not None and a.action != "eval":
        raise UserError("--port is for `correct eval` (replay on a servo bus)")
    if a.ckpt is None and not (a.action == "eval" and a.port is not None):
        raise UserError("--ckpt is required (a counterfactual checkpoint), except for "
                        "`correct eval --port`, which replays the residual's commands only")
    if a.ckpt is not None:
        _check_model_paths(a.ckpt)
    from nactuator.correction import run

    if a.port is not None:
        print(run.evaluate_bus(a.config, a.residual or os.path.join(a.out, "residual.pt"),
                               a.port, out=a.out, calibration=a.calibration,
                               settle_s=a.settle_s, limit_margin=a.limit_margin))
    elif a.action == "fit":
        print(run.fit(a.config, a.ckpt, a.out, device=a.device))
    else:
        print(run.evaluate(a.config, a.ckpt, a.residual or os.path.join(a.out, "residual.pt"),
                           out=a.out, world_seed=a.world_seed, device=a.device))
    return 0


def _transfer(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.experiments.transfer import transfer

    print(transfer(a.ckpt, a.platform, a.out, data=a.data, joint_map=a.joint_map,
                   stats=a.stats, scratch=a.scratch, seed=a.seed))
    return 0


def _vision(a: argparse.Namespace) -> int:
    import json

    from nactuator.vision.run import calibrate_synthetic, format_report

    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    r = calibrate_synthetic(a.camera, frames=a.frames, held_out=a.held_out,
                            translation=a.translation, rotation_deg=a.rotation, seed=a.seed,
                            iterations=a.iterations, noise=not a.no_noise, out=a.out,
                            device=a.device)
    print(json.dumps(r, indent=1) if a.json else format_report(r))
    return 0


def _vision_render(a: argparse.Namespace) -> int:
    from nactuator.vision.masks import format_render_report, render_masks
    from nactuator.vision.noise import load_mask_noise

    noise = load_mask_noise(a.noise) if a.noise else None
    try:
        episodes = [int(x) for x in a.episodes.split(",")] if a.episodes else None
    except ValueError:
        from nactuator.errors import UserError

        raise UserError(f"--episodes {a.episodes!r}: expected episode indices like 0,3,5") \
            from None
    print(format_render_report(render_masks(a.data, a.camera, noise=noise, every=a.every,
                                            state=a.state, episodes=episodes, seed=a.seed)))
    return 0


def _vision_import(a: argparse.Namespace) -> int:
    from nactuator.vision.masks import import_masks

    r = import_masks(a.data, a.episode, a.masks, a.camera, timestamps=a.timestamps,
                     video_fps=a.video_fps, offset=a.offset, tolerance=a.tolerance)
    print(f"imported {r['masks']} masks onto frames {r['first_frame']}..{r['last_frame']} of "
          f"episode {r['episode']} ({r['frames']} frames) into {r['folder']}; largest "
          f"alignment error {r['max_alignment_error_ms']:.1f} ms (tolerance "
          f"{r['tolerance_ms']:.1f} ms)")
    return 0


def _vision_overlay(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.vision.masks import overlay

    try:
        frames = [int(x) for x in a.frames.split(",")]
    except ValueError:
        from nactuator.errors import UserError

        raise UserError(f"--frames {a.frames!r}: expected frame indices like 0,100,200") from None
    r = overlay(a.data, a.episode, frames, a.out, camera=a.camera, mask_camera=a.mask_camera,
                state=a.state, scale=a.scale, ckpt=a.ckpt, device=a.device)
    ious = ", ".join(f"{f}: {v:.3f}" for f, v in zip(r["frames"], r["iou"], strict=True))
    sheet = f" and {r['sheet']}" if r["sheet"] else f" in {a.out}"
    print(f"wrote {len(r['files'])} overlay(s) {r['size'][0]}x{r['size'][1]}{sheet}; "
          f"hard IoU rendered ({r['state']} state) vs observed per frame {ious}; mean "
          f"{r['mean_iou']:.3f}")
    return 0


def _infer(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.eval.infer import infer

    print(infer(a.ckpt, a.data, split=a.split, out=a.out, force_only=a.force_only,
                contact=a.contact))
    return 0


def _contact(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.eval.contact import calibrate_contact

    print(calibrate_contact(a.ckpt, a.data, a.out, split=a.split, tare_seconds=a.tare_seconds))
    return 0


def _detect(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.eval.detection_run import run_detection

    print(run_detection(a.ckpt, a.data, split=a.split, threshold=a.threshold, hold=a.hold,
                        out=a.out, train_data=a.train_data))
    return 0


def _export(a: argparse.Namespace) -> int:
    from nactuator.model_files import export_format

    _check_model_paths(a.ckpt)
    export_format(a.out, a.format)  # before importing torch: a wrong name fails at once
    from nactuator.export import export

    print(export(a.ckpt, a.out, fmt=a.format, quantize=a.quantize))
    return 0


def _sweep(a: argparse.Namespace, rest: list[str]) -> int:
    backend = _backend(a)
    from nactuator.experiments.sweep import run_sweep

    # LightningCLI-style extras (--trainer.x=...) arrive unparsed; a "--" separator is optional.
    extra = [x for x in [*a.extra, *rest] if x != "--"]
    print(run_sweep(a.file, max_runs=a.max_runs, method=a.method, out=a.out,
                    extra_args=extra, backend=backend))
    return 0


def _emulate(a: argparse.Namespace) -> int:
    from nactuator.hardware.emulator import run_emulator

    run_emulator(bus=a.bus, platform=a.platform, seed=a.seed, bus_timing=a.bus_timing,
                 corrupt_rate=a.corrupt_rate, drop_rate=a.drop_rate, latency_ms=a.latency_ms,
                 dead_ids=a.dead_id, alert_ids=a.alert_id, voltage_sag=a.voltage_sag,
                 leader=a.leader, link=a.link, duration=a.duration, payload_kg=a.payload_kg,
                 grasp=a.grasp)
    return 0


def _record(a: argparse.Namespace) -> int:
    from nactuator.hardware.recorder import record

    quality = {} if a.min_valid_fraction is None else {
        "min_valid_fraction": a.min_valid_fraction}
    print(record(platform=a.platform, leader=a.leader, follower=a.follower, task=a.task,
                 episodes=a.episodes, seconds=a.seconds, out=a.out, payload_g=a.payload_g,
                 split=a.split, leader_calibration=a.leader_calibration,
                 follower_calibration=a.follower_calibration, rrd=a.rrd,
                 display=a.display, **quality))
    return 0


def _calibrate_arm(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.guide import Interrupted, calibrate_arm

    try:
        print(calibrate_arm(a.platform, a.leader, a.follower, a.out, weights_g=a.weights_g,
                            leader_calibration=a.leader_calibration,
                            follower_calibration=a.follower_calibration, ckpt=a.ckpt,
                            protocol=a.protocol, episode_seconds=a.episode_seconds,
                            steps=a.adapt_steps, extra_args=[x for x in rest if x != "--"]))
    except KeyboardInterrupt as err:
        why = str(err) if isinstance(err, Interrupted) else "stopped (Ctrl-C)"
        print(f"nactuator calibrate-arm: {why}; the finished steps are kept in "
              f"{os.path.join(a.out, 'calibrate.json')}: run the same command to resume",
              file=sys.stderr)
        return 130
    return 0


def _base_commands(a: argparse.Namespace, platform, limits) -> tuple:
    """The base sequence of ``collect``: a recorded episode's commands, or generated sweeps."""
    from nactuator.errors import UserError
    from nactuator.hardware.collector import sweep_commands

    if a.base is None:
        return (sweep_commands(platform, a.sweep_seconds, seed=a.seed, limits=limits),
                f"sweep {a.sweep_seconds:g} s seed {a.seed}")
    from nactuator.data import read_dataset

    path, _, index = a.base.partition(":")
    ds = read_dataset(path)
    if ds.platform != platform.name:
        raise UserError(f"--base {path}: a {ds.platform} dataset, not {platform.name}")
    wanted = int(index) if index else ds.episodes[0].index if ds.episodes else 0
    episode = next((ep for ep in ds.episodes if ep.index == wanted), None)
    if episode is None:
        raise UserError(f"--base {a.base}: no episode {wanted}; the dataset has episodes "
                        f"{[ep.index for ep in ds.episodes]}")
    return episode.frames["q_cmd"].astype(float), f"{path} episode {wanted}"


def _collect(a: argparse.Namespace) -> int:
    from nactuator.hardware.collector import SafetyLimits, collect
    from nactuator.platforms import load_platform

    platform = load_platform(a.platform)
    limits = SafetyLimits.from_platform(
        platform, limit_margin=a.limit_margin, max_velocity=a.max_velocity,
        max_temperature=a.max_temperature, max_current=a.max_current)
    base, source = _base_commands(a, platform, limits)
    print(collect(platform, a.port, base, episodes=a.episodes, out=a.out, task=a.task,
                  noise_sigma=a.noise_sigma, noise_probability=a.noise_probability,
                  seed=a.seed, split=a.split, limits=limits, calibration=a.calibration,
                  base_source=source))
    return 0


def _live(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.control.live import run_live

    print(run_live(ckpt=a.ckpt, platform=a.platform, port=a.port, out=a.out,
                   seconds=a.seconds, device=a.device, calibration=a.calibration,
                   quiet=a.quiet, rrd=a.rrd, display=a.display, contact=a.contact))
    return 0


def _track(a: argparse.Namespace) -> int:
    _check_model_paths(a.ckpt)
    from nactuator.control.track_run import track

    print(track(a.path, ckpt=a.ckpt, platform=a.platform, methods=tuple(a.method),
                payloads_g=tuple(a.payload_g), port=a.port, relative=a.relative, out=a.out,
                config=a.config, world=a.world, seed=a.seed, track_noise=a.track_noise,
                calibration=a.calibration, field=a.field, camera=a.camera))
    return 0


def _pretrain(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.experiments.pretrain import pretrain

    pretrain(a.platform, a.out or f"runs/pretrain/{a.platform}", config=a.config,
             bundle=a.bundle, jobs=a.jobs, extra_train_args=[x for x in rest if x != "--"])
    return 0


def _field_fit(a: argparse.Namespace) -> int:
    from nactuator.control.track_run import fit_field_file

    info = fit_field_file(a.out, platform=a.platform, poses=a.poses, per_pose=a.per_pose,
                          payload_g=a.payload_g, steps=a.steps, noise=a.track_noise,
                          config=a.config, world=a.world, seed=a.seed,
                          observation=a.observation, prior=a.prior, signed=a.signed)
    print(f"field: {info['samples']} perturbations at {info['payload_g']} g "
          f"({info['collect_s']:.0f} s in the world), fitted in {info['fit_s']:.0f} s; "
          f"held-out R² {info['heldout_r2']:.3f}; wrote {a.out}")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _add_viewer_flags(s: argparse.ArgumentParser, what: str) -> None:
    s.add_argument("--rrd", default=None, metavar="FILE",
                   help=f"save {what} as a Rerun recording (.rrd; open it with `rerun FILE`)")
    s.add_argument("--display", action="store_true",
                   help=f"stream {what} to the Rerun viewer (spawned; needs a graphical "
                        "display)")


PLATFORM_HELP = "platform name: so101, omx, franka or pendulum (conf/platform/<name>.yaml)"
DEVICE_HELP = "cpu (default) or cuda[:i]"
CKPT_HELP = "a checkpoint from `nactuator train`/`fit` (.ckpt) or a saved actuator bundle"
MODEL_HELP = (CKPT_HELP + ", or a file from `nactuator export` (TorchScript .pt/.ts, "
              "ONNX .onnx, fp32 or int8)")
# How `train` and `cv` pass the options they do not know on to LightningCLI `fit`.
TRAIN_EPILOG = """\
every other option goes unchanged to LightningCLI `fit`, after conf/base.yaml and
conf/train/<platform>.yaml (later ones win):
  --config YAML              a training recipe, e.g. conf/train/nad_so101.yaml (repeatable)
  --trainer.KEY=VALUE        any Lightning Trainer argument, e.g. --trainer.max_epochs=12
  --model.KEY=VALUE          the model and loss (docs/training.md), e.g. --model.width=64
  --data.KEY=VALUE           the DataModule, e.g. --data.batch_size=8
  --logger tensorboard|wandb|csv|none
example:
  nactuator train --platform so101 --data runs/data/so101-nad \\
      --config conf/train/nad_so101.yaml --trainer.max_epochs=12 \\
      --trainer.default_root_dir=runs/so101-nad
every pass-through option with its default: nactuator fit --help
"""
LIVE_EPILOG = """\
the status line on stderr (redrawn on a terminal, a line every 5 s in a log), e.g.
  live  60.0 Hz | |f|   4.90 N (fx fy fz ...) gate 0.90 | 600 cycles, 3 incomplete, 1 lost
  Hz          cycles per second over the last second; "—" until two cycles have run
  |f|, gate   the latest estimate: force magnitude and axes [N], contact gate (0..1)
  contact     with --contact: the latest contact estimate, link and |force| [N] or none
  cycles      cycles run so far (one CSV row each)
  incomplete  cycles in which at least one servo's telemetry was not read (the model keeps
              that servo's last reading; the row has valid = 0): cabling, bus load, timeouts
  lost        schedule slots skipped because a cycle overran its period: no row for them,
              no burst to catch up; --seconds still gives round(seconds x fps) rows, later
"""
CV_EPILOG = """\
everything after `--` goes to every fold's `nactuator train` (and from there to LightningCLI
`fit`: --config, --trainer.*, --model.*, --data.*; see `nactuator train --help`); cv sets
each fold's --data.cv_folds/--data.cv_fold, --trainer.default_root_dir and --logger itself.
example:
  nactuator cv --platform omx --data runs/data/omx-nad --max-folds 2 --jobs 2 \\
      --out runs/cv/omx -- --config conf/train/nad_omx.yaml --trainer.max_epochs=12
on a Ray cluster (one task per fold; every node sees the same paths):
  nactuator cv --platform omx --data runs/data/omx-nad --backend ray --address HEAD:6379 \\
      --out runs/cv/omx -- --config conf/train/nad_omx.yaml
"""


def _add_backend_args(s: argparse.ArgumentParser, what: str, jobs_default: str) -> None:
    """--backend/--jobs/--address/--task-cpus/--task-gpus of cv, sweep and adapt."""
    s.add_argument("--backend", default="local", choices=["local", "ray"],
                   help=f"where the {what} run: local (a pool of --jobs on this machine) or "
                        "ray (one Ray task each; docs/training.md \"Running cross-validation "
                        "on a cluster\")")
    s.add_argument("--jobs", type=int, default=None,
                   help=f"{what} run at the same time with --backend local ({jobs_default})")
    s.add_argument("--address", default=None, metavar="HOST:PORT",
                   help="--backend ray: the Ray head (`ray start --head --port=PORT`); default "
                        "$RAY_ADDRESS, the cluster started on this machine, or a new local one")
    s.add_argument("--task-cpus", type=float, default=None, metavar="N",
                   help="--backend ray: CPUs per task (default conf/distributed/ray.yaml: 1)")
    s.add_argument("--task-gpus", type=float, default=None, metavar="N",
                   help="--backend ray: GPUs per task (default conf/distributed/ray.yaml: 0; "
                        "1 for a recipe with --trainer.accelerator=gpu)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nactuator",
        description="Neural actuator models for low-cost servo arms.",
    )
    # Read (and removed) by main() before parsing, so it works anywhere on the line.
    p.add_argument("--debug", action="store_true",
                   help="show the Python traceback of an error (or set NACTUATOR_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("sim-check", help="gradient and MuJoCo-parity checks of the simulator")
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.set_defaults(func=_sim_check)

    d = sub.add_parser("data", help="nactuator datasets (the on-disk format): import NAD "
                       "CSVs or BAM logs, synthesize, describe, show")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    s = dsub.add_parser("import-nad", help="import CSV files of the Neural Actuator Dataset "
                        "(NAD, Dou et al.) or in its layout (OMX, SO-101, Franka)")
    s.add_argument("src", help="a NAD CSV file or a folder of them (e.g. ../shared/data/nad/so101)")
    s.add_argument("--out", required=True,
                   help="nactuator dataset folder to create or append to")
    s.add_argument("--platform", default=None, help="default: detected from the CSV header")
    s.add_argument("--allow-duplicates", action="store_true",
                   help="import files whose content (sha256) is already in the dataset")
    s.add_argument("--task", default=None, metavar="NAME",
                   help="task label for your own CSVs outside the NAD folder layout: SRC is "
                        "one CSV or a flat folder of them (needs --split; payload grams are "
                        "read from the name, e.g. push_200g)")
    s.add_argument("--split", default=None, choices=["train", "validation", "test"],
                   help="split of those CSVs (needs --task)")
    s.set_defaults(func=_data_import_nad)
    s = dsub.add_parser("import-bam", help="import BAM XL330 pendulum JSON logs")
    s.add_argument("src", help="a BAM raw JSON log or a folder of them")
    s.add_argument("--out", required=True,
                   help="nactuator dataset folder to create or append to")
    s.add_argument("--allow-duplicates", action="store_true",
                   help="import files whose content (sha256) is already in the dataset")
    s.add_argument("--grid", default=None, choices=["first_sample", "bam"],
                   help="time grid: first_sample (t0, t0 + 5 ms, ...; the platform default) "
                        "or bam (BAM's processed grid from t = 0, for its scoring protocol)")
    s.set_defaults(func=_data_import_bam)
    s = dsub.add_parser("synth", help="generate data from a hidden ground-truth servo world")
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--out", required=True, help="dataset folder to create")
    s.add_argument("--seed", type=int, default=0, help="seeds the world's servos and tasks")
    s.add_argument("--world", default=None, help="world YAML (default: conf/world/<platform>)")
    s.add_argument("--trajectories-per-task", type=int, default=10,
                   help="repetitions of each task (split 8:1:1 by episode)")
    s.add_argument("--seconds", type=float, default=None, help="length of each trajectory")
    s.add_argument("--tasks", nargs="*", default=None, help="subset of task names")
    s.set_defaults(func=_data_synth)
    s = dsub.add_parser("info", help="describe a dataset")
    s.add_argument("path", help="dataset folder")
    s.set_defaults(func=_data_info)
    s = dsub.add_parser("show", help="show one episode in Rerun (joints, commands, telemetry, "
                        "force and condition labels)")
    s.add_argument("dataset", help="dataset folder")
    s.add_argument("--episode", type=int, required=True, help="episode_index to show")
    _add_viewer_flags(s, "the episode")
    s.set_defaults(func=_data_show)

    for name, what in (("fit", "train"), ("validate", "validate"), ("test", "test")):
        s = sub.add_parser(name, help=f"LightningCLI {what} (--config conf/base.yaml ...)",
                           add_help=False)
        s.set_defaults(func=_lightning, passthrough=True)
    s = sub.add_parser("train", help="train on a platform's default or given data "
                       "(what `make train` runs); extra args go to LightningCLI fit",
                       epilog=TRAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--data", default=None, help="dataset path(s), comma separated "
                   "(default: the platform's small synthetic dataset, generated once)")
    s.set_defaults(func=_train, passthrough=True)

    s = sub.add_parser("eval", help="evaluation protocol: rollouts, metrics, plots")
    s.add_argument("--ckpt", required=True, nargs="+", metavar="CKPT",
                   help=MODEL_HELP + "; several are scored one after the other, each into "
                   "its own --out folder")
    s.add_argument("--data", required=True, help="dataset path(s), comma separated")
    s.add_argument("--split", default="test", choices=["train", "validation", "test"],
                   help="episodes to evaluate (default: test)")
    s.add_argument("--out", required=True, nargs="+", metavar="FOLDER",
                   help="folder for metrics.json, metrics.md and the PNG plots (one per --ckpt)")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--folds", "--cv-folds", dest="cv_folds", type=int, default=None,
                   help="evaluate with the splits of a cross-validation fold (see `cv`)")
    s.add_argument("--fold", "--cv-fold", dest="cv_fold", type=int, default=0,
                   help="which fold (0-based); --folds/--fold as `cv` numbers them")
    s.add_argument("--baselines", default=None, metavar="all|none|NAME[,NAME...]",
                   help="add classical baselines fitted on the train split as table rows: "
                   "id-linear, id-friction, gmo, gmo-friction, threshold, svm, random-forest")
    s.add_argument("--baselines-config", default=None, metavar="YAML",
                   help="partial YAML merged onto conf/eval/baselines.yaml")
    s.add_argument("--compare", default=None, metavar="CKPT",
                   help="a second checkpoint (or export) rolled out on the same episodes (its "
                        "joint rows beside the model's), e.g. a counterfactual beside a "
                        "telemetry model")
    s.add_argument("--residual-force", default=None, action=argparse.BooleanOptionalAction,
                   help="add the force read from the model's torque through the nominal "
                        "inverse dynamics (rows 'model_residual'; docs/contact.md); default: "
                        "on for a model trained with model.external_torque")
    s.add_argument("--known-load", action="store_true",
                   help="apply each episode's labelled end-effector force (a payload) in the "
                        "rollout's simulator steps, as a model trained with "
                        "model.external_torque was trained (not the protocol: the simulation "
                        "is told the load)")
    s.set_defaults(func=_eval)

    s = sub.add_parser("calibrate-intervals", help="conformal scale of the force interval "
                       "from held-out episodes (model.uncertainty), stored in the checkpoint")
    s.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) or bundle with the "
                   "uncertainty head")
    s.add_argument("--data", default=None, help="dataset path(s) with the held-out episodes")
    s.add_argument("--split", default="validation", choices=["validation", "test"],
                   help="held-out episodes to calibrate on (default: validation)")
    s.add_argument("--scale", type=float, default=None,
                   help="set this scale (in σ) instead, e.g. the pooled out-of-fold scale "
                        "`cv` reports")
    s.add_argument("--by-gate", action="store_true",
                   help="fit one scale where the model's contact gate is open and one where "
                        "it is closed (docs/uncertainty.md)")
    s.add_argument("--contact-scale", type=float, default=None,
                   help="with --scale: the scale where the gate is open (--scale is then the "
                        "closed gate's), e.g. the pair `cv` reports")
    s.add_argument("--level", type=float, default=0.9, help="nominal coverage (default 0.9)")
    s.add_argument("--out", default=None, help="write the calibrated checkpoint here "
                   "(default: in place)")
    s.add_argument("--folds", "--cv-folds", dest="cv_folds", type=int, default=None,
                   help="use the splits of a cross-validation fold (see `cv`)")
    s.add_argument("--fold", "--cv-fold", dest="cv_fold", type=int, default=0,
                   help="which fold (0-based)")
    s.set_defaults(func=_calibrate_intervals)

    s = sub.add_parser("cv", help="k-fold cross-validation by episode of a training "
                       "recipe: mean ± sd over folds; extra args go to `train`",
                       epilog=CV_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--data", required=True, help="dataset path(s), comma separated")
    s.add_argument("--folds", type=int, default=None,
                   help="number of folds (default: leave one episode out within each task)")
    s.add_argument("--max-folds", type=int, default=None,
                   help="score only the first N folds (quicker, noisier)")
    _add_backend_args(s, "folds", "default 1")
    s.add_argument("--out", default="runs/cv", help="output folder (cv.md, cv.json, cv.png)")
    s.set_defaults(func=_cv, passthrough=True)

    s = sub.add_parser("adapt", help="fine-tune a pretrained checkpoint on N new episodes: "
                       "held-out error vs N and vs wall time; extra args go to `train`")
    s.add_argument("--ckpt", required=True, help="the pretrained checkpoint (" + CKPT_HELP + ")")
    s.add_argument("--data", required=True,
                   help="dataset path(s) of the new arm/task, comma separated: train runs "
                        "are the fine-tuning pool, the held-out episodes are scored")
    s.add_argument("--episodes", type=_positive_int, nargs="+", default=None, metavar="N",
                   help="fine-tuning set sizes (default: conf/train/adapt.yaml, 1 2 4 8 12)")
    s.add_argument("--held-out", default=None, choices=["auto", "test", "validation"],
                   help="split scored as held out (default auto: test if present, else "
                        "validation)")
    s.add_argument("--held-out-runs", type=int, default=None, metavar="K",
                   help="also hold out the last K train runs of every task (default 0)")
    s.add_argument("--config", default=None, metavar="YAML",
                   help="adapt config with 'adapt' and 'train' sections "
                        "(default: conf/train/adapt.yaml)")
    s.add_argument("--out", default="runs/adapt",
                   help="output folder (adapt.md, adapt.json, adapt.png, one n_NNN/ per N)")
    _add_backend_args(s, "fine-tunes", "default 1: each one's wall time is a result")
    s.set_defaults(func=_adapt, passthrough=True)

    s = sub.add_parser("bench-bam", help="BAM XL330 benchmark: train a counterfactual model on "
                       "kp 100-400, score the held-out kp 800 logs open loop (BAM's metric); "
                       "extra args go to LightningCLI fit")
    s.add_argument("--src", default="../shared/data/bam/xl330/raw",
                   help="folder of BAM's raw XL330 JSON logs (default: %(default)s)")
    s.add_argument("--out", required=True,
                   help="output folder: data/, train/, bench.json, bench.md, bench_kp800.png")
    s.add_argument("--ckpt", default=None,
                   help="score this counterfactual checkpoint instead of training one")
    s.add_argument("--config", default=None,
                   help="LightningCLI training config (default: conf/bench/bam.yaml)")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.set_defaults(func=_bench_bam, passthrough=True)

    s = sub.add_parser("plan", help="optimise a command sequence through a counterfactual "
                       "model + simulator so the arm follows a target trajectory")
    s.add_argument("--ckpt", required=True, help="a counterfactual checkpoint (" + CKPT_HELP
                   + ")")
    s.add_argument("--target", required=True,
                   help="CSV: a 'time' column (s, on the platform's control grid) and one "
                        "column per channel (target joint positions, rad / m)")
    s.add_argument("--out", default=None,
                   help="folder for commands.csv, plan.json, plan.md and plan.png")
    s.add_argument("--iterations", type=_positive_int, default=200,
                   help="gradient steps (Adam) on the command sequence")
    s.add_argument("--lr", type=_positive_float, default=0.02,
                   help="Adam step size on the commands (rad / m)")
    s.add_argument("--smoothness", type=float, default=1e-3,
                   help="weight of the squared command change per step in the objective")
    s.add_argument("--kp", type=float, default=None,
                   help="Position P gain register the commands will run with (needed by "
                        "models that read the gain)")
    s.add_argument("--supply-voltage", type=float, default=None,
                   help="supply voltage before the motion [V] (models with a supply input)")
    s.add_argument("--temperature", type=float, default=None,
                   help="motor temperature before the motion [degC] (models with that input)")
    s.add_argument("--world", default=None,
                   help="replay the target and the optimised commands in this hidden world "
                        "(a world YAML, or 'default' for conf/world/<platform>.yaml) and "
                        "report the real tracking errors")
    s.add_argument("--world-seed", type=int, default=0,
                   help="seed of the hidden world's servos and noise")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.set_defaults(func=_plan)

    s = sub.add_parser("correct", help="residual action correction: learn corrected commands "
                       "through a counterfactual model + simulator (fit), judge them in the "
                       "hidden world (eval)")
    s.add_argument("action", choices=["fit", "eval"],
                   help="fit: train the residual on the config's training targets; eval: "
                        "replay target vs corrected commands in the hidden world, or with "
                        "--port on a servo bus")
    s.add_argument("--ckpt", default=None, help="a counterfactual checkpoint (" + CKPT_HELP
                   + "); required except for eval --port")
    s.add_argument("--config", default=None,
                   help="correction YAML (default: conf/correction/so101.yaml)")
    s.add_argument("--out", required=True,
                   help="folder: fit writes residual.pt and fit.json; eval writes eval.json, "
                        "eval.md and correction.png")
    s.add_argument("--residual", default=None,
                   help="eval: the residual file (default: OUT/residual.pt)")
    s.add_argument("--world-seed", type=int, default=None,
                   help="eval: the hidden arm the commands run on (default: the config's "
                        "eval.world_seed)")
    s.add_argument("--port", default=None,
                   help="eval: play the held-out targets as sent and corrected on the servo "
                        "bus at this port (e.g. an `nactuator emulate` pty) and score the "
                        "bus's telemetry instead of the hidden world; torque off at the end")
    s.add_argument("--calibration", default=None,
                   help="eval --port: the arm's LeRobot calibration JSON (Feetech)")
    s.add_argument("--settle-s", type=float, default=None,
                   help="eval --port: hold each sequence's first command this long before "
                        "playing it (default: the platform's record_settle_s)")
    s.add_argument("--limit-margin", type=float, default=None,
                   help="eval --port: fraction of each joint's range kept clear (default: the "
                        "platform's hardware.collect limit_margin); a command past it stops "
                        "the replay before it is written")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.set_defaults(func=_correct)

    s = sub.add_parser("transfer", help="a joint-wise checkpoint as a model of another arm "
                       "(another joint count): eval it zero-shot, adapt it (docs/training.md)")
    s.add_argument("--ckpt", required=True, help="the joint-wise source checkpoint (" + CKPT_HELP
                   + ")")
    s.add_argument("--platform", required=True, help="the target arm: " + PLATFORM_HELP)
    s.add_argument("--data", default=None,
                   help="the target arm's recordings: their train split's input statistics "
                        "normalise the model's inputs (no label is read)")
    s.add_argument("--stats", default="data", choices=["data", "source"],
                   help="normalise with the target data's statistics (default) or the "
                        "source's of the mapped joints (no target data at all)")
    s.add_argument("--joint-map", default=None,
                   help="per target joint, the source joint it takes its joint-id embedding "
                        "(and with --stats source its statistics) from, comma-separated names, "
                        "'-' for none (the mean); default: arm joints in order, gripper to "
                        "gripper")
    s.add_argument("--scratch", action="store_true",
                   help="write the same architecture untrained instead (adapt's from-scratch "
                        "reference)")
    s.add_argument("--seed", type=int, default=0, help="--scratch: the weights' seed")
    s.add_argument("--out", required=True, help="the bundle file to write (.pt)")
    s.set_defaults(func=_transfer)

    vis = sub.add_parser("vision", help="image-space supervision: hand-eye calibration from "
                         "silhouettes, masks beside a dataset, overlays (docs/vision.md)")
    vsub = vis.add_subparsers(dest="vision_command", required=True, metavar="ACTION")
    s = vsub.add_parser("calibrate", help="refine a perturbed camera extrinsic from soft "
                        "silhouettes vs MuJoCo ray-cast masks (synthetic, judged against the "
                        "true camera)")
    s.add_argument("--camera", default="so101_front",
                   help="camera file or name under conf/vision/cameras/ (the true camera)")
    # 16, not 8: with the default mask noise 8 frames left 3 cm / 2 deg, 16 reach 0.4 cm /
    # 0.2 deg on two seeds (docs/vision.md) for about twice the CPU.
    s.add_argument("--frames", type=int, default=16, help="frames (joint states) to fit on")
    s.add_argument("--held-out", type=int, default=8, help="frames to score the IoU on")
    s.add_argument("--translation", type=float, default=0.05,
                   help="start: camera centre moved by this many metres")
    s.add_argument("--rotation", type=float, default=5.0,
                   help="start: camera turned by this many degrees")
    s.add_argument("--iterations", type=int, default=150, help="Adam steps on the extrinsic")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the states, the mask noise and the perturbation direction")
    s.add_argument("--no-noise", action="store_true", help="fit on clean masks")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's)")
    s.add_argument("--out", default=None,
                   help="folder for calibrate.json and the refined camera.yaml")
    s.add_argument("--json", action="store_true", help="print the whole report as JSON")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.set_defaults(func=_vision)

    s = vsub.add_parser("render-masks", help="ray-cast ground-truth masks of each frame's joint "
                        "state (MuJoCo, not our renderer) and store them beside the dataset")
    s.add_argument("--data", required=True, help="dataset folder")
    s.add_argument("--camera", required=True,
                   help="camera file or name under conf/vision/cameras/ (copied beside the masks)")
    s.add_argument("--noise", default=None,
                   help="mask damage: a file or name under conf/vision/noise/ (e.g. segmenter); "
                        "default: clean masks")
    s.add_argument("--every", type=int, default=1, help="render every k-th frame")
    s.add_argument("--state", choices=["true", "stored"], default=None,
                   help="joint state to render: true (the synthetic world's exact positions, "
                        "regenerated; default for synthetic data) or stored (the dataset's q)")
    s.add_argument("--episodes", default=None, help="episode indices, comma separated "
                   "(default: all)")
    s.add_argument("--seed", type=int, default=0, help="seed of the noise (+ episode index)")
    s.set_defaults(func=_vision_render)

    s = vsub.add_parser("import-masks", help="store a folder of PNG masks (e.g. SAM masks of "
                        "your video) beside an episode, aligned by nearest timestamp")
    s.add_argument("--data", required=True, help="dataset folder")
    s.add_argument("--episode", type=int, required=True, help="episode index")
    s.add_argument("--masks", required=True, help="folder of binary PNG masks")
    s.add_argument("--camera", required=True,
                   help="camera file of the video the masks come from (its size must match)")
    s.add_argument("--timestamps", default=None,
                   help="CSV with columns file,time (seconds, the video's clock)")
    s.add_argument("--video-fps", type=float, default=None,
                   help="instead of --timestamps: time = the file name's last number / this")
    s.add_argument("--offset", type=float, default=0.0,
                   help="video time (s) of the episode's first frame; subtracted from each time")
    s.add_argument("--tolerance", type=float, default=None,
                   help="largest allowed distance (s) to the nearest frame (default: half the "
                        "episode's median frame period)")
    s.set_defaults(func=_vision_import)

    s = vsub.add_parser("overlay", help="PNG of the observed mask and the soft renderer's "
                        "contour at the frame's joint state")
    s.add_argument("--data", required=True, help="dataset folder with masks")
    s.add_argument("--episode", type=int, required=True, help="episode index")
    s.add_argument("--frames", required=True, help="frame indices, comma separated")
    s.add_argument("--out", required=True, help="folder for the PNGs")
    s.add_argument("--camera", default=None,
                   help="camera to render with (default: the one stored beside the masks)")
    s.add_argument("--mask-camera", default=None,
                   help="which stored masks, by camera name (needed when there are several)")
    s.add_argument("--state", choices=["true", "stored"], default="stored",
                   help="joint state to render: stored (the dataset's q) or true (synthetic)")
    s.add_argument("--ckpt", default=None,
                   help="render the state our model's closed-loop rollout reaches instead "
                        "(checkpoint, bundle, pretrained/NAME or export)")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--scale", type=int, default=4, help="pixels per camera pixel")
    s.set_defaults(func=_vision_overlay)

    s = sub.add_parser("infer", help="causal force/gate/condition from telemetry (no simulator)")
    s.add_argument("--ckpt", required=True, help=MODEL_HELP)
    s.add_argument("--data", required=True, help="dataset path(s), comma separated")
    s.add_argument("--split", default=None, choices=["train", "validation", "test"],
                   help="episodes to run on (default: all)")
    s.add_argument("--out", default=None, help="CSV file for the predictions")
    s.add_argument("--force-only", action="store_true",
                   help="write force and gate only (no per-motor condition columns)")
    s.add_argument("--contact", default=None, metavar="FILE",
                   help="also estimate contact anywhere on the arm per frame (link, point, "
                        "force) with this calibration of `nactuator contact calibrate` "
                        "(docs/contact.md)")
    s.set_defaults(func=_infer)

    con = sub.add_parser("contact", help="contact anywhere on the arm from the learned "
                         "actuator torque (docs/contact.md)")
    csub = con.add_subparsers(dest="contact_command", required=True, metavar="ACTION")
    s = csub.add_parser("calibrate", help="detection thresholds of `infer --contact` from "
                        "no-contact runs of your arm with one model")
    s.add_argument("--ckpt", required=True, help=MODEL_HELP)
    s.add_argument("--data", required=True, help="dataset path(s) of contact-free runs, comma "
                   "separated (episodes with a force or contact label are skipped)")
    s.add_argument("--split", default=None, choices=["train", "validation", "test"],
                   help="episodes to calibrate on (default: all)")
    s.add_argument("--tare-seconds", type=float, default=1.0,
                   help="zero each episode's residual on its first this many seconds, which "
                        "must be contact-free (0: the raw residual; default %(default)s)")
    s.add_argument("--out", required=True, help="the calibration file (JSON) to write")
    s.set_defaults(func=_contact)

    s = sub.add_parser("detect", help="fault detection on mid-run fault episodes: delay after "
                       "onset, false flags before it, per-motor localisation")
    s.add_argument("--ckpt", required=True, help=MODEL_HELP)
    s.add_argument("--data", required=True, help="dataset path(s) with fault-onset episodes "
                   "(nactuator data synth --world conf/world/<platform>_onset.yaml)")
    s.add_argument("--split", default=None, choices=["train", "validation", "test"],
                   help="episodes to run on (default: all)")
    s.add_argument("--threshold", type=_fraction, default=None,
                   help="flag a motor when its degraded score 1 - c exceeds this ... "
                        "(default: conf/eval/detection.yaml, 0.5)")
    s.add_argument("--hold", type=_positive_int, default=None,
                   help="... on this many consecutive frames (causal debounce; default: the "
                        "platform's in conf/eval/detection.yaml: SO-101 30, OMX 6)")
    s.add_argument("--out", default=None, help="folder for detection.json and the plots")
    s.add_argument("--train-data", default=None, help="the checkpoint's training dataset: "
                   "adds the random forest fitted on its train split, scored per frame")
    s.set_defaults(func=_detect)

    s = sub.add_parser("export", help="export a checkpoint's model for deployment")
    s.add_argument("--ckpt", required=True, help=CKPT_HELP)
    s.add_argument("--out", required=True,
                   help="file to write: .pt or .ts (TorchScript) or .onnx (ONNX)")
    s.add_argument("--format", default=None, choices=["torchscript", "onnx"],
                   help="default: from the --out extension, which it must agree with")
    s.add_argument("--quantize", default="none", choices=["none", "int8"],
                   help="int8: ONNX Runtime dynamic quantization (--format onnx only), "
                        "checked against eager within the int8 tolerances")
    s.set_defaults(func=_export)

    s = sub.add_parser("sweep", help="run a wandb-format sweep YAML locally (offline)")
    s.add_argument("file", help="sweep YAML (e.g. conf/sweeps/architecture.yaml)")
    s.add_argument("--max-runs", type=int, default=None,
                   help="run at most this many configurations (required for random); a "
                        "capped grid tries every value of every parameter first")
    s.add_argument("--method", default=None, choices=["grid", "random"],
                   help="override the file's method (grid: every combination, the first "
                        "parameter varying fastest, or a covering subset with --max-runs; "
                        "random: --max-runs seeded draws)")
    s.add_argument("--out", default="runs/sweep",
                   help="folder for one run-NNN/ per configuration and results.md")
    _add_backend_args(s, "runs", "default 1")
    s.add_argument("extra", nargs="*", help="extra LightningCLI args for every run")
    s.set_defaults(func=_sweep, passthrough=True)

    s = sub.add_parser("emulate", help="a virtual servo arm on a pseudo-terminal")
    s.add_argument("--bus", required=True, choices=["dynamixel", "feetech"],
                   help="wire protocol: dynamixel (Protocol 2.0, OMX) or feetech (SCS, SO-101)")
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--seed", type=int, default=0, help="seeds the hidden servo world and faults")
    s.add_argument("--bus-timing", action="store_true", help="emulate wire time at the baud rate")
    s.add_argument("--corrupt-rate", type=float, default=0.0, help="fraction of corrupted replies")
    s.add_argument("--drop-rate", type=float, default=0.0, help="fraction of dropped replies")
    s.add_argument("--latency-ms", type=float, default=0.0, help="added reply latency")
    s.add_argument("--dead-id", type=int, action="append", default=[],
                   help="servo ID that stops answering (repeatable)")
    s.add_argument("--alert-id", type=int, action="append", default=[],
                   help="servo ID that reports a hardware-error alert (repeatable)")
    s.add_argument("--voltage-sag", type=float, default=0.0, help="supply sag in volts under load")
    s.add_argument("--payload-kg", type=float, default=0.0,
                   help="a mass at the end effector for the whole run [kg] (the world arm; "
                        "the client is not told)")
    s.add_argument("--grasp", action="store_true",
                   help="--payload-kg is an object between the jaws instead, as data synth's "
                        "payload tasks hold it: the jaws stop on it and its weight hangs "
                        "while they press it")
    s.add_argument("--leader", action="store_true",
                   help="emulate a leader arm (torque off, moved by a scripted human)")
    s.add_argument("--link", default=None, help="also create a symlink to the pty at this path")
    s.add_argument("--duration", type=float, default=None, help="exit after this many seconds")
    s.set_defaults(func=_emulate)

    s = sub.add_parser("record", help="leader-follower teleoperation recording into a "
                       "nactuator dataset")
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--leader", required=True,
                   help="serial port of the leader arm (e.g. /dev/ttyACM0, or an emulator's pty)")
    s.add_argument("--follower", required=True, help="serial port of the follower arm")
    s.add_argument("--leader-calibration", default=None,
                   help="LeRobot calibration JSON of the leader (SO-101: from "
                        ".venv-lerobot/bin/lerobot-calibrate; docs/hardware.md)")
    s.add_argument("--follower-calibration", default=None,
                   help="LeRobot calibration JSON of the follower")
    s.add_argument("--task", required=True, help="task label, e.g. pick_place_200g")
    s.add_argument("--episodes", type=_positive_int, default=1, help="episodes to record")
    s.add_argument("--seconds", type=_positive_float, default=10.0,
                   help="length of each episode (Ctrl-C ends the current one early, saved)")
    s.add_argument("--out", required=True, help="dataset folder (appended to if it exists)")
    s.add_argument("--payload-g", type=float, default=None,
                   help="grams held by the follower: labels force (0, 0, -m g); omit if unknown")
    s.add_argument("--split", default="train", choices=["train", "validation", "test"],
                   help="split of the recorded episodes (default: train)")
    s.add_argument("--min-valid-fraction", type=_fraction, default=None,
                   help="stop with an error (after saving it) when an episode has complete "
                        "follower telemetry in fewer of its frames (default 0.9)")
    _add_viewer_flags(s, "leader and follower joints, commands and telemetry")
    s.set_defaults(func=_record)

    s = sub.add_parser("calibrate-arm", help="guided: check the arm, record a short "
                       "protocol with your known weights, adapt the pretrained actuator, "
                       "score it, write the bundle for `live` (resumable)")
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--leader", required=True, help="serial port of the leader arm")
    s.add_argument("--follower", required=True, help="serial port of the follower arm")
    s.add_argument("--leader-calibration", default=None, help="LeRobot calibration JSON of "
                   "the leader (SO-101; docs/hardware.md)")
    s.add_argument("--follower-calibration", default=None,
                   help="LeRobot calibration JSON of the follower")
    s.add_argument("--out", required=True, help="folder for the recordings, the adaptation, "
                   "the bundle (actuator.pt) and calibrate.json; a rerun resumes there")
    s.add_argument("--weights-g", default=None, metavar="G1,G2[,G3]",
                   help="the known weights you own, in grams (default: asked for)")
    s.add_argument("--ckpt", default=None, help="start from this model instead of the "
                   "protocol's pretrained bundle (" + CKPT_HELP + ")")
    s.add_argument("--protocol", default=None,
                   help="protocol YAML (default conf/calibrate/<platform>.yaml)")
    s.add_argument("--episode-seconds", type=_positive_float, default=None,
                   help="every run this long instead of the protocol's (a quick trial)")
    s.add_argument("--adapt-steps", type=_positive_int, default=None,
                   help="fine-tuning optimiser steps (default: scaled to the minutes recorded)")
    s.set_defaults(func=_calibrate_arm, passthrough=True)  # after `--`: more `train` arguments

    s = sub.add_parser("collect", help="autonomous collection: replay a base command sequence "
                       "open loop with action noise, stopping on any safety limit")
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--port", required=True, help="serial port of the arm (or an emulator's pty)")
    s.add_argument("--calibration", default=None, help="LeRobot calibration JSON of the arm")
    s.add_argument("--out", required=True, help="dataset folder (appended to if it exists)")
    s.add_argument("--base", default=None, metavar="DATASET[:EPISODE]",
                   help="replay this recorded episode's commands (default: generated sweeps)")
    s.add_argument("--sweep-seconds", type=_positive_float, default=20.0,
                   help="length of the generated sweep base sequence (without --base)")
    s.add_argument("--episodes", type=_positive_int, default=1, help="episodes to collect")
    s.add_argument("--task", default="collect", help="task label of the collected episodes")
    s.add_argument("--noise-sigma", type=float, default=0.01,
                   help="std of the action noise on revolute channels [rad] (default 0.01)")
    s.add_argument("--noise-probability", type=_fraction, default=0.5,
                   help="probability that a frame's action is noised (default 0.5)")
    s.add_argument("--seed", type=int, default=0, help="seeds the sweeps and the noise")
    s.add_argument("--split", default="train", choices=["train", "validation", "test"],
                   help="split of the collected episodes (default: train)")
    s.add_argument("--limit-margin", type=_fraction, default=None,
                   help="fraction of each joint's range kept clear at both ends "
                        "(default: the platform's hardware.collect)")
    s.add_argument("--max-velocity", type=_positive_float, default=None,
                   help="|velocity| limit of revolute joints [rad/s]")
    s.add_argument("--max-temperature", type=_positive_float, default=None,
                   help="servo temperature limit [degC]")
    s.add_argument("--max-current", type=_positive_float, default=None,
                   help="|current| limit [A]")
    s.set_defaults(func=_collect)

    s = sub.add_parser("live", help="live virtual force sensor on a servo bus",
                       epilog=LIVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--ckpt", required=True, help=MODEL_HELP)
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--port", required=True, help="serial port of the arm (or an emulator's pty)")
    s.add_argument("--calibration", default=None,
                   help="LeRobot calibration JSON of the arm (SO-101: from "
                        ".venv-lerobot/bin/lerobot-calibrate; docs/hardware.md)")
    s.add_argument("--out", default=None, help="CSV file (default: stdout)")
    s.add_argument("--seconds", type=_positive_float, default=None,
                   help="stop after this long (default: until Ctrl-C)")
    s.add_argument("--device", default="cpu", help=DEVICE_HELP)
    s.add_argument("--quiet", action="store_true",
                   help="no running status line on stderr (rate, force, gate, cycle counts)")
    s.add_argument("--contact", default=None, metavar="FILE",
                   help="also estimate contact anywhere on the arm every cycle (link, point, "
                        "force; the columns of `infer --contact`) with this calibration of "
                        "`nactuator contact calibrate` for the same model file "
                        "(docs/contact.md)")
    _add_viewer_flags(s, "joints, commands, force, contact gate, condition and contact")
    s.set_defaults(func=_live)

    pol = sub.add_parser("policy", help="force-aware behaviour cloning: demonstrations, "
                         "fit, closed-loop evaluation in the hidden world, run on a bus")
    psub = pol.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    for name, what in (("demos", "scripted-expert demonstrations in the hidden world"),
                       ("fit", "train one policy per task and input condition"),
                       ("eval", "every policy in closed loop in the hidden world")):
        s = psub.add_parser(name, help=what)
        s.add_argument("--config", default=None,
                       help="policy YAML (default conf/policy/so101.yaml)")
        s.add_argument("--actuator", default=None,
                       help="frozen actuator checkpoint (default: the config's)")
        s.add_argument("--out", default="runs/policy/so101", help="the policy run folder: "
                       "demos/, policies/ and eval/ go under it")
        if name in ("demos", "eval"):
            s.add_argument("--episodes", type=int, default=None,
                           help="episodes per task and payload (demos) or per case and "
                                "condition (eval); default: the config's")
        if name == "fit":
            s.add_argument("--max-steps", type=int, default=None,
                           help="optimiser steps per policy (default: the config's)")
        s.set_defaults(func=_policy)
    s = psub.add_parser("run", help="a fitted policy driving a servo bus (the follower or "
                        "an emulator's pty), torque off on every exit")
    s.add_argument("--ckpt", required=True, help="policy file from `policy fit` "
                   "(runs/policy/so101/policies/TASK-CONDITION.pt)")
    s.add_argument("--actuator", required=True, help="the frozen actuator model it was fitted "
                   "with (" + MODEL_HELP + ")")
    s.add_argument("--port", required=True, help="serial port of the arm (or an emulator's pty)")
    s.add_argument("--calibration", default=None, help="LeRobot calibration JSON of the arm")
    s.add_argument("--seconds", type=_positive_float, default=None,
                   help="per episode (default: the task's)")
    s.add_argument("--episodes", type=int, default=1, help="episodes to run, one after another")
    s.set_defaults(func=_policy_run)

    s = sub.add_parser("track", help="move the end-effector along a 3-D or image path by "
                       "damped least squares on dx/du (kinematic, actuator-aware or a learned "
                       "field), in the hidden world or on a servo bus")
    s.add_argument("--path", required=True,
                   help="CSV with columns time, x, y, z (s; m, base frame), or time, u, v "
                        "(s; px of --camera: tracked in the image)")
    s.add_argument("--camera", default=None,
                   help="a camera file (conf/vision/cameras/NAME.yaml, or NAME): needed by a "
                        "pixel path; with a 3-D path the errors are also reported in pixels")
    s.add_argument("--ckpt", default=None, help="a counterfactual checkpoint (needed by "
                   "--method actuator; " + CKPT_HELP + ")")
    s.add_argument("--platform", default=None, help=PLATFORM_HELP + " (default: the "
                   "checkpoint's)")
    s.add_argument("--method", nargs="+", default=["kinematic"],
                   choices=["kinematic", "actuator", "field"],
                   help="Jacobian(s): rigid FK, the actuator model + simulator, or a "
                        "learned field (--field)")
    s.add_argument("--field", default=None,
                   help="a Jacobian field file from `nactuator field fit` (--method field)")
    s.add_argument("--payload-g", nargs="+", type=float, default=[0.0],
                   help="world only: payload(s) hung at the end-effector, not told to the "
                        "controller [g]")
    s.add_argument("--port", default=None,
                   help="drive this servo bus (or an emulator's pty) instead of the world")
    s.add_argument("--calibration", default=None, help="LeRobot calibration JSON (--port)")
    s.add_argument("--relative", action="store_true",
                   help="the path is offsets from where the end-effector is at the start")
    s.add_argument("--config", default=None,
                   help="start pose and controller settings (default conf/track/<platform>)")
    s.add_argument("--world", default=None, help="world YAML (default conf/world/<platform>)")
    s.add_argument("--seed", type=int, default=0, help="the hidden world's seed")
    s.add_argument("--track-noise", type=float, default=0.0,
                   help="world only: std of noise on the observed point track [m]")
    s.add_argument("--out", default=None,
                   help="folder for track.json, track.md, track.png and per-run CSV logs")
    s.set_defaults(func=_track)

    s = sub.add_parser("pretrain", help="build the shipped pretrained actuator of a platform "
                       "(synthetic worlds + NAD; `make pretrain`): bundle and model card")
    s.add_argument("--platform", required=True, help=PLATFORM_HELP)
    s.add_argument("--config", default=None,
                   help="the recipe (default conf/pretrain/<platform>.yaml)")
    s.add_argument("--out", default=None, help="work folder: data, training, evaluation, "
                   "logs (default runs/pretrain/<platform>); a rerun resumes there")
    s.add_argument("--bundle", default=None, help="the bundle to write (default the "
                   "package's pretrained/<platform>.pt; the card goes beside it as .md)")
    s.add_argument("--jobs", type=_positive_int, default=2,
                   help="synthetic worlds generated side by side")
    s.set_defaults(func=_pretrain, passthrough=True)  # after `--`: more `train` arguments

    fld = sub.add_parser("field", help="a learned Jacobian field J(obs) of the end-effector, "
                         "fitted to the hidden world's point tracks (for track --method field)")
    fsub = fld.add_subparsers(dest="field_command", required=True, metavar="ACTION")
    s = fsub.add_parser("fit", help="random command perturbations around the track config's "
                        "start pose in the hidden world, then fit and save the field")
    s.add_argument("--platform", default="so101", help=PLATFORM_HELP)
    s.add_argument("--out", required=True, help="the field file to write (.pt)")
    s.add_argument("--poses", type=_positive_int, default=None,
                   help="random poses within ±0.3 rad of the start pose, per payload "
                        "(default: the config's field.poses)")
    s.add_argument("--per-pose", type=_positive_int, default=None,
                   help="perturbations per pose (±0.04 rad, held the config's horizon; "
                        "default: the config's field.per_pose)")
    s.add_argument("--payload-g", type=float, nargs="+", default=None,
                   help="payload(s) hung at the end-effector while collecting, one block "
                        "of poses each, one dataset [g] (default: the config's "
                        "field.payloads_g)")
    s.add_argument("--observation", nargs="+", default=None, choices=["q", "effort", "error"],
                   help="what the field reads: q (always, first), effort (the servos' "
                        "load telemetry), error (command − joints) (default: the config's "
                        "field.observation)")
    s.add_argument("--prior", default=None, choices=["none", "fk", "fk_scale"],
                   help="fk: learn only a correction to rigid FK, J_FK(q) + ΔJ(obs); "
                        "fk_scale: FK's columns each scaled within 1 ± 0.5 (default: the "
                        "config's field.prior)")
    s.add_argument("--signed", default=None, action=argparse.BooleanOptionalAction,
                   help="one set of columns for a command step up and one for a step down "
                        "(default: the config's field.signed)")
    s.add_argument("--steps", type=_positive_int, default=3000, help="Adam steps of the fit")
    s.add_argument("--track-noise", type=float, default=0.0005,
                   help="std of the noise on the observed point track [m]")
    s.add_argument("--config", default=None,
                   help="start pose, horizon and field defaults (default "
                        "conf/track/<platform>)")
    s.add_argument("--world", default=None, help="world YAML (default conf/world/<platform>)")
    s.add_argument("--seed", type=int, default=0, help="the hidden world's and the fit's seed")
    s.set_defaults(func=_field_fit)
    return p


_PATH_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
                PermissionError)


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.strerror}: {err.filename}"
    return " ".join(str(err).split()) or type(err).__name__


def _run(argv: list[str]) -> int:
    parser = build_parser()
    # LightningCLI commands take their own arguments; argparse must not touch them.
    if argv and argv[0] in ("fit", "validate", "test"):
        a = argparse.Namespace(command=argv[0])
        return _lightning(a, argv[1:])
    a, rest = parser.parse_known_args(argv)
    if getattr(a, "passthrough", False):
        return a.func(a, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return a.func(a)


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user error (``UserError``, a missing or unwritable path) prints one
    line and exits 2; ``--debug`` or ``NACTUATOR_DEBUG=1`` shows its traceback instead."""
    from nactuator.errors import UserError

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("NACTUATOR_DEBUG", "").strip() not in ("", "0")
    if "--debug" in argv:
        debug = True
        argv = [x for x in argv if x != "--debug"]
    command = " ".join(x for x in argv[:2] if not x.startswith("-")) or "nactuator"
    # Warp compiles kernels once into the per-user cache, wherever the command runs from.
    from nactuator.paths import use_warp_cache

    use_warp_cache()
    try:
        return _run(argv)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"nactuator {command}: interrupted", file=sys.stderr)
        return 130
    except (UserError, *_PATH_ERRORS) as err:
        if debug:
            raise
        print(f"nactuator {command}: error: {_one_line(err)} [--debug shows the traceback]",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
