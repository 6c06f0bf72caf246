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
