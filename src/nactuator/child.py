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
import time
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path


def run_nactuator(args: Sequence[str], log: Path,
                  usage: MutableMapping[str, float | None] | None = None) -> int:
    """``python -m nactuator.cli ARGS`` with stdout and stderr appended to ``log`` (after a
    ``$ command`` line); returns the exit code. ``usage``, if given, receives the child's
    ``wall_s`` and ``cpu_s`` (see :func:`run_command`)."""
    return run_command([sys.executable, "-m", "nactuator.cli", *args], log, usage=usage)


def run_command(command: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                cwd: Path | None = None,
                usage: MutableMapping[str, float | None] | None = None) -> int:
    """Any command (e.g. a sweep file's own ``command``) run as :func:`run_nactuator` runs a
    subcommand; ``env`` adds to (and overrides) the inherited environment.

    ``usage``, if given, receives ``wall_s`` (seconds from start to exit) and ``cpu_s``: the
    user + system CPU seconds of this child and the children it waited for, from its own
    ``wait4`` resource usage, so other jobs running beside it do not count (None where the
    OS has no ``wait4``). On a loaded machine ``cpu_s`` is the figure that says what the
    work costs; ``wall_s`` also counts the time the child waited for a core."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "a") as sink:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(command), stdout=sink, stderr=subprocess.STDOUT,
                                env=full_env, cwd=cwd)
        cpu: float | None = None
        if hasattr(os, "wait4"):
            try:
                _, status, rusage = os.wait4(proc.pid, 0)
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            proc.returncode = os.waitstatus_to_exitcode(status)
            cpu = rusage.ru_utime + rusage.ru_stime
        else:  # pragma: no cover - Windows
            proc.wait()
        if usage is not None:
            usage["wall_s"] = time.perf_counter() - t0
            usage["cpu_s"] = cpu
        return proc.returncode
