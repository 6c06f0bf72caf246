"""A joint-wise model moved between arms with different joint counts (issue 22: SO-101, 6
joints -> OMX, 5): the shared weights carry over, each target joint gets its mapped joint's
embedding, and with independent joints (no system latent) the moved model computes exactly
the source's per-joint torque from the same history; the CLI's bundle is an OMX model that
``eval`` rolls out."""

from __future__ import annotations

import json

import pytest
import torch
from test_models import make_stats, make_window

from nactuator.models import NeuralActuator, load_actuator
from nactuator.models.transfer import TransferError, source_stats, transfer_jointwise

FULL = ["command", "state", "telemetry", "error"]
JW = {"arch": "jointwise", "hidden": 32, "n_layers": 2, "head_hidden": 16, "dropout": 0.0}
MAP = [0, 1, 2, 3, 5]  # OMX joint1..joint4, gripper <- SO-101 pan, lift, elbow, wrist_flex, gripper


def so101_model(latent_dim: int, seed: int = 0) -> NeuralActuator:
    torch.manual_seed(seed)
    model = NeuralActuator(FULL, 6, make_stats(6), {**JW, "latent_dim": latent_dim}).eval()
    with torch.no_grad():  # a torque readout of trained size, so the comparison has teeth
        model.net.heads.torque_readout.weight.normal_(std=0.5)
    return model


def test_moved_weights_and_embeddings():
    src = so101_model(latent_dim=4)
    dst = transfer_jointwise(src, 5, make_stats(5), MAP)
    s, d = src.state_dict(), dst.state_dict()
    assert set(s) == set(d)
    for name in s:
        if name == "net.encoder.joint_embedding":
            torch.testing.assert_close(d[name], s[name][MAP])
        elif name.startswith("feature_builder."):
            assert d[name].numel() == s[name].numel() // 6 * 5  # the target's statistics
        else:
            torch.testing.assert_close(d[name], s[name])
    out = dst(make_window(batch=2, n=5))
    assert out["tau"].shape == (2, 5) and out["force"].shape == (2, 3)
    # a joint with no counterpart gets the mean of the source's embeddings
    mean = transfer_jointwise(src, 5, make_stats(5), [0, 1, None, 3, 5])
    torch.testing.assert_close(mean.net.encoder.joint_embedding[2],
                               src.net.encoder.joint_embedding.mean(0))


def test_independent_joints_compute_the_source_torque_of_their_mapped_joint():
    """latent_dim 0: a joint's torque depends only on its own history and embedding, so the
    OMX model's joint j equals the SO-101 model's joint MAP[j] on the same history (source
    statistics of the mapped joints)."""
    src = so101_model(latent_dim=0)
    dst = transfer_jointwise(src, 5, source_stats(src, MAP), MAP)
    window6 = make_window(batch=3, n=6, seed=2)
    window5 = {k: v[..., MAP] for k, v in window6.items()}
    with torch.no_grad():
        torch.testing.assert_close(dst(window5)["tau"], src(window6)["tau"][:, MAP])
        # and a wrong map gives other torques: the embedding matters
        swapped = transfer_jointwise(src, 5, source_stats(src, MAP), [1, 0, 2, 3, 5])
        assert not torch.allclose(swapped(window5)["tau"][:, 0], src(window6)["tau"][:, 0])


def test_refuses_what_cannot_move():
    torch.manual_seed(0)
    whole_arm = NeuralActuator(FULL, 6, make_stats(6), {"arch": "mlp", "hidden": 16}).eval()
    with pytest.raises(TransferError, match="only a joint-wise model"):
        transfer_jointwise(whole_arm, 5, make_stats(5), MAP)
    with pytest.raises(TransferError, match="joint_map has 4 entries"):
        transfer_jointwise(so101_model(2), 5, make_stats(5), MAP[:4])
    with pytest.raises(TransferError, match="not a joint of the source"):
        transfer_jointwise(so101_model(2), 5, make_stats(5), [0, 1, 2, 3, 6])


@pytest.mark.usefixtures("one_torch_thread")
def test_cli_writes_an_omx_bundle_that_eval_scores(tmp_path, capsys):
    from test_training import write_sim_dataset

    from nactuator.cli import main
    from nactuator.models import bundle_to_dict, save_bundle

    data = write_sim_dataset(tmp_path / "omx", "omx")
    src = save_bundle(bundle_to_dict(so101_model(4, seed=1), "so101"), tmp_path / "so101.pt")
    out = tmp_path / "omx_from_so101.pt"
    assert main(["transfer", "--ckpt", str(src), "--platform", "omx", "--data", str(data),
                 "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert "joint1<-shoulder_pan" in line and "gripper<-gripper" in line
    model, meta = load_actuator(out)
    assert meta["platform"] == "omx" and model.n_motors == 5
    assert meta["training_config"]["transfer"]["joint_map"]["joint4"] == "wrist_flex"
    assert main(["transfer", "--ckpt", str(src), "--platform", "omx", "--data", str(data),
                 "--scratch", "--out", str(tmp_path / "scratch.pt")]) == 0
    scratch, _ = load_actuator(tmp_path / "scratch.pt")
    assert not torch.allclose(scratch.net.encoder.history_proj.weight,
                              model.net.encoder.history_proj.weight)
    assert main(["eval", "--ckpt", str(out), "--data", str(data), "--split", "test",
                 "--out", str(tmp_path / "eval")]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["platform"] == "omx" and metrics["verdict"]["joints_deg"] > 0
    assert main(["transfer", "--ckpt", str(src), "--platform", "omx", "--out",
                 str(tmp_path / "x.pt")]) == 2
    assert "--data" in capsys.readouterr().err


def test_a_next_state_model_moves_with_the_target_step_scale():
    step6 = {"dq": [0.01] * 6, "dqd": [0.2] * 6}
    torch.manual_seed(0)
    src = NeuralActuator(FULL, 6, make_stats(6), {**JW, "latent_dim": 2,
                                                  "dynamics": "next_state",
                                                  "state_step": step6}).eval()
    with pytest.raises(TransferError, match="state_step"):
        transfer_jointwise(src, 5, make_stats(5), MAP)
    step5 = {"dq": [0.02] * 5, "dqd": [0.3] * 5}
    dst = transfer_jointwise(src, 5, make_stats(5), MAP, step5)
    out = dst(make_window(batch=2, n=5))
    assert dst.dynamics == "next_state" and out["dq"].shape == (2, 5)
    torch.testing.assert_close(out["dq"], out["state_delta"][..., 0] * 0.02)
