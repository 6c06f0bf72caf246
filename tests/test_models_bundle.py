"""The actuator bundle: save/load round trips, EMA choice, clear errors on bad files."""

from __future__ import annotations

import copy

import pytest
import torch
from test_models import make_stats, make_window

from nactuator.models import (
    BUNDLE_FORMAT,
    BundleError,
    NeuralActuator,
    bundle_to_dict,
    load_actuator,
    save_bundle,
)


def trained_pair(arch: str = "transformer"):
    """An actuator plus an 'EMA' copy whose weights differ (as after training)."""
    torch.manual_seed(0)
    raw = NeuralActuator(["command", "state", "telemetry", "error"], 5, make_stats(),
                         {"arch": arch, "d_model": 64, "d_ff": 128} if arch == "transformer"
                         else {"arch": arch, "hidden": 64})
    ema = copy.deepcopy(raw)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return raw.eval(), ema.eval()


def outputs(actuator, window):
    with torch.no_grad():
        return actuator(window)


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_bundle_file_round_trip_uses_ema_weights_by_default(tmp_path, arch):
    raw, ema = trained_pair(arch)
    bundle = bundle_to_dict(raw, "omx", {"ema_state_dict": ema.state_dict(),
                                         "training_config": {"lr": 1e-4}, "run": "a"})
    path = save_bundle(bundle, tmp_path / "actuator.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["actuator.pt"]  # no temp file left

    window = make_window()
    loaded, meta = load_actuator(path)
    assert not loaded.training and meta["weights"] == "ema"
    torch.testing.assert_close(outputs(loaded, window), outputs(ema, window), rtol=0, atol=0)
    loaded_raw, meta_raw = load_actuator(path, use_ema=False)
    assert meta_raw["weights"] == "raw"
    torch.testing.assert_close(outputs(loaded_raw, window), outputs(raw, window), rtol=0, atol=0)
    assert meta["platform"] == "omx" and meta["features"] == raw.features
    assert meta["training_config"] == {"lr": 1e-4} and meta["extra"] == {"run": "a"}
    assert meta["model_config"] == raw.model_config and meta["format"] == BUNDLE_FORMAT


def test_lightning_checkpoint_and_ema_module_are_accepted(tmp_path):
    raw, ema = trained_pair()
    averaged = torch.optim.swa_utils.AveragedModel(ema)  # keys prefixed "module."
    ckpt = {"epoch": 3, "state_dict": {"actuator.x": torch.zeros(1)},
            "nactuator": bundle_to_dict(raw, "so101", {"ema_state_dict": averaged})}
    torch.save(ckpt, tmp_path / "last.ckpt")
    loaded, meta = load_actuator(tmp_path / "last.ckpt", expect_platform="so101")
    window = make_window()
    torch.testing.assert_close(outputs(loaded, window), outputs(ema, window), rtol=0, atol=0)
    # the in-memory dict works too, and without EMA the raw weights are used
    loaded, meta = load_actuator(bundle_to_dict(raw, "so101"))
    assert meta["weights"] == "raw" and meta["source"] == "<dict>"
    torch.testing.assert_close(outputs(loaded, window), outputs(raw, window), rtol=0, atol=0)


def test_norm_stats_travel_in_the_bundle():
    raw, _ = trained_pair("mlp")
    bundle = bundle_to_dict(raw, "omx")
    loaded, _ = load_actuator(bundle)
    torch.testing.assert_close(loaded.feature_builder.mean, raw.feature_builder.mean)
    assert bundle["norm_stats"]["voltage"]["mean"] == pytest.approx(make_stats()["voltage"]["mean"])
    assert all(v.device.type == "cpu" for v in bundle["state_dict"].values())


def test_bad_bundles_give_clear_errors(tmp_path):
    raw, _ = trained_pair("gru")
    with pytest.raises(FileNotFoundError, match="nope.ckpt does not exist"):
        load_actuator(tmp_path / "nope.ckpt")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(BundleError, match="notes.txt is not a torch checkpoint"):
        load_actuator(tmp_path / "notes.txt")
    torch.save({"state_dict": {}, "epoch": 1}, tmp_path / "plain.ckpt")
    with pytest.raises(BundleError, match=r"no 'nactuator' bundle.*\['epoch', 'state_dict'\]"):
        load_actuator(tmp_path / "plain.ckpt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(BundleError, match="holds a list"):
        load_actuator(tmp_path / "list.pt")
    bundle = bundle_to_dict(raw, "omx")
    with pytest.raises(BundleError, match="'nactuator-actuator/0' is not 'nactuator-actuator/1'"):
        load_actuator({**bundle, "format": "nactuator-actuator/0"})
    with pytest.raises(BundleError, match="trained for platform 'omx', expected 'so101'"):
        load_actuator(bundle, expect_platform="so101")
    with pytest.raises(BundleError, match=r"missing \['norm_stats'\]"):
        load_actuator({k: v for k, v in bundle.items() if k != "norm_stats"})
    broken = {**bundle, "model_config": {**bundle["model_config"], "hidden": 32}}
    with pytest.raises(BundleError, match="raw weights do not fit"):
        load_actuator(broken)
    with pytest.raises(BundleError, match="ema_state_dict has keys the actuator does not"):
        bundle_to_dict(raw, "omx", {"ema_state_dict": {"nope.weight": torch.zeros(1)}})
    with pytest.raises(ValueError, match="platform must be a platform name"):
        bundle_to_dict(raw, "")


class _CreatesAFile:
    """A pickle payload: unpickling it calls ``Path.touch`` (any callable would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path):
    raw, ema = trained_pair("gru")
    marker = tmp_path / "pwned"
    bundle = bundle_to_dict(raw, "so101", {"ema_state_dict": ema})
    # The payload hides inside an otherwise valid Lightning-style checkpoint.
    torch.save({"epoch": 1, "nactuator": bundle, "hyper_parameters": _CreatesAFile(marker)},
               tmp_path / "evil.ckpt")
    with pytest.raises(BundleError, match=r"evil\.ckpt was refused.*could run code"):
        load_actuator(tmp_path / "evil.ckpt")
    assert not marker.exists(), "loading the checkpoint executed code from it"
    # The same bundle without the payload loads: refusing is about the payload, not the file.
    torch.save({"epoch": 1, "nactuator": bundle}, tmp_path / "good.ckpt")
    loaded, meta = load_actuator(tmp_path / "good.ckpt", expect_platform="so101")
    assert meta["weights"] == "ema"


def _pooled_pair(arch: str):
    """The same network with and without the pooled condition head (same seed)."""
    from nactuator.input_filters import POOLED_KEYS

    stats = {**make_stats(), **{k: {"mean": [0.1] * 5, "std": [2.0] * 5} for k in POOLED_KEYS}}
    sizes = {"arch": arch, "d_model": 32, "d_ff": 64} if arch == "transformer" else {
        "arch": arch, "hidden": 32}
    torch.manual_seed(0)
    plain = NeuralActuator(["command", "state", "telemetry", "error"], 5, stats, sizes).eval()
    torch.manual_seed(0)
    pooled = NeuralActuator(["command", "state", "telemetry", "error", "pooled"], 5, stats,
                            {**sizes, "condition_head": {"kind": "pooled", "hidden": 8}})
    return plain, pooled.eval(), POOLED_KEYS


@pytest.mark.parametrize("arch", ["transformer", "jointwise"])
def test_the_pooled_condition_head_reads_only_each_motors_current_statistics(tmp_path, arch):
    """With ``condition_head: pooled`` the network's torque and force are those of the same
    network without pooled channels (it does not see them), and motor j's condition changes
    with motor j's pooled statistics of the current frame only: not with older frames', not
    with another motor's, not with the window's other channels. The bundle keeps the head."""
    plain, pooled, keys = _pooled_pair(arch)
    pooled.net.load_state_dict(plain.net.state_dict())
    window = make_window(n=5)
    g = torch.Generator().manual_seed(1)
    window.update({k: torch.randn(4, 9, 5, generator=g) for k in keys})
    base = outputs(pooled, window)
    for key in ("tau", "force", "gate"):
        torch.testing.assert_close(base[key], outputs(plain, window)[key], rtol=0, atol=0)

    def changed(edit) -> torch.Tensor:
        other = {k: v.clone() for k, v in window.items()}
        edit(other)
        return (outputs(pooled, other)["condition"] - base["condition"]).abs().amax(0)

    now = changed(lambda w: w["pool_effort_command_slope"][:, -1, 2].add_(3.0))
    assert now[2] > 1e-4 and (now[[0, 1, 3, 4]] == 0).all()
    assert (changed(lambda w: w["pool_effort_mean"][:, :-1].add_(3.0)) == 0).all()
    assert (changed(lambda w: w["effort"].add_(3.0)) == 0).all()

    path = save_bundle(bundle_to_dict(pooled, "omx"), tmp_path / "pooled.pt")
    loaded, meta = load_actuator(path)
    assert meta["model_config"]["condition_head"] == {"kind": "pooled", "hidden": 8}
    torch.testing.assert_close(outputs(loaded, window), base, rtol=0, atol=0)
    with pytest.raises(ValueError, match="feature group 'pooled'"):
        NeuralActuator(plain.features, 5, make_stats(),
                       {"arch": arch, "condition_head": {"kind": "pooled"}})


def test_the_pooled_condition_head_trains_at_its_own_learning_rate():
    """``model.condition_head`` + ``model.condition_lr`` (conf/train/pooled_condition.yaml):
    the head's parameters form their own optimiser group at condition_lr, everything else
    stays at lr, and every parameter is in exactly one group."""
    from nactuator.input_filters import POOLED_KEYS
    from nactuator.training.module import NeuralActuatorModule

    module = NeuralActuatorModule(
        platform="omx", arch="mlp", width=16, depth=1, lr=1e-3, lr_total_steps=10,
        features=["command", "state", "telemetry", "error", "pooled"],
        condition_head={"kind": "pooled", "hidden": 8}, condition_lr=3e-2)
    module.build_actuator({**make_stats(), **{k: {"mean": [0.0] * 5, "std": [1.0] * 5}
                                              for k in POOLED_KEYS}})
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert [g["name"] for g in groups] == ["all", "condition"]
    assert [g["initial_lr"] for g in groups] == pytest.approx([1e-3, 3e-2])
    assert {id(p) for p in groups[1]["params"]} == {
        id(p) for p in module.actuator.condition_head.parameters()}
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(module.actuator.parameters()))


def test_the_shared_condition_head_scores_every_motor_with_one_mlp():
    """``condition_head: {shared: true}``: one MLP tied over the motors, so its size does not
    grow with the motor count, permuting the motors permutes the logits, and every motor's
    logit is the per-motor head's with that one MLP copied into each motor's weights."""
    from nactuator.models.heads import PooledConditionHead

    torch.manual_seed(0)
    shared = PooledConditionHead(6, 9, hidden=16, shared=True)
    assert sum(p.numel() for p in shared.parameters()) == sum(
        p.numel() for p in PooledConditionHead(2, 9, hidden=16, shared=True).parameters())
    stats = torch.randn(4, 9, 6, generator=torch.Generator().manual_seed(1))
    logits = shared(stats)
    assert logits.shape == (4, 6)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    torch.testing.assert_close(shared(stats[:, :, perm]), logits[:, perm], rtol=0, atol=1e-6)
    per_motor = PooledConditionHead(6, 9, hidden=16)
    with torch.no_grad():
        for name, p in per_motor.named_parameters():
            p.copy_(getattr(shared, name).expand_as(p))
    torch.testing.assert_close(per_motor(stats), logits, rtol=1e-5, atol=1e-5)


def test_a_shared_condition_head_round_trips_and_old_heads_keep_their_config(tmp_path):
    """The bundle keeps ``shared: true`` and gives the same outputs after loading; a
    per-motor head's config has no ``shared`` key (bundles before the option read as
    before, bit for bit), and a misspelt key is refused."""
    plain, pooled, keys = _pooled_pair("transformer")
    stats = {**make_stats(), **{k: {"mean": [0.1] * 5, "std": [2.0] * 5} for k in keys}}
    torch.manual_seed(0)
    shared = NeuralActuator(pooled.features, 5, stats, {
        "arch": "transformer", "d_model": 32, "d_ff": 64,
        "condition_head": {"kind": "pooled", "hidden": 8, "shared": True}}).eval()
    window = make_window(n=5)
    g = torch.Generator().manual_seed(1)
    window.update({k: torch.randn(4, 9, 5, generator=g) for k in keys})
    base = outputs(shared, window)
    loaded, meta = load_actuator(save_bundle(bundle_to_dict(shared, "omx"), tmp_path / "s.pt"))
    assert meta["model_config"]["condition_head"] == {"kind": "pooled", "hidden": 8,
                                                      "shared": True}
    torch.testing.assert_close(outputs(loaded, window), base, rtol=0, atol=0)
    assert "shared" not in pooled.model_config["condition_head"]
    # the per-motor head computes what it computed before the option existed
    head, cols = pooled.condition_head, pooled.pool_columns
    tokens = pooled.frame_tokens(window)[:, -1][:, cols]
    h = torch.nn.functional.silu(torch.einsum("bpn,nph->bnh", tokens, head.w1) + head.b1)
    h = torch.nn.functional.silu(torch.einsum("bnh,nhk->bnk", h, head.w2) + head.b2)
    old = torch.sigmoid(torch.einsum("bnh,nh->bn", h, head.w3) + head.b3)
    torch.testing.assert_close(outputs(pooled, window)["condition"], old, rtol=0, atol=0)
    with pytest.raises(ValueError, match="unknown keys"):
        NeuralActuator(pooled.features, 5, stats, {
            "arch": "transformer", "condition_head": {"kind": "pooled", "shard": True}})


def test_the_condition_head_can_train_at_a_constant_learning_rate():
    """``model.condition_lr_schedule: constant`` (conf/train/shared_condition.yaml): the
    condition group stays at condition_lr on every step while the rest warms up and decays;
    without condition_lr it is refused (there is no group to hold)."""
    from nactuator.input_filters import POOLED_KEYS
    from nactuator.training.module import NeuralActuatorModule

    kwargs = dict(platform="omx", arch="mlp", width=16, depth=1, lr=1e-3, lr_total_steps=10,
                  warmup_steps=3, features=["command", "state", "telemetry", "error", "pooled"],
                  condition_head={"kind": "pooled", "hidden": 8, "shared": True})
    module = NeuralActuatorModule(**kwargs, condition_lr=3e-2, condition_lr_schedule="constant")
    module.build_actuator({**make_stats(), **{k: {"mean": [0.0] * 5, "std": [1.0] * 5}
                                              for k in POOLED_KEYS}})
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    seen = []
    for _ in range(10):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert [s[1] for s in seen] == pytest.approx([3e-2] * 10)
    assert seen[0][0] < seen[3][0] == pytest.approx(1e-3) and seen[-1][0] < 1e-3
    with pytest.raises(ValueError, match="needs condition_lr"):
        NeuralActuatorModule(**kwargs, condition_lr_schedule="constant")
