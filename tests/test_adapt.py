"""Fine-tuning from a checkpoint (``model.init_from``, ``backbone_lr_scale``) and
``nactuator adapt``: real module, real Trainer, real simulator, tiny datasets."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from test_training import make_dm, make_module, make_trainer, write_sim_dataset

from nactuator.cli import main
from nactuator.data import read_dataset
from nactuator.eval import evaluate
from nactuator.experiments.adapt import AdaptError, load_adapt_config, plan_episodes
from nactuator.experiments.cv import fold_row
from nactuator.models import load_actuator
from nactuator.platforms import conf_dir
from nactuator.training.cli import lightning_main
from nactuator.training.module import InitFromError

PRETRAINED_SIZES = dict(width=16, depth=1, model_sizes={"head_hidden": 16, "dropout": 0.0})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 16-wide so101 checkpoint trained for 4 steps on one tiny dataset (EMA != raw)."""
    root = tmp_path_factory.mktemp("pretrain")
    data = write_sim_dataset(root / "ds", "so101", frames=32, seed=0)
    L.seed_everything(0)
    module = make_module(**PRETRAINED_SIZES)
    trainer = make_trainer(root, max_steps=4)
    trainer.fit(module, datamodule=make_dm(data, horizon=4))
    ckpt = root / "pretrained.ckpt"
    trainer.save_checkpoint(ckpt)
    return ckpt


