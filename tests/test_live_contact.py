"""`live --contact` (issue 23): each cycle's contact link, point and force are what `infer
--contact` reports for that frame of the telemetry the loop read, against an emulated SO-101
(the hidden world behind the real Feetech wire protocol); a bad calibration file is one line
naming the file and the field, before any bus is opened."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from nactuator.cli import main
from nactuator.contact import ContactCalibration, model_sha256
from nactuator.control.live import CONTACT_COLUMNS, LiveLoop, run_live
from nactuator.hardware.emulator import Emulator
from nactuator.hardware.open import open_bus
from nactuator.hardware.recorder import with_hardware
from nactuator.input_filters import input_filter_spec
from nactuator.models import NeuralActuator, bundle_to_dict, load_actuator, save_bundle
from nactuator.platforms import load_platform

STATS_KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")
JOINTS = 5  # SO-101 joints that move a contact link (conf/contact/so101.yaml's links)


def small_bundle(path, platform: str = "so101", seed: int = 0) -> str:
    n = load_platform(platform).n
    stats = {k: {"mean": [0.0] * n, "std": [1.0] * n} for k in STATS_KEYS}
    torch.manual_seed(seed)
    actuator = NeuralActuator(n_motors=n, norm_stats=stats, model_config={
        "arch": "transformer", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64})
    spec = input_filter_spec(5, "hold_last_valid")
    return str(save_bundle(bundle_to_dict(actuator, platform, {"input_filters": spec}), path))


def calibration(path, ckpt: str, threshold: list[float], tare_seconds: float = 0.0,
                platform: str = "so101") -> str:
    ContactCalibration(platform=platform, threshold=threshold, tare_seconds=tare_seconds,
                       model=ckpt, model_sha256=model_sha256(ckpt), quantile=0.999,
                       margin=1.2, frames=100, data=[]).save(path)
    return str(path)


class Tap:
    """The real bus, passed through; keeps every frame the live loop read."""

    def __init__(self, bus) -> None:
        self.bus, self.frames = bus, []

    def read(self):
        frame = self.bus.read()
        self.frames.append(frame)
        return frame

    def __getattr__(self, name: str):
        return getattr(self.bus, name)


@pytest.mark.parametrize("estimator", ["frame", "filter"])
def test_live_contact_is_what_infer_contact_gives_on_the_frames_it_read(
        tmp_path, monkeypatch, estimator) -> None:
    """Every cycle's contact columns equal `infer --contact`'s (eval.contact.contact_columns,
    the batch path over the recording) on the same frames: the causal residual (velocity
    filter, tare over 0.25 s) and the surface search, frame by frame; with either estimator
    of conf/contact/so101.yaml (each frame alone, or the contact filter over frames)."""
    import nactuator.contact.estimate as estimate_mod
    import nactuator.eval.contact as eval_contact
    from nactuator.contact import ContactStream, load_contact_config

    def config(platform, path=None):
        return {**load_contact_config(platform, path), "estimator": estimator}
    monkeypatch.setattr(estimate_mod, "load_contact_config", config)
    monkeypatch.setattr(eval_contact, "load_contact_config", config)
    from nactuator.data import Episode
    from nactuator.data.episodes import filter_episode
    from nactuator.eval.contact import contact_columns
    from nactuator.eval.episodes import predict_episodes

    ckpt = small_bundle(tmp_path / "so101.pt")
    actuator, meta = load_actuator(ckpt)
    so101 = with_hardware(load_platform("so101"), rx_timeout_ms=5000.0, reply_timeout_ms=5000.0)
    # The world arm, torque on and holding, stepped a fixed time per read: it moves alike on
    # an idle and a loaded machine; the untrained model's torque drives a residual of N m.
    with Emulator("feetech", so101, seed=2, step_per_read=so101.control_dt) as follower, \
            open_bus(so101, follower.port) as bus:
        for t in follower.tables.values():
            t.set("Torque_Enable", 1)
        bus.wait_ready()
        tap = Tap(bus)
        # Thresholds every tared frame crosses: the surface search runs on every cycle after
        # the tare window (0.25 s), none before it.
        calib = calibration(tmp_path / "contact.json", ckpt, [1e-9] * JOINTS, tare_seconds=0.25)
        loop = LiveLoop(actuator, tap, so101, bus.read_goal(),
                        input_filters=meta["input_filters"],
                        contact=ContactStream.open(calib, so101, ckpt))
        rows = loop.run(1.0, sink=None)
    assert set(CONTACT_COLUMNS) | {"contact_ms"} <= set(rows[0])
    read = tap.frames
    frames = {k: np.stack([getattr(f, k) for f in read]).astype(np.float32)
              for k in ("q", "qd", "effort", "voltage", "temperature")}
    frames["q_cmd"] = np.tile(loop.q_cmd, (len(read), 1)).astype(np.float32)
    frames["telemetry_valid"] = np.stack([f.valid for f in read]).astype(np.float32)
    recording = filter_episode(Episode(index=0, task="live", split="test", length=len(read),
                                       payload_mass=float("nan"), meta={}, frames=frames),
                               meta["input_filters"])
    preds = predict_episodes(actuator, [recording])
    offline, _ = contact_columns(so101, [recording], preds, calib, ckpt)
    links = [r["contact_link"] for r in rows]
    np.testing.assert_array_equal(links, offline["contact_link"])
    stop = round(0.25 / so101.control_dt)  # the tare window reports nothing, as offline
    assert links[:stop] == [""] * stop
    assert all(links[stop:])  # then a contact on some link every cycle
    assert len({tuple(np.round([r["contact_px"], r["contact_py"], r["contact_pz"]], 4))
                for r in rows[stop:]}) > 1  # and not one fixed answer
    for key in CONTACT_COLUMNS[1:]:
        got = np.array([r[key] for r in rows])
        np.testing.assert_allclose(got, offline[key], rtol=1e-6, atol=1e-6, err_msg=key)
    assert np.isnan([r["contact_fx"] for r in rows if not r["contact_link"]]).all()
    assert all(r["contact_ms"] > 0 for r in rows)


def test_live_cli_reports_contact_columns_and_status(tmp_path, capsys) -> None:
    """`nactuator live --contact FILE` through the CLI: the CSV carries infer's contact
    column names, the status line the latest contact, the summary the flagged cycles."""
    ckpt = small_bundle(tmp_path / "so101.pt")
    calib = calibration(tmp_path / "contact.json", ckpt, [1e-9] * JOINTS)  # flags every cycle
    with Emulator("feetech", "so101", seed=1) as follower:
        code = main(["live", "--ckpt", ckpt, "--platform", "so101", "--port", follower.port,
                     "--seconds", "0.4", "--contact", calib, "--out", str(tmp_path / "l.csv")])
        assert [t.get("Torque_Enable") for t in follower.tables.values()] == [0] * 6
    out, err = capsys.readouterr()
    rows = list(csv.DictReader((tmp_path / "l.csv").open()))
    assert code == 0 and len(rows) == round(0.4 * load_platform("so101").fps)
    assert list(CONTACT_COLUMNS) == [c for c in rows[0] if c.startswith("contact_")
                                     and c != "contact_ms"]
    names = {"upper_arm", "lower_arm", "wrist", "gripper"}  # conf/contact/so101.yaml
    after = [r["contact_link"] for r in rows[10:]]  # past the warm-up frames
    assert set(after) <= names and all(after)
    assert "| contact " in err and "contact on" in out


def test_a_bad_contact_file_is_one_line_naming_the_file_and_field(tmp_path, capsys) -> None:
    ckpt = small_bundle(tmp_path / "so101.pt")
    other = small_bundle(tmp_path / "other.pt", seed=1)
    good = json.loads(open(calibration(tmp_path / "c.json", ckpt, [0.1] * JOINTS)).read())
    cases = {
        "missing.json": (None, "no contact calibration file"),
        "platform.json": ({**good, "platform": "omx"}, "field 'platform' is 'omx'"),
        "sha.json": ({**good, "model_sha256": model_sha256(other)}, "field 'model_sha256'"),
        "count.json": ({**good, "threshold": [0.1, 0.1]}, "field 'threshold' has 2 values"),
        "negative.json": ({**good, "threshold": [0.1, -1, 0.1, 0.1, 0.1]}, "field 'threshold'"),
        "format.json": ({**good, "format": "x"}, "field 'format'"),
        "tare.json": ({**good, "tare_seconds": "1"}, "field 'tare_seconds'"),
    }
    for name, (content, words) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_text(json.dumps(content))
        # /dev/null is no servo bus: every one of these fails before a bus is opened
        code = main(["live", "--ckpt", ckpt, "--platform", "so101", "--port", "/dev/null",
                     "--contact", str(path), "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, (name, err)
        assert str(path) in err[0] and words in err[0], (name, err)


def test_live_contact_on_a_platform_without_contact_links_names_the_config(tmp_path) -> None:
    from nactuator.errors import UserError

    n = load_platform("omx").n
    stats = {k: {"mean": [0.0] * n, "std": [1.0] * n} for k in STATS_KEYS}
    ckpt = str(save_bundle(bundle_to_dict(NeuralActuator(n_motors=n, norm_stats=stats,
                                                         model_config={"arch": "mlp"}), "omx"),
                           tmp_path / "omx.pt"))
    calib = calibration(tmp_path / "omx.json", ckpt, [0.1] * 4, platform="omx")
    with pytest.raises(UserError, match="contact/omx.yaml: no contact configuration"):
        run_live(ckpt, "omx", "/dev/null", contact=calib)
