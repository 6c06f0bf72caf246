"""Shipped pretrained actuators (issue 26 item 1): `--ckpt pretrained/NAME`, the bundle
`make pretrain` writes (EMA weights only, safe to load), its model card, and the recipes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from test_models import make_window
from test_models_bundle import outputs, trained_pair

from nactuator.experiments.pretrain import load_pretrain_config, write_pretrained_bundle
from nactuator.model_files import ModelFileError, pretrained_dir, resolve_model_path
from nactuator.models import bundle_to_dict, load_actuator, load_model

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "src" / "nactuator" / "pretrained"


def test_a_pretrained_name_resolves_to_the_shipped_file_and_an_unknown_one_is_refused(
        tmp_path, monkeypatch):
    monkeypatch.setenv("NACTUATOR_PRETRAINED", str(tmp_path / "shipped"))
    (tmp_path / "shipped").mkdir()
    (tmp_path / "shipped" / "arm.pt").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("pretrained/arm") == tmp_path / "shipped" / "arm.pt"
    assert resolve_model_path("pretrained/arm.pt") == tmp_path / "shipped" / "arm.pt"
    with pytest.raises(ModelFileError, match=r"no pretrained actuator 'nope' \(shipped: "
                                             r"pretrained/arm;"):
        resolve_model_path("pretrained/nope")
    # A real file of that name, relative to where the user is, wins over the shipped one.
    (tmp_path / "pretrained").mkdir()
    (tmp_path / "pretrained" / "arm").write_bytes(b"y")
    assert resolve_model_path("pretrained/arm") == Path("pretrained/arm")


def test_the_pretrained_bundle_holds_the_ema_weights_only_and_loads_by_name(
        tmp_path, monkeypatch):
    raw, ema = trained_pair()
    ckpt = tmp_path / "best.ckpt"  # a Lightning checkpoint's layout: our bundle under a key
    torch.save({"state_dict": {}, "optimizer_states": [{}],
                "nactuator": bundle_to_dict(raw, "omx", {"ema_state_dict": ema.state_dict()})},
               ckpt)
    monkeypatch.setenv("NACTUATOR_PRETRAINED", str(tmp_path / "shipped"))
    out = write_pretrained_bundle(ckpt, pretrained_dir() / "omx.pt",
                                  extra={"pretrain_recipe": "omx.yaml"})
    stored = torch.load(out, map_location="cpu", weights_only=True)
    assert stored["ema_state_dict"] is None and "optimizer_states" not in stored
    model, meta = load_model("pretrained/omx", expect_platform="omx")
    window = make_window()
    torch.testing.assert_close(outputs(model, window), outputs(ema, window), rtol=0, atol=0)
    assert meta["extra"]["pretrain_recipe"] == "omx.yaml"


@pytest.mark.parametrize("platform", ["so101", "omx"])
def test_the_shipped_bundle_loads_safely_and_its_card_tells_its_hash_and_figures(platform):
    bundle, card = SHIPPED / f"{platform}.pt", SHIPPED / f"{platform}.md"
    assert bundle.is_file() and card.is_file(), "run `make pretrain PLATFORM=...`"
    # weights_only: the file holds tensors and plain containers, nothing that runs code.
    torch.load(bundle, map_location="cpu", weights_only=True)
    actuator, meta = load_actuator(f"pretrained/{platform}", expect_platform=platform)
    assert meta["platform"] == platform and meta["weights"] == "raw"  # EMA stored as weights
    text = card.read_text()
    digest = re.search(r"SHA-256 `([0-9a-f]{64})`", text)
    assert digest and digest.group(1) == hashlib.sha256(bundle.read_bytes()).hexdigest()
    params = int(re.search(r"([\d,]+) parameters", text).group(1).replace(",", ""))
    assert params == sum(p.numel() for p in actuator.parameters())
    assert "## NAD validation" in text and "command following" in text
    assert bundle.stat().st_size < 1_000_000  # small enough to ship in the repository


@pytest.mark.parametrize("platform", ["so101", "omx"])
def test_the_pretrain_recipe_parses_as_nactuator_train_arguments(platform):
    """A typo in a recipe's train_args would fail only after the synthesis; parse them with
    `train`'s own LightningCLI now."""
    from nactuator.data.datamodule import NADDataModule
    from nactuator.training.cli import _make_cli_class
    from nactuator.training.module import NeuralActuatorModule

    cfg, _ = load_pretrain_config(platform)
    assert (ROOT / cfg["world"]).is_file()
    conf = ROOT / "conf"
    configs = [conf / "base.yaml", conf / "train" / f"{platform}.yaml"]
    args = [*(a for c in configs for a in ("--config", str(c))), "--platform", platform,
            "--data.paths=[x]", *cfg["train_args"]]
    cli = _make_cli_class()(NeuralActuatorModule, NADDataModule, run=False, args=args,
                            parser_kwargs={"default_env": False})
    assert cli.trainer.max_epochs == 30 and cli.model.hparams.width == 64


def test_a_bad_recipe_is_refused_with_the_key_named(tmp_path):
    from nactuator.errors import UserError

    bad = tmp_path / "r.yaml"
    bad.write_text("platform: so101\nseeds: [1]\nepochs: 3\n")
    with pytest.raises(UserError, match=r"unknown keys \['epochs'\]"):
        load_pretrain_config("so101", bad)
    bad.write_text("platform: so101\nseeds: []\n")
    with pytest.raises(UserError, match="seeds must be a non-empty list"):
        load_pretrain_config("so101", bad)
