"""dx/du against the hidden world (docs/tracking.md, "How right is each dx/du").

At ``--poses`` poses (the track start pose and seeded ones within ±0.3 rad of it) and each
payload, the world's own end-effector response to ±0.03 rad command steps held for the
horizon is the truth; the kinematic Jacobian and the actuator model's dx/du are scored by
their relative Frobenius error (control.jacobian_check).

    .venv/bin/python bench/jacobian.py --ckpt runs/so101_cf.ckpt [--horizon 16] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from nactuator.control.jacobian import ActuatorJacobian, Points
from nactuator.control.jacobian_check import jacobian_errors
from nactuator.control.track_run import load_track_config
from nactuator.models import load_actuator
from nactuator.platforms import load_platform
from nactuator.sim import Simulator


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=None, help="a counterfactual checkpoint (optional)")
    ap.add_argument("--platform", default="so101")
    ap.add_argument("--horizon", type=int, default=None, help="default: conf/track")
    ap.add_argument("--poses", type=int, default=6)
    ap.add_argument("--payload-g", nargs="+", type=float, default=[0.0, 200.0, 350.0])
    ap.add_argument("--out", default=None, help="folder for jacobian.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    p = load_platform(a.platform)
    q0, settings = load_track_config(p)
    horizon = a.horizon or settings.horizon
    joints = settings.joints or [j for j in range(p.n) if j not in p.gripper_indices]
    rng = np.random.default_rng(0)
    poses = [q0] + [q0 + np.where(np.isin(np.arange(p.n), joints),
                                  rng.uniform(-0.3, 0.3, p.n), 0.0) for _ in range(a.poses - 1)]
    sim = Simulator(p)
    aj = None
    if a.ckpt:
        act, _ = load_actuator(a.ckpt, expect_platform=p.name)
        aj = ActuatorJacobian(act, sim, Points.end_effector(sim.kinematics), horizon=horizon)
    rows = jacobian_errors(p, sim, np.array(poses), horizon,
                           tuple(g / 1000 for g in a.payload_g), joints, aj)
    print(f"dx/du over {horizon} steps ({horizon * p.control_dt * 1e3:.0f} ms), {a.poses} "
          f"poses; relative error ||J - J_world|| / ||J_world||, mean (max) over poses")
    print("| payload [g] | kinematic | actuator model | ||J_world|| / ||J_kin|| |")
    print("|---|---|---|---|")
    for g in a.payload_g:
        sel = [r for r in rows if r["payload_g"] == g]
        k = np.array([r["kinematic"] for r in sel])
        ratio = np.array([r["world_over_kinematic"] for r in sel])
        act = (f"{np.mean([r['actuator'] for r in sel]):.2f} "
               f"({np.max([r['actuator'] for r in sel]):.2f})") if aj else "—"
        print(f"| {g:.0f} | {k.mean():.2f} ({k.max():.2f}) | {act} | {ratio.mean():.2f} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "jacobian.json").write_text(json.dumps(
            {"horizon": horizon, "ckpt": a.ckpt, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
