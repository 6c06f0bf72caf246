"""Live-loop cycle time and jitter at the platform rate (docs/benchmarks.md, "Live loop").

For each platform (OMX: 5 DYNAMIXEL servos; SO-101: 6 Feetech servos) and with/without
emulated bus timing at 1 Mbps, an emulator runs in its own process (so it does not share
our GIL) and the live loop runs here with an untrained paper-size Transformer bundle, or
with any model file ``nactuator live`` runs (``--model``: a checkpoint, or an exported
TorchScript / ONNX fp32 / ONNX int8 file; its platform only). Per cycle: telemetry read +
inference + command write. Baseline, same run: the bare vendor SDK group read of the same
telemetry block (what the read costs without our layer). ``--fps`` paces the loop faster
than the platform's rate, to measure the rate a model sustains.

    .venv/bin/python bench/live.py [--seconds 5] [--rrd] [--pool 64]
    .venv/bin/python bench/live.py --model runs/so101/actuator-int8.onnx --fps 120

``--pool N``: every case runs twice, the untrained model without and with the input
filters' pooled statistics over N frames (the feature group ``pooled``,
``conf/train/pooled_condition.yaml``): what pooling costs a live cycle, in the same run.
A ``--model`` runs with its own input filters (its bundle's spec).

``--rrd``: each case runs twice more, without and with a Rerun recording to a file (what
``nactuator live --rrd FILE`` does), and a second table gives the rate, cycle time, jitter
and the per-frame cost of ``Viewer.log_frame`` (docs/benchmarks.md, "Live loop in Rerun").

``--contact``: on the SO-101 (the platform with a contact configuration), one emulator, the
same loop three times in a row: contact off; on and idle (a calibration whose thresholds are
never crossed: the residual's inverse dynamics every cycle, no surface search); on and in
contact (thresholds crossed every cycle: the NNLS surface search every cycle, the worst
case). The calibration files are written for the model file the loop runs
(docs/benchmarks.md, "Live loop with contact"). With ``--contact FILE`` (and ``--model``) a
fourth case runs the user's calibration as it is.

    .venv/bin/python bench/live.py --contact --seconds 10 --timing off
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

import numpy as np
import torch

from nactuator.control.live import LiveLoop, summarize_timings
from nactuator.hardware.open import open_bus
from nactuator.input_filters import POOLED_KEYS, input_filter_spec
from nactuator.models import NeuralActuator, load_model
from nactuator.paths import use_warp_cache
from nactuator.platforms import load_platform
from nactuator.viewer import Viewer

STATS_KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")
FILTERS = input_filter_spec()  # what a default training run saves in the bundle


def wire_ms(bus: str, n: int) -> float:
    """Bytes on the wire per cycle at 1 Mbps (10 bits/byte), request + replies + write."""
    if bus == "dynamixel":  # FAST_SYNC_READ 124..146 + SYNC_WRITE of Goal_Position
        read = (14 + n) + (8 + 27 * n)
        write = 14 + 5 * n
    else:  # SYNC_READ 56..70 (6 status packets) + SYNC_WRITE
        read = (8 + n) + n * (6 + 15)
        write = 8 + 3 * n
    return (read + write) * 10 / 1e6 * 1e3


def start_emulator(bus: str, platform: str, link: Path, timing: bool, seconds: float):
    """The emulator in its own process, with the reference arm: its replies then cost what
    the protocol costs, not a world physics step (which real servos do not have)."""
    code = (f"from nactuator.hardware.emulator import run_emulator; run_emulator("
            f"bus={bus!r}, platform={platform!r}, bus_timing={timing}, link={str(link)!r}, "
            f"duration={seconds}, arm='reference')")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    proc.stdout.readline()  # "emulated ... on <pty>": ready
    for _ in range(100):
        if link.exists():
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"emulator for {platform} did not start")


def baseline_read_ms(bus_obj, cycles: int) -> np.ndarray:
    """Bare SDK group read of the telemetry block, no decoding, no retries."""
    if bus_obj.platform.hardware["bus"] == "dynamixel":
        import dynamixel_sdk as sdk

        group = sdk.GroupSyncRead(bus_obj.sdk_port, bus_obj.sdk_packet_handler, 124, 23)
        run = group.fastSyncRead
    else:
        import scservo_sdk as sdk

        group = sdk.GroupSyncRead(bus_obj.sdk_port, bus_obj.sdk_packet_handler, 56, 15)
        run = group.txRxPacket
    for i in bus_obj.ids:
        group.addParam(i)
    times = []
    for _ in range(cycles):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
        time.sleep(1 / bus_obj.platform.fps)
    return np.array(times) * 1e3


def model_only_ms(actuator, n: int, cycles: int) -> np.ndarray:
    """Bare forward pass on a ready window: what inference costs without our loop."""
    window = {k: torch.zeros(1, actuator.window_length, n) for k in actuator.inputs}
    times = []
    with torch.inference_mode():
        for _ in range(10):
            actuator(window)
        for _ in range(cycles):
            t0 = time.perf_counter()
            actuator(window)
            times.append(time.perf_counter() - t0)
    return np.array(times) * 1e3


class TimedViewer(Viewer):
    """A Viewer that keeps how long each log_frame took (ms)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log_ms: list[float] = []

    def log_frame(self, t: float, **signals) -> None:
        t0 = time.perf_counter()
        super().log_frame(t, **signals)
        self.log_ms.append(1e3 * (time.perf_counter() - t0))


