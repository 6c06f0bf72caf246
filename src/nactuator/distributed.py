"""Where the experiment drivers' runs execute: a local thread pool, or tasks on a Ray cluster.

``cv`` (one task per fold), ``sweep`` (one per trial) and ``adapt`` (one per fine-tune) each
hand :func:`run_all` a list of calls of one module-level function. Each call starts its
training in a child process (:mod:`nactuator.child`), so a task needs one CPU:

- ``local`` (the default): a thread pool of ``jobs`` threads on this machine;
- ``ray``: each call is a Ray task (``ray.remote``) asking for ``num_cpus`` / ``num_gpus``
  (``conf/distributed/ray.yaml``, or ``--task-cpus`` / ``--task-gpus``) on the cluster at
  ``address`` (``HOST:PORT`` of a ``ray start --head``; without it ``ray.init()`` joins the
  cluster ``$RAY_ADDRESS`` names, or the one started on this machine, or starts a local one).

A Ray task runs the same function in the driver's working directory with a few of its
environment variables (:data:`FORWARDED_ENV`), so every node must see the same paths: the
checkout and its venv, the data and the output folder (a shared filesystem). The function
writes its logs and results there, as it does locally, and returns what the driver gathers.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nactuator.errors import UserError
from nactuator.paths import conf_dir
from nactuator.platforms import read_yaml_mapping

__all__ = ["BACKENDS", "Backend", "BackendError", "local_head", "make_backend", "run_all"]

BACKENDS = ("local", "ray")
# What a Ray task takes from the driver's environment (the rest is the node's own).
FORWARDED_ENV = ("PYTHONPATH", "NACTUATOR_CONF", "NACTUATOR_CACHE", "WARP_CACHE_PATH",
                 "WANDB_MODE")


class BackendError(UserError, ValueError):
    """The backend cannot run with these settings; the message says which and why."""


@dataclass(frozen=True)
class Backend:
    """Where :func:`run_all` runs its calls (build it with :func:`make_backend`)."""

    name: str = "local"
    jobs: int = 1
    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def describe(self) -> str:
        if self.name == "local":
            return f"{self.jobs} local job(s)"
        where = self.address or "the default Ray cluster"
        return f"Ray tasks on {where} ({self.num_cpus:g} CPU, {self.num_gpus:g} GPU each)"


def _ray_resources(path: Path) -> tuple[float, float]:
    raw = read_yaml_mapping(path, BackendError, "Ray config")
    if set(raw) != {"num_cpus", "num_gpus"}:
        raise BackendError(f"{path}: expected exactly the keys num_cpus and num_gpus, "
                           f"got {sorted(raw)}")
    return raw["num_cpus"], raw["num_gpus"]


def _check_address(address: str) -> None:
    """A clear one-line error for a malformed or unreachable ``HOST:PORT`` before
    ``ray.init`` retries it for a minute."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise BackendError(f"--address {address!r}: expected HOST:PORT of a Ray head "
                           "(the --port of `ray start --head`), e.g. 127.0.0.1:6379")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as err:
        raise BackendError(f"--address {address}: no Ray head answers there "
                           f"({err.strerror or err}); start one with "
                           f"`ray start --head --port={port}` on {host}") from err


