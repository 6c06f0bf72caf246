"""The policy configuration (conf/policy/<platform>.yaml): loaded and checked once, so a
bad file is one line naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import yaml

from nactuator.errors import UserError
from nactuator.model_files import resolve_model_path
from nactuator.paths import conf_dir

from .sensing import CONDITIONS
from .task_world import TASKS

__all__ = ["default_config_path", "load_config"]

SECTIONS = ("platform", "actuator", "protection", "tasks", "expert", "demos", "policy", "eval")


def default_config_path(platform: str = "so101") -> Path:
    return conf_dir() / "policy" / f"{platform}.yaml"


def load_config(path: str | Path | None = None, actuator: str | None = None) -> dict:
    """Read ``path`` (default conf/policy/so101.yaml); ``actuator`` overrides its checkpoint."""
    path = Path(path) if path is not None else default_config_path()
    if not path.is_file():
        raise UserError(f"{path}: no such policy config (see conf/policy/so101.yaml)")
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({err.__class__.__name__})") from err
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a mapping at the top level")
    missing = [k for k in SECTIONS if k not in cfg]
    if missing:
        raise UserError(f"{path}: missing sections {missing}")
    for task in TASKS:
        if task not in cfg["tasks"]:
            raise UserError(f"{path}: tasks.{task} missing")
    for case in cfg["eval"].get("cases", []):
        if case.get("task") not in TASKS:
            raise UserError(f"{path}: eval.cases task {case.get('task')!r} is not one of "
                            f"{list(TASKS)}")
    bad = [c for c in cfg["eval"].get("conditions", []) if c not in CONDITIONS]
    if bad:
        raise UserError(f"{path}: eval.conditions {bad} not among {list(CONDITIONS)}")
    if actuator is not None:
        cfg["actuator"] = actuator
    # a shipped bundle by name (pretrained/so101) is read like a file
    if not resolve_model_path(cfg["actuator"]).exists():
        raise UserError(f"{path}: actuator {cfg['actuator']!r} does not exist (train one: "
                        f"`make train PLATFORM={cfg['platform']}`, or pass --actuator)")
    return cfg
