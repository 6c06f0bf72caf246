"""A local, offline driver for wandb-format sweep files (``conf/sweeps/*.yaml``).

The same YAML runs online with ``wandb sweep FILE`` + ``wandb agent ID``. Here each
configuration of the sweep (grid: every combination, the first parameter varying fastest,
or with ``max_runs`` below the grid's size a subset that tries every value of every
parameter first; random: ``max_runs`` seeded draws) is run as the sweep's own ``command``
in a child process (``nactuator.child``, as cv and adapt start theirs: one BLAS thread),
with wandb forced offline, and its final metrics are read back from a JSON file the run
writes. The result is a ranked markdown table of the sweep metric, also
written with all figures to ``<out>/results.json`` and ``<out>/results.md``.

The runs go one at a time by default, ``--jobs`` at a time, or as Ray tasks on a cluster
(``--backend ray``, :mod:`nactuator.distributed`): the grid (or the random draws) is
decided here and each run is one task; Ray Tune's search algorithms are not used.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nactuator.atomic import write_text
from nactuator.child import run_command
from nactuator.distributed import Backend, make_backend, run_all
from nactuator.errors import UserError
from nactuator.paths import conf_dir, warp_cache_dir
from nactuator.platforms import read_yaml_mapping

METHODS = ("grid", "random")
DISTRIBUTIONS = ("uniform", "int_uniform", "log_uniform_values", "q_uniform")
DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]


class SweepError(UserError, ValueError):
    """The sweep file is not one this driver can run; the message says where and why."""


def load_sweep(file: str | Path) -> dict[str, Any]:
    path = Path(file)
    spec = read_yaml_mapping(path, SweepError, "sweep file")
    metric = spec.get("metric")
    if not (isinstance(metric, dict) and isinstance(metric.get("name"), str)
            and metric.get("goal") in ("minimize", "maximize")):
        raise SweepError(
            f"{path}: 'metric' must be {{name: <logged metric>, goal: minimize|maximize}}, "
            f"got {metric!r}"
        )
    params = spec.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SweepError(f"{path}: 'parameters' must be a non-empty mapping")
    for name, p in params.items():
        if not isinstance(p, dict) or not ({"value", "values"} & set(p) or "distribution" in p):
            raise SweepError(
                f"{path}: parameter {name!r} needs 'value', 'values' or 'distribution', "
                f"got {p!r}"
            )
        if "values" in p and (not isinstance(p["values"], list) or not p["values"]):
            raise SweepError(f"{path}: parameter {name!r}: 'values' must be a non-empty list")
        if "distribution" in p and p["distribution"] not in DISTRIBUTIONS:
            raise SweepError(
                f"{path}: parameter {name!r}: distribution {p['distribution']!r} is not "
                f"one of {list(DISTRIBUTIONS)}"
            )
    spec["_path"] = str(path)
    return spec


def _sample(name: str, p: dict, rng: random.Random) -> Any:
    if "value" in p:
        return p["value"]
    if "values" in p:
        return rng.choice(p["values"])
    lo, hi = p["min"], p["max"]
    kind = p["distribution"]
    if kind == "int_uniform":
        return rng.randint(int(lo), int(hi))
    if kind == "log_uniform_values":
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))
    if kind == "q_uniform":
        q = p.get("q", 1)
        return round(rng.uniform(lo, hi) / q) * q
    return rng.uniform(lo, hi)


def covering_subset(runs: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` of the grid's ``runs`` chosen so that every value of every parameter is
    tried as early as possible: each next run is the one with the most values not tried
    yet, then the one whose values were tried least often, then the earliest in grid order
    (deterministic). 4 architectures x 2 widths in 4 runs: every architecture and both
    widths, where the first 4 of the grid order would all have the first width."""
    def values(run: dict[str, Any]) -> list[tuple[str, str]]:
        return [(name, json.dumps(v, sort_keys=True)) for name, v in run.items()]

    tried: Counter[tuple[str, str]] = Counter()
    left = list(enumerate(runs))
    chosen: list[tuple[int, dict[str, Any]]] = []
    while left and len(chosen) < count:
        best = min(left, key=lambda item: (-sum(tried[v] == 0 for v in values(item[1])),
                                           sum(tried[v] for v in values(item[1])), item[0]))
        left.remove(best)
        chosen.append(best)
        tried.update(values(best[1]))
    return [run for _, run in chosen]


def configurations(spec: dict, method: str | None = None, max_runs: int | None = None,
                   seed: int = 0) -> list[dict[str, Any]]:
    """The runs of a sweep, in order: grid = the full product with the first parameter
    varying fastest; with ``max_runs`` below its size, :func:`covering_subset` (every value
    of every parameter within the first runs, not the first N of the product); random =
    ``max_runs`` draws from a generator seeded with ``seed``."""
    method = method or spec.get("method")
    where = spec.get("_path", "sweep")
    if method not in METHODS:
        raise SweepError(
            f"{where}: method {method!r} cannot run locally; use one of {list(METHODS)} "
            f"(override with --method)"
        )
    params: dict[str, dict] = spec["parameters"]
    if method == "grid":
        axes = []
        for name, p in params.items():
            if "distribution" in p and "values" not in p:
                raise SweepError(
                    f"{where}: grid search needs 'values' for parameter {name!r}, which has "
                    f"a distribution; use --method random"
                )
            axes.append([(name, v) for v in (p["values"] if "values" in p else [p["value"]])])
        runs = [dict(reversed(combo)) for combo in itertools.product(*reversed(axes))]
        runs = [{name: run[name] for name in params} for run in runs]  # file order of keys
        if max_runs is not None and max_runs < len(runs):
            return covering_subset(runs, max_runs)
        return runs
    if max_runs is None:
        raise SweepError(f"{where}: a random sweep needs --max-runs")
    rng = random.Random(seed)
    return [{name: _sample(name, p, rng) for name, p in params.items()}
            for _ in range(max_runs)]