def make_backend(name: str = "local", jobs: int | None = None, address: str | None = None,
                 num_cpus: float | None = None, num_gpus: float | None = None,
                 config: str | os.PathLike | None = None) -> Backend:
    """Check the settings (and, for Ray, that it is installed and the head answers) before
    any work starts; ``num_cpus`` / ``num_gpus`` default to ``config``
    (``conf/distributed/ray.yaml``)."""
    if name not in BACKENDS:
        raise BackendError(f"--backend {name!r}: expected one of {list(BACKENDS)}")
    if name == "local":
        if address is not None or num_cpus is not None or num_gpus is not None:
            raise BackendError("--address, --task-cpus and --task-gpus are for --backend ray")
        jobs = 1 if jobs is None else jobs
        if jobs < 1:
            raise BackendError(f"--jobs must be >= 1, got {jobs}")
        return Backend("local", jobs=jobs)
    if jobs is not None:
        raise BackendError("--jobs is for --backend local; with --backend ray the cluster's "
                           "CPUs and --task-cpus decide how many run at once")
    path = Path(config) if config is not None else conf_dir() / "distributed" / "ray.yaml"
    cpus, gpus = _ray_resources(path)
    cpus = cpus if num_cpus is None else num_cpus
    gpus = gpus if num_gpus is None else num_gpus
    for flag, value in (("--task-cpus", cpus), ("--task-gpus", gpus)):
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise BackendError(f"{flag} / {path}: expected a number >= 0, got {value!r}")
    if address is not None:
        _check_address(address)
    try:
        import ray  # noqa: F401
    except ImportError as err:
        raise BackendError("--backend ray needs Ray: pip install 'nactuator[ray]' (make setup "
                           "installs it)") from err
    return Backend("ray", address=address, num_cpus=float(cpus), num_gpus=float(gpus))


def _in_dir(cwd: str, fn: Callable[..., Any], args: tuple) -> Any:
    """A Ray task: ``fn(*args)`` in the driver's working directory (relative paths of the
    recipe mean what they mean locally). A worker runs one task at a time."""
    os.chdir(cwd)
    return fn(*args)


def run_all(backend: Backend, fn: Callable[..., Any],
            calls: Sequence[tuple]) -> Iterator[tuple[int, Any]]:
    """``fn(*calls[i])`` for every ``i`` on ``backend``; yields ``(i, result)`` as each
    finishes. Every call runs to its end even if one fails; the first failure is raised
    after the last (a finished fold is kept for the next, resumed, run)."""
    if not calls:
        return
    if backend.name == "local":
        yield from _run_local(backend.jobs, fn, calls)
    else:
        yield from _run_ray(backend, fn, calls)


def _run_local(jobs: int, fn: Callable[..., Any], calls: Sequence[tuple]
               ) -> Iterator[tuple[int, Any]]:
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(fn, *args): i for i, args in enumerate(calls)}
        for future in as_completed(futures):
            try:
                result = future.result()
            except Exception as err:  # noqa: BLE001 - raised below, after the others finish
                failure = failure or err
                continue
            yield futures[future], result
    if failure is not None:
        raise failure


def _run_ray(backend: Backend, fn: Callable[..., Any], calls: Sequence[tuple]
             ) -> Iterator[tuple[int, Any]]:
    import logging

    import ray

    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=backend.address, runtime_env={"env_vars": env},
                     logging_level=logging.WARNING, configure_logging=True,
                     **({} if backend.address else {"include_dashboard": False}))
        except ConnectionError as err:
            raise BackendError(f"ray: cannot join the cluster at "
                               f"{backend.address or '$RAY_ADDRESS'}: {err}") from err
    try:
        task = ray.remote(_in_dir).options(num_cpus=backend.num_cpus,
                                           num_gpus=backend.num_gpus)
        cwd = os.getcwd()
        refs = {task.remote(cwd, fn, tuple(args)): i for i, args in enumerate(calls)}
        failure: BaseException | None = None
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:
                # the task's own exception (a UserError keeps its one-line message)
                failure = failure or (err.cause if isinstance(err.cause, UserError) else err)
                continue
            yield refs[ready[0]], result
        if failure is not None:
            raise failure
    finally:
        if started:
            ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_head(num_cpus: int = 2, timeout_s: float = 60.0) -> Iterator[str]:
    """A Ray head on 127.0.0.1 for the tests and the bench (``ray start --head --block`` in
    its own process group, which holds its GCS, raylet and workers); yields its
    ``HOST:PORT`` and kills that group, by its id, afterwards."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must be short
    ray_cli = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--block", f"--port={port}",
         "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}", "--num-gpus=0",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if head.poll() is not None:
                    raise BackendError(f"`{ray_cli} start --head` exited with code "
                                       f"{head.returncode}") from None
                if time.monotonic() > deadline:
                    raise BackendError(f"the Ray head did not come up in {timeout_s:g} s"
                                       ) from None
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        try:  # some of the group (the GCS, the autoscaler monitor) outlive SIGTERM for ~30 s
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)
