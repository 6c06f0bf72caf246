"""Metrics, scoring and references of the evaluation room on hand-made cases (no simulator)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nactuator.data import Episode
from nactuator.data.references import LinearForceReference, command_following
from nactuator.eval import metrics as M
from nactuator.eval.protocol import score_episode
from nactuator.eval.report import markdown_report
from nactuator.rollout import Rollout

DEG = math.pi / 180.0


def make_episode(length: int, n: int = 3, task: str = "task", index: int = 0,
                 seed: int = 0, force: np.ndarray | None = None,
                 condition: np.ndarray | None = None) -> Episode:
    rng = np.random.default_rng(seed)
    t = np.arange(length)[:, None]
    q = 0.3 * np.sin(0.05 * t + np.arange(n)) + 0.01 * rng.normal(size=(length, n))
    frames = {
        "q_cmd": q + 0.02 * rng.normal(size=(length, n)),
        "q": q,
        "qd": np.gradient(q, axis=0) / 0.017,
        "effort": rng.normal(size=(length, n)),
        "voltage": 12 + 0.1 * rng.normal(size=(length, n)),
        "temperature": 35 + rng.normal(size=(length, n)),
        "force": np.full((length, 3), np.nan) if force is None else force,
        "condition": np.full((length, n), np.nan) if condition is None else condition,
        "timestamp": np.arange(length) * 0.017,
    }
    return Episode(index=index, task=task, split="test", length=length,
                   payload_mass=math.nan, meta={}, frames=frames)


def perfect_rollout(ep: Episode) -> Rollout:
    """A rollout that reproduces the recording exactly, zero force, gate 0, nominal."""
    steps, n = ep.length - 1, ep.frames["q"].shape[1]
    return Rollout(q=ep.frames["q"].astype(float).copy(), qd=np.zeros((ep.length, n)),
                   tau=np.zeros((steps, n)), force=np.zeros((steps, 3)),
                   gate=np.zeros(steps), gate_logit=np.full(steps, -20.0),
                   condition=np.ones((steps, n)), condition_logit=np.full((steps, n), 20.0))


SCALES, UNITS = M.channel_scales(["revolute", "revolute", "prismatic"])


def test_rollout_off_by_one_degree_gives_mae_one_at_every_horizon():
    ep = make_episode(700)
    ro = perfect_rollout(ep)
    ro.q[1:, 1] += 1.0 * DEG  # joint 2 is exactly 1 deg off after the start frame
    ro.q[1:, 2] += 0.002  # the prismatic finger is 2 mm off
    scores = score_episode(ep, ro, SCALES)
    model = scores["joints"]["model"]
    assert set(model) == {"@10", "@100", "@300", "@500", "@600", "full"}
    for h, values in model.items():
        assert values == pytest.approx([0.0, 1.0, 2.0], abs=1e-9), h


def test_prefix_windows_are_prefixes_and_long_horizons_are_skipped():
    err = np.concatenate([np.zeros(10), np.full(10, 2.0), np.full(30, 4.0)])  # 50 steps
    mae = M.prefix_mae(err, horizons=(10, 20, 100))
    assert mae["@10"] == 0.0
    assert mae["@20"] == pytest.approx(1.0)  # mean of the first 20, not a sliding window
    assert "@100" not in mae  # longer than the rollout: skipped, not shortened
    assert mae["full"] == pytest.approx((20 + 120) / 50)


def test_command_following_reference_scores_goal_at_previous_frame():
    ep = make_episode(50)
    ep.frames["q_cmd"] = ep.frames["q"].copy()
    ep.frames["q_cmd"][:-1] = ep.frames["q"][1:]  # a servo that reaches each goal in one step
    assert np.allclose(command_following(ep), ep.frames["q"][1:])
    scores = score_episode(ep, perfect_rollout(ep), SCALES)
    assert scores["joints"]["command_following"]["full"] == pytest.approx([0, 0, 0], abs=1e-9)


def test_force_mae_counts_unlabelled_frames_as_zero():
    label = np.full((4, 3), np.nan)
    label[:, 2] = -4.9  # a payload run: only z is labelled
    pred = np.tile([0.0, 0.0, -4.9], (4, 1))
    assert M.force_errors(pred, label).mean() == pytest.approx(0.0)
    pred[:, 0] = 1.0  # 1 N on an unlabelled axis is an error of 1 N against 0
    assert M.force_errors(pred, label).mean() == pytest.approx(1.0 / 3.0)


def test_binary_metrics_on_a_hand_made_case():
    m = M.binary_metrics(np.array([0.9, 0.8, 0.3, 0.6, 0.1]), np.array([1, 1, 0, 0, 0]))
    assert m["accuracy"] == pytest.approx(0.8)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(1.0)
    assert m["f1"] == pytest.approx(0.8)
    assert m["auc"] == pytest.approx(1.0)
    assert m["specificity"] == pytest.approx(2 / 3)  # 0.3 and 0.1 of the three negatives
    # no positive: accuracy is only the negative-class rate, i.e. the specificity
    one = M.binary_metrics(np.array([0.9, 0.2, 0.1, 0.3]), np.array([0, 0, 0, 0]))
    assert one["accuracy"] == one["specificity"] == pytest.approx(0.75)
    assert math.isnan(M.binary_metrics(np.array([0.9]), np.array([1]))["specificity"])
    assert M.roc_auc(np.array([0.2, 0.4, 0.6, 0.8]), np.array([0, 1, 0, 1])) == 0.75
    assert M.roc_auc(np.array([0.5, 0.5]), np.array([1, 0])) == 0.5  # ties count half
    assert math.isnan(M.roc_auc(np.array([0.1, 0.2]), np.array([1, 1])))  # one class only


def test_gate_condition_and_false_contact_from_an_episode():
    n, length = 3, 101
    force = np.full((length, 3), np.nan)
    force[:50] = 0.0  # labelled no contact
    force[50:, 2] = -2.0  # labelled contact
    cond = np.full((length, n), np.nan)
    cond[:, 2] = np.r_[np.ones(60), np.zeros(41)]  # joint 3 degraded from frame 60 on
    ep = make_episode(length, n, force=force, condition=cond)
    ro = perfect_rollout(ep)
    ro.gate[:] = np.r_[np.zeros(40), np.ones(60)]  # fires 10 frames early
    ro.condition[:, 2] = np.r_[np.full(60, 0.9), np.full(40, 0.1)]
    s = score_episode(ep, ro, SCALES)
    # Gate: step i is scored against frame i (its window's current frame).
    assert s["gate"]["n"] == 100
    assert s["gate"]["recall"] == 1.0
    assert s["gate"]["precision"] == pytest.approx(50 / 60)
    # False contacts: 10 of the 50 labelled-zero frames.
    assert s["false_contact"]["frames"] == 50
    assert s["false_contact"]["false_contact_rate"] == pytest.approx(0.2)
    # Condition: only joint 3 is labelled; a perfect separation.
    assert s["condition"]["n"] == 100
    assert s["condition"]["accuracy"] == 1.0 and s["condition"]["auc"] == 1.0
    assert "no_contact_run" not in s


def test_no_contact_run_reports_magnitude_and_false_contact_rate():
    ep = make_episode(21)  # force never labelled: a matched no-contact reference run
    ro = perfect_rollout(ep)
    ro.force[:, 0] = 3.0
    ro.force[:, 1] = 4.0
    ro.gate[:5] = 0.9
    s = score_episode(ep, ro, SCALES)
    assert s["no_contact_run"]["model"]["mean_force_norm"] == pytest.approx(5.0)
    assert s["no_contact_run"]["model"]["false_contact_rate"] == pytest.approx(0.25)
    assert s["force"]["model"]["full"]["mae"] == pytest.approx(7.0 / 3.0)


def test_aggregate_is_mean_over_tasks_of_task_means():
    eps = [{"task": "a", "x": 1.0, "steps": 10}, {"task": "a", "x": 3.0, "steps": 10},
           {"task": "b", "x": 10.0, "steps": 5}]
    agg = M.aggregate(eps)
    assert agg["tasks"]["a"]["x"] == 2.0
    assert agg["mean"]["x"] == 6.0  # not the pooled mean 4.67
    assert agg["mean"]["steps"] == 25  # counts add up


def test_linear_reference_recovers_a_planted_linear_force_exactly():
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(7 * 3, 3))
    bias = np.array([0.5, -1.0, 2.0])

    def planted(seed: int) -> Episode:
        ep = make_episode(200, seed=seed)
        from nactuator.data.references import force_features
        ep.frames["force"] = force_features(ep) @ weight + bias
        return ep

    ref = LinearForceReference.fit([planted(s) for s in range(3)])
    held_out = planted(7)
    truth = held_out.frames["force"]
    # Exact up to the tiny ridge shrinkage (λ = 1e-6 of the data scale).
    assert np.abs(ref.predict(held_out) - truth).max() < 1e-6 * np.abs(truth).max()
    assert ref.train_frames == 600


def test_linear_reference_needs_training_episodes():
    from nactuator.data import DataFormatError

    with pytest.raises(DataFormatError, match="train split is empty"):
        LinearForceReference.fit([])


def test_markdown_report_has_the_tables_and_both_references():
    eps = [make_episode(120, task=t, index=i, seed=i) for i, t in enumerate(["a", "b"])]
    per_ep = [score_episode(ep, perfect_rollout(ep), SCALES) for ep in eps]
    agg = M.aggregate(per_ep)
    result = {
        "checkpoint": "ck.pt", "data": ["d"], "split": "test", "platform": "omx",
        "episodes": 2, "steps": 238, "wall_time_s": 1.0, "device": "cpu",
        "channels": [{"name": f"j{i}", "unit": u} for i, u in enumerate(UNITS)],
        "arm_indices": [0, 1],
        "references": {"linear_regression": {"ridge": 1e-6, "train_episodes": 3,
                                             "train_frames": 600}},
        "aggregate": {"all": agg, "contact": None, "no_contact": agg},
        "notes": [],
    }
    text = markdown_report(result)
    assert "## Joint rollout MAE" in text and "command following (q = goal)" in text
    assert "| @100 | model |" in text
    assert "j2 (mm)" in text
    assert "## No contact" in text
    assert "`a`" in text and "`b`" in text


def test_gate_on_unlabelled_frames_of_a_payload_run_is_reported_apart():
    force = np.full((41, 3), np.nan)
    force[10:30, 2] = -4.9  # the carry interval; -999 (NaN) before and after
    ep = make_episode(41, force=force)
    ro = perfect_rollout(ep)
    ro.gate[:] = 0.9  # a gate stuck "on"
    s = score_episode(ep, ro, SCALES)
    assert s["gate"]["n"] == 20 and s["gate"]["recall"] == 1.0
    assert s["false_contact"]["frames"] == 0  # no frame is *known* to be contact-free
    assert s["unlabelled_frames"]["frames"] == 20  # steps 0-9 and 30-39
    assert s["unlabelled_frames"]["false_contact_rate"] == 1.0


def test_evaluation_filters_inputs_with_the_checkpoints_causal_spec():
    from nactuator.data.episodes import filter_episode
    from nactuator.input_filters import input_filter_spec

    ep = make_episode(40)
    ep.frames["temperature"][:] = 35.0
    ep.frames["temperature"][20, 1] = 150.0  # a one-frame telemetry glitch
    ep.frames["temperature"][30:, 0] = 40.0  # a real step
    out = filter_episode(ep, input_filter_spec(11)).frames["temperature"]
    assert out[:, 1].max() == 35.0  # the spike is gone
    assert ep.frames["temperature"][20, 1] == 150.0  # the input is not modified
    # Trailing median: the step shows once most of the past 11 frames have it (frame 35),
    # never earlier: nothing is read from the future.
    assert out[34, 0] == 35.0 and out[35, 0] == 40.0 and out[-1, 0] == 40.0
    raw = filter_episode(ep, input_filter_spec(1)).frames["temperature"]
    assert raw[20, 1] == 150.0


def test_the_payload_is_read_from_the_force_during_the_carry_only():
    from nactuator.eval.protocol import G, payload_estimates

    label = np.full((100, 3), np.nan)
    label[40:80] = [0.0, 0.0, -0.3 * G]  # a 300 g carry on frames 40..79
    ep = make_episode(100, force=label)
    ep.frames["payload_mass"] = np.where(np.isfinite(label[:, 2]), 0.3, 0.0)
    guess = np.zeros((100, 3))
    guess[40:80, 2] = -0.2 * G  # reads 200 g while carrying ...
    guess[:40, 2] = -5.0  # ... and anything outside the carry does not count
    out = payload_estimates(ep, label, {"model": guess, "other": None})
    assert out["carry_frames"] == 40 and out["true_g"] == pytest.approx(300.0)
    assert out["model"]["mass_g"] == pytest.approx(200.0)
    assert out["model"]["abs_error_g"] == pytest.approx(100.0) and "other" not in out
    ep.frames["payload_mass"] = np.zeros(100)  # a push (no payload): no payload figures
    assert payload_estimates(ep, label, {"model": guess}) is None
