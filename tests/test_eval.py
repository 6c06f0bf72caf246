"""End-to-end evaluation: a tiny real-format dataset, an untrained actuator bundle, the real
simulator. Checks the files a user gets and the errors a user can run into."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from nactuator.data import DatasetWriter, read_dataset
from nactuator.eval import EvalDataError, evaluate
from nactuator.eval.infer import infer
from nactuator.eval.protocol import episode_rollouts
from nactuator.models import NeuralActuator, bundle_to_dict, save_bundle
from nactuator.platforms import load_platform

PLATFORM = "so101"
SMALL = {"arch": "transformer", "window_length": 9, "d_model": 16, "n_layers": 1, "n_heads": 2,
         "d_ff": 32, "head_hidden": 16}


def synthetic_frames(platform, length: int, seed: int, payload: bool) -> dict:
    rng = np.random.default_rng(seed)
    n = platform.n
    t = np.arange(length)[:, None] * platform.control_dt
    q = 0.2 * np.sin(2.0 * t + np.arange(n)) + 0.005 * rng.normal(size=(length, n))
    force = np.full((length, 3), np.nan)
    if payload:
        force[length // 3: 2 * length // 3, 2] = -4.9
    return {
        "q_cmd": q + 0.02,
        "q": q,
        "qd": np.gradient(q, axis=0) / platform.control_dt,
        "effort": 0.1 * rng.normal(size=(length, n)),
        "voltage": 12.0 + 0.05 * rng.normal(size=(length, n)),
        "temperature": 35.0 + rng.normal(size=(length, n)),
        "force": force,
        "timestamp": np.arange(length) * platform.control_dt,
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A dataset (3 train, 1 test with payload, 1 test without) and an untrained bundle."""
    root = tmp_path_factory.mktemp("eval")
    platform = load_platform(PLATFORM)
    data = root / "data"
    with DatasetWriter(data, platform, fps=platform.fps) as w:
        for i in range(3):
            w.add_episode(synthetic_frames(platform, 80, i, payload=True), "carry", "train")
        w.add_episode(synthetic_frames(platform, 120, 10, payload=True), "carry", "test")
        w.add_episode(synthetic_frames(platform, 60, 11, payload=False), "idle", "test")
    ds = read_dataset(data)
    stats = {}
    for key in ("q_cmd", "q", "qd", "effort", "voltage", "temperature"):
        x = ds.frames[key].astype(np.float64)
        stats[key] = {"mean": x.mean(0).tolist(), "std": x.std(0).tolist()}
    x = ds.frames["q_cmd"] - ds.frames["q"]
    stats["error"] = {"mean": x.mean(0).tolist(), "std": (x.std(0) + 1e-3).tolist()}
    actuator = NeuralActuator(n_motors=platform.n, norm_stats=stats, model_config=SMALL)
    ckpt = save_bundle(bundle_to_dict(actuator, PLATFORM), root / "untrained.pt")
    return {"root": root, "data": data, "ckpt": ckpt, "platform": platform, "actuator": actuator,
            "dataset": ds}