@pytest.fixture(scope="module")
def new_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another tiny so101 dataset (other commands, other statistics): the 'new arm'."""
    return write_sim_dataset(tmp_path_factory.mktemp("new") / "ds", "so101", frames=32, seed=5,
                             splits={"train": 3, "validation": 1, "test": 1})


# ------------------------------------------------------------- init_from in the module


def test_init_from_builds_the_checkpoints_actuator_with_its_ema_weights(pretrained):
    bundle = torch.load(pretrained, weights_only=True)["nactuator"]
    module = make_module(init_from=str(pretrained))  # this run says width 32 ...
    module.setup("fit")
    # ... but the architecture is the checkpoint's (16 wide), the weights its EMA ones.
    assert module.actuator.model_config == bundle["model_config"]
    assert module.actuator.model_config["d_model"] == 16
    state = module.actuator.state_dict()
    for key, value in bundle["ema_state_dict"].items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)
    assert any(not torch.equal(bundle["state_dict"][k], v)
               for k, v in bundle["ema_state_dict"].items()), "EMA == raw: test is vacuous"
    for name, p in module.actuator.named_parameters():  # the EMA restarts from them
        torch.testing.assert_close(module.ema.shadow[name], p.detach(), rtol=0, atol=0)


def test_init_from_keeps_the_checkpoints_normalisation(pretrained, new_data, tmp_path):
    ckpt_stats = torch.load(pretrained, weights_only=True)["nactuator"]["norm_stats"]
    dm = make_dm(new_data, horizon=4)
    dm.setup("fit")
    assert dm.norm_stats["q_cmd"]["mean"] != pytest.approx(ckpt_stats["q_cmd"]["mean"])
    module = make_module(init_from=str(pretrained))
    make_trainer(tmp_path, max_steps=1).fit(module, datamodule=dm)
    stats = module.actuator.feature_builder.norm_stats()
    for key, value in ckpt_stats.items():
        assert stats[key]["mean"] == pytest.approx(value["mean"], rel=1e-6), key
        assert stats[key]["std"] == pytest.approx(value["std"], rel=1e-6), key


def test_backbone_lr_scale_makes_two_param_groups(pretrained):
    module = make_module(init_from=str(pretrained), lr=2e-3, backbone_lr_scale=0.1)
    module.setup("fit")
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert [g["name"] for g in groups] == ["heads", "backbone"]
    assert groups[0]["lr"] == pytest.approx(2e-3) and groups[1]["lr"] == pytest.approx(2e-4)
    encoder = {id(p) for p in module.actuator.net.encoder.parameters()}
    assert {id(p) for p in groups[1]["params"]} == encoder
    assert not encoder & {id(p) for p in groups[0]["params"]}
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(
        list(module.actuator.parameters()))
    # scale 1 keeps the single group of an ordinary run (older checkpoints resume)
    plain = make_module(init_from=str(pretrained))
    plain.setup("fit")
    assert len(plain.configure_optimizers()["optimizer"].param_groups) == 1


def test_a_frozen_backbone_does_not_move_while_the_heads_learn(pretrained, new_data, tmp_path):
    module = make_module(init_from=str(pretrained), backbone_lr_scale=0.0)
    module.setup("fit")
    before = {k: v.clone() for k, v in module.actuator.state_dict().items()}
    make_trainer(tmp_path, max_steps=3).fit(module, datamodule=make_dm(new_data, horizon=4))
    after = module.actuator.state_dict()
    encoder = [k for k in before if k.startswith("net.encoder.")]
    heads = [k for k in before if k.startswith("net.heads.")]
    assert encoder and heads
    assert all(torch.equal(before[k], after[k]) for k in encoder)
    assert any(not torch.equal(before[k], after[k]) for k in heads)


def test_a_checkpoint_of_another_platform_or_other_features_is_refused(pretrained):
    with pytest.raises(InitFromError, match="trained for platform 'so101'.*'omx'"):
        make_module(platform="omx", init_from=str(pretrained)).setup("fit")
    with pytest.raises(InitFromError, match="feature groups"):
        make_module(init_from=str(pretrained),
                    features=["command", "state", "error"]).setup("fit")
    with pytest.raises(ValueError, match="backbone_lr_scale"):
        make_module(backbone_lr_scale=-0.5)


def test_fine_tuning_through_lightning_cli(pretrained, new_data, tmp_path):
    cli = lightning_main([
        "fit", "--config", str(conf_dir() / "base.yaml"), "--platform", "so101",
        f"--data.paths=[{new_data}]", f"--model.init_from={pretrained}",
        "--model.backbone_lr_scale=0.25", "--data.samples_per_epoch=4",
        "--data.batch_size=4", "--data.horizon={0: 3}", "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
        "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"])
    groups = cli.trainer.optimizers[0].param_groups
    assert groups[1]["lr"] == pytest.approx(0.25 * groups[0]["lr"])
    last = next(tmp_path.rglob("last.ckpt"))
    actuator, meta = load_actuator(last)
    assert meta["model_config"]["d_model"] == 16  # the pretrained architecture
    assert meta["training_config"]["init_from"] == str(pretrained)
    # the fine-tuned checkpoint resumes (and loads in a fresh module) with its architecture
    resumed = lightning_main([
        "validate", "--config", str(conf_dir() / "base.yaml"), "--platform", "so101",
        f"--data.paths=[{new_data}]", f"--model.init_from={pretrained}",
        "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
        "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}",
        f"--ckpt_path={last}"])
    weights = resumed.model.ema.averaged_state_dict(resumed.model.actuator)
    for key, value in actuator.state_dict().items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=0)


# ---------------------------------------------------------------------------- adapt


def _fake(root: str, runs: list[tuple[str, str]]):
    episodes = [SimpleNamespace(index=i, task=t, split=s) for i, (t, s) in enumerate(runs)]
    return SimpleNamespace(root=root, episodes=episodes)


def test_the_pool_interleaves_tasks_and_held_out_runs_never_fine_tune():
    ds = _fake("d", [("push", "train")] * 3 + [("ref", "train")] * 3
               + [("push", "validation"), ("ref", "validation")])
    plan = plan_episodes([ds], "auto", held_out_runs=1)
    assert plan.held_out_split == "validation"  # no test split
    assert [(r.task, r.index) for r, _ in plan.pool] == [("push", 0), ("ref", 3), ("push", 1),
                                                         ("ref", 4)]
    assert sorted(r.index for r, _ in plan.held_out) == [2, 5, 6, 7]
    with pytest.raises(AdaptError, match="no test episodes"):
        plan_episodes([ds], "test")
    with pytest.raises(AdaptError, match="would leave none"):
        plan_episodes([ds], "auto", held_out_runs=3)


def test_adapt_config_errors_name_the_key(tmp_path):
    assert load_adapt_config()["adapt"]["episodes"] == [1, 2, 4, 8, 12]
    bad = tmp_path / "a.yaml"
    bad.write_text("adapt: {episodes: [1], metric: m, time_curve: largest, held_out: auto, "
                   "held_out_runs: 0, epochs: 3}\ntrain: {}\n")
    with pytest.raises(AdaptError, match=r"unknown key\(s\) \['epochs'\]"):
        load_adapt_config(bad)
    bad.write_text("adapt: {episodes: [0], metric: m, time_curve: largest, held_out: auto, "
                   "held_out_runs: 0}\ntrain: {}\n")
    with pytest.raises(AdaptError, match="adapt.episodes"):
        load_adapt_config(bad)


# One fine-tune in the fast suite (a child training costs ~20 s of start-up here); the nested
# N = 1, 2 pair runs with the slow tests. The pool order that makes the subsets nested is
# checked above without training (test_the_pool_interleaves_...).
@pytest.mark.parametrize("counts", [(2,), pytest.param((1, 2), marks=pytest.mark.slow)],
                         ids=["n2", "n1-n2"])
def test_adapt_writes_the_curve_and_n0_is_the_checkpoint(pretrained, new_data, tmp_path,
                                                          capsys, counts):
    out = tmp_path / "adapt"
    code = main(["adapt", "--ckpt", str(pretrained), "--data", str(new_data),
                 "--episodes", *map(str, counts), "--out", str(out), "--",
                 "--trainer.max_epochs=2", "--data.samples_per_epoch=4",
                 "--data.batch_size=4", "--data.horizon={0: 3}"])
    assert code == 0
    result = json.loads((out / "adapt.json").read_text())
    assert [p["n"] for p in result["points"]] == [0, *counts]
    assert result["held_out"]["split"] == "test" and len(result["held_out"]["episodes"]) == 1
    printed = capsys.readouterr().out
    assert "| N | fine-tune s |" in printed and "| 2 |" in printed
    assert (out / "adapt.md").read_text().strip() in printed
    assert (out / "adapt.png").stat().st_size > 0

    # N = 0 is exactly `nactuator eval` of the checkpoint on the held-out episodes.
    evaluate(pretrained, new_data, split="test", out=tmp_path / "ev")
    direct = fold_row(json.loads((tmp_path / "ev" / "metrics.json").read_text()))
    n0 = result["points"][0]["metrics"]
    for key in ("arm mean (deg), model", "worst arm joint (deg), model",
                "force 3-axis (N), model rollout", "force 3-axis (N), model causal"):
        assert n0[key] == pytest.approx(direct[key], rel=1e-9, abs=1e-12), key

    # Each fine-tune saw exactly its N train runs (nested), never the held-out run.
    held = read_dataset(new_data).split_indices("test")
    for p in result["points"][1:]:
        subset = read_dataset(out / "data" / f"n_{p['n']:03d}")
        train = [e for e in subset.episodes if e.split == "train"]
        assert len(train) == p["n"] == len(p["episodes"])
        assert all(e.meta["adapt_source"]["split"] == "train" for e in train)
        assert all(e.meta["adapt_source"]["episode_index"] not in held for e in train)
        assert p["metrics"]["arm mean (deg), model"] != n0["arm mean (deg), model"]
        assert p["fit_s"] > 0 and p["process_s"] >= p["fit_s"]
        # CPU seconds of the fit (the cost on one free core), bounded by the cores it had
        assert 0 < p["fit_cpu_s"] <= p["process_s"] * (os.cpu_count() or 1)
        ft, meta = load_actuator(p["checkpoint"])
        assert meta["model_config"]["d_model"] == 16
    if len(counts) == 2:
        assert result["points"][1]["episodes"] == result["points"][2]["episodes"][:1]
    # the time curve: every epoch of the largest N, in order of wall time
    curve = result["time_curve"]
    assert [(t["n"], t["epoch"]) for t in curve] == [(2, 0), (2, 1)]
    assert 0 < curve[0]["seconds"] < curve[1]["seconds"]
    assert curve[-1]["value"] == result["points"][-1]["metrics"][result["metric"]]
    assert np.isfinite([t["value"] for t in curve]).all()
