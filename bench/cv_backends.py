"""Wall time of one small `nactuator cv` on the local pool (--jobs 2) and as Ray tasks on a
2-CPU Ray head started on 127.0.0.1 (--backend ray --address), same folds, same seeds.

After one untimed local run (it pays the first-time costs: bytecode, file cache, kernels),
the runs alternate local, ray, ray, local (ABBA, so a drift in the machine's load falls on
both alike); every run starts from an empty output folder. Checks that every run gives the
same per-fold figures, and writes ``cv_backends.json`` / ``cv_backends.md`` with each wall
time, the ray / local ratio and the load average before and after.

Run (docs/benchmarks.md, "Cross-validation on Ray"):
  .venv/bin/python bench/cv_backends.py --out runs/bench/cv_backends
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from nactuator.atomic import write_json, write_text
from nactuator.data.synth import synthesize
from nactuator.distributed import local_head, make_backend
from nactuator.experiments.cv import run_cv

TASKS = ["go_up_and_stay_still_200g", "pick_and_place_200g"]
# base.yaml shortened: 2 epochs of 16 segments of H = 8 (a fold ~1 min on a free core)
RECIPE = ["--trainer.max_epochs=2", "--data.samples_per_epoch=16", "--data.batch_size=8",
          "--data.horizon=8"]


def _folds(out: Path) -> dict:
    summary = json.loads((out / "cv.json").read_text())["summary"]
    return {sel: {k: v["folds"] for k, v in t.items()} for sel, t in summary.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench/cv_backends")
    parser.add_argument("--folds", type=int, default=2, help="folds scored (of 3)")
    a = parser.parse_args()
    out = Path(a.out).resolve()
    data = out / "data"
    if not (data / "meta" / "info.json").is_file():  # 4 runs of 3 s per task: 3 CV folds
        print(synthesize("so101", str(data), trajectories_per_task=4, seconds=3.0,
                         tasks=TASKS))
    load_before = os.getloadavg()
    runs = []
    with local_head(num_cpus=2) as address:
        backends = {"local": make_backend("local", jobs=2),
                    "ray": make_backend("ray", address=address)}
        run_cv("so101", str(data), max_folds=a.folds, out=out / "warm-up",
               extra_args=RECIPE, backend=backends["local"])
        for k, name in enumerate(["local", "ray", "ray", "local"]):
            run_out = out / f"{k}-{name}"
            shutil.rmtree(run_out, ignore_errors=True)
            t0 = time.perf_counter()
            run_cv("so101", str(data), max_folds=a.folds, out=run_out, extra_args=RECIPE,
                   backend=backends[name])
            seconds = time.perf_counter() - t0
            runs.append({"backend": name, "seconds": seconds, "out": str(run_out),
                         "load": os.getloadavg()})
            print(f"{name}: {seconds:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    figures = [_folds(Path(r["out"])) for r in runs]
    same = all(f == figures[0] for f in figures)
    local = [r["seconds"] for r in runs if r["backend"] == "local"]
    ray = [r["seconds"] for r in runs if r["backend"] == "ray"]
    ratio = sum(ray) / sum(local)
    result: dict = {"recipe": RECIPE, "tasks": TASKS, "folds": a.folds, "runs": runs,
              "same_per_fold_figures": same, "ray_over_local": ratio,
              "load_before": load_before, "load_after": os.getloadavg(),
              "cpus": os.cpu_count()}
    lines = ["| run | backend | wall s | load (1 min) after |", "|---|---|---|---|"]
    lines += [f"| {k} | {r['backend']} | {r['seconds']:.1f} | {r['load'][0]:.2f} |"
              for k, r in enumerate(runs)]
    pairs = [runs[1]["seconds"] / runs[0]["seconds"], runs[2]["seconds"] / runs[3]["seconds"]]
    result["ray_over_local_adjacent"] = pairs
    lines += ["", f"ray / local (sums over the ABBA runs): {ratio:.3f} (adjacent pairs "
              f"{pairs[0]:.3f}, {pairs[1]:.3f}); identical per-fold "
              f"figures in every run: {same}; load average before "
              f"{load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f}."]
    write_json(out / "cv_backends.json", result)
    write_text(out / "cv_backends.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