def bench_rrd(platform: str, timing: bool, seconds: float, actuator,
              filters: dict = FILTERS) -> list[dict]:
    """The same loop without and with a Rerun recording (.rrd file), one emulator."""
    p = load_platform(platform)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / "port"
        proc = start_emulator(p.hardware["bus"], platform, link, timing, seconds * 3 + 30)
        try:
            with open_bus(p, str(link)) as b:
                b.wait_ready()
                for viewer in (None, TimedViewer("bench", p.channel_names,
                                                 rrd=Path(tmp) / "live.rrd")):
                    loop = LiveLoop(actuator, b, p, b.read_goal(), viewer=viewer,
                                    input_filters=filters)
                    s = summarize_timings(loop.run(seconds, sink=None), p.fps)
                    s["lost_slots"] = loop.lost_slots
                    if viewer is not None:
                        viewer.close()
                        s["log_p50_ms"] = float(np.percentile(viewer.log_ms, 50))
                        s["log_p99_ms"] = float(np.percentile(viewer.log_ms, 99))
                        s["rrd_kb_per_s"] = (Path(tmp) / "live.rrd").stat().st_size / 1e3 / seconds
                    out.append(s)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return out


def bench(platform: str, timing: bool, seconds: float, actuator,
          fps: float | None = None, filters: dict = FILTERS) -> dict:
    p = load_platform(platform)
    if fps is not None:  # the loop paces itself at p.fps; the emulator answers any rate
        p = dataclasses.replace(p, fps=fps)
    bus = p.hardware["bus"]
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / "port"
        proc = start_emulator(bus, platform, link, timing, seconds * 2 + 30)
        try:
            with open_bus(p, str(link)) as b:
                b.wait_ready()
                base = baseline_read_ms(b, int(seconds * p.fps / 2))
                loop = LiveLoop(actuator, b, p, b.read_goal(), input_filters=filters)
                cpu = time.process_time()
                rows = loop.run(seconds, sink=None)
                cpu = time.process_time() - cpu
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    s = summarize_timings(rows, p.fps)
    model = model_only_ms(actuator, p.n, len(rows))
    s["sdk_read_p50_ms"] = float(np.percentile(base, 50))
    s["model_p50_ms"] = float(np.percentile(model, 50))
    s["wire_ms"] = wire_ms(bus, p.n) if timing else 0.0
    # CPU time of this process per cycle (the emulator is another process; waiting for
    # the bus or the next slot costs none): the rate one free core sustains, whatever the
    # load of a shared machine does to the wall-clock figures.
    s["cpu_ms"] = 1e3 * cpu / len(rows)
    # Our overhead: what the loop adds on top of the bare SDK read and the bare forward.
    s["own_p50_ms"] = (s["read_p50_ms"] - s["sdk_read_p50_ms"]) + \
        (s["infer_p50_ms"] - s["model_p50_ms"]) + s["write_p50_ms"]
    return s


CONTACT_CASES = ("off", "idle", "in contact")


def contact_calibration(path: Path, model: Path, platform, threshold: float) -> Path:
    """A calibration file for ``model`` whose every threshold is ``threshold`` N m."""
    from nactuator.contact import (
        ContactCalibration,
        LinkSurfaces,
        load_contact_config,
        model_sha256,
    )

    joints = int(LinkSurfaces.build(platform, load_contact_config(platform)).last_joint.max()) + 1
    ContactCalibration(platform=platform.name, threshold=[threshold] * joints, tare_seconds=0.0,
                       model=str(model), model_sha256=model_sha256(model), quantile=0.999,
                       margin=1.2, frames=0, data=[]).save(path)
    return path


