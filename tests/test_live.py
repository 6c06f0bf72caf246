"""The live virtual force sensor against an emulated follower (hidden world), with an
untrained actuator bundle saved through the models room's Contract 4 functions."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from nactuator.control.live import run_live
from nactuator.hardware.emulator import Emulator
from nactuator.hardware.recorder import with_hardware
from nactuator.input_filters import POOLED_KEYS, input_filter_spec
from nactuator.models import NeuralActuator, bundle_to_dict, save_bundle
from nactuator.platforms import load_platform
from nactuator.rollout import StreamingWindow

STATS_KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")


def untrained_bundle(path, platform: str, n: int, extra: dict | None = None,
                     pooled: bool = False) -> str:
    """An untrained bundle (the paper's transformer size); ``pooled`` adds the feature group
    of the input filters' pooled statistics and the condition head on them (the spec in
    ``extra`` must then pool)."""
    stats = {k: {"mean": [0.0] * n, "std": [1.0] * n}
             for k in (*STATS_KEYS, *(POOLED_KEYS if pooled else ()))}
    stats["voltage"] = {"mean": [12.0] * n, "std": [0.3] * n}
    stats["temperature"] = {"mean": [30.0] * n, "std": [5.0] * n}
    features = ["command", "state", "telemetry", "error", *(["pooled"] if pooled else [])]
    config = {"arch": "transformer",
              **({"condition_head": {"kind": "pooled", "hidden": 8}} if pooled else {})}
    actuator = NeuralActuator(features, n_motors=n, norm_stats=stats, model_config=config)
    save_bundle(bundle_to_dict(actuator, platform, extra), path)
    return str(path)


def test_a_motor_not_read_this_cycle_keeps_its_last_reading() -> None:
    """The live loop's window (StreamingWindow with the bundle's filters) holds a motor's
    last valid reading; before its first reading the motor reads 0."""
    window = StreamingWindow(["q"], 3, 2, filters=input_filter_spec(1))
    window.push({"q": np.array([np.nan, 2.0])}, valid=np.array([False, True]))
    window.push({"q": np.array([3.0, np.nan])}, valid=np.array([True, False]))
    window.push({"q": np.array([9.0, 7.0])}, valid=np.array([False, True]))
    np.testing.assert_array_equal(window.tensors()["q"][0].numpy(),
                                  [[0.0, 2.0], [3.0, 2.0], [3.0, 7.0]])


def offline_estimates(ckpt: str, frames: list, q_cmd: np.ndarray) -> dict[str, np.ndarray]:
    """What `infer` (the batch path: whole-episode causal windows, the checkpoint's input
    filters) estimates for the telemetry frames a live loop read: the reference the live
    rows are compared with."""
    from nactuator.data import Episode
    from nactuator.data.episodes import filter_episode
    from nactuator.eval.infer import predict_episodes
    from nactuator.models import load_actuator

    actuator, meta = load_actuator(ckpt)
    values = {k: np.stack([getattr(f, k) for f in frames]).astype(np.float32)
              for k in ("q", "qd", "effort", "voltage", "temperature")}
    values["q_cmd"] = np.tile(q_cmd, (len(frames), 1)).astype(np.float32)
    values["telemetry_valid"] = np.stack([f.valid for f in frames]).astype(np.float32)
    recording = Episode(index=0, task="live", split="test", length=len(frames),
                        payload_mass=float("nan"), meta={}, frames=values)
    (offline,) = predict_episodes(actuator, [filter_episode(recording, meta["input_filters"])])
    return offline


@pytest.fixture
def taps(monkeypatch) -> list:
    """Every bus `run_live` opens, wrapped in a :class:`Tap` (appended here): what the loop
    read off the bus, kept to recompute its outputs offline."""
    import contextlib

    import nactuator.control.live as live_module

    opened: list[Tap] = []
    real_open_bus = live_module.open_bus

    @contextlib.contextmanager
    def tapped_open_bus(*args, **kwargs):
        with real_open_bus(*args, **kwargs) as bus:
            opened.append(Tap(bus))
            yield opened[-1]

    monkeypatch.setattr(live_module, "open_bus", tapped_open_bus)
    return opened


def assert_rows_match(rows: list[dict], offline: dict, names, atol: float) -> None:
    """The live CSV rows (6 significant digits) against the offline estimates."""
    values = {"force": [[float(r[k]) for k in ("fx", "fy", "fz")] for r in rows],
              "gate": [float(r["gate"]) for r in rows],
              "condition": [[float(r[f"condition_{c}"]) for c in names] for r in rows]}
    for key, got in values.items():
        np.testing.assert_allclose(np.array(got), offline[key], rtol=1e-5, atol=atol,
                                   err_msg=key)


def test_live_streams_forces_from_an_emulated_arm(tmp_path, taps) -> None:
    ckpt = untrained_bundle(tmp_path / "omx_untrained.pt", "omx", 5)
    out = tmp_path / "live.csv"
    # Patient replies: an emulator in this process can take a few hundred ms to answer on
    # a loaded machine; the loop runs a fixed number of cycles whatever each one takes.
    omx = with_hardware(load_platform("omx"), rx_timeout_ms=5000.0, reply_timeout_ms=5000.0)
    with Emulator("dynamixel", "omx", seed=3) as follower:
        for t in follower.tables.values():  # the arm holds its pose, torque on
            t.set("Torque_Enable", 1)
        summary = run_live(ckpt, omx, follower.port, out=out, seconds=1.0)
        # The loop commanded the arm; when it ends, torque is off.
        assert [t.get("Torque_Enable") for t in follower.tables.values()] == [0] * 5
    assert summary.startswith("live: ") and "cycles" in summary
    assert out.exists() and not (tmp_path / "live.csv.partial").exists()
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == round(1.0 * omx.fps)
    assert {"fx", "fy", "fz", "gate", "condition_joint3", "read_ms", "infer_ms",
            "write_ms", "total_ms"} <= set(rows[0])
    # Each row is what `infer` estimates for the frames read so far (the CSV keeps 6
    # significant digits); the held command is the goal the loop wrote every cycle.
    [tap] = taps
    assert len(tap.frames) == len(rows) and len(set(map(tuple, tap.goals))) == 1
    offline = offline_estimates(ckpt, tap.frames, tap.goals[0])
    assert_rows_match(rows, offline, load_platform("omx").channel_names, atol=1e-6)
    assert np.ptp(offline["force"][8:], axis=0).max() > 0  # the telemetry moved the output
    assert all(float(r["read_ms"]) > 0 and float(r["infer_ms"]) > 0 for r in rows)
    assert [int(r["warm"]) for r in rows[:8]] == [0] * 8 and int(rows[8]["warm"]) == 1
    assert all(int(r["valid"]) for r in rows)


def test_live_refuses_a_checkpoint_of_another_platform(tmp_path) -> None:
    from nactuator.models import BundleError

    ckpt = untrained_bundle(tmp_path / "so101.pt", "so101", 6)
    with pytest.raises(BundleError, match="so101.*expected 'omx'"):
        run_live(ckpt, "omx", "/dev/null", seconds=0.1)


def test_status_line_redraws_in_place_on_a_terminal_and_logs_otherwise() -> None:
    import io

    from nactuator.control.live import StatusLine

    rows = [{"t": k / 60, "fx": 0.0, "fy": 0.0, "fz": -4.9, "gate": 0.9, "valid": int(k != 3)}
            for k in range(120)]
    log = io.StringIO()
    line = StatusLine(60.0, log, every_log=5.0)
    line.update(rows[:60], 0)
    line.update(rows, 2)  # within 5 s of the first: not printed again
    (text,) = log.getvalue().splitlines()
    assert "60.0 Hz" in text and "|f|   4.90 N" in text and "gate 0.90" in text
    assert "60 cycles, 1 incomplete, 0 lost" in text

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    line = StatusLine(60.0, tty, every=0.0)
    line.update(rows[:10], 0)
    line.update(rows, 1)
    line.close()
    assert tty.getvalue().count("\r\x1b[K") == 2 and tty.getvalue().endswith("\n")


def test_status_line_says_dash_until_a_rate_is_known_and_help_explains_the_counts(
        monkeypatch, capsys) -> None:
    import io

    from nactuator.cli import build_parser
    from nactuator.control.live import StatusLine

    row = {"t": 0.0, "fx": 0.0, "fy": 0.0, "fz": -4.9, "gate": 0.9, "valid": 0}
    text = StatusLine(60.0, io.StringIO()).text([row], 1)
    assert text.startswith("live     — Hz |") and "nan" not in text
    assert "1 cycles, 1 incomplete, 1 lost" in text
    two = StatusLine(60.0, io.StringIO()).text([row, {**row, "t": 0.5}], 0)
    assert two.startswith("live   2.0 Hz |")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    assert StatusLine(60.0).tty  # live's default stream, stderr, is a terminal here

    try:
        build_parser().parse_args(["live", "--help"])
    except SystemExit:
        pass
    help_text = capsys.readouterr().out
    for word in ("incomplete  cycles in which at least one servo's telemetry was not read",
                 "lost        schedule slots skipped because a cycle overran its period",
                 '"—" until two cycles have run'):
        assert word in help_text, word


def test_live_cli_takes_a_calibration_and_shows_its_status(tmp_path, capsys) -> None:
    import json

    from nactuator.cli import main

    p = load_platform("so101")
    cal = {n: {"id": k + 1, "drive_mode": 0, "homing_offset": 0, "range_min": 0,
               "range_max": 4095} for k, n in enumerate(p.channel_names)}
    (tmp_path / "cal.json").write_text(json.dumps(cal))
    ckpt = untrained_bundle(tmp_path / "so101.pt", "so101", 6)
    with Emulator("feetech", "so101", seed=1) as follower:
        code = main(["live", "--ckpt", ckpt, "--platform", "so101", "--port", follower.port,
                     "--calibration", str(tmp_path / "cal.json"), "--seconds", "0.3",
                     "--out", str(tmp_path / "live.csv")])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("live: ") and (tmp_path / "live.csv").is_file()
    assert "live " in err and " cycles, " in err  # the running status line
    code = main(["live", "--ckpt", ckpt, "--platform", "so101", "--port", "/dev/null",
                 "--calibration", str(tmp_path / "missing.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "calibration file" in err[0]


def test_live_streams_an_exported_model_like_its_checkpoint(tmp_path, taps) -> None:
    """The live path (StreamingWindow, zero-padded warm-up included) with an ONNX export of
    a checkpoint: each cycle's outputs are the checkpoint's on the same window; its
    TorchScript export streams through `nactuator live`."""
    import torch

    from nactuator.cli import main
    from nactuator.control.live import LiveLoop
    from nactuator.export import export
    from nactuator.hardware.open import open_bus
    from nactuator.models import load_actuator, load_model

    stats = {k: {"mean": [0.0] * 5, "std": [1.0] * 5} for k in STATS_KEYS}
    torch.manual_seed(2)
    small = NeuralActuator(n_motors=5, norm_stats=stats, model_config={
        "arch": "transformer", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64})
    ckpt = save_bundle(bundle_to_dict(small, "omx"), tmp_path / "omx.pt")
    fp32 = export(ckpt, tmp_path / "omx.onnx")
    torchscript = export(ckpt, tmp_path / "omx-export.pt")
    reference, _ = load_actuator(ckpt)
    exported, meta = load_model(fp32, expect_platform="omx")
    assert meta["export"] == {"kind": "onnx", "quantize": "none"}
    omx = with_hardware(load_platform("omx"), rx_timeout_ms=5000.0, reply_timeout_ms=5000.0)
    with Emulator("dynamixel", "omx", seed=4) as follower, open_bus(omx, follower.port) as bus:
        bus.wait_ready()
        loop = LiveLoop(exported, bus, omx, bus.read_goal())
        for cycle in range(12):
            row = loop.cycle(scheduled=0.0)
            with torch.no_grad():
                want = reference(loop.window.tensors())
            assert int(row["warm"]) == int(cycle >= 8)
            got = np.array([row["fx"], row["fy"], row["fz"], row["gate"]])
            expected = np.array([*want["force"][0].tolist(), float(want["gate"][0, 0])])
            np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
            conditions = [row[f"condition_{c}"] for c in omx.channel_names]
            np.testing.assert_allclose(conditions, want["condition"][0].numpy(), atol=1e-5)
    with Emulator("dynamixel", "omx", seed=5) as follower:
        code = main(["live", "--ckpt", torchscript, "--platform", "omx", "--port", follower.port,
                     "--seconds", "0.3", "--quiet", "--out", str(tmp_path / "ts.csv")])
    rows = list(csv.DictReader((tmp_path / "ts.csv").open()))
    assert code == 0 and len(rows) == round(0.3 * omx.fps)
    # the TorchScript file through `nactuator live` gives the checkpoint's `infer` estimates
    [tap] = taps
    offline = offline_estimates(ckpt, tap.frames, tap.goals[0])
    assert_rows_match(rows, offline, omx.channel_names, atol=1e-5)


class Tap:
    """The real bus, passed through; keeps every frame the live loop read."""

    def __init__(self, bus) -> None:
        self.bus, self.frames, self.goals = bus, [], []

    def read(self):
        frame = self.bus.read()
        self.frames.append(frame)
        return frame

    def write_goal(self, q) -> None:
        self.goals.append(np.array(q, dtype=float))
        self.bus.write_goal(q)

    def __getattr__(self, name: str):  # everything else: the real bus
        return getattr(self.bus, name)


@pytest.mark.parametrize("pool", [None, 64], ids=["plain", "pooled"])
def test_the_live_loop_gives_what_infer_gives_on_the_telemetry_it_read(tmp_path, pool) -> None:
    """LiveLoop against an emulated arm whose joint3 servo stops answering mid-run: every
    row (force, gate, condition) equals `infer`'s estimate for that frame of the telemetry
    the loop read, the frames without joint3 included (the checkpoint's input filters both
    ways: hold-last-valid, temperature median, and with ``pool`` the pooled statistics the
    loop computes frame by frame)."""
    from nactuator.control.live import LiveLoop
    from nactuator.data import Episode
    from nactuator.data.episodes import filter_episode
    from nactuator.eval.infer import predict_episodes
    from nactuator.hardware.open import open_bus
    from nactuator.models import load_actuator

    spec = input_filter_spec(11, "hold_last_valid", pool)
    actuator, meta = load_actuator(untrained_bundle(tmp_path / "omx.pt", "omx", 5,
                                                    {"input_filters": spec}, pooled=bool(pool)))
    assert bool(pool) == (set(POOLED_KEYS) <= set(actuator.inputs))
    assert meta["input_filters"] == spec
    # A dead servo costs reply timeouts until it counts as absent: keep them short here.
    omx = with_hardware(load_platform("omx"), rx_timeout_ms=100.0, reply_timeout_ms=100.0,
                        dead_after_failures=2)
    with Emulator("dynamixel", "omx", seed=3) as follower, open_bus(omx, follower.port) as bus:
        bus.wait_ready()
        tap = Tap(bus)
        loop = LiveLoop(actuator, tap, omx, bus.read_goal(), input_filters=meta["input_filters"])
        follower.after_reads(15, lambda: follower.set_dead(13))
        rows = loop.run(1.0, sink=None)
    read = tap.frames
    valid = np.stack([f.valid for f in read])
    first_lost = int(np.argmin(valid[:, 2]))
    assert not valid[:, 2].all() and first_lost > 0  # joint3 was read, then lost
    frames = {k: np.stack([getattr(f, k) for f in read]).astype(np.float32)
              for k in ("q", "qd", "effort", "voltage", "temperature")}
    frames["q_cmd"] = np.tile(loop.q_cmd, (len(read), 1)).astype(np.float32)
    frames["telemetry_valid"] = valid.astype(np.float32)
    recording = Episode(index=0, task="live", split="test", length=len(read),
                        payload_mass=float("nan"), meta={}, frames=frames)
    (offline,) = predict_episodes(actuator, [filter_episode(recording, spec)])
    names = load_platform("omx").channel_names
    live = {"force": [[r["fx"], r["fy"], r["fz"]] for r in rows],
            "gate": [r["gate"] for r in rows],
            "condition": [[r[f"condition_{c}"] for c in names] for r in rows]}
    for key, values in live.items():
        np.testing.assert_allclose(np.array(values), offline[key], atol=1e-5, err_msg=key)
    assert [int(r["valid"]) for r in rows] == valid.all(axis=1).astype(int).tolist()
