"""The README's commands work as written, in order, on a copy of the checkout, and leave
nothing untracked in it (`make docs-check`; CI runs it after `make test`).

The copy holds the tracked files and links this checkout's `.venv` and `.cache` (so Warp's
kernels are not compiled again); `../shared` beside it links the real data. Only the
run lengths shrink (epochs, seconds, folds, runs), by the substitutions below: every
command, path and flag is the README's own.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NACTUATOR_SHARED", ROOT.parent / "shared")).resolve()

# Setting up and running the whole suite is what CI does around this test.
SKIPPED = ("make setup", "make test")
TINY_TRAIN = "--trainer.max_epochs=1 --data.samples_per_epoch=16"
SHORTER = [
    # make train: one short epoch (LightningCLI: the last value of a key wins)
    (r'^(make train [^"\n]*?)(?: ARGS="([^"]*)")?$',
     lambda m: f'{m[1]} ARGS="{(m[2] + " ") if m[2] else ""}{TINY_TRAIN}"'),
    (r"^(nactuator data synth .*)$", r"\1 --trajectories-per-task 3 --seconds 2"),
    (r"--seconds 10\b", "--seconds 1"),
    (r"^(nactuator cv .*?)--max-folds \d+(.*?) -- (.*)$", rf"\1--max-folds 1\2 -- \3 {TINY_TRAIN}"),
    (r"^(nactuator policy (?:demos|eval) .*)$", r"\1 --episodes 1"),
    (r"^(nactuator policy fit .*)$", r"\1 --max-steps 2"),
    (r"^(nactuator calibrate-arm .*)$", r"\1 --episode-seconds 1 --adapt-steps 8"),
    (r"^(nactuator collect .*)--episodes \d+ --sweep-seconds \d+",
     r"\1--episodes 1 --sweep-seconds 2"),
    (r"^(nactuator sweep .*?)--max-runs \d+(.*)$",
     r"\1--max-runs 1\2 -- --trainer.max_epochs=1 --data.samples_per_epoch=8"),
]


def readme_commands(text: str) -> list[str]:
    """Every line of every ```bash block, in order, without comments and skipped lines."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].rstrip()
            if line and not line.startswith("#") and not line.startswith(SKIPPED):
                lines.append(line)
    return lines


def shortened(line: str) -> str:
    for pattern, repl in SHORTER:
        line = re.sub(pattern, repl, line)
    return line


def left_running(session: int) -> list[str]:
    """The command lines of the processes still alive in ``session`` (its leader's pid)."""
    ps = subprocess.run(["ps", "-eo", "sid=,pid=,args="], capture_output=True, text=True,
                        check=True).stdout
    rows = [line.split(None, 2) for line in ps.splitlines()]
    return [f"{r[1]} {r[2]}" for r in rows if len(r) == 3 and r[0] == str(session)]


def kill_session(session: int) -> None:
    try:
        os.killpg(session, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_every_background_command_is_stopped_by_its_pid():
    """A ``cmd &`` is followed by ``name=$!`` and later ``kill $name``: job numbers (``%1``)
    shift as blocks are added, and an emulator left running hangs whoever waits for its
    output (it did: CI waited 30 minutes)."""
    commands = readme_commands((ROOT / "README.md").read_text())
    started = [i for i, c in enumerate(commands) if c.endswith("&")]
    assert started
    for i in started:
        name = commands[i + 1].partition("=$!")[0]
        assert commands[i + 1] == f"{name}=$!", commands[i:i + 2]
        assert any(re.match(rf"kill [^;]*\${name}\b", c) for c in commands[i + 2:]), \
            f"${name} is never killed"
    assert not any("%" in c for c in commands if c.startswith("kill"))


def test_commands_are_found_and_only_shortened():
    commands = readme_commands((ROOT / "README.md").read_text())
    assert "make train PLATFORM=so101" in commands
    assert shortened("make train PLATFORM=so101") == \
        f'make train PLATFORM=so101 ARGS="{TINY_TRAIN}"'
    assert shortened('make train PLATFORM=x DATA=d ARGS="--a=1"') == \
        f'make train PLATFORM=x DATA=d ARGS="--a=1 {TINY_TRAIN}"'
    calibrate = next(c for c in commands if c.startswith("nactuator calibrate-arm"))
    assert shortened(calibrate) == f"{calibrate} --episode-seconds 1 --adapt-steps 8"
    for line in commands:
        assert shortened(line).startswith(line.split(" ")[0])


@pytest.mark.readme
def test_readme_runs_in_order_and_leaves_the_checkout_clean(tmp_path):
    work = tmp_path / "work"
    repo = work / "nactuator"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    (work / "shared").symlink_to(SHARED)
    for name in (".venv", ".cache"):
        (repo / name).symlink_to(ROOT / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    (repo / ".git" / "info" / "exclude").write_text(".venv\n.cache\n")
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "copy"], cwd=repo, check=True)

    commands = [shortened(c) for c in readme_commands((ROOT / "README.md").read_text())]
    script = "set -euo pipefail\n" + "\n".join(commands) + "\n"
    (tmp_path / "readme.sh").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTEST"))}
    env["PATH"] = os.environ["PATH"]
    env.pop("WARP_CACHE_PATH", None)  # the commands must find the cache themselves
    # Output goes to files, not pipes: a background process the page forgot to stop would
    # hold a pipe open and hang the run; instead it is found in the script's session below.
    out, err = tmp_path / "readme.out", tmp_path / "readme.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(["bash", str(tmp_path / "readme.sh")], cwd=repo, env=env,
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=1800)
        finally:
            left = left_running(proc.pid)
            kill_session(proc.pid)
    assert returncode == 0, (f"README command failed\n--- script\n{script}\n--- output\n"
                             f"{out.read_text()[-6000:]}\n--- errors\n{err.read_text()[-6000:]}")
    assert not left, "the README's commands left processes running:\n" + "\n".join(left)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=repo, capture_output=True, text=True, check=True).stdout
    assert status == "", f"the README's commands left files outside runs/:\n{status}"
    for made in ("runs/so101/best.ckpt", "runs/so101-nad/eval/metrics.md",
                 "runs/so101-nad/forces.csv", "runs/cv/omx/cv.md", "runs/live.csv",
                 "runs/so101/actuator.onnx", "runs/data/my-recording/meta/info.json",
                 "runs/my-arm/actuator.pt", "runs/my-arm/live.csv"):
        assert (repo / made).exists(), made
