"""`nactuator eval --baselines ...`: the classical rows land in the same tables as the model.

A small on-disk dataset from the noiseless MuJoCo world of test_baselines.py (free motion,
a held payload, elbow windows with and without a band) and an untrained actuator bundle:
the baselines are fitted on its train split and scored on its test split."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_baselines import (
    PAYLOAD_KG,
    NoiselessWorld,
    condition_episode,
    free_episodes,
    payload_episode,
)

from nactuator.cli import main
from nactuator.data import DatasetWriter, read_dataset
from nactuator.eval import EvalDataError, evaluate
from nactuator.eval.baselines import load_settings
from nactuator.models import NeuralActuator, bundle_to_dict, save_bundle
from nactuator.platforms import load_platform

SMALL = {"arch": "transformer", "history": 9, "d_model": 16, "n_layers": 1, "n_heads": 2,
         "d_ff": 32, "head_hidden": 16}
KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "force", "payload_mass",
        "condition", "timestamp")


def _frames(ep, n):
    f = dict(ep.frames)
    t = ep.length
    f.setdefault("voltage", np.full((t, n), 12.0))
    f.setdefault("temperature", np.full((t, n), 30.0))
    f.setdefault("force", np.full((t, 3), np.nan))
    f.setdefault("payload_mass", np.zeros(t))
    f.setdefault("condition", np.ones((t, n)))
    return {k: np.asarray(f[k], np.float64) for k in KEYS}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("baselines_eval")
    platform = load_platform("so101")
    settings = load_settings()
    world = NoiselessWorld(platform, settings.armature_for(platform)
                           or [c.armature for c in platform.channels])
    data = root / "data"
    with DatasetWriter(data, platform, fps=platform.fps) as w:
        for ep in free_episodes(world, count=3):
            w.add_episode(_frames(ep, platform.n), "free", "train")
        for i in range(6):
            ep = condition_episode(platform, i, degraded=i % 2 == 1, seed=i, world=world)
            w.add_episode(_frames(ep, platform.n), ep.task, "train")
        w.add_episode(_frames(payload_episode(world, moving=False), platform.n), "payload",
                      "test")
        w.add_episode(_frames(free_episodes(world, count=5)[4], platform.n), "free", "test")
        for i in range(2):
            ep = condition_episode(platform, 10 + i, degraded=i == 1, seed=50 + i,
                                   world=world)
            w.add_episode(_frames(ep, platform.n), ep.task, "test")
    ds = read_dataset(data)
    stats = {}
    for key in ("q_cmd", "q", "qd", "effort", "voltage", "temperature"):
        x = ds.frames[key].astype(np.float64)
        stats[key] = {"mean": x.mean(0).tolist(), "std": (x.std(0) + 1e-3).tolist()}
    x = ds.frames["q_cmd"] - ds.frames["q"]
    stats["error"] = {"mean": x.mean(0).tolist(), "std": (x.std(0) + 1e-3).tolist()}
    actuator = NeuralActuator(n_motors=platform.n, norm_stats=stats, model_config=SMALL)
    ckpt = save_bundle(bundle_to_dict(actuator, "so101"), root / "untrained.pt")
    return {"root": root, "data": data, "ckpt": ckpt}


@pytest.mark.slow  # ~60 s on 2 cores (every baseline fitted); `make test-slow-sample` runs it in CI
def test_eval_cli_adds_one_row_per_baseline_to_every_table(case, capsys):
    out = case["root"] / "eval_all"
    assert main(["eval", "--ckpt", str(case["ckpt"]), "--data", str(case["data"]),
                 "--split", "test", "--out", str(out), "--baselines", "all"]) == 0
    text = capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    assert m["baselines"]["methods"] == ["id-linear", "id-friction", "gmo", "gmo-friction",
                                         "threshold", "svm", "random-forest"]
    # Force tables: every force baseline and the model on the recorded state, every horizon.
    force = m["aggregate"]["all"]["mean"]["force"]
    for method in ("model", "linear_regression", "id-linear", "id-friction", "gmo",
                   "gmo-friction", "model_causal"):
        assert set(force[method]) >= {"@10", "@100", "full"}, method
    for row in ("ID-Linear (classical)", "ID-Friction (classical)",
                "momentum observer (classical)", "model (causal, recorded state)",
                "## Classical baselines", "### Current-to-torque calibration",
                "### No contact", "### Motor condition per window", "SVM-RBF (classical)"):
        assert row in text, row
    # The payload test episode: ID-Linear knows the answer of the noiseless world.
    payload = next(e for e in m["per_episode"] if e["task"] == "payload")
    assert payload["force"]["id-linear"]["full"]["mae_z"] < 0.05 * PAYLOAD_KG * 9.81
    assert payload["force"]["id-linear"]["full"]["mae"] < \
        0.2 * payload["force"]["model"]["full"]["mae"]
    # No-contact rows: the free-motion test run is a no-contact run for every method.
    runs = m["aggregate"]["no_contact"]["mean"]["baselines"]["no_contact_run"]
    assert runs["id-linear"]["false_contact_rate"] < 0.02  # the filters start at frame 0
    assert runs["id-linear"]["frames"] > 0 and "model_causal" in runs
    # Condition: pooled windows of the elbow, classical and model side by side.
    cond = m["baselines"]["condition"]
    assert cond["positives"] > 0 and cond["windows"] > cond["positives"]
    assert set(cond["methods"]) == {"threshold", "svm", "random-forest", "model_rollout",
                                    "model_causal"}
    assert cond["methods"]["random-forest"]["accuracy"] >= 0.9
    assert m["baselines"]["fit"]["condition"]["channels"] == ["elbow_flex"]


def test_eval_without_baselines_is_unchanged_and_bad_names_fail_early(case):
    out = case["root"] / "eval_none"
    evaluate(case["ckpt"], case["data"], split="test", out=out)
    m = json.loads((out / "metrics.json").read_text())
    assert "baselines" not in m
    assert set(m["aggregate"]["all"]["mean"]["force"]) == {"model", "model_causal",
                                                         "linear_regression"}
    with pytest.raises(EvalDataError, match="unknown baseline"):
        evaluate(case["ckpt"], case["data"], split="test", out=out, baselines="gmo,lstm")