def bench_contact(timing: bool, seconds: float, actuator, model: Path,
                  user_file: str | None = None, filters: dict = FILTERS,
                  estimator: str | None = None) -> list[tuple[str, dict]]:
    """The SO-101 loop with contact off / idle / in contact (and the user's file), one
    emulator, one after the other."""
    from nactuator.contact import ContactStream

    p = load_platform("so101")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {"idle": contact_calibration(Path(tmp) / "idle.json", model, p, 1e9),
                 "in contact": contact_calibration(Path(tmp) / "on.json", model, p, 1e-9)}
        if user_file is not None:
            files["user file"] = Path(user_file)
        link = Path(tmp) / "port"
        proc = start_emulator(p.hardware["bus"], p.name, link, timing,
                              seconds * (len(files) + 1) + 30)
        try:
            with open_bus(p, str(link)) as b:
                b.wait_ready()
                for case in ("off", *files):
                    stream = (None if case == "off"
                              else ContactStream.open(files[case], p, model, estimator))
                    loop = LiveLoop(actuator, b, p, b.read_goal(), input_filters=filters,
                                    contact=stream)
                    cpu = time.process_time()
                    rows = loop.run(seconds, sink=None)
                    cpu = time.process_time() - cpu
                    s = summarize_timings(rows, p.fps)
                    s["lost_slots"] = loop.lost_slots
                    s["cpu_ms"] = 1e3 * cpu / len(rows)
                    out.append((case, s))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rrd", action="store_true",
                    help="also measure the loop with a Rerun recording (nactuator live --rrd)")
    ap.add_argument("--model", default=None,
                    help="a model file (checkpoint or export) instead of the untrained one")
    ap.add_argument("--fps", type=float, default=None,
                    help="pace the loop at this rate (default: the platform's)")
    ap.add_argument("--timing", choices=["off", "on", "both"], default="both",
                    help="emulated bus timing at 1 Mbps")
    ap.add_argument("--contact", nargs="?", const="", default=None, metavar="FILE",
                    help="only the SO-101 loop with contact off / idle / in contact (and "
                         "with FILE, a calibration of --model, as it is)")
    ap.add_argument("--contact-estimator", choices=["frame", "filter"], default=None,
                    help="with --contact: the estimator (default: conf/contact/so101.yaml's)")
    ap.add_argument("--pool", type=int, default=None, metavar="FRAMES",
                    help="also run the untrained model with pooled statistics over FRAMES")
    args = ap.parse_args(argv)
    use_warp_cache()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"live loop, {args.seconds:g} s per case, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
          + (f", model {args.model}" if args.model else "")
          + (f", paced at {args.fps:g} Hz" if args.fps else ""))
    timings = {"off": (False,), "on": (True,), "both": (False, True)}[args.timing]
    if args.contact is not None:
        main_contact(args, timings)
        return
    header = ("| platform | servos | pooled | bus timing | rate Hz | read p50/p99 ms | "
              "SDK-only read p50 | infer p50/p99 ms | model-only p50 | write p50/p99 ms | "
              "total p50/p99 ms | wire ms | own overhead p50 ms | jitter p50/p99 ms | "
              "CPU ms/cycle | one-core rate Hz |")
    print(header)
    print("|" + "---|" * 16)
    actuators = {}
    model = None if args.model is None else load_model(args.model)
    platforms = ("omx", "so101") if model is None else (model[1]["platform"],)
    pools = (None,) if args.pool is None or model is not None else (None, args.pool)
    for platform in platforms:
        p = load_platform(platform)
        for pool in pools:
            stats = {k: {"mean": [0.0] * p.n, "std": [1.0] * p.n}
                     for k in (*STATS_KEYS, *(POOLED_KEYS if pool else ()))}
            features = ["command", "state", "telemetry", "error", *(["pooled"] if pool else [])]
            actuator = model[0] if model is not None else NeuralActuator(
                features, n_motors=p.n, norm_stats=stats,
                model_config={"arch": "transformer"}).eval()
            filters = (model[1]["input_filters"] if model is not None
                       else input_filter_spec(pool_frames=pool))
            if pool is None:
                actuators[platform] = (actuator, filters)
            for timing in timings:
                bench_case(platform, timing, args, actuator, filters)
    if not args.rrd:
        return
    print("\n| platform | bus timing | rerun | rate Hz | lost slots | total p50/p99 ms | "
          "jitter p50/p99 ms | log_frame p50/p99 ms | .rrd kB/s |")
    print("|" + "---|" * 9)
    for platform, (actuator, filters) in actuators.items():
        for timing in (False, True):
            for s, rrd in zip(bench_rrd(platform, timing, args.seconds, actuator, filters),
                              ("off", "--rrd"), strict=True):
                log = (f"{s['log_p50_ms']:.3f}/{s['log_p99_ms']:.3f}" if rrd != "off"
                       else "-")
                size = f"{s['rrd_kb_per_s']:.0f}" if rrd != "off" else "-"
                print(f"| {platform} | {'1 Mbps' if timing else 'off'} | {rrd} | "
                      f"{s['rate_hz']:.1f} | {s['lost_slots']} | "
                      f"{s['total_p50_ms']:.2f}/{s['total_p99_ms']:.2f} | "
                      f"{s['jitter_p50_ms']:.2f}/{s['jitter_p99_ms']:.2f} | {log} | {size} |",
                      flush=True)


