"""Throughput of a real training step (forward + loss + backward + AdamW step) in
arm-control-steps per second, with the shares of simulator, model and overhead, the
step-wise rollout (the path before the frame-wise one) measured in the same run, and the
arithmetic floor.

    .venv/bin/python bench/train.py                       # B in {4,16,64}, H in {64,192}
    .venv/bin/python bench/train.py --batch 16 --horizon 192 --repeats 5
    .venv/bin/python bench/train.py --quick               # tiny sizes: the smoke test
    .venv/bin/python bench/train.py --device cuda         # on a GPU (model, batch, simulator)

arm-control-steps/s = B x H / (seconds per training step). The model is the recipe's
(`conf/train/nad_so101.yaml`: a 64-wide 2-block transformer, 85 k parameters) on SO-101.
Batches come from the DataModule over ``--data`` (default: the real NAD SO-101 files,
imported into a temporary folder; without them, or with ``--quick``, a batch of random
channels of the same shapes). Both rollout paths run the same batch from the same weights,
interleaved repeat by repeat (the machine is shared); each figure is the best of
``--repeats``.

Shares of a step: *simulator* is the wall time inside ``Simulator.step`` (its torch glue
and the kernel) plus the engine's adjoint; *model* is the network alone, forward and
backward on a (B, L, n_in) token batch, times H (measured in isolation, same process);
*overhead* is the rest (windows, features, losses, autograd bookkeeping, optimiser).
Floor: the network's FLOPs (``FlopCounterMode``, forward + backward) at this core's
measured matmul rate on the network's own widest layer shape, plus an H-step simulator
rollout with gradients at the same B (``Simulator.rollout`` forward + backward, the rate
bench/sim.py measures). *no-overhead ceiling*: step / (simulator + model), the speed-up the
step would get if everything but the simulator and the network cost nothing. A second table
times the evaluation rollout (validation, ``eval``: eval mode, no autograd) of the same
batches on both paths. One torch thread. Prints markdown tables.

``--device cuda`` puts the model, the batch and the simulator (its Warp kernels) on the GPU;
every timed region then ends with ``torch.cuda.synchronize()`` so that it counts the kernels'
work, not their launch. Without a CUDA device it stops with that message.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from nactuator.paths import use_warp_cache

ROOT = Path(__file__).resolve().parents[1]
use_warp_cache()

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from nactuator import rollout as rollout_mod  # noqa: E402
from nactuator.platforms import load_platform  # noqa: E402
from nactuator.sim.check import start_states  # noqa: E402
from nactuator.training.module import NeuralActuatorModule  # noqa: E402

PLATFORM = "so101"
MODEL = {"width": 64, "depth": 2, "model_sizes": {"head_hidden": 32, "dropout": 0.0}}
PATHS = ("stepwise", "frame-wise")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (a no-op on the CPU), so a timer counts them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SimClock:
    """Seconds spent in one Simulator: ``step`` (forward incl. glue) and the engine's
    backward (the adjoint launch incl. its glue)."""

    def __init__(self, sim) -> None:
        self.seconds = 0.0
        step, engine = sim.step, sim._engine(1)
        backward = engine.backward
        device = sim.device

        def timed_step(*a, **k):
            synchronize(device)
            clock = time.perf_counter()
            try:
                return step(*a, **k)
            finally:
                synchronize(device)
                self.seconds += time.perf_counter() - clock

        def timed_backward(*a, **k):
            synchronize(device)
            clock = time.perf_counter()
            try:
                return backward(*a, **k)
            finally:
                synchronize(device)
                self.seconds += time.perf_counter() - clock

        sim.step, engine.backward = timed_step, timed_backward


def make_module(norm_stats: dict, device: torch.device) -> NeuralActuatorModule:
    torch.manual_seed(0)
    module = NeuralActuatorModule(platform=PLATFORM, init_noise_q=0.002, init_noise_qd=0.02,
                                  **MODEL)
    module.build_actuator(norm_stats)
    return module.to(device)  # the simulator follows the module's device


def random_batch(module_platform, batch: int, horizon: int, seed: int = 0):
    """Channels of a training batch with random values (the shapes the DataModule serves)
    and the statistics to normalise them with."""
    n, frames = module_platform.n, 8 + horizon + 1
    gen = torch.Generator().manual_seed(seed)
    q0, _ = start_states(module_platform, batch, seed=seed)
    data = {k: torch.randn(batch, frames, n, generator=gen) for k in rollout_mod.RECORDED_KEYS}
    data["q"] = q0[:, None, :] + 0.05 * torch.randn(batch, frames, n, generator=gen)
    data["qd"] = 0.2 * torch.randn(batch, frames, n, generator=gen)
    data["force"] = torch.randn(batch, frames, 3, generator=gen)
    data["force_valid"] = torch.ones(batch, frames, dtype=torch.bool)
    data["condition"] = torch.ones(batch, frames, n)
    data["condition_valid"] = torch.ones(batch, frames, n, dtype=torch.bool)
    data["pad"] = torch.zeros(batch, frames, dtype=torch.bool)
    stats = {k: {"mean": [0.0] * n, "std": [1.0] * n}
             for k in ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")}
    return data, stats


def nad_batches(source: Path, tmp: Path, sizes: list[tuple[int, int]]):
    """One DataModule batch per (B, H) from the real NAD files, and their statistics."""
    from nactuator.data.datamodule import NADDataModule
    from nactuator.data.importers import import_nad

    import_nad(source, tmp / PLATFORM, platform=PLATFORM)
    batches, stats = {}, None
    for batch, horizon in sizes:
        dm = NADDataModule(tmp / PLATFORM, PLATFORM, horizon=horizon, batch_size=batch,
                           samples_per_epoch=batch)
        dm.setup("fit")
        batches[batch, horizon] = next(iter(dm.train_dataloader()))
        stats = dm.norm_stats
    return batches, stats


CPU = torch.device("cpu")


def best_of(repeats: int, run: Callable[[], object], device: torch.device = CPU) -> float:
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        clock = time.perf_counter()
        run()
        synchronize(device)
        best = min(best, time.perf_counter() - clock)
    return best


def training_step(module: NeuralActuatorModule, optimizer, batch) -> None:
    optimizer.zero_grad(set_to_none=True)
    r = module(batch, noise=True)
    module.compute_losses(r, batch)["loss"].backward()
    optimizer.step()


def network_cost(module: NeuralActuatorModule, batch: int, repeats: int) -> tuple[float, float]:
    """(seconds, FLOPs) of the network's forward + backward on one (B, L, n_in) window."""
    actuator = module.actuator
    tokens = torch.randn(batch, module.window_length, actuator.feature_builder.n_in,
                         device=module.device, requires_grad=True)

    def run() -> None:
        out = actuator.forward_tokens(tokens)
        (out["tau"].sum() + out["force"].sum() + out["condition_logit"].sum()).backward()

    run()
    with FlopCounterMode(display=False) as counter:
        run()
    return best_of(repeats, run, module.device), float(counter.get_total_flops())


