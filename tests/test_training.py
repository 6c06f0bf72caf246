"""The training module end to end: real simulator, real DataModule, real models.

The tiny dataset is recorded from the simulator itself, driven by a PD servo law whose
effort is logged as the telemetry, so a model that reads the telemetry right can
reproduce the recorded motion exactly: a fast, well-posed overfitting target.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from nactuator.data import DatasetWriter
from nactuator.data.datamodule import NADDataModule
from nactuator.platforms import load_platform
from nactuator.rollout import Rollout
from nactuator.sim import Simulator
from nactuator.training.losses import LossWeights
from nactuator.training.module import NeuralActuatorModule

WINDOW = 9
BEFORE = WINDOW - 1  # context frames before a segment's start frame
TINY_MODEL = dict(arch="transformer", width=32, depth=1,
                  model_sizes={"head_hidden": 32, "dropout": 0.0})


def write_sim_dataset(root: Path, platform_name: str = "so101", frames: int = 48,
                      splits: dict[str, int] | None = None, seed: int = 0,
                      force: bool = True, condition: bool = True,
                      degrade: int | None = None) -> Path:
    """Episodes recorded from the simulator under a PD law ``tau = kp e − kd qd``.

    Telemetry: effort = tau / torque_max (the platform's 'fraction of max torque' style),
    steady voltage and slowly rising temperature with a little variation. Optionally a
    payload-style force label on the second half of every other episode, and condition
    labels on every motor. ``degrade``: that motor's effort reads 3x and its condition 0
    (restricted) in every odd episode (a toy condition the pooled statistics separate).
    """
    splits = splits or {"train": 3, "validation": 1, "test": 1}
    platform = load_platform(platform_name)
    rng = np.random.default_rng(seed)
    n, count = platform.n, sum(splits.values())
    lower = np.array([c.limit_lower for c in platform.channels])
    upper = np.array([c.limit_upper for c in platform.channels])
    centre, span = (lower + upper) / 2, (upper - lower) / 2
    t = np.arange(frames) * platform.control_dt
    phase = rng.uniform(0, 2 * np.pi, size=(count, 1, n))
    freq = rng.uniform(0.5, 1.0, size=(count, 1, n))
    q_cmd = centre + 0.15 * span * np.sin(2 * np.pi * freq * t[None, :, None] + phase)
    kp = 0.4 * np.array(platform.torque_max) / (0.15 * span.max())
    kd = 0.05 * kp

    sim = Simulator(platform)
    q = torch.tensor(q_cmd[:, 0], dtype=torch.float32)
    qd = torch.zeros_like(q)
    tau_max = torch.tensor(platform.torque_max, dtype=torch.float32)
    qs, qds, taus = [], [], []
    with torch.no_grad():
        for k in range(frames):
            cmd = torch.tensor(q_cmd[:, k], dtype=torch.float32)
            tau = torch.clamp(torch.tensor(kp, dtype=torch.float32) * (cmd - q)
                              - torch.tensor(kd, dtype=torch.float32) * qd, -tau_max, tau_max)
            qs.append(q.numpy().copy())
            qds.append(qd.numpy().copy())
            taus.append(tau.numpy().copy())
            q, qd = sim.step(q, qd, tau)
    q_rec, qd_rec, tau_rec = (np.stack(x, axis=1) for x in (qs, qds, taus))

    order = [s for s, c in splits.items() for _ in range(c)]
    with DatasetWriter(root, platform, fps=1.0 / platform.control_dt) as writer:
        for e, split in enumerate(order):
            f = np.full((frames, 3), np.nan)
            if force and e % 2 == 0:
                f[frames // 2 :] = [0.0, 0.0, -2.0]
            elif force:
                f[:] = 0.0
            frames_e = {
                "q_cmd": q_cmd[e], "q": q_rec[e], "qd": qd_rec[e],
                "effort": tau_rec[e] / np.array(platform.torque_max),
                "voltage": 12.0 + 0.05 * rng.standard_normal((frames, n)),
                "temperature": 30.0 + 0.01 * np.arange(frames)[:, None] + np.zeros((1, n)),
                "force": f,
            }
            if condition:
                frames_e["condition"] = np.ones((frames, n))
            if degrade is not None and e % 2 == 1:
                frames_e["effort"][:, degrade] *= 3.0
                frames_e["condition"][:, degrade] = 0.0
            writer.add_episode(frames_e, task="pd_sines", split=split)
    return root


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def so101_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sim_dataset(tmp_path_factory.mktemp("so101") / "ds", "so101")


def make_dm(path: Path, platform: str = "so101", horizon: int | dict = 6, batch_size: int = 4,
            samples_per_epoch: int | None = 8) -> NADDataModule:
    return NADDataModule([path], platform, window_length=WINDOW, horizon=horizon,
                         batch_size=batch_size, samples_per_epoch=samples_per_epoch, seed=0)


def make_module(platform: str = "so101", **kwargs) -> NeuralActuatorModule:
    args = dict(TINY_MODEL, platform=platform, window_length=WINDOW,
                lr=3e-3, warmup_steps=0, ema_decay=0.9, lr_total_steps=1000)
    args.update(kwargs)
    return NeuralActuatorModule(**args)


def make_trainer(tmp_path: Path, **kwargs) -> L.Trainer:
    args = dict(accelerator="cpu", devices=1, max_steps=2, logger=False,
                enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                gradient_clip_val=1.0, default_root_dir=tmp_path)
    args.update(kwargs)
    return L.Trainer(**args)


def built(module: NeuralActuatorModule, dm: NADDataModule) -> NeuralActuatorModule:
    """The module with its actuator built from the DataModule (as Trainer.setup does)."""
    dm.setup("fit")
    module.build_actuator(dm.norm_stats)
    return module


def first_batch(dm: NADDataModule, split: str = "train") -> dict[str, torch.Tensor]:
    dm.setup("fit")
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    return next(iter(loader))


# ------------------------------------------------------------------- loss alignment


def test_losses_score_frame_after_each_step(so101_data):
    """A rollout that reproduces the recorded frames s+1..s+H has zero joint loss; the
    same rollout shifted by one frame does not (Contract 2 alignment)."""
    dm = make_dm(so101_data)
    module = built(make_module(), dm)
    batch = first_batch(dm)
    B, H = batch["q"].shape[0], 6
    exact = batch["q"][:, BEFORE : BEFORE + H + 1]
    r = Rollout(q=exact, qd=batch["qd"][:, BEFORE : BEFORE + H + 1],
                tau=torch.zeros(B, H, 6), force=batch["force"][:, BEFORE : BEFORE + H],
                gate=torch.full((B, H), 0.5), gate_logit=torch.zeros(B, H),
                condition=torch.ones(B, H, 6), condition_logit=torch.full((B, H, 6), 20.0))
    parts = module.compute_losses(r, batch)
    assert parts["joint"].item() == pytest.approx(0.0, abs=1e-9)
    assert parts["force"].item() == pytest.approx(0.0, abs=1e-9)
    assert parts["cond"].item() < 1e-6  # every motor labelled nominal, logits +20
    shifted = Rollout(**{**r.__dict__, "q": batch["q"][:, BEFORE - 1 : BEFORE + H]})
    assert module.compute_losses(shifted, batch)["joint"].item() > 1e-6
    # SO-101's jaw is revolute: it is scored as a joint, and there is no gripper loss.
    assert module.revolute == list(range(6)) and module.prismatic == []
    assert parts["grip"].item() == 0.0


def test_unlabelled_force_frames_teach_no_contact_unless_masked(so101_data):
    """NAD -999 frames: by default "0 N, no contact" (so the gate learns to switch off);
    with ``unlabelled_force_as_zero=False`` they are left out of L_force and L_gate."""
    dm = make_dm(so101_data)
    batch = dict(first_batch(dm))
    batch["force"] = torch.zeros_like(batch["force"])
    batch["force_valid"] = torch.zeros_like(batch["force_valid"])  # nothing labelled
    B, H = batch["q"].shape[0], 6
    r = Rollout(q=batch["q"][:, BEFORE : BEFORE + H + 1],
                qd=batch["qd"][:, BEFORE : BEFORE + H + 1], tau=torch.zeros(B, H, 6),
                force=torch.full((B, H, 3), 2.0), gate=torch.full((B, H), 0.95),
                gate_logit=torch.full((B, H), 3.0), condition=torch.ones(B, H, 6),
                condition_logit=torch.full((B, H, 6), 20.0))
    as_zero = built(make_module(), dm).compute_losses(r, batch)
    assert as_zero["force"].item() == pytest.approx(1.5)  # Huber_1(2 N) on every frame
    assert as_zero["gate"].item() == pytest.approx(3.0486, abs=1e-3)  # BCE(sigmoid(3), 0)
    masked = built(make_module(loss=LossWeights(unlabelled_force_as_zero=False)), dm)
    parts = masked.compute_losses(r, batch)
    assert parts["force"].item() == 0.0 and parts["gate"].item() == 0.0


# --------------------------------------------------------------------- BPTT is real


def test_gradient_reaches_the_first_rollout_step(so101_data):
    torch.manual_seed(0)
    dm = make_dm(so101_data, horizon=6)
    module = built(make_module(), dm)
    batch = first_batch(dm)
    outputs: list[dict[str, torch.Tensor]] = []
    # the network runs once per step on both rollout paths (window or frame-wise tokens)
    hook = module.actuator.net.register_forward_hook(lambda m, i, out: outputs.append(out))
    r = module(batch)
    hook.remove()
    assert len(outputs) == 6
    tau0 = outputs[0]["tau"]
    # Only the joint error after the LAST step is scored.
    loss = (r.q[:, -1] - batch["q"][:, BEFORE + 6]).pow(2).sum()
    (grad_tau0,) = torch.autograd.grad(loss, tau0, retain_graph=True)
    assert torch.isfinite(grad_tau0).all()
    assert grad_tau0.abs().max() > 1e-8

    # Changing only the oldest frame of the first window (frame s − 8, seen by step 0
    # and by no later window) changes the parameter gradient of that last-step loss.
    def param_grad(b: dict[str, torch.Tensor]) -> torch.Tensor:
        module.actuator.zero_grad()
        out = module(b)
        (out.q[:, -1] - b["q"][:, BEFORE + 6]).pow(2).sum().backward()
        return torch.cat([p.grad.flatten() for p in module.actuator.parameters()
                          if p.grad is not None])

    g = param_grad(batch)
    changed = {k: v.clone() for k, v in batch.items()}
    changed["effort"][:, 0] += 0.5
    changed["pad"][:, 0] = False  # make sure the frame is not masked as padding
    g_changed = param_grad(changed)
    assert (g - g_changed).abs().max() > 1e-7 * g.abs().max()


# ------------------------------------------------------------------------- overfit


def test_overfits_a_tiny_dataset(so101_data, tmp_path):
    """The rollout loss on a fixed batch falls at least 10x within 40 steps."""
    L.seed_everything(0)
    dm = make_dm(so101_data, horizon=6, samples_per_epoch=4 * 40)
    module = make_module(lr=5e-3, loss=LossWeights(w_force=0.0, w_gate=0.0, w_cond=0.0))
    fixed = first_batch(make_dm(so101_data, horizon=6))
    module = built(module, dm)

    def rollout_loss() -> float:
        with torch.no_grad():
            return module.compute_losses(module(fixed), fixed)["joint"].item()

    before = rollout_loss()
    trainer = make_trainer(tmp_path, max_steps=40)
    trainer.fit(module, datamodule=dm)
    after = rollout_loss()
    assert math.isfinite(after)
    assert after < before / 10, f"rollout loss {before:.4g} -> {after:.4g}"
    assert module.skipped_nonfinite == 0


# ----------------------------------------------------------- non-finite updates


class InjectNaN(L.Callback):
    """Corrupts chosen batches: a NaN target (the loss diverges) or NaN telemetry (the
    model's effort is non-finite and the simulator must not be stepped)."""

    def __init__(self) -> None:
        self.before: dict[int, dict[str, torch.Tensor]] = {}
        self.after: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before[batch_idx] = copy.deepcopy(pl_module.actuator.state_dict())
        if batch_idx == 1:
            batch["q"][:, -1] = float("nan")
        if batch_idx == 2:
            batch["effort"][:, -3:] = float("nan")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after[batch_idx] = copy.deepcopy(pl_module.actuator.state_dict())


def test_nonfinite_updates_are_skipped_and_counted(so101_data, tmp_path):
    L.seed_everything(0)
    dm = make_dm(so101_data, horizon=4, samples_per_epoch=16)
    module = make_module()
    inject = InjectNaN()
    trainer = make_trainer(tmp_path, max_steps=4, callbacks=[inject])
    trainer.fit(module, datamodule=dm)
    assert module.skipped_nonfinite == 2
    assert trainer.callback_metrics["train/skipped_nonfinite"].item() == 2.0
    for idx in (1, 2):  # skipped: weights untouched
        for k, v in inject.before[idx].items():
            torch.testing.assert_close(inject.after[idx][k], v, rtol=0, atol=0)
    for idx in (0, 3):  # normal steps move the weights
        moved = any(not torch.equal(inject.after[idx][k], v)
                    for k, v in inject.before[idx].items())
        assert moved
    for p in module.actuator.parameters():
        assert torch.isfinite(p).all()
    assert module.ema.num_updates == 2  # the EMA skips the skipped steps too


# ------------------------------------------------- prismatic gripper (OMX finger)


def test_omx_gripper_is_scored_in_millimetres(tmp_path):
    data = write_sim_dataset(tmp_path / "omx", "omx", frames=24,
                             splits={"train": 1, "validation": 1})
    dm = make_dm(data, platform="omx", horizon=3, samples_per_epoch=4)
    module = make_module("omx")
    assert module.prismatic == [4] and module.revolute == [0, 1, 2, 3]
    trainer = make_trainer(tmp_path, max_steps=1, limit_val_batches=1, max_epochs=1)
    trainer.fit(module, datamodule=dm)
    metrics = trainer.callback_metrics
    assert metrics["train/grip"] > 0 and torch.isfinite(metrics["train/loss"])
    assert "val/grip_mae_mm" in metrics and "val/joint_mae_deg" in metrics


# ----------------------------------------------------------- curriculum in a fit


class RecordHorizons(L.Callback):
    def __init__(self) -> None:
        self.train: list[tuple[int, int]] = []
        self.val: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train.append((trainer.current_epoch, batch["q"].shape[1] - WINDOW))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.val.append(batch["q"].shape[1] - BEFORE)


def test_the_curriculum_sets_each_epochs_horizon_and_validation_is_whole_episodes(
        so101_data, tmp_path):
    dm = make_dm(so101_data, horizon={0: 2, 1: 3}, samples_per_epoch=4)
    record = RecordHorizons()
    trainer = make_trainer(tmp_path, max_epochs=3, max_steps=-1, limit_val_batches=1,
                           callbacks=[record])
    trainer.fit(make_module(), datamodule=dm)
    assert record.train == [(0, 2), (1, 3), (2, 3)]
    assert record.val == [48, 48, 48]  # the whole 48-frame validation episode, every epoch


def test_resume_continues_the_curriculum(so101_data, tmp_path):
    """A checkpoint written at the end of epoch 0 resumes epoch 1 at its stage's horizon."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    schedule = {0: 2, 1: 3}
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_last=True,
                            save_on_train_epoch_end=False)
    trainer = make_trainer(tmp_path, max_epochs=1, max_steps=-1, enable_checkpointing=True,
                           limit_val_batches=1, callbacks=[saver])
    trainer.fit(make_module(), datamodule=make_dm(so101_data, horizon=schedule,
                                                  samples_per_epoch=4))
    record = RecordHorizons()
    trainer = make_trainer(tmp_path, max_epochs=2, max_steps=-1, callbacks=[record])
    trainer.fit(make_module(), datamodule=make_dm(so101_data, horizon=schedule,
                                                  samples_per_epoch=4),
                ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    # Lightning may replay the interrupted epoch's batch (the loader is not resumable);
    # every batch must have its own epoch's horizon, and epoch 1 must run.
    assert all(h == schedule[min(e, 1)] for e, h in record.train), record.train
    assert (1, 3) in record.train


def test_validation_scores_whole_episodes_like_eval(so101_data, tmp_path):
    """`val/joint_mae_deg` is the eval protocol's arm mean over the whole episode."""
    from nactuator.data import read_dataset
    from nactuator.data.episodes import filter_episode
    from nactuator.eval import metrics as M
    from nactuator.eval.protocol import episode_rollouts as eval_rollout
    from nactuator.eval.protocol import score_episode

    dm = make_dm(so101_data)
    module = built(make_module(), dm)
    module.ema = None  # score the raw weights on both sides
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        metrics = module.rollout_metrics(module(batch), batch)
    (episode,) = [e for e in read_dataset(so101_data).episodes if e.split == "validation"]
    episode = filter_episode(episode, dm.input_filters)  # the inputs `eval` gives the model
    scales, _ = M.channel_scales(["revolute"] * 6)
    (ro,) = eval_rollout(module.actuator, module.simulator, [episode])
    scores = score_episode(episode, ro, scales)
    arm = module.platform.arm_indices
    expected = np.mean(np.asarray(scores["joints"]["model"]["full"])[arm])
    assert metrics["joint_mae_deg"].item() == pytest.approx(expected, rel=1e-4)


# ------------------------------------------------------------- checkpoints, resume


def test_checkpoint_bundle_and_resume(so101_data, tmp_path):
    from nactuator.models import load_actuator

    L.seed_everything(0)
    dm = make_dm(so101_data, horizon=4)
    module = make_module()
    trainer = make_trainer(tmp_path, max_steps=3)
    trainer.fit(module, datamodule=dm)
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)
    bundle = saved["nactuator"]
    assert bundle["platform"] == "so101"
    assert bundle["training_config"]["lr"] == pytest.approx(3e-3)
    assert bundle["training_config"]["loss"]["w_pos"] == 100.0
    # The input filters the DataModule applied travel with the model.
    assert bundle["input_filters"] == dm.input_filters
    assert bundle["input_filters"]["missing"] == "hold_last_valid"
    assert bundle["input_filters"]["median"] == {"temperature": 11}

    # Eval needs nothing but the file: EMA weights by default.
    actuator, meta = load_actuator(ckpt)
    assert meta["weights"] == "ema" and meta["platform"] == "so101"
    assert meta["input_filters"] == dm.input_filters
    for k, v in module.ema.shadow.items():
        torch.testing.assert_close(actuator.state_dict()[k], v)

    # Resume: weights, EMA and optimiser step are restored exactly, then training goes on.
    resumed = make_module()
    trainer2 = make_trainer(tmp_path, max_steps=3)
    trainer2.fit(resumed, datamodule=make_dm(so101_data, horizon=4), ckpt_path=ckpt)
    assert trainer2.global_step == 3
    for k, v in module.actuator.state_dict().items():
        torch.testing.assert_close(resumed.actuator.state_dict()[k], v, rtol=0, atol=0)
    for k, v in module.ema.shadow.items():
        torch.testing.assert_close(resumed.ema.shadow[k], v, rtol=0, atol=0)
    assert resumed.ema.num_updates == module.ema.num_updates
    opt_a = trainer.optimizers[0].state_dict()["state"]
    opt_b = trainer2.optimizers[0].state_dict()["state"]
    assert {k: float(s["step"]) for k, s in opt_a.items()} == {
        k: float(s["step"]) for k, s in opt_b.items()}
    trainer3 = make_trainer(tmp_path, max_steps=4)
    trainer3.fit(resumed, datamodule=make_dm(so101_data, horizon=4), ckpt_path=ckpt)
    assert trainer3.global_step == 4
    step = next(iter(trainer3.optimizers[0].state_dict()["state"].values()))["step"]
    assert float(step) == 4.0

    # The module itself reloads from the file alone (hparams + bundle), EMA included.
    reloaded = NeuralActuatorModule.load_from_checkpoint(ckpt)
    for k, v in module.actuator.state_dict().items():
        torch.testing.assert_close(reloaded.actuator.state_dict()[k], v, rtol=0, atol=0)
    for k, v in module.ema.shadow.items():
        torch.testing.assert_close(reloaded.ema.shadow[k], v, rtol=0, atol=0)

    # A checkpoint of another platform is refused with a clear message.
    with pytest.raises(ValueError, match="trained for platform 'so101'.*'omx'"):
        NeuralActuatorModule.load_from_checkpoint(ckpt, platform="omx")


# ------------------------------------------------------------ real NAD recordings


def test_trains_on_the_real_so101_recordings(nad_dir, tmp_path):
    """Two steps on the real SO-101 500 g pick-and-place files (imported to a nactuator dataset):
    real telemetry and payload force labels go through the whole loss."""
    from nactuator.data.importers import import_nad

    data = tmp_path / "so101-real"
    import_nad(nad_dir / "so101", data)
    dm = make_dm(data, horizon=3, samples_per_epoch=8)
    module = make_module()
    trainer = make_trainer(tmp_path, max_epochs=1, max_steps=-1, limit_val_batches=2)
    trainer.fit(module, datamodule=dm)
    metrics = trainer.callback_metrics
    assert trainer.global_step == 2 and module.skipped_nonfinite == 0
    for key in ("train/loss", "train/joint", "train/force", "val/loss", "val/joint_mae_deg"):
        assert torch.isfinite(metrics[key]), key
    assert dm.norm_stats["voltage"]["mean"][0] == pytest.approx(12.0, abs=1.5)  # volts, SI


# ---------------------------------------------------------------- clear errors


def test_horizon_longer_than_every_episode(so101_data, tmp_path):
    dm = make_dm(so101_data, horizon={0: 4, 1: 500})
    trainer = make_trainer(tmp_path, max_epochs=3, max_steps=-1)
    with pytest.raises(ValueError, match=r"horizon \+ 1 = 501 frames.*longest 48"):
        trainer.fit(make_module(), datamodule=dm)  # refused before the first step


def test_dataset_missing_a_feature_the_model_needs(tmp_path):
    """Franka logs no voltage/temperature (platform data.unrecorded): the telemetry group
    cannot be fed, the telemetry-free variant can."""
    platform = load_platform("franka")
    n, T = platform.n, 40
    rng = np.random.default_rng(0)
    root = tmp_path / "franka"
    with DatasetWriter(root, platform, fps=62.5) as w:
        for split in ("train", "validation"):
            q = 0.1 * rng.standard_normal((T, n))
            w.add_episode({"q_cmd": q, "q": q, "qd": np.zeros((T, n)), "effort": q,
                           "voltage": np.full((T, n), np.nan),
                           "temperature": np.full((T, n), np.nan)}, task="hold", split=split)
    dm = make_dm(root, platform="franka", horizon=4)
    with pytest.raises(ValueError, match=r"franka.*'voltage'.*\['telemetry'\]"):
        make_trainer(tmp_path).fit(make_module("franka"),
                                   datamodule=dm)
    free = make_module("franka", features=["command", "state", "error"])
    free.check_dataset(make_dm(root, platform="franka", horizon=4))  # nothing missing


def test_module_and_data_must_agree(so101_data, tmp_path):
    with pytest.raises(ValueError, match="window_length"):
        make_trainer(tmp_path).fit(make_module(window_length=4),
                                   datamodule=make_dm(so101_data, horizon=4))
    with pytest.raises(ValueError, match="arch"):
        make_module(arch="cnn")
    with pytest.raises(ValueError, match="feature group"):
        make_module(features=["command", "vision"])


def test_state_noise_perturbs_training_rollouts_only(so101_data):
    dm = make_dm(so101_data)
    module = built(make_module(state_noise_q=0.01, state_noise_qd=0.1), dm)
    batch = first_batch(dm)
    with torch.no_grad():
        clean = module(batch).q
        torch.manual_seed(0)
        noisy = module(batch, noise=True).q
    torch.testing.assert_close(module(batch).q, clean)  # validation path: deterministic
    drift = (noisy[:, 1:] - clean[:, 1:]).abs()
    assert drift.max() > 1e-3 and drift[:, -1].mean() > drift[:, 0].mean()  # a random walk
    with pytest.raises(ValueError, match="state noise must be >= 0"):
        make_module(state_noise_q=-1.0)


# ------------------------------------------------------ condition frames (issue 18)


@pytest.mark.parametrize("frames", [None, 256], ids=["segments_off", "condition_frames"])
def test_condition_frames_teach_the_pooled_head_a_separable_condition(tmp_path, frames):
    """``data.condition_frames`` with the rollout's condition term off (``loss.w_cond: 0``,
    conf/train/condition_frames.yaml): the pooled condition head learns from the frames
    alone -- a motor whose effort reads 3x in the restricted runs is told apart on the
    held-out runs, as ``infer`` scores them -- and without the frames it learns nothing
    (its weights stay where they started, but for weight decay). The frames' loss reaches
    no other parameter."""
    from nactuator.data.episodes import filter_episode
    from nactuator.eval.episodes import load_episodes, predict_episodes
    from nactuator.platforms import load_platform

    root = write_sim_dataset(tmp_path / "ds", "so101", frames=64, force=False, degrade=2,
                             splits={"train": 6, "validation": 2, "test": 2})
    L.seed_everything(0)
    dm = NADDataModule([root], "so101", window_length=WINDOW, horizon=6, batch_size=4,
                       samples_per_epoch=4 * 40, seed=0, pool_frames=16,
                       condition_frames=frames)
    module = make_module(features=["command", "state", "telemetry", "error", "pooled"],
                         condition_head={"kind": "pooled", "hidden": 16}, condition_lr=0.03,
                         condition_lr_schedule="constant",
                         loss=LossWeights(w_cond=0.0, w_cond_frames=100.0))
    module = built(module, dm)
    head = {k: v.clone() for k, v in module.actuator.condition_head.state_dict().items()}
    if frames:  # the frames' loss moves the head and nothing else
        batch = first_batch(dm)
        module.condition_frames_loss(batch["condition_frames"]).backward()
        grads = {name for name, p in module.actuator.named_parameters()
                 if p.grad is not None and p.grad.abs().sum() > 0}
        assert grads and all(name.startswith("condition_head.") for name in grads)
        module.actuator.zero_grad(set_to_none=True)
    make_trainer(tmp_path, max_steps=40).fit(module, datamodule=dm)
    actuator = module.actuator.eval()
    held_out = [filter_episode(ep, dm.input_filters)
                for ep in load_episodes(root, load_platform("so101"), None)
                if ep.split != "train"]
    right = []
    for ep, out in zip(held_out, predict_episodes(actuator, held_out), strict=True):
        restricted = ep.frames["condition"][:, 2] < 0.5
        right.append((out["condition"][:, 2] < 0.5) == restricted)
    accuracy = float(np.concatenate(right).mean())
    if frames:
        assert accuracy > 0.95, accuracy
    else:
        for key, value in actuator.condition_head.state_dict().items():  # weight decay only
            torch.testing.assert_close(value, head[key], rtol=1e-3, atol=0)
        assert accuracy < 0.9, accuracy