def test_evaluate_writes_metrics_tables_and_plots(tiny):
    out = tiny["root"] / "eval_out"
    text = evaluate(tiny["ckpt"], tiny["data"], split="test", out=out)
    files = {p.name for p in out.iterdir()}
    assert {"metrics.json", "metrics.md"} <= files
    pngs = [p for p in out.iterdir() if p.suffix == ".png"]
    assert len(pngs) == 4  # joints + force for each of the 2 test episodes
    assert all(p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    assert (out / "metrics.md").read_text() == text

    m = json.loads((out / "metrics.json").read_text())
    assert m["platform"] == PLATFORM and m["episodes"] == 2 and m["steps"] == 119 + 59
    # A bare bundle has no training config and no spec: raw temperature, zero fill (legacy).
    assert m["input_filters"]["median"] == {} and m["input_filters"]["missing"] == "zero"
    mean = m["aggregate"]["all"]["mean"]
    # @10 exists for both, @100 only for the 120-frame episode; longer ones are skipped.
    assert set(mean["joints"]["model"]) == {"@10", "@100", "full"}
    assert any("@300 skipped for 2 of 2" in note for note in m["notes"])
    # The full-trajectory joint MAE, recomputed here: per episode mean |x[t] - q[t+1]| in
    # degrees (x = the rollout's q, or q_cmd for command following), then the mean over the
    # two tasks (one episode each).
    from nactuator.sim import Simulator

    assert all(c.kind == "revolute" for c in tiny["platform"].channels)
    episodes = [e for e in tiny["dataset"].episodes if e.split == "test"]
    rolled = episode_rollouts(tiny["actuator"], Simulator(tiny["platform"]), episodes)
    for method, predicted in (("model", [r.q[1:] for r in rolled]),
                              ("command_following", [e.frames["q_cmd"][:-1] for e in episodes])):
        per_episode = [np.degrees(np.abs(x.astype(np.float64) - e.frames["q"][1:])).mean(0)
                       for x, e in zip(predicted, episodes, strict=True)]
        np.testing.assert_allclose(mean["joints"][method]["full"], np.mean(per_episode, 0),
                                   rtol=1e-5, atol=1e-6, err_msg=method)
    # q_cmd = q + 0.02 rad: command following is off by 0.02 rad = 1.146 deg on every joint
    # (q_cmd[i] vs q[i+1] adds the one-step motion, so it is at least that on average).
    assert min(mean["joints"]["command_following"]["@10"]) > 0.5
    assert set(mean["force"]) == {"model", "model_causal", "linear_regression"}
    # The idle task is a no-contact run; its force magnitude and false contacts are reported.
    assert m["aggregate"]["no_contact"]["tasks"].keys() == {"idle"}
    assert m["aggregate"]["contact"]["tasks"].keys() == {"carry"}
    assert "gate" in m["aggregate"]["contact"]["mean"]
    assert "## Joint rollout MAE" in text and "linear regression (train split)" in text


def test_rollout_starts_at_recorded_q0_and_follows_the_simulator(tiny):
    from nactuator.sim import Simulator

    platform, actuator = tiny["platform"], tiny["actuator"]
    episodes = [e for e in tiny["dataset"].episodes if e.split == "test"]
    sim = Simulator(platform)
    ro = episode_rollouts(actuator, sim, episodes)
    assert [r.q.shape for r in ro] == [(120, 6), (60, 6)]
    assert np.allclose(ro[0].q[0], episodes[0].frames["q"][0], atol=1e-6)
    assert np.all(np.isfinite(ro[0].q))
    # Batched rollouts equal one-episode rollouts: episodes do not leak into each other.
    alone = episode_rollouts(actuator, sim, episodes[1:])[0]
    assert np.abs(alone.q - ro[1].q).max() < 1e-5
    assert np.abs(alone.force - ro[1].force).max() < 1e-5
    assert actuator.training  # the fixture's module is left in the mode it was given
    again = episode_rollouts(actuator, sim, episodes[1:])[0]
    assert np.array_equal(again.q, alone.q)  # an evaluation repeats bit for bit


def test_wrong_platform_is_a_clear_error(tiny):
    omx = load_platform("omx")
    ds = tiny["dataset"]
    stats = {k: {"mean": [0.0] * omx.n, "std": [1.0] * omx.n}
             for k in ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")}
    actuator = NeuralActuator(n_motors=omx.n, norm_stats=stats, model_config=SMALL)
    ckpt = save_bundle(bundle_to_dict(actuator, "omx"), tiny["root"] / "omx.pt")
    with pytest.raises(EvalDataError, match=r"platform 'so101' but the checkpoint is for 'omx'"):
        evaluate(ckpt, ds.root, split="test", out=tiny["root"] / "never")
    assert not (tiny["root"] / "never").exists()


def test_missing_model_input_is_a_clear_error(tiny):
    from nactuator.sim import Simulator

    ep = [e for e in tiny["dataset"].episodes if e.split == "test"][0]
    broken = type(ep)(index=ep.index, task=ep.task, split=ep.split, length=ep.length,
                      payload_mass=ep.payload_mass, meta=ep.meta,
                      frames={k: v for k, v in ep.frames.items() if k != "effort"})
    actuator = tiny["actuator"]
    with pytest.raises(EvalDataError, match="needs channel 'effort' but the data lacks it"):
        episode_rollouts(actuator, Simulator(tiny["platform"]), [broken])


def test_empty_split_is_a_clear_error(tiny):
    with pytest.raises(EvalDataError, match="no episodes in split 'validation'"):
        evaluate(tiny["ckpt"], tiny["data"], split="validation", out=tiny["root"] / "e2")


def test_infer_writes_one_row_per_frame_with_all_columns(tiny):
    csv = tiny["root"] / "infer" / "pred.csv"
    summary = infer(tiny["ckpt"], tiny["data"], split=None, out=csv)
    df = pd.read_csv(csv)
    names = tiny["platform"].channel_names
    assert list(df.columns) == (["episode", "frame", "timestamp", "fx", "fy", "fz", "gate"]
                                + [f"condition_{n}" for n in names])
    assert len(df) == 3 * 80 + 120 + 60
    assert df.groupby("episode")["frame"].max().tolist() == [79, 79, 79, 119, 59]
    assert df["gate"].between(0, 1).all() and np.isfinite(df[["fx", "fy", "fz"]]).all().all()
    assert "420 frames" in summary and "frames/s" in summary and "force MAE" in summary

    only = infer(tiny["ckpt"], tiny["data"], split="test", out=csv, force_only=True)
    df = pd.read_csv(csv)
    assert list(df.columns) == ["episode", "frame", "timestamp", "fx", "fy", "fz", "gate"]
    assert len(df) == 180 and "180 frames" in only


def test_infer_is_causal(tiny):
    """Changing the future never changes an estimate of the past."""
    from nactuator.eval.infer import predict_episodes

    ep = [e for e in tiny["dataset"].episodes if e.split == "test"][0]
    frames = {k: v.copy() for k, v in ep.frames.items()}
    frames["effort"][60:] += 1.0
    changed = type(ep)(index=ep.index, task=ep.task, split=ep.split, length=ep.length,
                       payload_mass=math.nan, meta={}, frames=frames)
    a, b = predict_episodes(tiny["actuator"], [ep, changed])
    assert np.allclose(a["force"][:60], b["force"][:60], atol=1e-6)
    assert not np.allclose(a["force"][60:], b["force"][60:], atol=1e-6)
