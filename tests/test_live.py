"""The live virtual force sensor against an emulated follower (hidden world), with an
untrained actuator bundle saved through the models room's Contract 4 functions."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from nactuator.control.live import hold_last_valid, run_live
from nactuator.hardware.emulator import Emulator
from nactuator.hardware.recorder import with_hardware
from nactuator.models import NeuralActuator, bundle_to_dict, save_bundle
from nactuator.platforms import load_platform

STATS_KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")


def untrained_bundle(path, platform: str, n: int) -> str:
    stats = {k: {"mean": [0.0] * n, "std": [1.0] * n} for k in STATS_KEYS}
    stats["voltage"] = {"mean": [12.0] * n, "std": [0.3] * n}
    stats["temperature"] = {"mean": [30.0] * n, "std": [5.0] * n}
    actuator = NeuralActuator(n_motors=n, norm_stats=stats,
                              model_config={"arch": "transformer"})  # the paper's size
    save_bundle(bundle_to_dict(actuator, platform), path)
    return str(path)


def test_a_motor_not_read_this_cycle_keeps_its_last_reading() -> None:
    held = {"q": np.full(2, np.nan, dtype=np.float32)}
    hold_last_valid(held, {"q": np.array([1.0, 2.0])}, np.array([True, True]))
    hold_last_valid(held, {"q": np.array([3.0, np.nan])}, np.array([True, False]))
    np.testing.assert_array_equal(held["q"], [3.0, 2.0])
    hold_last_valid(held, {"q": np.array([9.0, 7.0])}, np.array([False, True]))
    np.testing.assert_array_equal(held["q"], [3.0, 7.0])


def test_live_streams_forces_from_an_emulated_arm(tmp_path) -> None:
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
    force = np.array([[float(r[k]) for k in ("fx", "fy", "fz")] for r in rows])
    assert np.isfinite(force).all()
    gate = np.array([float(r["gate"]) for r in rows])
    assert ((gate >= 0) & (gate <= 1)).all()
    cond = np.array([[float(r[f"condition_{c}"]) for c in load_platform("omx").channel_names]
                     for r in rows])
    assert ((cond >= 0) & (cond <= 1)).all()
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
