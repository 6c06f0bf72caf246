"""Run a `nactuator` subcommand in a child process, its output appended to a log file.

`cv`, `adapt`, `sweep` and `bench-bam` (the `experiments` room) train and evaluate in child
processes (a fold, a fine-tune, a sweep run, a benchmark run each get a fresh interpreter, and
a crash in one leaves the others). The child gets one BLAS/OpenMP thread: these drivers run
several children side by side on few cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_nactuator(args: Sequence[str], log: Path) -> int:
    """``python -m nactuator.cli ARGS`` with stdout and stderr appended to ``log`` (after a
    ``$ command`` line); returns the exit code."""
    return run_command([sys.executable, "-m", "nactuator.cli", *args], log)


def run_command(command: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                cwd: Path | None = None) -> int:
    """Any command (e.g. a sweep file's own ``command``) run as :func:`run_nactuator` runs a
    subcommand; ``env`` adds to (and overrides) the inherited environment."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "a") as sink:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        return subprocess.run(list(command), stdout=sink, stderr=subprocess.STDOUT,
                              env=full_env, cwd=cwd).returncode
