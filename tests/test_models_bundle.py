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
