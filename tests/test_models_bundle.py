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
