"""Run a `nactuator` subcommand in a child process, its output appended to a log file.

`cv`, `adapt` and `bench-bam` train and evaluate in child processes (a fold, a fine-tune, a
benchmark run each get a fresh interpreter, and a crash in one leaves the others). The child
gets one BLAS/OpenMP thread: these drivers run several children side by side on few cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def run_nactuator(args: Sequence[str], log: Path) -> int:
    """``python -m nactuator.cli ARGS`` with stdout and stderr appended to ``log`` (after a
    ``$ command`` line); returns the exit code."""
    command = [sys.executable, "-m", "nactuator.cli", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}
    with open(log, "a") as sink:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        return subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=env).returncode
