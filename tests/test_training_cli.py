"""LightningCLI wiring (`nactuator fit|validate|test`, `nactuator train`) and DDP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nactuator.paths import warp_cache_dir
from nactuator.platforms import conf_dir
from nactuator.training.cli import lightning_main, logger_config, rewrite_args, train

sys.path.insert(0, str(Path(__file__).parent))
from test_training import write_sim_dataset  # noqa: E402

BASE = str(conf_dir() / "base.yaml")
SO101_YAML = str(conf_dir() / "platform" / "so101.yaml")
ROOT = conf_dir().parent


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sim_dataset(tmp_path_factory.mktemp("cli") / "so101", "so101")


def tiny_args(out: Path) -> list[str]:
    """One epoch of two batches, one validation batch, outputs under ``out``."""
    return [
        "--data.samples_per_epoch=8", "--data.batch_size=4",
        "--data.horizon={0: 4}", "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1",
        "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={out}",
    ]


def test_rewrite_args_platform_yaml_and_logger_shortcuts(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = rewrite_args(["--config", BASE, "--config", SO101_YAML, "--logger", "wandb", "--x=1"])
    assert out[:4] == ["--config", BASE, "--platform", SO101_YAML]
    logger = json.loads(out[4].removeprefix("--trainer.logger="))
    assert logger["class_path"].endswith("WandbLogger")
    assert logger["init_args"]["offline"] is True  # no credentials: never goes online
    assert os.environ["WANDB_MODE"] == "offline"
    assert out[5] == "--x=1"
    assert rewrite_args(["--logger=none"]) == ["--trainer.logger=false"]
    with pytest.raises(ValueError, match="--logger must be one of"):
        logger_config("mlflow")


def test_wandb_goes_online_only_with_credentials(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert logger_config("wandb")["init_args"]["offline"] is False
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert logger_config("wandb")["init_args"]["offline"] is True


def test_fit_validate_test_through_lightning_cli(data, tmp_path):
    args = ["--config", BASE, "--config", SO101_YAML, f"--data.paths=[{data}]",
            *tiny_args(tmp_path)]
    cli = lightning_main(["fit", *args])
    assert cli.model.platform.name == "so101" and cli.datamodule.platform.name == "so101"
    assert cli.trainer.global_step == 2
    metrics = cli.trainer.callback_metrics
    assert torch.isfinite(metrics["val/loss"]) and "val/joint_mae_deg" in metrics
    # base.yaml rewrites last.ckpt after every epoch (resumable), besides the best by val/score
    (last,) = tmp_path.rglob("last.ckpt")
    assert any(p.name.startswith("best-") for p in last.parent.iterdir())
    assert torch.load(last, weights_only=True)["nactuator"]["platform"] == "so101"
    assert any(p.name.startswith("events.out.tfevents") for p in tmp_path.rglob("*"))

    for command, key in (("validate", "val/loss"), ("test", "test/loss")):
        cli = lightning_main([command, *args, f"--ckpt_path={last}"])
        assert torch.isfinite(cli.trainer.callback_metrics[key])


def test_cli_rejects_unknown_keys_and_platforms(data, tmp_path):
    with pytest.raises(SystemExit):
        lightning_main(["fit", "--config", BASE, "--platform", "so101",
                        f"--data.paths=[{data}]", "--model.no_such_option=1"])
    with pytest.raises(SystemExit):
        lightning_main(["fit", "--config", BASE, "--platform", "no_such_robot",
                        f"--data.paths=[{data}]"])


def test_train_entry_point_with_data(data, tmp_path, capsys):
    from nactuator.training.callbacks import EpochLines

    # Progress bar left on: stdout is captured (not a terminal), so one line per epoch
    # replaces Lightning's redrawn tqdm bar.
    args = [a for a in tiny_args(tmp_path) if not a.startswith("--trainer.enable_progress")]
    cli = train("so101", data=str(data), extra_args=args)
    assert cli.model.loss_weights.w_vel == 5.0  # conf/train/so101.yaml was applied
    assert isinstance(cli.trainer.progress_bar_callback, EpochLines)
    printed = capsys.readouterr().out
    assert "\r" not in printed
    assert re.search(r"\[nactuator\] epoch 1/1, step 2: train/loss [\d.e+-]+, val/loss", printed)
    assert "train/loss at start" not in printed and "steps): start" in printed
    # stable names for the next command: <root>/best.ckpt and <root>/last.ckpt
    for name in ("best.ckpt", "last.ckpt"):
        link = tmp_path / name
        assert link.is_symlink() and link.resolve().parent.name == "checkpoints"
        assert torch.load(link, weights_only=True)["nactuator"]["platform"] == "so101"
    assert f"nactuator eval --ckpt {tmp_path / 'best.ckpt'}" in printed


@pytest.mark.slow
def test_ddp_two_cpu_processes(data, tmp_path):
    """`--trainer.strategy=ddp` with 2 CPU processes (gloo): both ranks train, the
    checkpoint is written once and its weights are finite."""
    out = tmp_path / "ddp"
    env = dict(os.environ, WARP_CACHE_PATH=str(warp_cache_dir()))
    cmd = [sys.executable, "-m", "nactuator.cli", "fit", "--config", BASE,
           "--platform", "so101", f"--data.paths=[{data}]", *tiny_args(out),
           "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "GLOBAL_RANK: 1" in proc.stdout + proc.stderr
    ckpts = list(out.rglob("last.ckpt"))
    assert len(ckpts) == 1
    state = torch.load(ckpts[0], weights_only=True)
    # samples_per_epoch is per process: 8 segments / batch 4 = 2 steps, each rank on its
    # own sampling stream, gradients averaged over both.
    assert state["global_step"] == 2
    for v in state["nactuator"]["state_dict"].values():
        assert torch.isfinite(v).all()


@pytest.mark.slow
def test_ddp_two_nodes_on_loopback(data, tmp_path):
    """`--trainer.num_nodes 2`: one process per "node", joined over 127.0.0.1 (gloo), as
    on a real cluster where each node runs the same command with its NODE_RANK."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node_rank in (0, 1):
        out = tmp_path / f"node{node_rank}"
        env = dict(os.environ, WARP_CACHE_PATH=str(warp_cache_dir()),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(node_rank))
        cmd = [sys.executable, "-m", "nactuator.cli", "fit", "--config", BASE,
               "--platform", "so101", f"--data.paths=[{data}]", *tiny_args(out),
               "--trainer.strategy=ddp", "--trainer.num_nodes=2", "--trainer.devices=1",
               "--trainer.accelerator=cpu"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, text in zip(procs, outputs, strict=True):
        assert p.returncode == 0, text[-3000:]
    assert "GLOBAL_RANK: 1" in outputs[1] and "MEMBER: 2/2" in outputs[1]
    assert len(list((tmp_path / "node0").rglob("last.ckpt"))) == 1


def test_default_dataset_is_generated_once_and_cached(tmp_path):
    from nactuator.data import read_dataset
    from nactuator.data.defaults import default_dataset

    first = default_dataset("pendulum", tmp_path / "datasets")
    assert first.parent == tmp_path / "datasets" and first.name.startswith("pendulum-default-")
    ds = read_dataset(first)
    assert ds.platform == "pendulum"
    assert {e.split for e in ds.episodes} == {"train", "validation", "test"}
    stamp = (first / "meta" / "info.json").stat().st_mtime_ns
    assert default_dataset("pendulum", tmp_path / "datasets") == first  # reused
    assert (first / "meta" / "info.json").stat().st_mtime_ns == stamp
    assert not [p for p in (tmp_path / "datasets").iterdir() if p.name.startswith(".")]


def test_progress_lines_replace_the_bar_only_off_a_terminal(monkeypatch):
    from lightning.pytorch.callbacks import TQDMProgressBar

    import nactuator.progress
    from nactuator.training.cli import log_progress_instead_of_bar

    assert log_progress_instead_of_bar(None, [])  # pytest captures stdout: not a terminal
    assert log_progress_instead_of_bar(True, [])
    assert not log_progress_instead_of_bar(False, [])  # switched off: nothing at all
    assert not log_progress_instead_of_bar(None, [TQDMProgressBar()])  # the user's own bar
    monkeypatch.setattr(nactuator.progress, "is_terminal", lambda stream: True)
    assert not log_progress_instead_of_bar(None, [])
