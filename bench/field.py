"""A learned Jacobian field against rigid FK in closed loop (docs/results.md §9, "field").

Fits J_θ(q) (control.field) to the world's end-effector tracks under random ±0.04 rad
command perturbations held 16 steps at poses within ±0.3 rad of the track start pose
(with 0.5 mm track noise; at 0 g, or ``--fit-payload-g``), then tracks the circle path at
0 / 200 / 350 g with the field and with rigid FK, judged by the world's own end-effector.

    .venv/bin/python bench/field.py [--poses 96] [--per-pose 8] [--out DIR]

``--fit-steps`` and ``--path`` exist for the smoke test (tests/test_bench_control.py): a few
Adam steps and a short path; the defaults are the figures' settings.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from nactuator.control.field import collect_perturbations, fit_field
from nactuator.control.jacobian import Points
from nactuator.control.plants import WorldPlant
from nactuator.control.track import Tracker, read_path, run_tracking
from nactuator.control.track_run import load_track_config
from nactuator.paths import conf_dir
from nactuator.platforms import load_platform
from nactuator.sim import Simulator


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--poses", type=int, default=96)
    ap.add_argument("--per-pose", type=int, default=8)
    ap.add_argument("--fit-payload-g", type=float, default=0.0)
    ap.add_argument("--payload-g", nargs="+", type=float, default=[0.0, 200.0, 350.0])
    ap.add_argument("--fit-steps", type=int, default=3000, help="full-batch Adam steps")
    ap.add_argument("--path", default=str(conf_dir() / "track" / "paths" / "so101_circle.csv"),
                    help="target path CSV (time, x, y, z)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    p = load_platform("so101")
    q0, s = load_track_config(p)
    joints = s.joints or [j for j in range(p.n) if j not in p.gripper_indices]
    t0 = time.perf_counter()
    data = collect_perturbations(p, q0, joints, a.poses, a.per_pose, s.horizon,
                                 payload_kg=a.fit_payload_g / 1000)
    t1 = time.perf_counter()
    field, fit = fit_field(data, p.n, joints, steps=a.fit_steps)
    t2 = time.perf_counter()
    print(f"field: {fit['samples']} perturbations ({t1 - t0:.0f} s in the world), fitted in "
          f"{t2 - t1:.0f} s; held-out R² {fit['heldout_r2']:.3f}")
    sim = Simulator(p)
    pts = Points.end_effector(sim.kinematics)
    times, path = read_path(a.path)
    rows = []
    print("| method | payload [g] | rms [mm] | max [mm] | final [mm] | settling [s] | "
          "decide p50 [ms] | stop |")
    print("|---|---|---|---|---|---|---|---|")
    for g in a.payload_g:
        for method in ("kinematic", "field"):
            plant = WorldPlant(p, pts, sim.kinematics, q0, payload_kg=g / 1000)
            tracker = Tracker(method, p, sim.kinematics, pts, s, field=field)
            m = run_tracking(plant, tracker, times, path).metrics()
            rows.append({"method": method, "payload_g": g, **m})
            print(f"| {method} | {g:.0f} | {m['rms_mm']:.2f} | {m['max_mm']:.2f} | "
                  f"{m['final_mm']:.2f} | {m['settling_s']:.2f} | {m['decide_p50_ms']:.1f} | "
                  f"{m['stop']} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "field.json").write_text(json.dumps({"fit": fit, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
