"""nactuator.models: shapes, sizes, features, window semantics (Contract 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from nactuator.models import (
    DEFAULT_FEATURES,
    ENCODERS,
    FeatureBuilder,
    NeuralActuator,
    build_model,
    count_parameters,
)

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ("transformer", "mlp", "gru", "lstm")
CHANNELS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")
N = 5  # OMX: 4 arm joints + gripper
L = 9


def make_stats(n: int = N) -> dict:
    """Plausible train-set statistics, different per channel and motor."""
    return {k: {"mean": [0.1 * (i + 1) + j for j in range(n)],
                "std": [0.5 + 0.2 * i + 0.1 * j for j in range(n)]}
            for i, k in enumerate(CHANNELS)}


def make_window(batch: int = 4, length: int = L, n: int = N, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(batch, length, n, generator=g) * 2.0 for k in CHANNELS[:-1]}


def actuator(arch: str = "transformer", features=("command", "state", "telemetry", "error"),
             seed: int = 0, **sizes) -> NeuralActuator:
    torch.manual_seed(seed)
    return NeuralActuator(list(features), N, make_stats(), {"arch": arch, **sizes}).eval()


# ------------------------------------------------------------------- outputs and sizes


@pytest.mark.parametrize("arch", ARCHS)
def test_outputs_have_contract_shapes_and_ranges(arch):
    out = actuator(arch)(make_window(batch=4))
    shapes = {k: tuple(v.shape) for k, v in out.items()}
    assert shapes == {"tau": (4, N), "force": (4, 3), "force_raw": (4, 3), "gate": (4, 1),
                      "gate_logit": (4, 1), "condition": (4, N), "condition_logit": (4, N)}
    assert all(torch.isfinite(v).all() for v in out.values())
    assert ((out["gate"] > 0) & (out["gate"] < 1)).all()
    assert ((out["condition"] > 0) & (out["condition"] < 1)).all()
    torch.testing.assert_close(out["gate"], torch.sigmoid(out["gate_logit"]))
    torch.testing.assert_close(out["condition"], torch.sigmoid(out["condition_logit"]))
    torch.testing.assert_close(out["force"], out["gate"] * out["force_raw"])


@pytest.mark.parametrize("n_motors", [5, 6])  # OMX and SO-101 layouts
def test_parameter_counts_are_about_1p4m_and_matched(n_motors):
    n_in = 7 * n_motors
    counts = {a: count_parameters(build_model(a, n_in, n_motors)) for a in ARCHS}
    assert 1.40e6 <= counts["transformer"] <= 1.48e6, counts  # SPEC §4: ~1.44 M
    for a in ARCHS:
        for b in ARCHS:
            assert abs(counts[a] - counts[b]) <= 0.10 * counts[b], (a, b, counts)


def test_transformer_matches_the_spec_layout():
    net = build_model("transformer", 35, N)
    encoder = net.encoder
    assert len(encoder.blocks) == 4 and encoder.width == 192
    assert encoder.pos_embedding.shape == (1, 9, 192)
    block = encoder.blocks[0]
    assert block.attn.n_heads == 4
    assert block.ffn[0].out_features == 384 and isinstance(block.ffn[1], torch.nn.GELU)
    assert count_parameters(net) == 1_440_238  # the figure reported in docs/benchmarks.md


def test_attention_output_is_gated_by_the_query():
    """Forcing the gate pre-activation to -inf must silence the attention branch."""
    torch.manual_seed(0)
    attn = build_model("transformer", 35, N, dropout=0.0).encoder.blocks[0].attn
    u = torch.randn(2, L, 192)
    with torch.no_grad():
        attn.in_proj.bias[3 * 192:] = -1e4  # the last quarter is the gate
        out = attn(u)
    torch.testing.assert_close(out, attn.out_proj.bias.expand_as(out))


@pytest.mark.parametrize("arch", ARCHS)
def test_conf_model_yaml_builds_the_default_sizes(arch):
    conf = yaml.safe_load((ROOT / "conf" / "model" / f"{arch}.yaml").read_text())
    assert conf["model"]["arch"] == arch
    net = build_model(arch, 35, N, **conf["model"]["model_sizes"])
    assert net.config == build_model(arch, 35, N).config  # conf and code defaults agree
    hints = {"transformer": (1e-4, 1.0), "mlp": (3e-5, 0.3)}
    if arch in hints:  # SPEC §4 training hints
        assert (conf["model"]["lr"], conf["trainer"]["gradient_clip_val"]) == hints[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_initial_torque_is_small_but_trainable(arch):
    act = actuator(arch)
    window = make_window(batch=16)
    window["q"].requires_grad_(True)
    out = act(window)
    assert out["tau"].abs().max() < 0.05  # N·m: a stable first rollout
    assert out["force_raw"].abs().max() > 10 * out["tau"].abs().max()
    # BPTT: the torque must depend on the (simulated) joint state in the window.
    (grad,) = torch.autograd.grad(out["tau"].sum(), window["q"])
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_dropout_is_configurable():
    window = make_window()
    no_drop = actuator("transformer", dropout=0.0).train()
    torch.testing.assert_close(no_drop(window)["tau"], no_drop.eval()(window)["tau"])
    drop = actuator("transformer", dropout=0.1).train()
    assert not torch.allclose(drop(window)["force_raw"], drop.eval()(window)["force_raw"])
    assert actuator("gru").model_config["dropout"] == 0.1  # the SPEC default


# ------------------------------------------------------------------------ features


def test_feature_builder_normalises_with_the_stats_and_clips():
    stats = {k: {"mean": [1.0, -1.0], "std": [2.0, 0.0]} for k in CHANNELS}
    builder = FeatureBuilder(["command", "error"], 2, stats, eps=1e-3)
    assert builder.n_in == 4
    window = {"q_cmd": torch.tensor([[[5.0, -1.0]]]), "q": torch.tensor([[[2.0, -1.002]]])}
    tokens = builder(window)
    # q_cmd: (5 - 1) / 2 = 2; (-1 - -1) / eps = 0
    # error: q_cmd - q = (3, 0.002): (3 - 1) / 2 = 1; (0.002 + 1) / 1e-3 = 1002 -> clip 10
    torch.testing.assert_close(tokens, torch.tensor([[[2.0, 0.0, 1.0, 10.0]]]))
    saved = builder.norm_stats()["error"]
    assert saved["mean"] == [1.0, -1.0] and saved["std"] == pytest.approx([2.0, 1e-3])
    assert "mean" in dict(builder.named_buffers()) and "std" in dict(builder.named_buffers())


def test_token_layout_follows_the_group_order():
    stats = make_stats()
    builder = FeatureBuilder(["state", "command"], N, stats)
    window = make_window(batch=1)
    tokens = builder(window)
    expect_q = (window["q"] - torch.tensor(stats["q"]["mean"])) / torch.tensor(stats["q"]["std"])
    torch.testing.assert_close(tokens[..., :N], expect_q.clamp(-10, 10))
    assert builder.channels == ["q", "qd", "q_cmd"]


def test_pad_frames_become_the_train_mean():
    # The four telemetry-model groups (the counterfactual ones: tests/test_counterfactual.py).
    builder = FeatureBuilder(list(DEFAULT_FEATURES), N, make_stats())
    window = make_window(batch=2)
    pad = torch.zeros(2, L, dtype=torch.bool)
    pad[0, :3] = True
    tokens = builder({**window, "pad": pad})
    assert (tokens[0, :3] == 0).all()
    torch.testing.assert_close(tokens[0, 3:], builder(window)[0, 3:])
    torch.testing.assert_close(tokens[1], builder(window)[1])


@pytest.mark.parametrize("arch", ARCHS)
def test_telemetry_free_variant_ignores_telemetry(arch):
    full, free = actuator(arch), actuator(arch, features=("command", "state", "error"))
    assert free.feature_builder.n_in == 4 * N < full.feature_builder.n_in == 7 * N
    assert "effort" not in free.inputs
    window = make_window()
    changed = {**window, "effort": window["effort"] + 3.0,
               "voltage": window["voltage"] - 2.0, "temperature": window["temperature"] * 4}
    torch.testing.assert_close(free(changed), free(window))
    assert not torch.allclose(full(changed)["force_raw"], full(window)["force_raw"])
    # the telemetry-free window need not contain telemetry at all
    free({k: window[k] for k in ("q_cmd", "q", "qd")})


# ---------------------------------------------------------------- window semantics


@pytest.mark.parametrize("arch", ARCHS)
def test_output_depends_only_on_the_given_window(arch):
    """A sliding window over an episode: the prediction at frame t is the same whatever
    comes after t, the same for repeated calls (no carried state), and one sample's
    prediction does not depend on the rest of the batch."""
    act = actuator(arch)
    episode = make_window(batch=3, length=20, seed=1)
    t = 12
    window = {k: v[:, t - L + 1:t + 1] for k, v in episode.items()}
    future_changed = {k: v.clone() for k, v in episode.items()}
    for v in future_changed.values():
        v[:, t + 1:] += 5.0
    window_again = {k: v[:, t - L + 1:t + 1] for k, v in future_changed.items()}
    first, second = act(window), act(window_again)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    alone = act({k: v[1:2] for k, v in window.items()})
    torch.testing.assert_close({k: v[1:2] for k, v in first.items()}, alone,
                               rtol=1e-5, atol=1e-6)
    # ... and the oldest frame of the window does matter
    older = {k: v.clone() for k, v in window.items()}
    older["q"][:, 0] += 1.0
    assert not torch.allclose(act(older)["force_raw"], first["force_raw"])


def test_windows_of_the_wrong_length_or_shape_are_rejected():
    act = actuator()
    with pytest.raises(ValueError, match=r"\(B, 9, 35\)"):
        act(make_window(length=12))
    with pytest.raises(ValueError, match=r"window\['qd'\].*\(B, L, 5\)"):
        act({**make_window(), "qd": torch.zeros(4, L, 6)})
    with pytest.raises(KeyError, match="missing channel.*voltage"):
        act({k: v for k, v in make_window().items() if k != "voltage"})
    with pytest.raises(ValueError, match=r"window\['pad'\] must have shape \(B, L\)"):
        act({**make_window(), "pad": torch.zeros(4, L - 1, dtype=torch.bool)})


# --------------------------------------------------------------------- bad config


def test_bad_configuration_gives_clear_errors():
    with pytest.raises(ValueError, match="unknown model arch 'cnn'"):
        build_model("cnn", 35, N)
    with pytest.raises(ValueError, match=r"unknown size\(s\) \['width'\].*d_model"):
        build_model("transformer", 35, N, width=3)
    with pytest.raises(ValueError, match="divisible"):
        build_model("transformer", 35, N, d_model=190)
    with pytest.raises(ValueError, match="unknown feature group.*'telemetery'"):
        NeuralActuator(["command", "telemetery"], N, make_stats(), {"arch": "mlp"})
    with pytest.raises(ValueError, match="missing 'voltage'.'mean'"):
        stats = make_stats()
        del stats["voltage"]
        NeuralActuator(["telemetry"], N, stats, {"arch": "mlp"})
    with pytest.raises(ValueError, match=r"norm_stats\['q'\]\['std'\] must be 5 finite"):
        stats = make_stats()
        stats["q"]["std"] = [1.0, 2.0]
        NeuralActuator(["state"], N, stats, {"arch": "mlp"})
    with pytest.raises(ValueError, match="needs n_motors >= 1"):
        NeuralActuator(["state"], norm_stats=make_stats())
    with pytest.raises(ValueError, match="needs an 'arch'"):
        NeuralActuator(["state"], N, make_stats(), {"d_model": 64})
    assert sorted(ENCODERS) == sorted((*ARCHS, "jointwise"))
