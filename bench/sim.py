"""Simulator throughput of both engines against Newton and MuJoCo, measured in the same run,
and the simulator's share of a real training step.

    .venv/bin/python bench/sim.py                      # all platforms, B in {4,16,64,128}
    .venv/bin/python bench/sim.py --platforms so101 --batch 128 --horizon 32 --no-train

arm-substeps/s = arms x substeps per wall-clock second (one control step is the platform's
substeps: OMX 4, SO-101 5, Franka 8, pendulum 2). Forward runs ``Simulator.rollout`` under
``torch.no_grad``; fwd+bwd is a rollout with grad on all efforts plus ``backward()``. Each
figure is the best of ``--repeats`` runs (the machine is shared). One torch thread; Warp's
CPU kernels are single-threaded, so everything runs on one core. The baselines, measured in
the same run: the Newton engine at the same B, and MuJoCo's ``mj_step`` (C, no gradient) on
the same MJCF, substeps and dt, one arm.

Training-step share (``--no-train`` skips it): a real ``NeuralActuatorModule`` trained by a
Lightning ``Trainer`` on the real NAD SO-101 files (imported into a temporary folder), the
run-5 model (width 64, depth 2), B = 16, H = 192; the simulator's forward (``Simulator.step``
incl. its torch glue) and backward (the engine's adjoint) are timed inside those steps.

Start-up: a fresh process to its first fwd+bwd step, with an empty kernel cache (cold,
compiles the kernels) and with the cache filled (warm). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nactuator.paths import use_warp_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
use_warp_cache()

import torch  # noqa: E402

from nactuator.sim import Simulator  # noqa: E402
from nactuator.sim.check import start_states  # noqa: E402
from nactuator.sim.parity import mujoco_model  # noqa: E402

ENGINES = ("chain", "newton")

# What a fresh process pays before its first differentiable control step.
_START = """
import time; t0 = time.perf_counter()
import torch
from nactuator.sim import Simulator
sim = Simulator({platform!r}, engine={engine!r})
q = torch.zeros(1, sim.n); tau = torch.zeros(1, sim.n, requires_grad=True)
sim.step(q, q, tau)[0].sum().backward()
print(time.perf_counter() - t0)
"""


def best_of(repeats: int, run) -> float:
    """Shortest wall time of ``repeats`` calls of ``run()``."""
    best = float("inf")
    for _ in range(repeats):
        clock = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - clock)
    return best


def mujoco_rate(sim: Simulator, horizon: int, repeats: int) -> float:
    """MuJoCo arm-substeps/s: one arm, gravity held, ``horizon`` control steps."""
    import mujoco

    model = mujoco_model(sim.platform)
    data = mujoco.MjData(model)
    q0, _ = start_states(sim.platform, 1, seed=0)
    hold = sim.gravity_torque(q0)[0].double().numpy()

    def run() -> None:
        data.qpos[:] = q0[0].double().numpy()
        data.qvel[:] = 0.0
        for _ in range(horizon):
            data.qfrc_applied[:] = hold
            for _ in range(sim.platform.substeps):
                mujoco.mj_step(model, data)

    return horizon * sim.platform.substeps / best_of(repeats, run)


def engine_rates(sim: Simulator, batch: int, horizon: int, repeats: int) -> tuple[float, float]:
    """(forward, forward+backward) arm-substeps/s of ``Simulator.rollout``."""
    q0, qd0 = start_states(sim.platform, batch, seed=0)
    gen = torch.Generator().manual_seed(0)
    hold = sim.gravity_torque(q0).detach()[:, None, :]
    noise = 0.1 * sim.torque_max * torch.randn(batch, horizon, sim.n, generator=gen)
    taus = (hold + noise).contiguous()
    warm = taus[:, 0].clone().requires_grad_(True)
    sim.step(q0, qd0, warm)[0].sum().backward()  # builds the per-B state, loads kernels

    def forward() -> None:
        with torch.no_grad():
            sim.replay(q0, qd0, taus)

    def forward_backward() -> None:
        t = taus.clone().requires_grad_(True)
        q, qd = sim.replay(q0, qd0, t)
        (q.sum() + qd.sum()).backward()

    work = batch * horizon * sim.platform.substeps
    return work / best_of(repeats, forward), work / best_of(repeats, forward_backward)


def throughput(args) -> None:
    rows = []
    for name in args.platforms:
        sims = {engine: Simulator(name, engine=engine) for engine in ENGINES}
        reference = mujoco_rate(sims["chain"], args.horizon, args.repeats)
        for batch in args.batch:
            rates = {e: engine_rates(sims[e], batch, args.horizon, args.repeats) for e in ENGINES}
            rows.append((name, batch, rates, reference))
            print(f"  {name} B={batch}: " + ", ".join(
                f"{e} fwd {r[0]:,.0f} fwd+bwd {r[1]:,.0f}" for e, r in rates.items())
                  + f"; MuJoCo {reference:,.0f} arm-substeps/s", flush=True)

    print("\n| platform | B | engine | fwd arm-substeps/s | fwd+bwd arm-substeps/s | "
          "fwd vs Newton | fwd+bwd vs Newton | fwd per arm vs MuJoCo |")
    print("|---|---|---|---|---|---|---|---|")
    for name, batch, rates, reference in rows:
        newton_fwd, newton_both = rates["newton"]
        for engine, (fwd, both) in rates.items():
            print(f"| {name} | {batch} | {engine} | {fwd:,.0f} | {both:,.0f} | "
                  f"{fwd / newton_fwd:.2f}x | {both / newton_both:.2f}x | "
                  f"{fwd / reference:.2f}x |")
    print("\nMuJoCo mj_step, one arm (arm-substeps/s): " + ", ".join(
        f"{name} {ref:,.0f}" for name, ref in {r[0]: r[3] for r in rows}.items()))


# -- the simulator inside a real training step ------------------------------------------------

class _SimClock:
    """Wall time spent in the simulator: ``Simulator.step`` (forward incl. torch glue) and
    the engine's backward, installed on one Simulator instance."""

    def __init__(self, sim: Simulator) -> None:
        self.forward = self.backward = 0.0
        step, engine_of = sim.step, sim._engine

        def timed_step(*a, **k):
            clock = time.perf_counter()
            try:
                return step(*a, **k)
            finally:
                self.forward += time.perf_counter() - clock

        def timed_engine(batch):
            engine = engine_of(batch)
            if not getattr(engine, "_bench_timed", False):
                backward = engine.backward

                def timed_backward(*a, **k):
                    clock = time.perf_counter()
                    try:
                        return backward(*a, **k)
                    finally:
                        self.backward += time.perf_counter() - clock

                engine.backward, engine._bench_timed = timed_backward, True
            return engine

        sim.step, sim._engine = timed_step, timed_engine


