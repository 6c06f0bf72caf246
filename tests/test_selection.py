"""Checkpoint selection by ``val/score`` and the verdict lines against the trivial references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nactuator.data.references import LinearForceReference, is_worse, verdict
from nactuator.training.cli import selection_summary
from nactuator.training.selection import CHANCE_ERROR, ValidationScore

L = 3  # window length of the hand-made batches: frame s = L - 1 = 2 is the start


def _batch(q: np.ndarray, q_cmd: np.ndarray, force: np.ndarray, linear: np.ndarray,
           condition: np.ndarray) -> dict[str, torch.Tensor]:
    """One episode (B = 1) with L - 1 context frames before frame s."""
    t = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(0)  # noqa: E731
    return {"q": t(q), "q_cmd": t(q_cmd), "force": t(force), "force_linear": t(linear),
            "force_valid": torch.ones(1, len(q), dtype=torch.bool),
            "condition": t(condition),
            "condition_valid": torch.ones(1, *condition.shape, dtype=torch.bool)}


def _episode(steps: int = 6, n: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    frames = L - 1 + steps + 1
    q = rng.normal(size=(frames, n))
    q_cmd = q + rng.normal(scale=0.1, size=(frames, n))
    force = rng.normal(size=(frames, 3))
    linear = force + rng.normal(scale=0.5, size=(frames, 3))
    condition = np.ones((frames, n))
    return q, q_cmd, force, linear, condition


def test_score_terms_are_the_errors_over_their_references_computed_by_hand():
    q, q_cmd, force, linear, condition = _episode()
    steps, s = 6, L - 1
    rng = np.random.default_rng(1)
    q_sim = q[s : s + steps + 1] + rng.normal(scale=0.05, size=(steps + 1, 2))
    f_hat = force[s : s + steps] + rng.normal(scale=0.2, size=(steps, 3))
    p_nominal = np.where(np.arange(steps)[:, None] < 2, 0.2, 0.9) * np.ones((steps, 2))

    score = ValidationScore(arm=[0, 1], window_length=L)
    batch = _batch(q, q_cmd, force, linear, condition)
    mask = torch.ones(1, steps, dtype=torch.bool)
    as_t = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(0)  # noqa: E731
    score.update(as_t(q_sim), as_t(f_hat), as_t(p_nominal), batch, mask)
    got = score.compute()

    truth = q[s + 1 : s + 1 + steps]
    joints = np.abs(q_sim[1:] - truth).sum() / np.abs(q_cmd[s : s + steps] - truth).sum()
    label = force[s : s + steps]
    model_f = np.abs(f_hat - label).mean()
    reference = min(np.abs(label).mean(), np.abs(linear[s : s + steps] - label).mean())
    wrong = (p_nominal <= 0.5).mean()  # every label is nominal
    assert got["score/joints"] == pytest.approx(joints, rel=1e-5)
    assert got["score/force"] == pytest.approx(model_f / reference, rel=1e-5)
    assert got["score/condition"] == pytest.approx(wrong / CHANCE_ERROR, rel=1e-6)
    assert got["score"] == pytest.approx((joints + model_f / reference + wrong / 0.5) / 3,
                                         rel=1e-5)
    assert got["joints_command_deg"] == pytest.approx(
        math.degrees(np.abs(q_cmd[s : s + steps] - truth).mean()), rel=1e-5)


def test_a_force_gain_cannot_buy_a_model_that_drifts_off_command_following():
    """The SO-101 failure: val/loss picked an epoch whose force was lower but whose joints
    drifted 2x past command following. val/score must pick the epoch that tracks."""
    q, q_cmd, force, linear, condition = _episode(steps=20, seed=3)
    s, steps = L - 1, 20
    truth = q[s : s + steps + 1]
    follow = np.abs(q_cmd[s : s + steps] - q[s + 1 : s + 1 + steps]).mean()
    label = force[s : s + steps]

    def scored(joint_error: float, force_error: float) -> float:
        score = ValidationScore(arm=[0, 1], window_length=L)
        q_sim = truth + joint_error * np.sign(np.random.default_rng(0).normal(size=truth.shape))
        q_sim[0] = truth[0]
        f_hat = label + force_error
        as_t = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(0)  # noqa: E731
        score.update(as_t(q_sim), as_t(f_hat), as_t(np.ones((steps, 2))),
                     _batch(q, q_cmd, force, linear, condition),
                     torch.ones(1, steps, dtype=torch.bool))
        return score.compute()["score"]

    drifting = scored(joint_error=2.0 * follow, force_error=0.05)
    tracking = scored(joint_error=0.6 * follow, force_error=0.15)
    # The drifter's force is 3x better, its joints 2x worse than command following: the
    # tracker must still win (a force-dominated criterion would pick the drifter).
    assert tracking < drifting


def test_force_term_uses_zero_when_it_beats_the_linear_reference():
    q, q_cmd, force, _, condition = _episode()
    s, steps = L - 1, 6
    bad_linear = force + 10.0  # far worse than always predicting 0 N
    score = ValidationScore(arm=[0], window_length=L)
    f_hat = np.zeros((steps, 3)) + 0.1
    as_t = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(0)  # noqa: E731
    score.update(as_t(q[s : s + steps + 1]), as_t(f_hat), as_t(np.ones((steps, 2))),
                 _batch(q, q_cmd, force, bad_linear, condition),
                 torch.ones(1, steps, dtype=torch.bool))
    got = score.compute()
    label = force[s : s + steps]
    assert got["force_reference_n"] == pytest.approx(np.abs(label).mean(), rel=1e-5)
    assert got["score/joints"] == 0.0


def test_the_datamodule_serves_the_linear_reference_fit_on_its_train_split(tmp_path):
    from nactuator.data import DatasetWriter, read_dataset
    from nactuator.data.datamodule import NADDataModule
    from nactuator.platforms import load_platform

    omx = load_platform("omx")
    n, rng = omx.n, np.random.default_rng(0)
    with DatasetWriter(tmp_path / "ds", omx, omx.fps) as w:
        for k, split in enumerate(["train", "train", "train", "validation"]):
            T = 60 + 10 * k
            q = rng.normal(size=(T, n))
            frames = {"q_cmd": q + rng.normal(scale=0.1, size=(T, n)), "q": q,
                      "qd": rng.normal(size=(T, n)), "effort": rng.normal(size=(T, n)),
                      "voltage": 12 + rng.normal(scale=0.1, size=(T, n)),
                      "temperature": np.full((T, n), 35.0),  # constant: the median keeps it
                      "force": rng.normal(size=(T, 3)), "payload_mass": np.zeros(T)}
            frames["force"][: T // 3] = np.nan  # unlabelled frames count as 0 N
            w.add_episode(frames, "task", split)
    episodes = read_dataset(tmp_path / "ds").episodes
    reference = LinearForceReference.fit([e for e in episodes if e.split == "train"])
    dm = NADDataModule(tmp_path / "ds", "omx", window_length=L, horizon=4, batch_size=2)
    (validation,) = [e for e in episodes if e.split == "validation"]
    served = dm.split_episodes("validation")["force_linear"][0, L - 1 : L - 1 + 90].numpy()
    np.testing.assert_allclose(served, reference.predict(validation), rtol=1e-4, atol=1e-4)


def test_verdict_says_better_or_worse_against_each_reference():
    good = {"joints_deg": 0.9, "joints_command_deg": 1.4, "force_n": 0.03,
            "force_reference_n": 0.2}
    assert verdict(good) == ("joints 0.90° vs 1.40° command following: better; force 0.030 N "
                             "vs 0.200 N (best of 0 N and linear regression): better")
    assert not is_worse(good)
    bad = {**good, "joints_deg": 8.6}
    assert "joints 8.60° vs 1.40° command following: WORSE" in verdict(bad)
    assert is_worse(bad)


def test_train_summary_names_the_linked_epoch_and_why_and_warns_when_worse():
    history = [
        {"epoch": 0, "score": 1.5, "joints_deg": 3.0, "joints_command_deg": 1.4},
        {"epoch": 1, "score": 0.7, "joints_deg": 1.0, "joints_command_deg": 1.4},
        {"epoch": 2, "score": 0.8, "joints_deg": 1.1, "joints_command_deg": 1.4},
    ]
    lines = selection_summary(history, 0.7, "val/score")
    assert lines[0].startswith("best (epoch 1): val/score 0.700; joints 1.00°")
    assert lines[1].startswith("last (epoch 2): val/score 0.800")
    assert "best.ckpt is epoch 1, not the last (2)" in lines[2]
    assert not any("WARNING" in line for line in lines)
    worse = [{"epoch": 0, "score": 3.0, "joints_deg": 8.6, "joints_command_deg": 2.2}]
    lines = selection_summary(worse, 3.0, "val/score")
    assert any(line.startswith("WARNING: the linked model loses on the joints (command "
                               "following) on validation") for line in lines)
    # Losing on force only: the warning says so, and that the joints still win.
    force_only = [{"epoch": 0, "score": 1.2, "joints_deg": 1.0, "joints_command_deg": 2.2,
                   "force_n": 0.4, "force_reference_n": 0.3}]
    warning = [line for line in selection_summary(force_only, 1.2, "val/score")
               if line.startswith("WARNING")]
    assert len(warning) == 1 and "loses on the force (the force reference)" in warning[0]
    assert "joints" not in warning[0].split(";")[0] and "beat command following" in warning[0]
