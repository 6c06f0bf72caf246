"""model.arch: jointwise (DexNDM, SPEC §7): shared per-joint weights, joint-id embedding,
a pooled system latent; the same outputs, bundle, export and training as the other archs."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from test_export import eager, graph_args
from test_models import N, make_stats, make_window
from test_training import first_batch, make_dm, make_module, make_trainer, write_sim_dataset

from nactuator.export import export, load_torchscript, ort_session
from nactuator.models import NeuralActuator, build_model, bundle_to_dict, save_bundle
from nactuator.models.jointwise import JointwiseEncoder
from nactuator.training.losses import LossWeights

FULL = ["command", "state", "telemetry", "error"]
C = 7  # channels per joint with FULL: q_cmd, q, qd, effort, voltage, temperature, error
SMALL = {"arch": "jointwise", "hidden": 32, "n_layers": 2, "latent_dim": 4, "head_hidden": 16}


def net(seed: int = 0, **sizes) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = {**SMALL, **sizes}
    config.pop("arch")
    return build_model("jointwise", C * N, N, **config).eval()


def tokens(batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 9, C * N, generator=torch.Generator().manual_seed(seed))


def permute_joints(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Tokens with the joints reordered inside every channel block (FeatureBuilder layout)."""
    batch, length, _ = x.shape
    return x.view(batch, length, C, N)[..., perm].reshape(batch, length, C * N)


def test_outputs_have_the_contract_shapes_and_a_small_encoder():
    act = NeuralActuator(FULL, N, make_stats(), {"arch": "jointwise"}).eval()
    out = act(make_window(batch=4))
    assert {k: tuple(v.shape) for k, v in out.items()} == {
        "tau": (4, N), "force": (4, 3), "force_raw": (4, 3), "gate": (4, 1),
        "gate_logit": (4, 1), "condition": (4, N), "condition_logit": (4, N)}
    torch.testing.assert_close(out["force"], out["gate"] * out["force_raw"])
    enc = act.net.encoder
    assert isinstance(enc, JointwiseEncoder) and enc.latent_dim == 8
    # Weights shared across joints: the per-joint input layer reads one joint's window only,
    # so its size does not grow with the motor count (only the id embedding does).
    assert enc.history_proj.in_features == 9 * C
    assert act.net.heads.torque_readout.out_features == 1


