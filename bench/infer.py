"""CPU inference speed of the actuator model: eager PyTorch vs. optimised runtimes.

Batch-1 latency (p50/p95, ms) and batch-32/256 throughput (windows/s) on ONE CPU thread
for: eager PyTorch (inference mode), TorchScript (traced, frozen, optimize_for_inference),
torch.compile (inductor) and ONNX Runtime, each where it works here, plus two int8
dynamic-quantization paths (ONNX Runtime via ``export(..., quantize="int8")``, and torch.ao
on TorchScript for comparison) with their accuracy against eager. The paths are timed
in interleaved rounds so that load from other processes hits them alike; ratios are
against eager measured in the same run.

    .venv/bin/python bench/infer.py            # transformer
    .venv/bin/python bench/infer.py --arch gru --rounds 5 --json out.json

``--models FILE... --data DATASET`` times ``nactuator infer``'s own path instead
(``eval.infer.predict_episodes``: causal windows of every frame, batched) for model files
as ``infer`` loads them (checkpoints and exports), in interleaved rounds, on one thread:
frames per second of wall time and of this thread's CPU time.

    .venv/bin/python bench/infer.py --models runs/so101/best.ckpt runs/so101/int8.onnx \
        --data runs/data/so101-nad
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from nactuator.export import ExportableActuator, measure_int8_errors, ort_session, to_onnx
from nactuator.export.formats import export_metadata
from nactuator.models import NeuralActuator, count_parameters

CHANNELS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")
Runner = Callable[[tuple[torch.Tensor, ...]], object]


def make_actuator(arch: str, n_motors: int) -> NeuralActuator:
    torch.manual_seed(0)
    stats = {k: {"mean": [0.0] * n_motors, "std": [1.0] * n_motors} for k in CHANNELS}
    return NeuralActuator(["command", "state", "telemetry", "error"], n_motors, stats,
                          {"arch": arch}).eval()


def make_inputs(graph: ExportableActuator, batch: int) -> tuple[torch.Tensor, ...]:
    return graph.example_inputs(batch=batch)


def eager_runner(graph: ExportableActuator) -> Runner:
    def run(inputs):
        with torch.inference_mode():
            return graph(*inputs)
    return run


def torchscript_runner(graph: ExportableActuator) -> Runner:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated in 2.13
        traced = torch.jit.trace(graph, make_inputs(graph, 2), check_trace=False)
        module = torch.jit.optimize_for_inference(torch.jit.freeze(traced))

    def run(inputs):
        with torch.inference_mode():
            return module(*inputs)
    return run


def compile_runner(graph: ExportableActuator) -> Runner:
    compiled = torch.compile(graph, dynamic=False)

    def run(inputs):
        with torch.inference_mode():
            return compiled(*inputs)
    return run


def onnx_runner(graph: ExportableActuator, quantize: str = "none") -> Runner:
    folder = Path(tempfile.mkdtemp(prefix="nactuator-bench-"))
    path = folder / "actuator.onnx"
    to_onnx(graph.actuator, path, export_metadata(graph.actuator, {}), quantize=quantize)
    session = ort_session(path, threads=1)
    names = [i.name for i in session.get_inputs()]

    def run(inputs):
        return session.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})
    return run


def onnx_int8_runner(graph: ExportableActuator) -> Runner:
    """The deployable int8 file, exactly as ``nactuator export --quantize int8`` writes it."""
    return onnx_runner(graph, quantize="int8")


def torchscript_int8_runner(graph: ExportableActuator) -> Runner:
    """torch.ao dynamic quantization of every nn.Linear (int8 weights, fbgemm/x86 kernels),
    traced and frozen: the PyTorch-side alternative, timed for comparison only."""
    from torch.ao.quantization import quantize_dynamic

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in 2.13
        quantized = quantize_dynamic(graph, {torch.nn.Linear}, dtype=torch.qint8)
        traced = torch.jit.trace(quantized, make_inputs(graph, 2), check_trace=False)
        module = torch.jit.freeze(traced)

    def run(inputs):
        with torch.inference_mode():
            return module(*inputs)
    return run


def matmul_floor_runner(graph: ExportableActuator) -> Runner:
    """Only the transformer's matrix products (its Linear layers as bare ``torch.mm`` on
    the rows each sees at batch 1, plus attention): no other op could be this fast."""
    net = graph.actuator.net
    if net.config["arch"] != "transformer":
        raise NotImplementedError("the matmul floor is modelled for the transformer only")
    length, d_model = net.window_length, net.config["d_model"]
    encoder_ids = {id(m) for m in net.encoder.modules()}
    products = [(torch.randn(length if id(m) in encoder_ids else 1, m.in_features),
                 m.weight.detach().t().contiguous())
                for m in net.modules() if isinstance(m, torch.nn.Linear)]
    heads = net.config["n_heads"]
    q = torch.randn(heads, length, d_model // heads)

    def run(inputs):
        with torch.inference_mode():
            for x, w in products:
                torch.mm(x, w)
            for _ in net.encoder.blocks:
                torch.bmm(torch.bmm(q, q.transpose(1, 2)), q)
    return run


FLOOR = "(reference) the transformer's fp32 matmuls alone"
PATHS: dict[str, Callable[[ExportableActuator], Runner]] = {
    "eager": eager_runner,
    "torchscript (frozen + optimize_for_inference)": torchscript_runner,
    "torch.compile (inductor)": compile_runner,
    "onnxruntime (1 thread)": onnx_runner,
    "onnxruntime int8 dynamic (1 thread)": onnx_int8_runner,
    "torchscript int8 (torch.ao dynamic, frozen)": torchscript_int8_runner,
}
KEYS = dict(zip(("eager", "torchscript", "compile", "onnx", "onnx-int8", "torchscript-int8"),
                PATHS, strict=True))  # --paths names
INT8_PATHS = {"onnxruntime int8 dynamic (1 thread)", "torchscript int8 (torch.ao dynamic, frozen)"}


def check_outputs(run: Runner, reference: Runner, inputs: tuple[torch.Tensor, ...]) -> float:
    got, expected = run(inputs), reference(inputs)
    return max(float((torch.as_tensor(g) - e).abs().max()) for g, e in zip(got, expected,
                                                                           strict=True))


def time_calls(run: Runner, inputs: tuple[torch.Tensor, ...],
               calls: int) -> tuple[list[float], list[float]]:
    """(wall seconds, this thread's CPU seconds) per call. On a shared machine the wall
    time includes waiting for a core; the thread CPU time does not (all paths run their
    work on the calling thread at 1 thread), so it is the closer figure for a free core."""
    wall, cpu = [], []
    for _ in range(calls):
        start, start_cpu = time.perf_counter(), time.thread_time()
        run(inputs)
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
    return wall, cpu


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def flops_per_window(graph: ExportableActuator) -> float:
    """FLOPs (2 per multiply-add) of one batch-1 forward, as torch's FlopCounterMode counts
    them. oneDNN's fused LSTM kernel is invisible to the counter, so it is counted with
    oneDNN off, where the LSTM runs as the plain matmuls the counter sees."""
    inputs = make_inputs(graph, 1)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), \
            FlopCounterMode(display=False) as counter:
        graph(*inputs)
    return float(counter.get_total_flops())


def bench_models(paths: list[str], data: str, rounds: int) -> None:
    """frames/s of ``infer``'s path (see the module docstring) for each model file."""
    from nactuator.eval.episodes import load_episodes
    from nactuator.eval.infer import predict_episodes
    from nactuator.models import load_model
    from nactuator.platforms import load_platform

    models = {path: load_model(path) for path in paths}
    platforms = {meta["platform"] for _, meta in models.values()}
    if len(platforms) != 1:
        raise SystemExit(f"--models are for several platforms: {sorted(platforms)}")
    episodes = load_episodes(data, load_platform(platforms.pop()), None)
    frames = sum(ep.length for ep in episodes)
    wall: dict[str, list[float]] = {p: [] for p in paths}
    cpu: dict[str, list[float]] = {p: [] for p in paths}
    for model, _ in models.values():  # warm-up
        predict_episodes(model, episodes[:1])
    for _ in range(rounds):
        for path, (model, _) in models.items():
            start, start_cpu = time.perf_counter(), time.thread_time()
            predict_episodes(model, episodes)
            wall[path].append(time.perf_counter() - start)
            cpu[path].append(time.thread_time() - start_cpu)
    print(f"## infer path: {frames} frames ({len(episodes)} episodes of {data}), "
          f"{rounds} rounds, {torch.get_num_threads()} thread(s), load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| model | kind | frames/s (wall, median) | frames/s (thread CPU, median) |")
    print("|---|---|---|---|")
    for path, (_, meta) in models.items():
        kind = meta.get("export") or {"kind": "checkpoint", "quantize": "none"}
        label = kind["kind"] + ("" if kind["quantize"] == "none" else f" {kind['quantize']}")
        print(f"| {path} | {label} | {frames / statistics.median(wall[path]):,.0f} | "
              f"{frames / statistics.median(cpu[path]):,.0f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="transformer",
                        choices=["transformer", "mlp", "gru", "lstm"])
    parser.add_argument("--motors", type=int, default=5, help="5 = OMX layout, 6 = SO-101")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--latency-calls", type=int, default=300, help="batch-1 calls/round")
    parser.add_argument("--throughput-calls", type=int, default=20, help="calls/round/batch")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--models", nargs="+", default=None, metavar="FILE",
                        help="time infer's path for these model files (needs --data)")
    parser.add_argument("--data", default=None, help="dataset for --models")
    parser.add_argument("--paths", nargs="+", choices=list(KEYS), default=list(KEYS),
                        help="the paths to time (default: all; eager is always timed)")
    parser.add_argument("--warmup-calls", type=int, default=50, help="batch-1 warm-up calls")
    args = parser.parse_args(argv)
    if args.models:
        if args.data is None:
            parser.error("--models needs --data")
        torch.set_num_threads(args.threads)
        bench_models(args.models, args.data, args.rounds)
        return

    load_before = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    actuator = make_actuator(args.arch, args.motors)
    graph = ExportableActuator(actuator).eval()
    eager = eager_runner(graph)

    runners: dict[str, Runner] = {}
    notes: dict[str, str] = {}
    accuracy: dict[str, dict[str, float]] = {}
    probe = make_inputs(graph, 3)
    chosen = {KEYS[k] for k in ("eager", *args.paths)}
    for name, build in PATHS.items():
        if name not in chosen:
            continue
        try:
            run = build(graph)
            error = check_outputs(run, eager, probe)
            # a fresh batch size too: a runtime specialised to one shape must still be right
            error = max(error, check_outputs(run, eager, make_inputs(graph, 1)))
        except Exception as err:  # a missing compiler or package: report it, go on
            notes[name] = f"unavailable: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
            continue
        runners[name] = run
        notes[name] = f"max |out - eager| = {error:.1e}"
        if name in INT8_PATHS:  # the export's own int8 check, on its 256-window batch
            accuracy[name] = measure_int8_errors(lambda *xs, run=run: run(xs), graph)
            notes[name] += ("; int8 accuracy vs eager: "
                            + ", ".join(f"{k} {v:.2%} of RMS" if k in ("tau", "force")
                                        else f"{k} {v:.1e} abs" for k, v in
                                        accuracy[name].items()))
    timed = dict(runners)
    try:
        timed[FLOOR] = matmul_floor_runner(graph)
    except NotImplementedError as err:
        notes[FLOOR] = str(err)

    latency = {n: [] for n in timed}
    latency_cpu = {n: [] for n in timed}
    throughput = {n: {b: [] for b in args.batches} for n in runners}
    single = make_inputs(graph, 1)
    batched = {b: make_inputs(graph, b) for b in args.batches}
    for name, run in timed.items():  # warm-up (compilation, allocator, caches)
        time_calls(run, single, args.warmup_calls)
        for b in args.batches if name in runners else ():
            time_calls(run, batched[b], 3)
    for _ in range(args.rounds):
        for name, run in timed.items():
            wall, cpu = time_calls(run, single, args.latency_calls)
            latency[name] += wall
            latency_cpu[name] += cpu
            for b in args.batches if name in runners else ():
                seconds = sum(time_calls(run, batched[b], args.throughput_calls)[0])
                throughput[name][b].append(b * args.throughput_calls / seconds)

    params = count_parameters(actuator)
    mflops = flops_per_window(graph) / 1e6
    base_p50 = percentile(latency["eager"], 0.5)
    base_tp = {b: statistics.median(throughput["eager"][b]) for b in args.batches}
    print(f"## {args.arch}: {params:,} parameters, {mflops:.2f} MFLOPs per window "
          f"(n_motors={args.motors}, L={actuator.window_length}), {args.threads} thread(s), "
          f"torch {torch.__version__}, {platform.machine()}\n")
    header = ["path", "b=1 p50 ms", "b=1 p95 ms", "b=1 p50 CPU ms", "p50 speed-up"]
    header += [f"b={b} windows/s" for b in args.batches]
    header += [f"b={b} vs eager" for b in args.batches]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    figures: dict = {"arch": args.arch, "parameters": params, "mflops": mflops, "paths": {}}
    for name in timed:
        p50, p95 = percentile(latency[name], 0.5), percentile(latency[name], 0.95)
        p50_cpu = percentile(latency_cpu[name], 0.5)
        tps = {b: statistics.median(throughput[name][b]) for b in args.batches
               } if name in runners else {}
        row = [name, f"{p50 * 1e3:.3f}", f"{p95 * 1e3:.3f}", f"{p50_cpu * 1e3:.3f}",
               f"{base_p50 / p50:.2f}x"]
        row += [f"{tps[b]:,.0f}" if tps else "" for b in args.batches]
        row += [f"{tps[b] / base_tp[b]:.2f}x" if tps else "" for b in args.batches]
        print("| " + " | ".join(row) + " |")
        figures["paths"][name] = {"p50_ms": p50 * 1e3, "p95_ms": p95 * 1e3,
                                  "p50_cpu_ms": p50_cpu * 1e3, "throughput": tps}
    print()
    print(f"- 1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"on {os.cpu_count()} CPUs (above the CPU count, wall times include waiting)")
    for name, note in notes.items():
        print(f"- {name}: {note}")
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "notes": notes,
                                               "int8_errors": accuracy}, indent=2))


if __name__ == "__main__":
    main()