def bench_case(platform: str, timing: bool, args: argparse.Namespace, actuator,
               filters: dict) -> None:
    """One row of the main table: the loop with ``actuator`` and its input ``filters``."""
    p = load_platform(platform)
    pooled = "off" if "pool" not in filters else f"{filters['pool']['frames']} frames"
    s = bench(platform, timing, args.seconds, actuator, args.fps, filters)
    print(f"| {platform} | {p.n} | {pooled} | {'1 Mbps' if timing else 'off'} | "
          f"{s['rate_hz']:.1f} | {s['read_p50_ms']:.2f}/{s['read_p99_ms']:.2f} | "
          f"{s['sdk_read_p50_ms']:.2f} | "
          f"{s['infer_p50_ms']:.2f}/{s['infer_p99_ms']:.2f} | {s['model_p50_ms']:.2f} | "
          f"{s['write_p50_ms']:.2f}/{s['write_p99_ms']:.2f} | "
          f"{s['total_p50_ms']:.2f}/{s['total_p99_ms']:.2f} | {s['wire_ms']:.2f} | "
          f"{s['own_p50_ms']:.2f} | {s['jitter_p50_ms']:.2f}/{s['jitter_p99_ms']:.2f} | "
          f"{s['cpu_ms']:.2f} | {1e3 / s['cpu_ms']:,.0f} |",
          flush=True)


def main_contact(args, timings) -> None:
    """``--contact``: the table of docs/benchmarks.md "Live loop with contact"."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:  # an untrained paper-size bundle, saved: the calibration
            from nactuator.models import bundle_to_dict, save_bundle  # names its file

            p = load_platform("so101")
            stats = {k: {"mean": [0.0] * p.n, "std": [1.0] * p.n} for k in STATS_KEYS}
            untrained = NeuralActuator(n_motors=p.n, norm_stats=stats,
                                       model_config={"arch": "transformer"}).eval()
            model_path = save_bundle(bundle_to_dict(untrained, "so101"), Path(tmp) / "so101.pt")
        else:
            model_path = Path(args.model)
        actuator, meta = load_model(model_path)
        if meta["platform"] != "so101":
            raise SystemExit(f"--contact: the SO-101 only (conf/contact/), got {meta['platform']}")
        print("| bus timing | contact | rate Hz | lost slots | flagged cycles | "
              "total p50/p99 ms | contact p50/p99 ms | infer p50 ms | CPU ms/cycle | "
              "one-core rate Hz |")
        print("|" + "---|" * 10)
        for timing in timings:
            cases = bench_contact(timing, args.seconds, actuator, model_path,
                                  args.contact or None, meta["input_filters"],
                                  args.contact_estimator)
            base = cases[0][1]["total_p50_ms"]
            for case, s in cases:
                contact = (f"{s['contact_p50_ms']:.2f}/{s['contact_p99_ms']:.2f}"
                           if "contact_p50_ms" in s else "-")
                print(f"| {'1 Mbps' if timing else 'off'} | {case} | {s['rate_hz']:.1f} | "
                      f"{s['lost_slots']} | {s.get('contact_cycles', '-')} | "
                      f"{s['total_p50_ms']:.2f}/{s['total_p99_ms']:.2f} "
                      f"(x{s['total_p50_ms'] / base:.2f}) | {contact} | "
                      f"{s['infer_p50_ms']:.2f} | {s['cpu_ms']:.2f} | "
                      f"{1e3 / s['cpu_ms']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
