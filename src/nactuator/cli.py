"""The one ``nactuator`` command. Thin: parse, call one function in its room, print.

Each subcommand imports its room lazily so ``nactuator --help`` stays fast and a user who
only records data never pays for importing Warp or Lightning.
"""

from __future__ import annotations

import argparse
import json
import sys


def _sim_check(a: argparse.Namespace) -> int:
    from nactuator.sim.check import run_sim_check

    report = run_sim_check(a.platform, device=a.device)
    print(json.dumps(report, indent=2) if a.json else report["summary"])
    return 0 if report["passed"] else 1


def _data_import_nad(a: argparse.Namespace) -> int:
    from nactuator.data.importers import import_nad

    print(import_nad(a.src, a.out, platform=a.platform))
    return 0


def _data_import_bam(a: argparse.Namespace) -> int:
    from nactuator.data.importers import import_bam

    print(import_bam(a.src, a.out))
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


def _lightning(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.training.cli import lightning_main

    lightning_main([a.command, *rest])
    return 0


def _train(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.training.cli import train

    train(a.platform, data=a.data, extra_args=rest)
    return 0


def _eval(a: argparse.Namespace) -> int:
    from nactuator.eval import evaluate

    print(evaluate(a.ckpt, a.data, split=a.split, out=a.out, device=a.device,
                   baselines=a.baselines, baselines_config=a.baselines_config))
    return 0


def _infer(a: argparse.Namespace) -> int:
    from nactuator.eval.infer import infer

    print(infer(a.ckpt, a.data, split=a.split, out=a.out, force_only=a.force_only))
    return 0


def _export(a: argparse.Namespace) -> int:
    from nactuator.export import export

    print(export(a.ckpt, a.out, fmt=a.format, quantize=a.quantize))
    return 0


def _sweep(a: argparse.Namespace, rest: list[str]) -> int:
    from nactuator.training.sweep import run_sweep

    # LightningCLI-style extras (--trainer.x=...) arrive unparsed; a "--" separator is optional.
    extra = [x for x in [*a.extra, *rest] if x != "--"]
    print(run_sweep(a.file, max_runs=a.max_runs, method=a.method, out=a.out,
                    extra_args=extra))
    return 0


def _emulate(a: argparse.Namespace) -> int:
    from nactuator.hardware.emulator import run_emulator

    run_emulator(bus=a.bus, platform=a.platform, seed=a.seed, bus_timing=a.bus_timing,
                 corrupt_rate=a.corrupt_rate, drop_rate=a.drop_rate, latency_ms=a.latency_ms,
                 dead_ids=a.dead_id, alert_ids=a.alert_id, voltage_sag=a.voltage_sag,
                 leader=a.leader, link=a.link, duration=a.duration)
    return 0


def _record(a: argparse.Namespace) -> int:
    from nactuator.hardware.recorder import record

    print(record(platform=a.platform, leader=a.leader, follower=a.follower, task=a.task,
                 episodes=a.episodes, seconds=a.seconds, out=a.out, payload_g=a.payload_g,
                 split=a.split))
    return 0


def _live(a: argparse.Namespace) -> int:
    from nactuator.control.live import run_live

    print(run_live(ckpt=a.ckpt, platform=a.platform, port=a.port, out=a.out,
                   seconds=a.seconds, device=a.device))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nactuator",
        description="Neural actuator models for low-cost servo arms.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("sim-check", help="gradient and MuJoCo-parity checks of the simulator")
    s.add_argument("--platform", required=True)
    s.add_argument("--device", default="cpu")
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.set_defaults(func=_sim_check)

    d = sub.add_parser("data", help="NAD shards: import, synthesize, describe")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    s = dsub.add_parser("import-nad", help="import NAD CSV files (OMX, SO-101, Franka)")
    s.add_argument("src")
    s.add_argument("--out", required=True)
    s.add_argument("--platform", default=None, help="default: detected from the CSV header")
    s.set_defaults(func=_data_import_nad)
    s = dsub.add_parser("import-bam", help="import BAM XL330 pendulum JSON logs")
    s.add_argument("src")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_data_import_bam)
    s = dsub.add_parser("synth", help="generate data from a hidden ground-truth servo world")
    s.add_argument("--platform", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--world", default=None, help="world YAML (default: conf/world/<platform>)")
    s.add_argument("--trajectories-per-task", type=int, default=10)
    s.add_argument("--seconds", type=float, default=None, help="length of each trajectory")
    s.add_argument("--tasks", nargs="*", default=None, help="subset of task names")
    s.set_defaults(func=_data_synth)
    s = dsub.add_parser("info", help="describe a dataset")
    s.add_argument("path")
    s.set_defaults(func=_data_info)

    for name, what in (("fit", "train"), ("validate", "validate"), ("test", "test")):
        s = sub.add_parser(name, help=f"LightningCLI {what} (--config conf/base.yaml ...)",
                           add_help=False)
        s.set_defaults(func=_lightning, passthrough=True)
    s = sub.add_parser("train", help="train on a platform's default or given data "
                       "(what `make train` runs); extra args go to LightningCLI fit")
    s.add_argument("--platform", required=True)
    s.add_argument("--data", default=None, help="dataset path(s), comma separated")
    s.set_defaults(func=_train, passthrough=True)

    s = sub.add_parser("eval", help="evaluation protocol: rollouts, metrics, plots")
    s.add_argument("--ckpt", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--split", default="test")
    s.add_argument("--out", required=True)
    s.add_argument("--device", default="cpu")
    s.add_argument("--baselines", default=None, metavar="all|none|NAME[,NAME...]",
                   help="add classical baselines fitted on the train split as table rows: "
                   "id-linear, id-friction, gmo, gmo-friction, threshold, svm, random-forest")
    s.add_argument("--baselines-config", default=None, metavar="YAML",
                   help="partial YAML merged onto conf/eval/baselines.yaml")
    s.set_defaults(func=_eval)

    s = sub.add_parser("infer", help="causal force/gate/condition from telemetry (no simulator)")
    s.add_argument("--ckpt", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--split", default=None)
    s.add_argument("--out", default=None, help="CSV file for the predictions")
    s.add_argument("--force-only", action="store_true")
    s.set_defaults(func=_infer)

    s = sub.add_parser("export", help="export a checkpoint's model for deployment")
    s.add_argument("--ckpt", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--format", default="torchscript", choices=["torchscript", "onnx"])
    s.add_argument("--quantize", default="none", choices=["none", "int8"],
                   help="int8: ONNX Runtime dynamic quantization (--format onnx only), "
                        "checked against eager within the int8 tolerances")
    s.set_defaults(func=_export)

    s = sub.add_parser("sweep", help="run a wandb-format sweep YAML locally (offline)")
    s.add_argument("file")
    s.add_argument("--max-runs", type=int, default=None)
    s.add_argument("--method", default=None, choices=[None, "grid", "random"])
    s.add_argument("--out", default="runs/sweep")
    s.add_argument("extra", nargs="*", help="extra LightningCLI args for every run")
    s.set_defaults(func=_sweep, passthrough=True)

    s = sub.add_parser("emulate", help="a virtual servo arm on a pseudo-terminal")
    s.add_argument("--bus", required=True, choices=["dynamixel", "feetech"])
    s.add_argument("--platform", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--bus-timing", action="store_true", help="emulate wire time at the baud rate")
    s.add_argument("--corrupt-rate", type=float, default=0.0, help="fraction of corrupted replies")
    s.add_argument("--drop-rate", type=float, default=0.0, help="fraction of dropped replies")
    s.add_argument("--latency-ms", type=float, default=0.0, help="added reply latency")
    s.add_argument("--dead-id", type=int, action="append", default=[],
                   help="servo ID that stops answering (repeatable)")
    s.add_argument("--alert-id", type=int, action="append", default=[],
                   help="servo ID that reports a hardware-error alert (repeatable)")
    s.add_argument("--voltage-sag", type=float, default=0.0, help="supply sag in volts under load")
    s.add_argument("--leader", action="store_true",
                   help="emulate a leader arm (torque off, moved by a scripted human)")
    s.add_argument("--link", default=None, help="also create a symlink to the pty at this path")
    s.add_argument("--duration", type=float, default=None, help="exit after this many seconds")
    s.set_defaults(func=_emulate)

    s = sub.add_parser("record", help="leader-follower teleoperation recording to NAD shards")
    s.add_argument("--platform", required=True)
    s.add_argument("--leader", required=True)
    s.add_argument("--follower", required=True)
    s.add_argument("--task", required=True)
    s.add_argument("--episodes", type=int, default=1)
    s.add_argument("--seconds", type=float, default=10.0)
    s.add_argument("--out", required=True)
    s.add_argument("--payload-g", type=float, default=None)
    s.add_argument("--split", default="train", choices=["train", "validation", "test"])
    s.set_defaults(func=_record)

    s = sub.add_parser("live", help="live virtual force sensor on a servo bus")
    s.add_argument("--ckpt", required=True)
    s.add_argument("--platform", required=True)
    s.add_argument("--port", required=True)
    s.add_argument("--out", default=None, help="CSV file (default: stdout)")
    s.add_argument("--seconds", type=float, default=None)
    s.add_argument("--device", default="cpu")
    s.set_defaults(func=_live)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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


if __name__ == "__main__":
    sys.exit(main())