def matmul_rate(module: NeuralActuatorModule, batch: int, repeats: int) -> float:
    """FLOP/s of ``torch.mm`` on the network's widest layer at this batch: (B·L, d) @ (d, 4d)."""
    width = MODEL["width"]
    a = torch.randn(batch * module.window_length, width, device=module.device)
    b = torch.randn(width, 4 * width, device=module.device)
    calls = 200
    seconds = best_of(repeats, lambda: [torch.mm(a, b) for _ in range(calls)], module.device)
    return calls * 2 * a.shape[0] * width * 4 * width / seconds


def simulator_rollout(module: NeuralActuatorModule, batch: int, horizon: int,
                      repeats: int) -> float:
    """Seconds of an H-step simulator rollout with gradients (forward + backward), B arms."""
    sim = module.simulator
    q0, qd0 = (x.to(sim.device) for x in start_states(sim.platform, batch, seed=0))
    hold = sim.gravity_torque(q0).detach()[:, None, :].expand(batch, horizon, sim.n)

    def run() -> None:
        taus = hold.clone().requires_grad_(True)
        q, qd = sim.replay(q0, qd0, taus)
        (q.sum() + qd.sum()).backward()

    run()
    return best_of(repeats, run, sim.device)


def measure(module, batch_data, batch: int, horizon: int, repeats: int) -> dict:
    optimizer = torch.optim.AdamW(module.actuator.parameters(), lr=1e-6)
    clock = SimClock(module.simulator)
    stepwise, framewise = rollout_mod.closed_loop_rollout_stepwise, \
        rollout_mod.closed_loop_rollout
    import nactuator.training.module as training_module

    results = {path: (float("inf"), 0.0) for path in PATHS}
    for fn in (stepwise, framewise):  # warm-up (per-B state)
        training_module.closed_loop_rollout = fn
        training_step(module, optimizer, batch_data)
    for _ in range(repeats):  # interleaved: both paths see the same machine load
        for path, fn in zip(PATHS, (stepwise, framewise), strict=True):
            training_module.closed_loop_rollout = fn
            torch.manual_seed(0)
            clock.seconds = 0.0
            synchronize(module.device)
            start = time.perf_counter()
            training_step(module, optimizer, batch_data)
            synchronize(module.device)
            seconds = time.perf_counter() - start
            if seconds < results[path][0]:
                results[path] = (seconds, clock.seconds)
    training_module.closed_loop_rollout = framewise
    # The validation/eval rollout: the same block, eval mode, no autograd.
    evaluation = {path: float("inf") for path in PATHS}
    block = {k: v for k, v in batch_data.items() if v.ndim >= 2}
    step = module.simulator.step
    with rollout_mod.eval_mode(module.actuator), torch.no_grad():
        for _ in range(repeats):
            for path, fn in zip(PATHS, (stepwise, framewise), strict=True):
                evaluation[path] = min(evaluation[path], best_of(
                    1, lambda fn=fn: fn(module.actuator, step, block, module.window_length),
                    module.device))
    net_s, flops = network_cost(module, batch, repeats)
    rate = matmul_rate(module, batch, repeats)
    sim_floor = simulator_rollout(module, batch, horizon, repeats)
    return {"paths": results, "eval": evaluation, "model": horizon * net_s, "flops": flops,
            "rate": rate, "floor": horizon * flops / rate + sim_floor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--horizon", nargs="+", type=int, default=[64, 192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=None,
                        help="NAD SO-101 CSV folder (default: ../shared/data/nad/so101)")
    parser.add_argument("--quick", action="store_true",
                        help="B = 2, H = 4, one repeat, random channels: a smoke test")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default) or cuda[:i]: model, batch and simulator there")
    args = parser.parse_args()
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        parser.error(f"--device {args.device!r}: {e}")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device {args.device!r}: cpu or cuda[:i]")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device "
                     "(a CPU build, or no GPU on this machine)")
    if args.quick:
        args.batch, args.horizon, args.repeats = [2], [4], 1
    torch.set_num_threads(1)
    sizes = [(b, h) for b in args.batch for h in args.horizon]
    shared = Path(os.environ.get("NACTUATOR_SHARED", ROOT.parent / "shared"))
    source = args.data or shared / "data" / "nad" / PLATFORM

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        if not args.quick and source.exists():
            batches, stats = nad_batches(source, Path(tmp), sizes)
            what = f"real NAD {PLATFORM} files ({source})"
        else:
            platform = load_platform(PLATFORM)
            made = {s: random_batch(platform, *s) for s in sizes}
            batches = {s: made[s][0] for s in sizes}
            stats = made[sizes[0]][1]
            what = "random channels (no NAD files, or --quick)"
        module = make_module(stats, device)
        batches = {s: {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}
                   for s, b in batches.items()}
        params = sum(p.numel() for p in module.actuator.parameters())
        load = os.getloadavg()
        where = (torch.cuda.get_device_name(device) if device.type == "cuda"
                 else f"{os.cpu_count()} CPUs")
        print(f"torch {torch.__version__}, {device}, 1 torch thread, {where}, load average "
              f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {PLATFORM}, {params:,}-parameter "
              f"transformer; batches: {what}; best of {args.repeats}, paths interleaved")
        rows = []
        for batch, horizon in sizes:
            m = measure(module, batches[batch, horizon], batch, horizon, args.repeats)
            rows.append((batch, horizon, m))
            old, new = m["paths"]["stepwise"][0], m["paths"]["frame-wise"][0]
            print(f"  B={batch} H={horizon}: stepwise {old:.3f} s, frame-wise {new:.3f} s "
                  f"({old / new:.2f}x), floor {m['floor']:.3f} s", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.1f}\n")
    print("| B | H | path | arm-steps/s | step [s] | simulator | model | overhead | "
          "vs stepwise | floor [s] | step / floor | no-overhead ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for batch, horizon, m in rows:
        old = m["paths"]["stepwise"][0]
        for path in PATHS:
            seconds, sim_s = m["paths"][path]
            model_s = min(m["model"], seconds - sim_s)
            over = max(seconds - sim_s - model_s, 0.0)
            print(f"| {batch} | {horizon} | {path} | {batch * horizon / seconds:,.0f} | "
                  f"{seconds:.4f} | {100 * sim_s / seconds:.0f} % | "
                  f"{100 * model_s / seconds:.0f} % | {100 * over / seconds:.0f} % | "
                  f"{old / seconds:.2f}x | {m['floor']:.3f} | {seconds / m['floor']:.1f}x | "
                  f"{seconds / (sim_s + model_s):.2f}x |")
    print("\nEvaluation rollout of the same batches (eval mode, no autograd), arm-steps/s:\n")
    print("| B | H | stepwise | frame-wise | ratio |\n|---|---|---|---|---|")
    for batch, horizon, m in rows:
        old, new = m["eval"]["stepwise"], m["eval"]["frame-wise"]
        print(f"| {batch} | {horizon} | {batch * horizon / old:,.0f} | "
              f"{batch * horizon / new:,.0f} | {old / new:.2f}x |")
    m = rows[0][2]
    print(f"\nnetwork forward + backward: {m['flops'] / 1e6:.2f} MFLOP per window batch at "
          f"B = {rows[0][0]}; matmul rate {m['rate'] / 1e9:.1f} GFLOP/s on (B·L, d) @ (d, 4d)")


if __name__ == "__main__":
    main()
