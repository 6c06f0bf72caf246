"""The ``nactuator policy`` actions, one function each; the CLI only parses."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["run_policy_command"]


def run_policy_command(action: str, a: argparse.Namespace) -> str:
    from .config import load_config

    cfg = load_config(a.config, a.actuator)
    if getattr(a, "episodes", None) is not None and action == "demos":
        cfg["demos"]["episodes"] = a.episodes
    if getattr(a, "max_steps", None) is not None:
        cfg["policy"]["max_steps"] = a.max_steps
    root = Path(a.out)
    if action == "demos":
        from .demos import make_demos

        return make_demos(cfg, root / "demos")
    if action == "fit":
        from .fit import fit_policies

        return fit_policies(cfg, root / "demos", root / "policies")
    if action == "eval":
        from .evaluate import evaluate_policies

        return evaluate_policies(cfg, root / "policies", root / "eval", episodes=a.episodes)
    raise ValueError(f"unknown policy action {action!r}")
