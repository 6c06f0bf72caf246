"""What the force interval costs at inference: the recipe-size transformer (width 64, depth 2,
~85 k parameters) with and without the σ head (model.uncertainty), one thread, one window
(what `live` runs per frame) and a batch of windows (what `infer` runs), timed alternately
in the same run; the median of ``--repeats`` rounds.

    .venv/bin/python bench/uncertainty.py [--repeats 7] [--batches 1,1024]
"""

from __future__ import annotations

import argparse
import time

import torch

from nactuator.models import NeuralActuator
from nactuator.models.config import resolve_model_config

CHANNELS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature")
N_MOTORS = 6  # SO-101


def build(uncertainty: bool) -> NeuralActuator:
    torch.manual_seed(0)
    stats = {k: {"mean": [0.0] * N_MOTORS, "std": [1.0] * N_MOTORS}
             for k in (*CHANNELS, "error")}
    config = {**resolve_model_config("transformer", 9, 64, 2, {"head_hidden": 32}),
              "uncertainty": uncertainty}
    return NeuralActuator(n_motors=N_MOTORS, norm_stats=stats, model_config=config).eval()


def windows(batch: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    w = {k: torch.randn(batch, 9, N_MOTORS, generator=g) for k in CHANNELS}
    w["pad"] = torch.zeros(batch, 9, dtype=torch.bool)
    return w


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batches", default="1,1024")
    ap.add_argument("--calls", type=int, default=200, help="calls per round at B = 1")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    models = {"without σ head": build(False), "with σ head": build(True)}
    sizes = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print("| batch | without σ head (ms) | with σ head (ms) | ratio |")
    print("|---|---|---|---|")
    for batch in (int(b) for b in a.batches.split(",")):
        w = windows(batch)
        calls = max(1, a.calls if batch == 1 else a.calls // 40)
        times: dict[str, list[float]] = {name: [] for name in models}
        with torch.inference_mode():
            for _ in range(a.repeats):
                for name, m in models.items():  # alternate: load drifts hit both alike
                    m(w)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        m(w)
                    times[name].append((time.perf_counter() - t0) / calls * 1e3)
        base, head = (sorted(v)[len(v) // 2] for v in times.values())
        print(f"| {batch} | {base:.3f} | {head:.3f} | {head / base:.3f} |")
    print(f"\nparameters: {sizes['without σ head']:,} without, {sizes['with σ head']:,} with "
          "the σ head")


if __name__ == "__main__":
    main()
