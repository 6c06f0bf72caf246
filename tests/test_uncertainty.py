"""nactuator.uncertainty and the force interval: β-NLL, conformal calibration by episode,
coverage, and the interval in infer / export / eval; models without the head unchanged."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import norm
from test_eval import SMALL, tiny  # noqa: F401  (the module fixture: data + stats)
from test_models import make_stats, make_window

from nactuator.eval import evaluate
from nactuator.eval.infer import infer
from nactuator.eval.intervals import SCORES_FILE, calibrate, interval_scores, load_scores
from nactuator.experiments.cv import interval_rows
from nactuator.export import export, load_torchscript
from nactuator.models import NeuralActuator, bundle_to_dict, load_actuator, save_bundle
from nactuator.models.bundle import set_calibration
from nactuator.uncertainty import (
    GAUSSIAN_Z90,
    beta_nll,
    calibration_record,
    conformal_scale,
    coverage_metrics,
    cross_fold_coverage,
    episode_coverage,
    gate_scales,
    scale_per_element,
)

FULL = ["command", "state", "telemetry", "error"]
TINY = {"arch": "transformer", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32,
        "head_hidden": 16}


# ----------------------------------------------------------------------------- β-NLL

@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_beta_nll_value_and_gradient_match_the_formula(beta):
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(4, 6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    log_var = (0.5 * torch.randn(4, 6, 3, generator=g, dtype=torch.float64)).requires_grad_()
    target = torch.randn(4, 6, 3, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=g) > 0.3
    loss = beta_nll(mean, log_var, target, mask, beta)
    loss.backward()

    m, lv, y = mean.detach().numpy(), log_var.detach().numpy(), target.numpy()
    keep = np.repeat(mask.numpy()[..., None], 3, axis=-1).astype(float)
    var, count = np.exp(lv), keep.sum()
    weight = var ** beta  # a constant of the gradient (stop-grad)
    value = (weight * 0.5 * (lv + (y - m) ** 2 / var) * keep).sum() / count
    d_mean = weight * (m - y) / var * keep / count
    d_log_var = weight * 0.5 * (1.0 - (y - m) ** 2 / var) * keep / count
    assert loss.item() == pytest.approx(value, rel=1e-12)
    np.testing.assert_allclose(mean.grad.numpy(), d_mean, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(log_var.grad.numpy(), d_log_var, rtol=1e-10, atol=1e-14)


def test_beta_zero_is_torch_gaussian_nll():
    g = torch.Generator().manual_seed(1)
    mean, target = torch.randn(50, 3, generator=g), torch.randn(50, 3, generator=g)
    log_var = torch.randn(50, 3, generator=g)
    expected = torch.nn.functional.gaussian_nll_loss(mean, target, log_var.exp(), eps=0.0)
    assert beta_nll(mean, log_var, target, beta=0.0).item() == pytest.approx(expected.item(),
                                                                              rel=1e-5)


# ------------------------------------------------------------------- conformal by episode

def toy_episode(rng, frames=400, overconfidence=2.0):
    """A heteroscedastic episode: true σ varies over time (and per episode); the model's σ
    is the true one divided by ``overconfidence``. Returns the normalised scores."""
    t = np.linspace(0, 6, frames)[:, None]
    sigma_true = (0.05 + 0.5 * np.abs(np.sin(t + rng.uniform(0, 3)))) * np.ones((1, 3))
    error = rng.normal(size=sigma_true.shape) * sigma_true
    return np.abs(error) / (sigma_true / overconfidence)


def test_conformal_scale_covers_a_heteroscedastic_toy_with_known_sigma():
    rng = np.random.default_rng(0)
    calibration = [toy_episode(rng) for _ in range(30)]
    fit = conformal_scale(calibration, 0.9)
    # The exact answer: conformal risk control with n = 30 episodes asks for a mean
    # miscoverage of ((n + 1) α − 1) / n = 0.07, and 2 |N(0, 1)| exceeds 2 Φ⁻¹(1 − 0.035)
    # with probability 0.07.
    miss = (31 * 0.1 - 1) / 30
    assert fit["scale"] == pytest.approx(2.0 * norm.ppf(1 - miss / 2), rel=0.03)
    assert fit["guarantee"] and fit["episodes"] == 30 and fit["target"] > 0.9
    fresh = [toy_episode(rng) for _ in range(200)]
    assert episode_coverage(fresh, fit["scale"]).mean() >= 0.9
    # Uncalibrated, the Gaussian 1.645 σ of an overconfident model covers far less.
    assert episode_coverage(fresh, GAUSSIAN_Z90).mean() < 0.65


def test_few_calibration_episodes_have_no_finite_sample_guarantee():
    rng = np.random.default_rng(1)
    fit = conformal_scale([toy_episode(rng) for _ in range(3)], 0.9)
    assert not fit["guarantee"] and fit["target"] == pytest.approx(0.9)
    # 9 episodes at 90 % is exactly enough ((n + 1) alpha = 1): the bound allows no miss, so
    # the scale covers every score of every episode.
    nine = [toy_episode(rng) for _ in range(9)]
    fit = conformal_scale(nine, 0.9)
    assert fit["guarantee"] and fit["target"] == pytest.approx(1.0)
    assert fit["scale"] == max(float(np.max(s)) for s in nine)
    with pytest.raises(ValueError, match="at least one"):
        conformal_scale([np.array([np.nan])])
    # without the finite-sample bound the same nine aim at 90 % on average, not 100 %
    plain = conformal_scale(nine, 0.9, finite_sample=False)
    assert not plain["guarantee"] and plain["target"] == pytest.approx(0.9)
    assert episode_coverage(nine, plain["scale"]).mean() == pytest.approx(0.9, abs=0.01)


def test_cross_fold_calibration_never_uses_the_fold_it_judges():
    rng = np.random.default_rng(2)
    folds = [[toy_episode(rng, overconfidence=1.0) for _ in range(3)] for _ in range(3)]
    folds[0] = [10.0 * s for s in folds[0]]  # fold 0's model is 10x overconfident
    rows = cross_fold_coverage(folds, 0.9)
    assert rows[0]["episodes"] == 6 and rows[0]["coverage"] < 0.5  # others' scale: too small
    assert rows[1]["scale"] > 2 * rows[0]["scale"]  # fold 0's episodes widen the others'
    assert all(r["test_episodes"] == 3 for r in rows)


def gated_episode(rng, frames=300, contact_factor=3.0):
    """Scores (T, 3) of a model whose σ is right off contact and ``contact_factor`` times
    too small in contact (the shape §13 measured), and the gate (T,) that says contact:
    a third of the frames, in one block."""
    contact = np.zeros(frames, bool)
    start = rng.integers(0, 2 * frames // 3)
    contact[start:start + frames // 3] = True
    z = np.abs(rng.normal(size=(frames, 3)))
    return np.where(contact[:, None], contact_factor * z, z), contact


def test_gate_scales_cover_contact_and_free_frames_alike():
    rng = np.random.default_rng(5)
    cal = [gated_episode(rng) for _ in range(40)]
    fresh = [gated_episode(rng) for _ in range(200)]

    def coverage(scale, by_gate=None):
        per_group = {"contact": [], "free": []}
        for s, c in fresh:
            covered = s <= scale_per_element(scale, c, by_gate)
            per_group["contact"].append(covered[c].mean())
            per_group["free"].append(covered[~c].mean())
        return {k: float(np.mean(v)) for k, v in per_group.items()}

    one = conformal_scale([s for s, _ in cal], 0.9)
    single = coverage(one["scale"])
    # one scale: too narrow in contact, too wide off it (both sides of 90 %)
    assert single["contact"] < 0.8 and single["free"] > 0.95
    fits = gate_scales([s for s, _ in cal], [c for _, c in cal], 0.9)
    assert fits["fallback"] is None and fits["contact"]["episodes"] == 40
    # independently: |N(0,1)| exceeds Φ⁻¹(1 − m/2) with probability m, m the CRC miss at n=40
    miss = (41 * 0.1 - 1) / 40
    assert fits["free"]["scale"] == pytest.approx(norm.ppf(1 - miss / 2), rel=0.05)
    assert fits["contact"]["scale"] == pytest.approx(3 * norm.ppf(1 - miss / 2), rel=0.05)
    by_gate = {k: fits[k]["scale"] for k in ("free", "contact")}
    gated = coverage(fits["free"]["scale"], by_gate)
    assert 0.9 <= gated["contact"] <= 0.95 and 0.9 <= gated["free"] <= 0.95


def test_gate_scales_fall_back_when_the_gate_never_opens():
    rng = np.random.default_rng(6)
    cal = [gated_episode(rng) for _ in range(5)]
    fits = gate_scales([s for s, _ in cal], [np.zeros(len(c), bool) for _, c in cal], 0.9)
    assert fits["fallback"] == "contact" and fits["contact"]["scale"] == fits["free"]["scale"]
    with pytest.raises(ValueError, match="a gate of"):
        gate_scales([cal[0][0]], [cal[0][1][:10]])


def test_cross_fold_coverage_by_gate_uses_the_other_folds_and_both_scales():
    rng = np.random.default_rng(7)
    folds = [[gated_episode(rng) for _ in range(10)] for _ in range(3)]
    scores = [[s for s, _ in f] for f in folds]
    gates = [[c for _, c in f] for f in folds]
    plain = cross_fold_coverage(scores, 0.9)
    gated = cross_fold_coverage(scores, 0.9, gates)
    for f, row in enumerate(gated):
        others = [s for g in range(3) if g != f for s in scores[g]]
        other_gates = [c for g in range(3) if g != f for c in gates[g]]
        fit = gate_scales(others, other_gates, 0.9)
        assert row["by_gate"] == {"free": fit["free"]["scale"],
                                  "contact": fit["contact"]["scale"]}
        assert row["by_gate"]["contact"] > 2 * row["by_gate"]["free"]
        assert plain[f]["by_gate"] is None and row["episodes"] == 20


def test_coverage_metrics_by_hand():
    f = np.zeros((4, 3))
    truth = np.array([[0.5, 0, 0], [2.0, 0, 0], [0, 0, 0], [0, 0, -3.0]])
    lo, hi = f - 1.0, f + 1.0
    out = coverage_metrics(f, lo, hi, truth, {"contact": np.array([1, 1, 0, 1], bool),
                                              "none": np.zeros(4, bool)})
    assert out["all"]["coverage"] == pytest.approx(10 / 12)
    assert out["all"]["coverage_per_axis"] == pytest.approx([0.75, 1.0, 0.75])
    assert out["contact"]["coverage"] == pytest.approx(7 / 9)
    assert out["all"]["width"] == pytest.approx(2.0) and out["none"] is None


# ------------------------------------------------------------ the head in the model


def test_head_off_keeps_old_config_weights_and_outputs():
    window = make_window(batch=3, seed=4)
    torch.manual_seed(0)
    plain = NeuralActuator(FULL, 5, make_stats(), dict(TINY)).eval()
    torch.manual_seed(0)
    off = NeuralActuator(FULL, 5, make_stats(), {**TINY, "uncertainty": False}).eval()
    assert plain.model_config == off.model_config and "uncertainty" not in off.model_config
    assert plain.state_dict().keys() == off.state_dict().keys()
    a, b = plain(window), off(window)
    assert sorted(a) == sorted(b) and "force_lo" not in a
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_shipped_pretrained_bundle_without_the_head_loads_unchanged():
    actuator, meta = load_actuator("pretrained/omx")
    raw = torch.load(meta["source"], map_location="cpu", weights_only=True)
    assert not actuator.has_uncertainty and meta["uncertainty"] is None
    assert bundle_to_dict(actuator, "omx")["model_config"] == raw["model_config"]
    with torch.no_grad():
        out = actuator(make_window(batch=2, n=5, seed=0))
    assert "force_lo" not in out and "force_log_var" not in out


def head_bundle(path, scale=None):
    torch.manual_seed(0)
    act = NeuralActuator(FULL, 5, make_stats(), {**TINY, "uncertainty": True})
    if scale is not None:
        act.interval_calibration = calibration_record({"scale": scale}, "test")
    return save_bundle(bundle_to_dict(act, "omx"), path)


def test_interval_is_force_plus_minus_scale_sigma_and_round_trips(tmp_path):
    path = head_bundle(tmp_path / "b.pt", scale=2.5)
    act, meta = load_actuator(path)
    assert meta["uncertainty"]["scale"] == 2.5 and act.interval_scale == 2.5
    with torch.no_grad():
        out = act(make_window(batch=4, seed=1))
        log_var = act.net(act.feature_builder(make_window(batch=4, seed=1)))["force_log_var"]
    sigma = torch.exp(0.5 * log_var)
    torch.testing.assert_close(out["force_hi"] - out["force"], 2.5 * sigma)
    torch.testing.assert_close(out["force"] - out["force_lo"], 2.5 * sigma)
    set_calibration(path, calibration_record({"scale": 5.0}, "again"))
    act2, _ = load_actuator(path)
    with torch.no_grad():
        out2 = act2(make_window(batch=4, seed=1))
    torch.testing.assert_close(out2["force_hi"] - out2["force"], 5.0 * sigma)


def test_gate_conditional_interval_widens_where_the_gate_is_open(tmp_path):
    torch.manual_seed(0)
    act = NeuralActuator(FULL, 5, make_stats(), {**TINY, "uncertainty": True})
    window = make_window(batch=64, seed=3)
    with torch.no_grad():  # centre the untrained gate so that half the frames are "contact"
        logit = act.net(act.feature_builder(window))["gate_logit"]
        act.net.heads.force_readout.bias[3] -= logit.median()
    path = save_bundle(bundle_to_dict(act, "omx"), tmp_path / "b.pt")
    set_calibration(path, calibration_record({"scale": 1.0}, "given",
                                             {"free": 1.0, "contact": 4.0}))
    act, meta = load_actuator(path)
    assert meta["uncertainty"]["by_gate"] == {"free": 1.0, "contact": 4.0}
    with torch.no_grad():
        out = act(window)
        raw = act.net(act.feature_builder(window))
    gate = torch.sigmoid(raw["gate_logit"])
    assert (gate >= 0.5).any() and (gate < 0.5).any()  # both kinds of frame in the batch
    expected = torch.where(gate >= 0.5, 4.0, 1.0) * torch.exp(0.5 * raw["force_log_var"])
    torch.testing.assert_close(out["force_hi"] - out["force"], expected)
    # the exported graph carries the same rule
    module, ts_meta = load_torchscript(export(path, tmp_path / "g.ts"))
    args = [window[k] for k in ts_meta["inputs"]] + [torch.zeros(64, 9, dtype=torch.bool)]
    with torch.no_grad():
        got = dict(zip(ts_meta["outputs"], module(*args), strict=True))
    torch.testing.assert_close(got["force_hi"], out["force_hi"], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="contact scale"):
        calibration_record({"scale": 1.0}, "bad", {"free": 1.0, "contact": 0.0})


def test_torchscript_export_gives_the_interval(tmp_path):
    path = head_bundle(tmp_path / "b.pt", scale=3.0)
    file = export(path, tmp_path / "a.ts")
    module, meta = load_torchscript(file)
    assert meta["outputs"][4:] == ["force_lo", "force_hi", "force_sigma"]
    assert meta["uncertainty"]["scale"] == 3.0
    act, _ = load_actuator(path)
    window = make_window(batch=3, seed=2)
    args = [window[k] for k in meta["inputs"]] + [torch.zeros(3, 9, dtype=torch.bool)]
    with torch.no_grad():
        got = dict(zip(meta["outputs"], module(*args), strict=True))
        want = act(window)
    for key in meta["outputs"]:
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-5)
    assert (got["force_lo"] <= got["force"]).all() and (got["force"] <= got["force_hi"]).all()


# --------------------------------------------------------------- infer, calibrate, eval


def _predicted(ckpt, data, split):
    """(episodes, causal predictions) of ``ckpt`` on ``split``, as calibrate sees them."""
    from nactuator.eval.episodes import load_filtered, predict_episodes

    actuator, _, _, episodes = load_filtered(ckpt, data, split)
    return episodes, predict_episodes(actuator, episodes)


@pytest.fixture(scope="module")
def head_ckpt(tiny):  # noqa: F811
    torch.manual_seed(0)
    act = NeuralActuator(n_motors=tiny["platform"].n, norm_stats=tiny["actuator"].feature_builder
                         .norm_stats(), model_config={**SMALL, "uncertainty": True})
    return save_bundle(bundle_to_dict(act, "so101"), tiny["root"] / "head.pt")


def test_infer_csv_brackets_the_force_and_calibrate_sets_the_scale(tiny, head_ckpt, tmp_path):  # noqa: F811
    csv = tmp_path / "pred.csv"
    infer(head_ckpt, tiny["data"], split=None, out=csv, force_only=True)
    df = pd.read_csv(csv)
    bounds = [f"force_{b}_{a}" for b in ("lo", "hi") for a in "xyz"]
    assert list(df.columns) == ["episode", "frame", "timestamp", "fx", "fy", "fz", "gate",
                                *bounds]
    for a, f in zip("xyz", ("fx", "fy", "fz"), strict=True):
        assert (df[f"force_lo_{a}"] <= df[f]).all() and (df[f] <= df[f"force_hi_{a}"]).all()
    width = (df["force_hi_z"] - df["force_lo_z"]).to_numpy()

    cal = tmp_path / "cal.pt"
    text = calibrate(head_ckpt, tiny["data"], split="test", out=cal)
    assert "no finite-sample guarantee: 2 episode(s) < 9 needed" in text  # 2 test episodes
    scale = load_actuator(cal)[1]["uncertainty"]["scale"]
    infer(cal, tiny["data"], split=None, out=csv, force_only=True)
    calibrated = pd.read_csv(csv)
    ratio = (calibrated["force_hi_z"] - calibrated["force_lo_z"]).to_numpy() / width
    np.testing.assert_allclose(ratio, scale / GAUSSIAN_Z90, rtol=1e-4)  # CSV: 6 digits

    # the command sets a given scale (the pooled one `cv` prints) into a new file
    from nactuator.cli import main

    given = tmp_path / "given.pt"
    assert main(["calibrate-intervals", "--ckpt", str(head_ckpt), "--scale", "2.5",
                 "--out", str(given)]) == 0
    assert load_actuator(given)[1]["uncertainty"]["scale"] == 2.5
    assert main(["calibrate-intervals", "--ckpt", str(head_ckpt), "--scale", "2.5",
                 "--contact-scale", "4", "--out", str(given)]) == 0
    assert load_actuator(given)[1]["uncertainty"]["by_gate"] == {"free": 2.5, "contact": 4.0}

    # fitted by gate on the episodes: the same pair as gate_scales on their scores
    text = calibrate(head_ckpt, tiny["data"], split="test", out=cal, by_gate=True)
    record = load_actuator(cal)[1]["uncertainty"]
    rows = interval_scores(*_predicted(head_ckpt, tiny["data"], "test"))
    fits = gate_scales([r["scores"] for r in rows], [r["gate_contact"] for r in rows])
    assert record["by_gate"] == {k: fits[k]["scale"] for k in ("free", "contact")}
    assert "gate closed" in text


def test_eval_reports_coverage_and_writes_scores(tiny, head_ckpt, tmp_path):  # noqa: F811
    out = tmp_path / "eval"
    text = evaluate(head_ckpt, tiny["data"], split="test", out=out)
    report = json.loads((out / "metrics.json").read_text())["uncertainty"]
    assert "Force interval" in text and report["scale"] == pytest.approx(GAUSSIAN_Z90)
    assert 0 <= report["all"]["coverage"] <= 1 and report["all"]["width"] > 0
    assert report["contact"]["elements"] + report["no_contact"]["elements"] == \
        report["all"]["elements"] == 3 * (120 + 60)
    assert report["seen_task"]["elements"] == 3 * 120  # "carry" has train episodes
    assert report["unseen_task"]["elements"] == 3 * 60  # "idle" has none
    rows = load_scores(out / SCORES_FILE)
    scores = np.concatenate([r["scores"] for r in rows])
    assert np.mean(scores <= report["scale"]) == pytest.approx(report["all"]["coverage"],
                                                               abs=1e-9)
    # cv's out-of-fold calibration over two "folds" made of this one evaluation
    fold_rows, pooled = interval_rows([out / SCORES_FILE, out / SCORES_FILE])
    assert pooled["episodes"] == 4 and len(fold_rows) == 2
    assert 0 <= fold_rows[0]["interval coverage (%), out-of-fold"] <= 100
    # the files hold the gate, so the gate-conditional rows come too
    assert 0 <= fold_rows[0]["interval coverage (%), out-of-fold, by gate"] <= 100
    assert set(pooled["by_gate"]) == {"free", "contact"}
    # the sampling spread of one fold: the episodes' coverage sd over √(episodes a fold)
    nominal = conformal_scale([r["scores"] for r in rows + rows], 0.9,
                              finite_sample=False)["scale"]
    each = [100 * np.mean(r["scores"] <= nominal) for r in rows + rows]
    assert pooled["episode_sd"] == pytest.approx(np.std(each, ddof=1))
    assert pooled["episodes_per_fold"] == 2  # the fold sd is episode_sd / √2
    assert pooled["episode_sd_by_gate"] is not None
