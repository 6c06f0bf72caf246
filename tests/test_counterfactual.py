"""Counterfactual actuator models (issue 13): inputs known before execution only, the
firmware duty feature, BAM's benchmark metric, planning through the model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from nactuator.data import read_dataset
from nactuator.data.commands import command_channels
from nactuator.data.importers import import_bam, read_bam_log
from nactuator.experiments.bam import BENCH_SPLITS, BenchError, bam_mae, bench_bam, score_bam
from nactuator.models import NeuralActuator, bundle_to_dict, load_actuator, save_bundle
from nactuator.models.features import COUNTERFACTUAL_FEATURES, DEFAULT_FEATURES
from nactuator.models.firmware import FirmwareLaw
from nactuator.platforms import load_platform
from nactuator.rollout import closed_loop_rollout, episode_block

PENDULUM = load_platform("pendulum")
FIRMWARE = PENDULUM.hardware["firmware"]
MLP = {"arch": "mlp", "hidden": 16, "n_layers": 1, "head_hidden": 16, "dropout": 0.0}
KP800 = ("2026-01-15_10h29m47.json", "2026-01-15_10h29m54.json", "2026-01-15_10h30m02.json",
         "2026-01-15_10h30m10.json")


def stats_of(frames: dict) -> dict:
    out = {}
    for key in ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "supply_voltage",
                "initial_temperature"):
        x = np.asarray(frames[key], np.float64)
        out[key] = {"mean": x.mean(0).tolist(), "std": np.maximum(x.std(0), 0.1).tolist()}
    err = np.asarray(frames["q_cmd"], np.float64) - frames["q"]
    out["error"] = {"mean": err.mean(0).tolist(), "std": err.std(0).tolist()}
    return out


@pytest.fixture(scope="module")
def bam_log(bam_dir):
    """One kp 400 BAM log on the control grid, with its command channels."""
    ep = read_bam_log(bam_dir / "xl330" / "raw" / "2026-01-15_10h29m14.json")
    frames = {**ep.frames, **command_channels(ep.frames, ep.meta)}
    return ep, frames


def _actuators(frames):
    torch.manual_seed(0)
    stats = stats_of(frames)
    counterfactual = NeuralActuator(list(COUNTERFACTUAL_FEATURES), 1, stats,
                                    {**MLP, "firmware": FIRMWARE,
                                     "physics": {"kind": "dc_motor"}}).eval()
    telemetry = NeuralActuator(list(DEFAULT_FEATURES), 1, stats, {**MLP}).eval()
    return counterfactual, telemetry


def _rollout(actuator, sim, frames, steps=60):
    keys = [*actuator.inputs, *(k for k in ("q", "qd") if k not in actuator.inputs)]
    block = episode_block([{k: v[: steps + 1] for k, v in frames.items()}], keys, 9)
    with torch.no_grad():
        return closed_loop_rollout(actuator, sim.step, block, 9).q[0, :, 0].numpy()


# ------------------------------------------------------------------ what the model reads


def test_counterfactual_rollout_ignores_recorded_telemetry(bam_log, sims):
    """Perturbing the recorded effort/voltage/temperature traces changes the telemetry-
    conditioned rollout and leaves the counterfactual one bit-identical."""
    _, frames = bam_log
    counterfactual, telemetry = _actuators(frames)
    assert counterfactual.mode == "counterfactual" and telemetry.mode == "telemetry"
    assert not {"effort", "voltage", "temperature"} & set(counterfactual.inputs)
    rng = np.random.default_rng(0)
    perturbed = dict(frames)
    for key, scale in (("effort", 0.5), ("voltage", 1.0), ("temperature", 5.0)):
        perturbed[key] = frames[key] + scale * rng.normal(size=frames[key].shape)
    sim = sims["pendulum"]
    np.testing.assert_array_equal(_rollout(counterfactual, sim, frames),
                                  _rollout(counterfactual, sim, perturbed))
    changed = np.abs(_rollout(telemetry, sim, frames) - _rollout(telemetry, sim, perturbed))
    assert changed.max() > 1e-4


def test_checkpoints_say_which_mode_they_are(bam_log, tmp_path):
    _, frames = bam_log
    for actuator, mode in zip(_actuators(frames), ("counterfactual", "telemetry"), strict=True):
        path = save_bundle(bundle_to_dict(actuator, "pendulum"), tmp_path / f"{mode}.pt")
        assert torch.load(path, weights_only=True)["mode"] == mode
        loaded, meta = load_actuator(path)
        assert meta["mode"] == mode and loaded.mode == mode


def test_duty_feature_matches_the_documented_firmware_law(bam_log):
    """PresentPWM = kp (goal - position)[counts] / 256, saturating at +-885 (BAM README):
    the feature reproduces the servo's own PWM register within a few counts."""
    ep, frames = bam_log
    law = FirmwareLaw.from_config(FIRMWARE)
    t = lambda k: torch.as_tensor(frames[k][:, 0])  # noqa: E731
    duty = law.duty(t("q_cmd"), t("q"), t("kp"), t("torque_enable")).numpy()
    counts = ep.meta["kp"] * (frames["q_cmd"][:, 0] - frames["q"][:, 0]) * 4096 / (2 * np.pi) / 256
    np.testing.assert_allclose(duty * 885, np.clip(counts, -885, 885), atol=1e-3)
    recorded = frames["pwm"][:, 0]  # the decoded Present PWM register
    assert np.abs(duty - recorded).mean() * 885 < 6.0  # counts, of 885
    assert np.corrcoef(duty, recorded)[0, 1] > 0.999
    assert (np.abs(recorded) > 0.99).any() and np.abs(duty).max() == pytest.approx(1.0)


