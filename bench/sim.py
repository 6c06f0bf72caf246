"""Simulator throughput and start-up time, against MuJoCo measured in the same run.

    .venv/bin/python bench/sim.py                       # all platforms, B in {1,16,128}, H=128
    .venv/bin/python bench/sim.py --platforms omx --batch 1 16 --horizon 32

env-steps/s = arms x control steps per wall-clock second. The reference is MuJoCo's own
forward rate for the same MJCF and substeps (one arm, C, single thread), so the ratio says
how many MuJoCo CPU processes one Newton process replaces. Cold start: a fresh process with
an empty WARP_CACHE_PATH (kernel compile); warm: a fresh process with the cache filled.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("WARP_CACHE_PATH", str(ROOT / ".cache" / "warp"))

import torch  # noqa: E402

from nactuator.sim import Simulator  # noqa: E402
from nactuator.sim.check import start_states  # noqa: E402
from nactuator.sim.parity import mujoco_model  # noqa: E402

# What a fresh process pays before its first differentiable control step.
_START = """
import time; t0 = time.perf_counter()
import torch
from nactuator.sim import Simulator
sim = Simulator({platform!r})
q = torch.zeros(1, sim.n); tau = torch.zeros(1, sim.n, requires_grad=True)
sim.step(q, q, tau)[0].sum().backward()
print(time.perf_counter() - t0)
"""


def start_time(platform: str, cache: str) -> float:
    env = dict(os.environ, WARP_CACHE_PATH=cache)
    out = subprocess.run([sys.executable, "-c", _START.format(platform=platform)], env=env,
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def mujoco_rate(sim: Simulator, horizon: int) -> float:
    import mujoco

    model = mujoco_model(sim.platform)
    data = mujoco.MjData(model)
    q0, _ = start_states(sim.platform, 1, seed=0)
    data.qpos[:] = q0[0].double().numpy()
    hold = sim.gravity_torque(q0)[0].double().numpy()
    clock = time.perf_counter()
    for _ in range(horizon):
        data.qfrc_applied[:] = hold
        for _ in range(sim.platform.substeps):
            mujoco.mj_step(model, data)
    return horizon / (time.perf_counter() - clock)


def newton_rates(sim: Simulator, batch: int, horizon: int) -> tuple[float, float]:
    q0, qd0 = start_states(sim.platform, batch, seed=0)
    taus = sim.gravity_torque(q0).detach()[:, None, :].expand(batch, horizon, sim.n).contiguous()
    warm = taus[:, 0].clone().requires_grad_(True)
    sim.step(q0, qd0, warm)[0].sum().backward()  # builds and warms the model for this B
    with torch.no_grad():
        clock = time.perf_counter()
        sim.rollout(q0, qd0, taus)
        forward = time.perf_counter() - clock
    taus.requires_grad_(True)
    clock = time.perf_counter()
    q, qd = sim.rollout(q0, qd0, taus)
    (q.sum() + qd.sum()).backward()
    both = time.perf_counter() - clock
    return batch * horizon / forward, batch * horizon / both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--platforms", nargs="+", default=["omx", "so101", "franka", "pendulum"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 16, 128])
    parser.add_argument("--horizon", type=int, default=128)
    parser.add_argument("--no-start", action="store_true", help="skip cold/warm start timing")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, horizon H = {args.horizon}")
    rows = []
    for name in args.platforms:
        sim = Simulator(name)
        reference = mujoco_rate(sim, args.horizon)
        for batch in args.batch:
            fwd, both = newton_rates(sim, batch, args.horizon)
            rows.append((name, batch, fwd, both, reference))
            print(f"  {name} B={batch}: fwd {fwd:.0f}, fwd+bwd {both:.0f}, MuJoCo {reference:.0f}",
                  flush=True)

    print("\n| platform | B | fwd env-steps/s | fwd+bwd env-steps/s | MuJoCo fwd env-steps/s "
          "(1 arm) | fwd / MuJoCo | fwd+bwd / MuJoCo |")
    print("|---|---|---|---|---|---|---|")
    for name, batch, fwd, both, ref in rows:
        print(f"| {name} | {batch} | {fwd:,.0f} | {both:,.0f} | {ref:,.0f} | {fwd / ref:.3g} | "
              f"{both / ref:.3g} |")

    if not args.no_start:
        with tempfile.TemporaryDirectory(prefix="warp-cold-") as cache:
            cold = start_time(args.platforms[0], cache)
        warm = {name: start_time(name, os.environ["WARP_CACHE_PATH"]) for name in args.platforms}
        print(f"\n| start-up (fresh process, to the first fwd+bwd step) | seconds |\n|---|---|\n"
              f"| cold: empty kernel cache ({args.platforms[0]}) | {cold:.1f} |")
        for name, seconds in warm.items():
            print(f"| warm: cached kernels ({name}) | {seconds:.1f} |")


if __name__ == "__main__":
    main()