def _format_arg(name: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return f"--{name}={text}"


def build_command(spec: dict, params: dict[str, Any], extra_args: Sequence[str]) -> list[str]:
    """The sweep's ``command`` with wandb's macros expanded for one run."""
    args = [_format_arg(k, v) for k, v in params.items()]
    command: list[str] = []
    for item in spec.get("command") or DEFAULT_COMMAND:
        item = str(item)
        if item == "${env}":
            continue  # wandb's "/usr/bin/env"; not needed when we start the process
        if item in ("${interpreter}", "python", "python3"):
            command.append(sys.executable)
        elif item == "${program}":
            command.append(str(spec.get("program", "")))
        elif item == "${args}":
            command += args
        elif item == "${args_no_hyphens}":
            command += [a.removeprefix("--") for a in args]
        else:
            command.append(item)
    return command + list(extra_args)


def _metric_value(metrics: dict, name: str) -> float | None:
    value = metrics.get(name)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _write_atomic(path: Path, text: str) -> None:
    write_text(path, text)


def ranked_table(spec: dict, results: list[dict]) -> str:
    """Markdown table, best first by the sweep metric; failed runs last."""
    metric, goal = spec["metric"]["name"], spec["metric"]["goal"]
    names = list(spec["parameters"])
    sign = 1.0 if goal == "minimize" else -1.0
    ordered = sorted(results, key=lambda r: (r["metric"] is None,
                                             sign * r["metric"] if r["metric"] is not None
                                             else 0.0, r["run"]))
    lines = [f"| rank | run | {' | '.join(names)} | {metric} ({goal}) | status | time (s) |",
             "|" + "---|" * (len(names) + 5)]
    for rank, r in enumerate(ordered, 1):
        value = f"{r['metric']:.4g}" if r["metric"] is not None else "—"
        cells = " | ".join(str(r["params"].get(n)) for n in names)
        lines.append(f"| {rank} | {r['run']} | {cells} | {value} | {r['status']} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def _run_trial(spec: dict, k: int, params: dict[str, Any], out_dir: Path,
               extra_args: Sequence[str], env: dict[str, str]) -> dict[str, Any]:
    """Run configuration ``k`` of a sweep in ``out_dir/run-KKK`` and read back its metric
    (one task of :func:`run_sweep`)."""
    metric = spec["metric"]["name"]
    run_dir = out_dir / f"run-{k:03d}"
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.json"
    metrics_file.unlink(missing_ok=True)
    command = build_command(spec, params, [
        *extra_args,
        f"--trainer.default_root_dir={run_dir}",
        "--trainer.callbacks+=nactuator.training.callbacks.FinalMetrics",
        f"--trainer.callbacks.path={metrics_file}",
    ])
    started = time.perf_counter()
    (run_dir / "log.txt").unlink(missing_ok=True)
    returncode = run_command(command, run_dir / "log.txt", env=env, cwd=conf_dir().parent)
    seconds = time.perf_counter() - started
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
    value = _metric_value(metrics, metric)
    status = "ok" if returncode == 0 and value is not None else (
        f"failed (exit {returncode}, see {run_dir / 'log.txt'})"
        if returncode else f"no {metric}")
    return {"run": run_dir.name, "params": params, "metric": value,
            "metrics": metrics, "status": status, "seconds": seconds,
            "returncode": returncode, "command": command}


def run_sweep(file: str, max_runs: int | None = None, method: str | None = None,
              out: str = "runs/sweep", extra_args: Sequence[str] = (), seed: int = 0,
              backend: Backend | None = None) -> str:
    """Run every configuration of a sweep offline on ``backend`` (default: one local job at
    a time); return the ranked markdown table."""
    spec = load_sweep(file)
    runs = configurations(spec, method=method, max_runs=max_runs, seed=seed)
    backend = backend or make_backend("local")
    out_dir = Path(out).resolve()  # a Ray task may start in another folder
    out_dir.mkdir(parents=True, exist_ok=True)
    metric = spec["metric"]["name"]
    # wandb forced offline, whatever the sweep command asks for
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WARP_CACHE_PATH": str(warp_cache_dir())}
    print(f"[sweep] {len(runs)} run(s) on {backend.describe()}", flush=True)
    found: dict[int, dict] = {}
    calls = [(spec, k, params, out_dir, list(extra_args), env) for k, params in enumerate(runs)]
    for k, result in run_all(backend, _run_trial, calls):
        found[k] = result
        print(f"[sweep] run {k + 1}/{len(runs)}: {runs[k]}: {metric} = {result['metric']} "
              f"({result['status']}, {result['seconds']:.0f} s)", flush=True)
    results = [found[k] for k in range(len(runs))]
    table = ranked_table(spec, results)
    summary = {"file": spec["_path"], "method": method or spec.get("method"),
               "metric": spec["metric"], "seed": seed, "backend": backend.describe(),
               "runs": results}
    _write_atomic(out_dir / "results.json", json.dumps(summary, indent=2, default=str))
    _write_atomic(out_dir / "results.md", table + "\n")
    return table