def test_duty_is_zero_with_torque_off(bam_dir):
    ep = read_bam_log(bam_dir / "xl330" / "raw" / "2026-01-15_10h29m21.json")  # lift_and_drop
    frames = {**ep.frames, **command_channels(ep.frames, ep.meta)}
    off = frames["torque_enable"][:, 0] == 0
    assert 0.6 < off.mean() < 0.7
    law = FirmwareLaw.from_config(FIRMWARE)
    duty = law.duty(*(torch.as_tensor(frames[k][:, 0])
                      for k in ("q_cmd", "q", "kp", "torque_enable"))).numpy()
    assert (duty[off] == 0).all() and (np.abs(duty[~off]) > 0).mean() > 0.9


def test_command_channels_hold_what_is_known_before_execution(bam_log):
    ep, frames = bam_log
    assert (frames["kp"] == 400).all()
    np.testing.assert_allclose(frames["supply_voltage"][:, 0], ep.frames["voltage"][0, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(frames["initial_temperature"][:, 0],
                               ep.frames["temperature"][0, 0], rtol=1e-6)
    np.testing.assert_allclose(frames["q_cmd_next"][:-1], ep.frames["q_cmd"][1:], rtol=1e-6)


# ------------------------------------------------------------------------ BAM benchmark


@pytest.fixture(scope="module")
def kp800(bam_dir, tmp_path_factory):
    src = tmp_path_factory.mktemp("bam800")
    for name in KP800:
        (src / name).write_bytes((bam_dir / "xl330" / "raw" / name).read_bytes())
    out = tmp_path_factory.mktemp("bench") / "data"
    import_bam(src, out, splits=BENCH_SPLITS, grid="bam")
    return out


def test_bam_grid_reproduces_bams_processed_logs(kp800, bam_dir):
    for ep in read_dataset(kp800).episodes:
        processed = json.loads((bam_dir / "xl330" / "processed" / ep.meta["source"]).read_text())
        q = np.array([e["position"] for e in processed["entries"]])
        goal = np.array([e["goal_position"] for e in processed["entries"]])
        assert ep.length == len(q) and ep.split == "test"
        np.testing.assert_allclose(ep.frames["q"][:, 0], q, atol=1e-6)
        np.testing.assert_allclose(ep.frames["q_cmd"][:, 0], goal, atol=1e-6)


def test_bench_metric_reproduces_the_trivial_anchors(kp800):
    """q = goal scores 501.7 mrad and holding the first position 573.8 mrad on the kp 800
    logs: the figures measured with BAM's own tools (issue 13)."""
    episodes = read_dataset(kp800).episodes
    goal = np.mean([bam_mae(e.frames["q_cmd"][:, 0], e.frames["q"][:, 0]) for e in episodes])
    hold = np.mean([bam_mae(np.full(e.length, e.frames["q"][0, 0]), e.frames["q"][:, 0])
                    for e in episodes])
    assert 1000 * goal == pytest.approx(501.7, abs=0.1)
    assert 1000 * hold == pytest.approx(573.8, abs=0.1)


def test_score_bam_reports_ours_beside_the_anchors(kp800, tmp_path):
    ds = read_dataset(kp800)
    frames = {**ds.episodes[0].frames,
              **command_channels(ds.episodes[0].frames, ds.episodes[0].meta)}
    counterfactual, telemetry = _actuators(frames)
    ckpt = save_bundle(bundle_to_dict(counterfactual, "pendulum"), tmp_path / "cf.pt")
    result = score_bam(ckpt, kp800, tmp_path / "out")
    assert [r["trajectory"] for r in result["per_log"]] == [
        "sin_sin", "lift_and_drop", "up_and_down", "sin_time_square"]
    assert result["trivial"]["q = goal"] == pytest.approx(501.7, abs=0.1)
    # The untrained DC-motor prior already beats both trivial predictors by far.
    assert result["ours_mrad"] < 0.5 * result["trivial"]["q = goal"]
    assert (tmp_path / "out" / "bench_kp800.png").stat().st_size > 10_000
    assert "BAM M4" in (tmp_path / "out" / "bench.md").read_text()
    tele = save_bundle(bundle_to_dict(telemetry, "pendulum"), tmp_path / "tele.pt")
    with pytest.raises(Exception, match="recorded telemetry"):
        score_bam(tele, kp800, tmp_path / "out2")


def test_bench_refuses_data_not_imported_on_bams_grid(bam_dir, tmp_path):
    """A reused <out>/data imported with the platform's default grid would score against
    shifted samples: refused, naming the episode."""
    import_bam(bam_dir / "xl330" / "raw" / KP800[0], tmp_path / "out" / "data")
    with pytest.raises(BenchError, match="not the bench's import"):
        bench_bam(bam_dir / "xl330" / "raw", tmp_path / "out", ckpt="unused.ckpt")


# -------------------------------------------------------------------------------- plan


def test_plan_lowers_the_tracking_error_of_the_model(tmp_path, sims):
    """A short sine the position servo lags behind: optimising the commands through the
    model cuts the model's tracking error well below sending the target as the goal."""
    from nactuator.planning import optimise_commands, plan

    t = np.arange(80) * PENDULUM.control_dt
    target = (0.6 * np.sin(2 * np.pi * 1.5 * t))[:, None]
    stats = {k: {"mean": [0.0], "std": [1.0]} for k in ("q", "qd", "supply_voltage")}
    torch.manual_seed(0)
    model = NeuralActuator(list(COUNTERFACTUAL_FEATURES), 1, stats,
                           {**MLP, "firmware": FIRMWARE, "physics": {"kind": "dc_motor"}})
    exo = {"kp": np.array([200.0]), "supply_voltage": np.array([7.4]),
           "initial_temperature": np.array([30.0])}
    result = optimise_commands(model, sims["pendulum"], target, exo, iterations=30, lr=0.05)
    assert result.model_mae_plan < 0.5 * result.model_mae_naive
    # Through the CLI function: a CSV target, a checkpoint, files written.
    ckpt = save_bundle(bundle_to_dict(model, "pendulum"), tmp_path / "cf.pt")
    pd.DataFrame({"time": t, "pendulum": target[:, 0]}).to_csv(tmp_path / "t.csv", index=False)
    text = plan(ckpt, tmp_path / "t.csv", out=tmp_path / "plan", iterations=3, kp=200,
                supply_voltage=7.4, temperature=30.0)
    assert "optimised commands" in text
    commands = pd.read_csv(tmp_path / "plan" / "commands.csv")
    assert list(commands.columns) == ["time", "pendulum"] and len(commands) == len(t)


def test_plan_refuses_missing_exogenous_inputs(sims):
    from nactuator.planning import PlanError, optimise_commands

    stats = {k: {"mean": [0.0], "std": [1.0]} for k in ("q", "qd", "supply_voltage")}
    model = NeuralActuator(list(COUNTERFACTUAL_FEATURES), 1, stats,
                           {**MLP, "firmware": FIRMWARE, "physics": {"kind": "dc_motor"}})
    with pytest.raises(PlanError, match="--kp"):
        optimise_commands(model, sims["pendulum"], np.zeros((10, 1)),
                          {"supply_voltage": np.array([7.4])}, iterations=1)


def test_replayed_commands_drive_the_hidden_world():
    """The world replay used to judge a plan: the arm follows a held goal, and frame k is
    read before goal k is written."""
    from nactuator.data.synth import replay_commands

    commands = np.zeros((2, 120, 1))
    commands[1, 10:] = 0.5
    logs = replay_commands(PENDULUM, commands, np.zeros(1), kp=400.0)
    assert logs["q"].shape == (2, 120, 1) and logs["kp"].tolist() == [400.0]
    assert np.abs(logs["q"][0]).max() < 0.02
    assert np.abs(logs["q"][1, :11]).max() < 0.02 and logs["q"][1, -1, 0] > 0.25
    assert 6.0 < logs["voltage"][0, 0, 0] < 8.0


def test_live_refuses_a_counterfactual_checkpoint(bam_log, tmp_path):
    """The live loop streams telemetry, not the gain or the pre-motion supply: a clear
    error before any port is opened."""
    from nactuator.control.live import run_live

    ckpt = save_bundle(bundle_to_dict(_actuators(bam_log[1])[0], "pendulum"), tmp_path / "c.pt")
    with pytest.raises(ValueError, match="does not stream"):
        run_live(ckpt, "pendulum", port=str(tmp_path / "no-such-port"), seconds=1.0)


def test_physics_lr_and_backbone_lr_scale_give_three_disjoint_groups():
    """A counterfactual fine-tune: network heads at lr, encoder at lr x scale, the DC motor's
    constants at physics_lr without weight decay; every parameter in exactly one group."""
    from nactuator.training.module import NeuralActuatorModule

    module = NeuralActuatorModule(
        platform="pendulum", arch="mlp", width=16, depth=1,
        model_sizes={"head_hidden": 16, "dropout": 0.0, "physics": {"kind": "dc_motor"}},
        features=list(COUNTERFACTUAL_FEATURES), lr=1e-3, lr_total_steps=10,
        physics_lr=3e-2, backbone_lr_scale=0.1)
    stats = {k: {"mean": [0.0], "std": [1.0]} for k in ("q", "qd", "supply_voltage")}
    module.build_actuator(stats)
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert [g["name"] for g in groups] == ["heads", "backbone", "physics"]
    assert [g["initial_lr"] for g in groups] == pytest.approx([1e-3, 1e-4, 3e-2])
    assert groups[2]["weight_decay"] == 0.0
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(module.actuator.parameters()))
    assert set(ids[-len(groups[2]["params"]):]) == {
        id(p) for p in module.actuator.physics.parameters()}