def training_share(args) -> None:
    import lightning as L
    import yaml

    from nactuator.data.datamodule import NADDataModule
    from nactuator.data.importers import import_nad
    from nactuator.training.losses import LossWeights
    from nactuator.training.module import NeuralActuatorModule

    shared = Path(os.environ.get("NACTUATOR_SHARED", ROOT.parent / "shared"))
    source = shared / "data" / "nad" / "so101"
    if not source.exists():
        print(f"\n(training-step share skipped: {source} not found; set NACTUATOR_SHARED)")
        return
    loss = yaml.safe_load((ROOT / "conf" / "train" / "so101.yaml").read_text())["model"]["loss"]
    batch, horizon, steps = args.train_batch, args.train_horizon, args.train_steps

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.sim: list[float] = []

        def on_train_batch_start(self, trainer, module, *_):
            self._clock = time.perf_counter()
            self._sim = module._bench_clock.forward + module._bench_clock.backward

        def on_train_batch_end(self, trainer, module, *_):
            self.times.append(time.perf_counter() - self._clock)
            clock = module._bench_clock
            self.sim.append(clock.forward + clock.backward - self._sim)

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        import_nad(source, Path(tmp) / "so101", platform="so101")
        for engine in ENGINES:
            torch.manual_seed(0)
            module = NeuralActuatorModule(
                platform="so101", width=64, depth=2,
                model_sizes={"head_hidden": 32, "dropout": 0.0}, loss=LossWeights(**loss),
                lr=3e-3, warmup_steps=10, init_noise_q=0.002, init_noise_qd=0.02)
            # The YAML mechanism (sim.engine) on the module's own platform.
            module.platform = dataclasses.replace(
                module.platform, sim=dict(module.platform.sim, engine=engine))
            module._bench_clock = _SimClock(module.simulator)
            # The horizon lives in the DataModule (its curriculum); the module rolls out
            # whatever segment length it is served.
            data = NADDataModule(Path(tmp) / "so101", "so101", horizon=horizon,
                                 batch_size=batch, samples_per_epoch=batch * (steps + 1))
            clock = StepClock()
            trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps + 1,
                                limit_val_batches=0, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                num_sanity_val_steps=0, callbacks=[clock],
                                gradient_clip_val=1.0)
            trainer.fit(module, datamodule=data)
            # The first step builds the per-B launches/models; report the rest.
            step_s = sum(clock.times[1:]) / len(clock.times[1:])
            sim_s = sum(clock.sim[1:]) / len(clock.sim[1:])
            params = sum(p.numel() for p in module.actuator.parameters())
            results[engine] = (step_s, sim_s, params)
            print(f"  {engine}: training step {step_s:.2f} s, simulator {sim_s:.2f} s "
                  f"({100 * sim_s / step_s:.0f} %)", flush=True)

    print(f"\nTraining step, SO-101, real NAD files, B = {batch}, H = {horizon}, "
          f"{results['chain'][2]:,}-parameter transformer (mean of {steps} steps after one "
          "warm-up step):\n")
    print("| engine | training step [s] | simulator fwd+bwd [s] | simulator share | "
              "step speed vs Newton |")
    print("|---|---|---|---|---|")
    for engine, (step_s, sim_s, _) in results.items():
        print(f"| {engine} | {step_s:.2f} | {sim_s:.2f} | {100 * sim_s / step_s:.0f} % | "
              f"{results['newton'][0] / step_s:.2f}x |")


