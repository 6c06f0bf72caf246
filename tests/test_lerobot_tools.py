"""Every LeRobot command-line tool our code and docs name must run where they say it runs.

LeRobot 0.4.4 is installed in our environment without its dependencies (its torch pin
conflicts with ours), and every robot tool (``lerobot-calibrate``, ``lerobot-setup-motors``,
``lerobot-dataset-viz``, ...) imports torchvision, which has no wheel for torch 2.13 CPU.
So a tool named bare must answer ``--help`` here; one named as
``.venv-lerobot/bin/<tool>`` runs in the separate environment of ``make lerobot-env``, and
must be among the tools ``make lerobot-check`` runs there (tests/lerobot_check/).
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEPARATE = ".venv-lerobot/bin/"
NAMED = re.compile(r"(\.venv-lerobot/bin/)?\b(lerobot-[a-z][a-z-]*[a-z])")
LEROBOT_TOOLS = {e.name for e in distribution("lerobot").entry_points
                 if e.group == "console_scripts"}


def named_tools() -> dict[str, set[str]]:
    """``{"here": {...}, "separate": {...}}``: LeRobot tools named in src/, docs/, README."""
    files = [*ROOT.glob("src/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md"]
    found: dict[str, set[str]] = {"here": set(), "separate": set()}
    for path in files:
        for prefix, tool in NAMED.findall(path.read_text()):
            if tool in LEROBOT_TOOLS:  # not make targets such as lerobot-check
                found["separate" if prefix == SEPARATE else "here"].add(tool)
    return found


def tools_checked_in_the_separate_env() -> set[str]:
    source = (ROOT / "tests" / "lerobot_check" / "open_with_lerobot.py").read_text()
    return set(re.findall(r'"(lerobot-[a-z-]+)"', re.search(r"TOOLS = \(([^)]*)\)",
                                                               source).group(1)))


def test_tools_named_for_the_separate_env_are_the_ones_lerobot_check_runs():
    found = named_tools()
    # docs/hardware.md and the SO-101 bus's missing-servo hint send users to these two
    assert {"lerobot-calibrate", "lerobot-setup-motors"} <= found["separate"]
    assert found["separate"] <= tools_checked_in_the_separate_env()


@pytest.mark.parametrize("tool", sorted(named_tools()["here"]) or ["(none named)"])
def test_tools_named_bare_run_in_this_environment(tool):
    if tool == "(none named)":
        return  # nothing to run: every tool named is named in the separate environment
    exe = Path(sys.executable).parent / tool
    run = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (f"{tool} is named in src/ or docs/ but fails here: "
                                 f"{(run.stderr or run.stdout).strip().splitlines()[-1:]}")
