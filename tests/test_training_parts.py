"""Losses, EMA and horizon curriculum of the training room (pure torch, fast)."""

from __future__ import annotations

import math

import pytest
import torch

from nactuator.data.curriculum import HorizonCurriculum
from nactuator.training.ema import EMA
from nactuator.training.losses import (
    LossWeights,
    condition_loss,
    force_loss,
    gate_loss,
    gripper_loss,
    joint_loss,
    velocity_loss,
)
from nactuator.training.schedule import warmup_cosine

# ----------------------------------------------------------------------------- losses


def test_joint_loss_sums_joints_and_averages_time():
    q_real = torch.zeros(2, 4, 3)
    q_sim = q_real.clone()
    q_sim[..., 0] = 0.1  # quadratic zone of Huber_1: 0.5 * 0.1^2
    q_sim[..., 2] = 3.0  # linear zone: 3 - 0.5
    expected = 0.5 * 0.01 + 2.5
    assert joint_loss(q_sim, q_real).item() == pytest.approx(expected, rel=1e-6)


def test_gripper_loss_is_in_millimetres():
    q_real = torch.zeros(1, 5, 1)
    q_sim = torch.full_like(q_real, 0.002)  # 2 mm -> Huber_1(2) = 1.5
    assert gripper_loss(q_sim, q_real).item() == pytest.approx(1.5, rel=1e-6)
    assert gripper_loss(q_sim[..., :0], q_real[..., :0]).item() == 0.0


def test_velocity_loss_compares_finite_differences():
    dt = 0.02
    t = torch.arange(6, dtype=torch.float32).view(1, 6, 1)
    q_real = 0.01 * t  # 0.5 rad/s
    assert velocity_loss(q_real.clone(), q_real, dt).item() == pytest.approx(0.0, abs=1e-7)
    q_sim = 0.012 * t  # 0.6 rad/s: error 0.1 rad/s -> 0.5 * 0.01
    assert velocity_loss(q_sim, q_real, dt).item() == pytest.approx(0.005, rel=1e-4)


def test_force_loss_uses_only_labelled_frames_and_focal_weight():
    true = torch.zeros(1, 4, 3)
    true[0, 1, 2] = -4.9  # a payload frame
    valid = torch.tensor([[True, True, False, False]])
    pred = torch.zeros_like(true)
    pred[0, 2] = 100.0  # unlabelled frame: must not count
    pred[0, 0, 0] = 0.5  # free frame, error 0.5 -> 0.125, weight 1
    # payload frame: error 4.9 on z -> 4.4, weight 5; 6 labelled frame-channels
    expected = (0.125 + 5 * 4.4) / 6
    assert force_loss(pred, true, valid, beta=1.0, w_focal=5.0).item() == pytest.approx(
        expected, rel=1e-5)
    nothing = torch.zeros(1, 4, dtype=torch.bool)
    assert force_loss(pred, true, nothing).item() == 0.0


def test_force_loss_beta_changes_the_quadratic_zone():
    true, pred = torch.zeros(1, 1, 3), torch.full((1, 1, 3), 0.1)
    valid = torch.ones(1, 1, dtype=torch.bool)
    assert force_loss(pred, true, valid, beta=1.0).item() == pytest.approx(0.005, rel=1e-4)
    assert force_loss(pred, true, valid, beta=0.05).item() == pytest.approx(0.075, rel=1e-4)


def test_gate_loss_targets_contact_above_threshold():
    force = torch.tensor([[[0.0, 0.0, 0.0], [0.0, 0.0, -2.0]]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    right = torch.tensor([[[-20.0], [20.0]]])
    wrong = -right
    assert gate_loss(right, force, valid).item() < 1e-6
    assert gate_loss(wrong, force, valid).item() == pytest.approx(20.0, rel=1e-4)
    assert gate_loss(wrong, force, torch.zeros_like(valid)).item() == 0.0


def test_condition_loss_only_where_labelled():
    labels = torch.tensor([[[1.0, 0.0]]])
    valid = torch.tensor([[[False, True]]])
    logits = torch.tensor([[[-30.0, 0.0]]])  # first motor badly wrong but unlabelled
    assert condition_loss(logits, labels, valid).item() == pytest.approx(math.log(2), rel=1e-5)


def test_loss_weights_reject_bad_values():
    with pytest.raises(ValueError, match="w_vel"):
        LossWeights(w_vel=-1.0)
    with pytest.raises(ValueError, match="force_beta"):
        LossWeights(force_beta=0.0)


# -------------------------------------------------------------------------------- EMA


def test_ema_tracks_parameters_and_swaps_back():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    ema = EMA(net, decay=0.5)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    ema.num_updates = 10**6  # past the warm-up ramp: the decay is exactly 0.5
    ema.update(net)
    raw = {k: v.clone() for k, v in net.state_dict().items()}
    with ema.swapped_in(net):
        for k, v in net.state_dict().items():
            torch.testing.assert_close(v, start[k] + 0.5)
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, raw[k])


def test_ema_state_round_trip_and_mismatch():
    net = torch.nn.Linear(3, 2)
    ema = EMA(net, decay=0.9)
    ema.update(net)
    other = EMA(torch.nn.Linear(3, 2), decay=0.1)
    other.load_state_dict(ema.state_dict())
    assert other.decay == 0.9 and other.num_updates == 1
    for k in ema.shadow:
        torch.testing.assert_close(other.shadow[k], ema.shadow[k])
    with pytest.raises(ValueError, match="shape"):
        EMA(torch.nn.Linear(4, 2)).load_state_dict(ema.state_dict())


# ------------------------------------------------------------------------- curriculum


def test_curriculum_stages():
    c = HorizonCurriculum({0: 128, 20: 256, 40: 320})
    assert [c.horizon_at(e) for e in (0, 19, 20, 39, 40, 1000)] == [128, 128, 256, 256, 320, 320]
    assert c.max_horizon == 320 and c.changes
    assert not HorizonCurriculum({0: 8}).changes


@pytest.mark.parametrize("schedule, message", [
    ({}, "empty"),
    ({5: 8}, "start at epoch 0"),
    ({0: 0}, "horizon"),
    ({0: 8, -1: 4}, "epoch must be >= 0"),
    ({0: "long"}, "integer"),
])
def test_curriculum_rejects_bad_schedules(schedule, message):
    with pytest.raises(ValueError, match=message):
        HorizonCurriculum(schedule)


# ------------------------------------------------------------------- learning rate


def test_warmup_cosine_ramps_then_falls_to_the_floor():
    f = warmup_cosine(warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [f(s) for s in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert f(4) == pytest.approx(1.0)  # the peak, where the cosine starts
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5)  # half way down the 10 cosine steps
    assert f(14) == pytest.approx(0.1) and f(1000) == pytest.approx(0.1)
    assert warmup_cosine(0, 1)(0) == pytest.approx(1.0)