def start_time(platform: str, engine: str, cache: str) -> float:
    env = dict(os.environ, WARP_CACHE_PATH=cache)
    code = _START.format(platform=platform, engine=engine)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def start_up(args) -> None:
    name = args.platforms[0]
    print("\n| start-up (fresh process, to the first fwd+bwd step) | seconds |\n|---|---|")
    for engine in ENGINES:
        with tempfile.TemporaryDirectory(prefix="warp-cold-") as cache:
            cold = start_time(name, engine, cache)
        warm = start_time(name, engine, os.environ["WARP_CACHE_PATH"])
        print(f"| {engine}, cold: empty kernel cache ({name}) | {cold:.1f} |")
        print(f"| {engine}, warm: cached kernels ({name}) | {warm:.1f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--platforms", nargs="+", default=["so101", "omx", "franka", "pendulum"])
    parser.add_argument("--batch", nargs="+", type=int, default=[4, 16, 64, 128])
    parser.add_argument("--horizon", type=int, default=32, help="control steps per rollout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--train-horizon", type=int, default=192)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--no-train", action="store_true", help="skip the training-step share")
    parser.add_argument("--no-start", action="store_true", help="skip cold/warm start timing")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs (1 torch thread), "
          f"horizon H = {args.horizon}, best of {args.repeats}")
    throughput(args)
    if not args.no_train:
        training_share(args)
    if not args.no_start:
        start_up(args)


if __name__ == "__main__":
    main()
