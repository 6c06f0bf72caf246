"""LightningCLI wiring: ``nactuator fit|validate|test`` and ``nactuator train``.

``nactuator fit --config conf/base.yaml --platform so101 --data.paths '[DATA]'`` is a
plain LightningCLI over :class:`NeuralActuatorModule` and ``NADDataModule`` (typed and
strict: unknown keys are errors). One extra top-level argument, ``--platform NAME|YAML``,
is linked to both ``model.platform`` and ``data.platform`` so the two can never disagree.
A platform description given as ``--config conf/platform/<p>.yaml`` is recognised (it is
not a Lightning config) and treated as ``--platform``. ``--logger tensorboard|wandb|csv|
none`` is a shortcut for ``--trainer.logger`` (writing under ``--trainer.default_root_dir``);
wandb runs offline unless credentials exist.

``train(platform, data=None)`` is what ``make train`` runs: ``fit`` with conf/base.yaml,
the platform's training defaults (conf/train/<platform>.yaml, if present) and, without
``data``, the platform's small synthetic dataset (``nactuator.data.defaults``).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from nactuator.paths import cache_dir, conf_dir, use_warp_cache
from nactuator.platforms import PlatformError, load_platform

LOGGERS = ("tensorboard", "wandb", "csv", "none")


def _is_platform_description(path: str) -> bool:
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(raw, dict) and "channels" in raw and "robot_model" in raw


def logger_config(name: str, save_dir: str = "runs") -> Any:
    """The ``trainer.logger`` value for a logger shortcut name."""
    if name == "none":
        return False
    if name == "tensorboard":
        return {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": save_dir, "name": "nactuator"}}
    if name == "csv":
        return {"class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": save_dir, "name": "nactuator"}}
    if name == "wandb":
        # Online only with credentials and no explicit offline mode: a run must never
        # hang waiting for a network that is not there.
        mode = os.environ.get("WANDB_MODE", "")
        online = bool(os.environ.get("WANDB_API_KEY")) and mode not in ("offline", "disabled")
        os.environ.setdefault("WANDB_MODE", "online" if online else "offline")
        os.environ.setdefault("WANDB_INIT_TIMEOUT", "30")
        return {"class_path": "lightning.pytorch.loggers.WandbLogger",
                "init_args": {"save_dir": save_dir, "project": "nactuator",
                              "offline": not online}}
    raise ValueError(f"--logger must be one of {list(LOGGERS)}, got {name!r}")


def rewrite_args(argv: Sequence[str]) -> list[str]:
    """Turn the two conveniences (platform YAML as --config, --logger NAME) into
    plain LightningCLI arguments; everything else passes through unchanged."""
    out: list[str] = []
    args = list(argv)
    # Loggers write under the run's root folder, like Lightning's default logger does.
    save_dir = "runs"
    for k, arg in enumerate(args):
        if arg.startswith("--trainer.default_root_dir="):
            save_dir = arg.partition("=")[2]
        elif arg == "--trainer.default_root_dir" and k + 1 < len(args):
            save_dir = args[k + 1]
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if key in ("--config", "--logger") and not eq:
            if i + 1 >= len(args):
                raise SystemExit(f"nactuator: {key} needs a value")
            value = args[i + 1]
            i += 1
        if key == "--config" and _is_platform_description(value):
            out += ["--platform", value]
        elif key == "--logger":
            out.append(f"--trainer.logger={json.dumps(logger_config(value, save_dir))}")
        elif key == "--config":
            out += ["--config", value]
        else:
            out.append(arg)
        i += 1
    return out


def log_progress_instead_of_bar(enable_progress_bar: bool | None,
                                 callbacks: Sequence[Any]) -> bool:
    """True when Lightning would redraw its tqdm bar into a log: stdout (where the bar goes)
    is not a terminal, the bar is not switched off and no progress bar was configured. Then
    ``EpochLines`` takes its place: one line per epoch."""
    from lightning.pytorch.callbacks import ProgressBar

    from nactuator.progress import is_terminal

    if enable_progress_bar is False or is_terminal(sys.stdout):
        return False
    return not any(isinstance(c, ProgressBar) for c in callbacks)


def _make_cli_class() -> type:
    from lightning.pytorch.cli import LightningCLI

    class NactuatorCLI(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.add_argument(
                "--platform", type=str, required=True,
                help="platform name (conf/platform/<name>.yaml) or a platform YAML path; "
                     "sets model.platform and data.platform",
            )
            parser.link_arguments("platform", "model.platform")
            parser.link_arguments("platform", "data.platform")
            parser.link_arguments("data.window_length", "model.window_length")

        def before_instantiate_classes(self) -> None:
            config = self.config[self.subcommand] if self.subcommand else self.config
            try:
                load_platform(config["platform"])
            except PlatformError as e:
                raise SystemExit(f"nactuator: --platform: {e}") from e

        def instantiate_trainer(self, **kwargs: Any) -> Any:
            trainer = self._get(self.config_init, "trainer", default={})
            callbacks = kwargs.get("callbacks", trainer.get("callbacks")) or []
            callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
            if log_progress_instead_of_bar(trainer.get("enable_progress_bar"), callbacks):
                from nactuator.training.callbacks import EpochLines

                kwargs["callbacks"] = [*callbacks, EpochLines()]
            return super().instantiate_trainer(**kwargs)

    return NactuatorCLI


def lightning_main(argv: Sequence[str], run: bool = True) -> Any:
    """``nactuator fit|validate|test ...``: LightningCLI over the module and DataModule.

    Returns the LightningCLI object (its ``trainer``, ``model`` and ``datamodule``).
    """
    use_warp_cache()
    from nactuator.data.datamodule import NADDataModule
    from nactuator.training.module import NeuralActuatorModule

    # We pass the rewritten argv explicitly while sys.argv still holds the original.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    cli_class = _make_cli_class()
    return cli_class(
        NeuralActuatorModule,
        NADDataModule,
        args=rewrite_args(argv),
        run=run,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False},
    )


def _root_dir(args: Sequence[str]) -> str | None:
    for k, arg in enumerate(args):
        if arg.startswith("--trainer.default_root_dir="):
            return arg.partition("=")[2]
        if arg == "--trainer.default_root_dir" and k + 1 < len(args):
            return args[k + 1]
    return None


def train(platform: str, data: str | None = None, extra_args: Sequence[str] = ()) -> Any:
    """``make train PLATFORM=p [DATA=path] [ARGS=...]``: fit with the project defaults.

    Runs go under ``runs/<platform>`` unless ``--trainer.default_root_dir`` says otherwise;
    at the end ``best.ckpt`` and ``last.ckpt`` in that folder point at the run's
    checkpoints, so the next command needs no version or epoch in its path."""
    from nactuator.data.defaults import default_dataset
    from nactuator.data.episodes import dataset_paths

    name = load_platform(platform).name
    paths = ([str(p) for p in dataset_paths(data)] if data
             else [str(default_dataset(name, cache_dir() / "datasets"))])
    root = _root_dir(extra_args)
    argv = ["fit", "--config", str(conf_dir() / "base.yaml")]
    platform_defaults = conf_dir() / "train" / f"{name}.yaml"
    if platform_defaults.is_file():
        argv += ["--config", str(platform_defaults)]
    argv += ["--platform", platform, f"--data.paths={json.dumps(paths)}"]
    if root is None:
        root = str(Path("runs") / name)
        argv.append(f"--trainer.default_root_dir={root}")
    argv += list(extra_args)
    print("[nactuator] nactuator " + " ".join(argv), flush=True)
    cli = lightning_main(argv)
    if cli.trainer.is_global_zero:
        _print_next_steps(cli, paths, Path(root))
    return cli


def _link(link: Path, target: str) -> Path:
    """``link`` -> ``target`` (relative), replacing an older link atomically."""
    tmp = link.with_name(f".{link.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(Path(target).resolve(), link.parent.resolve()))
    os.replace(tmp, link)
    return link


def _print_next_steps(cli: Any, paths: Sequence[str], root: Path) -> None:
    """Link ``best.ckpt``/``last.ckpt`` in the run folder; print the best and last epochs'
    validation figures side by side, the verdict against the trivial references, which
    file ``best.ckpt`` is and why, and the eval command."""
    callbacks = cli.trainer.checkpoint_callbacks
    selector = next((c for c in callbacks if c.monitor and c.best_model_path), None)
    best = selector.best_model_path if selector else None
    last = next((c.last_model_path or c.best_model_path for c in callbacks
                 if not c.monitor and (c.last_model_path or c.best_model_path)), None)
    if last:
        print(f"[nactuator] last checkpoint: {_link(root / 'last.ckpt', last)} -> {last}")
    history = getattr(cli.model, "val_history", [])
    if best:
        split = "test" if any(_has_split(p, "test") for p in paths) else "validation"
        link = _link(root / "best.ckpt", best)
        print(f"[nactuator] best checkpoint (lowest {selector.monitor}): {link} -> {best}")
        for line in selection_summary(history, selector.best_model_score, selector.monitor):
            print(f"[nactuator] {line}")
        print(f"[nactuator] evaluate it: nactuator eval --ckpt {link} "
              f"--data {','.join(paths)} --split {split} --out {root / 'eval'}", flush=True)


def selection_summary(history: Sequence[dict[str, float]], best_score: Any,
                      monitor: str) -> list[str]:
    """Lines comparing the linked (best) epoch with the last one on validation, with the
    verdict against the trivial references; a warning when the model loses to them."""
    from nactuator.data.references import losing_terms, verdict

    if not history:
        return []
    key = monitor.removeprefix("val/")
    # The linked epoch is the first whose monitored value is the checkpoint's best score
    # (ModelCheckpoint keeps the first of equal scores), whatever its file is called.
    best = None if best_score is None else float(best_score)
    chosen = next((h for h in history if best is not None and h.get(key) is not None
                   and abs(h[key] - best) <= 1e-6 * max(1.0, abs(best))), None)
    final = history[-1]
    lines = []
    for name, row in (("best", chosen), ("last", final)):
        if row is None:
            continue
        score = row.get(key)
        shown = "—" if score is None else f"{score:.3f}"
        lines.append(f"{name} (epoch {row['epoch']}): {monitor} {shown}; {verdict(row)}")
    if chosen is not None and chosen is not final:
        lines.append(f"best.ckpt is epoch {chosen['epoch']}, not the last ({final['epoch']}): "
                     f"its {monitor} (each error over its trivial reference, averaged) is "
                     "lower on the validation episodes")
    row = chosen or final
    losing = losing_terms(row)
    if losing:
        # Name the term: a counterfactual model (no telemetry in) that beats command
        # following on the joints but loses on force is doing its job, and a single
        # "no better" line read as if the whole model were useless.
        lines.append(f"WARNING: the linked model loses on {' and '.join(losing)} on "
                     "validation; train longer or use a recipe from conf/train/ "
                     "(docs/training.md)" + (
                         "" if len(losing) > 1 or "joints_deg" not in row
                         or losing[0].startswith("the joints") else
                         "; its joints beat command following, so it may serve as a "
                         "counterfactual model (plan, track, correct) all the same"))
    return lines


def _has_split(path: str, split: str) -> bool:
    from nactuator.data import read_dataset

    return any(ep.split == split for ep in read_dataset(path).episodes)


if __name__ == "__main__":
    lightning_main(sys.argv[1:])