def test_weights_are_shared_permuting_joints_and_ids_permutes_torques():
    model = net()
    with torch.no_grad():  # ids as distinct as a trained embedding's, not the init's 0.02
        model.encoder.joint_embedding.normal_()
    x = tokens()
    perm = torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        base = model(x)
        permuted_input = model(permute_joints(x, perm))
        model.encoder.joint_embedding.copy_(model.encoder.joint_embedding[perm])
        both = model(permute_joints(x, perm))
    torch.testing.assert_close(both["tau"], base["tau"][:, perm], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(both["condition"], base["condition"][:, perm])
    torch.testing.assert_close(both["force"], base["force"], atol=1e-6, rtol=1e-5)
    # The joint-id embedding matters: permuting only the inputs is not a pure permutation.
    assert (permuted_input["tau"] - base["tau"][:, perm]).abs().max() > 1e-4


@pytest.mark.parametrize("latent_dim", [0, 4])
def test_joints_talk_only_through_the_system_latent(latent_dim):
    model = net(latent_dim=latent_dim, seed=1)
    with torch.no_grad():  # a readout large enough that an effect shows above float noise
        model.heads.torque_readout.weight.mul_(100.0)
    x = tokens()
    y = x.clone().view(3, 9, C, N)
    y[..., 0] += 1.0  # change joint 0's whole history, nothing else
    with torch.no_grad():
        a, b = model(x)["tau"], model(y.reshape(3, 9, C * N))["tau"]
    assert (a[:, 0] - b[:, 0]).abs().min() > 1e-4
    other = (a[:, 1:] - b[:, 1:]).abs().max().item()
    if latent_dim:
        assert other > 1e-4
    else:
        assert other == 0.0


def test_latent_dim_is_capped_at_eight():
    with pytest.raises(ValueError, match="latent_dim must be in 0..8"):
        net(latent_dim=9)


def saved_bundle(tmp_path):
    torch.manual_seed(0)
    act = NeuralActuator(FULL, N, make_stats(), SMALL)
    ema = {k: v + 0.01 for k, v in act.state_dict().items()}
    path = tmp_path / "actuator.pt"
    save_bundle(bundle_to_dict(act, "omx", {"ema_state_dict": ema}), path)
    return path


def test_torchscript_and_onnx_exports_match_eager(tmp_path):
    bundle = saved_bundle(tmp_path)
    module, meta = load_torchscript(export(bundle, tmp_path / "a.ts"))
    for batch in (1, 6):
        window = make_window(batch=batch, seed=batch)
        for g, e in zip(module(*graph_args(window, meta["inputs"])), eager(bundle, window),
                        strict=True):
            assert g.shape == e.shape and (g - e).abs().max() <= 1e-5
    pytest.importorskip("onnxruntime")
    session = ort_session(export(bundle, tmp_path / "a.onnx", fmt="onnx"))
    names = [i.name for i in session.get_inputs()]
    window = make_window(batch=3, seed=3)
    got = session.run(None, {k: x.numpy() for k, x in zip(names, graph_args(window, names),
                                                           strict=True)})
    for g, e in zip(got, eager(bundle, window), strict=True):
        assert g.shape == tuple(e.shape) and abs(g - e.numpy()).max() <= 1e-5


@pytest.mark.usefixtures("one_torch_thread")
def test_trains_through_the_simulator(tmp_path):
    """Rollout training (model -> clipped torque -> simulator, BPTT) lowers the joint loss."""
    L.seed_everything(0)
    data = write_sim_dataset(tmp_path / "ds", "so101")
    dm = make_dm(data, horizon=6, samples_per_epoch=4 * 40)
    module = make_module(arch="jointwise", width=32, depth=2,
                         model_sizes={"head_hidden": 16, "latent_dim": 4, "dropout": 0.0},
                         lr=5e-3, loss=LossWeights(w_force=0.0, w_gate=0.0, w_cond=0.0))
    fixed = first_batch(make_dm(data, horizon=6))
    dm.setup("fit")
    module.build_actuator(dm.norm_stats)

    def rollout_loss() -> float:
        with torch.no_grad():
            return module.compute_losses(module(fixed), fixed)["joint"].item()

    before = rollout_loss()
    make_trainer(tmp_path, max_steps=40).fit(module, datamodule=dm)
    after = rollout_loss()
    assert math.isfinite(after) and after < before / 5, f"{before:.4g} -> {after:.4g}"
    assert module.actuator.model_config["arch"] == "jointwise"


# ------------------------------------------------ the second mode: next-state (DexNDM)

STEP = {"dq": [0.01 * (j + 1) for j in range(N)], "dqd": [0.5] * N}


def next_state_actuator(seed: int = 0) -> NeuralActuator:
    torch.manual_seed(seed)
    return NeuralActuator(FULL, N, make_stats(), {**SMALL, "dynamics": "next_state",
                                                  "state_step": STEP}).eval()


def test_next_state_outputs_dq_dqd_in_the_data_step_scale_and_no_torque(tmp_path):
    actuator = next_state_actuator()
    out = actuator(make_window(batch=3))
    assert out["dq"].shape == out["dqd"].shape == (3, N)
    assert torch.isnan(out["tau"]).all()  # no simulator torque is predicted
    scale = torch.tensor([STEP["dq"], STEP["dqd"]]).T
    torch.testing.assert_close(torch.stack([out["dq"], out["dqd"]], -1),
                               out["state_delta"] * scale)
    assert out["force"].shape == (3, 3)  # the force heads stay
    assert actuator.dynamics == "next_state"
    assert actuator.model_config["state_step"] == STEP
    # the bundle rebuilds it (state_step is model config, not a weight)
    from nactuator.models import load_actuator

    path = save_bundle(bundle_to_dict(actuator, "so101"), tmp_path / "ns.pt")
    again, _ = load_actuator(path)
    window = make_window(batch=2)
    torch.testing.assert_close(again(window)["dq"], actuator(window)["dq"])


def test_next_state_needs_its_scale_and_refuses_physics_and_other_archs():
    from test_training import make_module

    with pytest.raises(ValueError, match="state_step"):
        NeuralActuator(FULL, N, make_stats(), {**SMALL, "dynamics": "next_state"})
    with pytest.raises(ValueError, match="jointwise dynamics"):
        NeuralActuator(FULL, N, make_stats(), {**SMALL, "dynamics": "sideways"})
    with pytest.raises(ValueError, match="set arch: jointwise"):
        make_module(arch="transformer", dynamics="next_state")
    # the torque mode's config is as before the option (old checkpoints load unchanged)
    assert "dynamics" not in NeuralActuator(FULL, N, make_stats(), dict(SMALL)).model_config


def test_next_state_rollout_is_the_model_not_the_simulator():
    """rollout_episodes (what eval and validation run) advances q by the model's dq: the
    simulator step is never called; the frame-wise rollout equals the step-wise definition."""
    from nactuator.rollout import (
        closed_loop_rollout_stepwise,
        episode_block,
        model_inputs,
        rollout_episodes,
    )

    actuator = next_state_actuator()

    def no_sim(q, qd, tau):
        raise AssertionError("a next-state rollout must not step the simulator")

    g = torch.Generator().manual_seed(3)
    episodes = [{k: torch.randn(T, N, generator=g) for k in model_inputs(actuator)}
                for T in (12, 15)]
    r = rollout_episodes(actuator, no_sim, episodes)
    assert r.q.shape == (2, 15, N) and torch.isnan(r.tau).all()
    # step 0 from the recorded q[0] at rest: q1 = q0 + dq of the first window
    block = episode_block(episodes, model_inputs(actuator), 9)
    block["qd"][:, 8] = 0.0
    ref = closed_loop_rollout_stepwise(actuator, no_sim, block, 9)
    torch.testing.assert_close(r.q, ref.q)
    torch.testing.assert_close(r.q[:, 1:] - r.q[:, :-1], torch.diff(ref.q, dim=1))
    assert not torch.allclose(r.q[:, 1], r.q[:, 0])


def test_teacher_forced_steps_are_one_step_predictions_from_the_recording():
    from nactuator.rollout import episode_block, model_inputs, teacher_forced_rollout

    actuator = next_state_actuator()
    g = torch.Generator().manual_seed(4)
    episodes = [{k: torch.randn(14, N, generator=g) for k in model_inputs(actuator)}
                for _ in range(2)]
    block = episode_block(episodes, model_inputs(actuator), 9)
    with torch.no_grad():
        r = teacher_forced_rollout(actuator, block, 9, steps=5)
        for i in range(5):
            window = {k: block[k][:, i : i + 9] for k in (*model_inputs(actuator), "pad")}
            out = actuator(window)
            torch.testing.assert_close(r.q[:, i + 1], block["q"][:, 8 + i] + out["dq"])
            torch.testing.assert_close(r.qd[:, i + 1], block["qd"][:, 8 + i] + out["dqd"])
            torch.testing.assert_close(r.force[:, i], out["force"])


@pytest.mark.usefixtures("one_torch_thread")
def test_next_state_trains_supervised_and_evaluates_open_loop(tmp_path):
    """A tiny next-state run lowers its one-step loss; its checkpoint rolls out open loop
    from frame 0 in ``nactuator eval`` (the model is the step) with a finite joint error."""
    from test_training import make_dm, make_module, make_trainer, write_sim_dataset

    from nactuator.eval import evaluate

    L.seed_everything(0)
    data = write_sim_dataset(tmp_path / "ds", "so101")
    dm = make_dm(data, horizon=8, samples_per_epoch=4 * 40)
    module = make_module(arch="jointwise", width=32, depth=2, dynamics="next_state",
                         model_sizes={"head_hidden": 16, "latent_dim": 4, "dropout": 0.0},
                         lr=5e-3, loss=LossWeights(w_force=0.0, w_gate=0.0, w_cond=0.0))
    fixed = first_batch(make_dm(data, horizon=8))
    dm.setup("fit")
    module.model_config["state_step"] = dm.state_step
    module.build_actuator(dm.norm_stats)
    assert module.actuator.dynamics == "next_state"

    def one_step_loss() -> float:
        with torch.no_grad():
            return module.compute_losses(module(fixed), fixed)["next"].item()

    before = one_step_loss()
    # one epoch of 40 steps, then a validation (whole episodes, open loop from frame 0)
    make_trainer(tmp_path, max_steps=40, limit_val_batches=1).fit(module, datamodule=dm)
    after = one_step_loss()
    assert math.isfinite(after) and after < before / 3, f"{before:.4g} -> {after:.4g}"
    [val] = module.val_history
    assert math.isfinite(val["score"]) and val["score"] > 0
    bundle = bundle_to_dict(module.actuator, "so101",
                            extra={"ema_state_dict": module.ema.averaged_state_dict(
                                module.actuator)})
    ckpt = save_bundle(bundle, tmp_path / "ns.pt")
    text = evaluate(ckpt, data, split="test", out=tmp_path / "eval")
    import json

    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert "Verdict" in text and metrics["steps"] == 47  # whole 48-frame episodes
    assert math.isfinite(metrics["verdict"]["joints_deg"])
    from nactuator.eval.infer import infer

    # the causal force / gate / condition estimates need no simulator either way
    assert "frames" in infer(ckpt, data, split="test", out=tmp_path / "ns.csv")
    assert (tmp_path / "ns.csv").read_text().count("\n") == 48 + 1  # one test episode
    with pytest.raises(Exception, match="next-state model"):
        export(ckpt, tmp_path / "ns.onnx")
