"""``NeuralActuatorModule``: training the actuator model *through* the simulator (SPEC §5).

Each batch is a set of recorded segments (Contract 2). The module rolls the model closed
loop through the differentiable simulator for the whole segment, compares the simulated
joint path with the recorded one, supervises the force / gate / condition heads at every
step, and backpropagates through time. Around that sit the training mechanics the
reference trainer uses: AdamW with warm-up + cosine LR, gradient clipping (the Trainer's
``gradient_clip_val``), skipping of non-finite updates, an EMA copy of the weights for
validation / test / export, a horizon curriculum, and initial-state noise.

The model is built in :meth:`setup`, once the DataModule's train-split normalisation
statistics exist (or from a checkpoint's bundle when loading one).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import torch

from nactuator.models import NeuralActuator, bundle_to_dict
from nactuator.models.features import DEFAULT_FEATURES, window_channels
from nactuator.platforms import Platform, load_platform
from nactuator.training.curriculum import HorizonCurriculum
from nactuator.training.ema import EMA
from nactuator.training.losses import (
    LossWeights,
    condition_loss,
    force_loss,
    gate_loss,
    gripper_loss,
    joint_loss,
    velocity_loss,
)
from nactuator.training.rollout import NonFiniteRollout, Rollout, rollout

# Which size name is the "width" and the "depth" of each architecture, so that one sweep
# axis (model.width / model.depth) means the same thing for every arch.
WIDTH_KEY = {"transformer": "d_model", "mlp": "hidden", "gru": "hidden", "lstm": "hidden"}
DEPTH_KEY = {"transformer": "n_layers", "mlp": "n_layers", "gru": "n_layers", "lstm": "n_layers"}


def resolve_model_config(
    arch: str, history: int, width: int | None, depth: int | None, sizes: dict[str, Any] | None
) -> dict[str, Any]:
    """``{"arch", "history" (window length L), **sizes}`` for ``NeuralActuator``.

    ``width``/``depth`` set the architecture's main width and layer count; for the
    transformer the feed-forward size follows as 2 × width (SPEC §4: 192 → 384) unless
    ``sizes`` names ``d_ff`` explicitly.
    """
    if arch not in WIDTH_KEY:
        raise ValueError(f"model.arch must be one of {sorted(WIDTH_KEY)}, got {arch!r}")
    config: dict[str, Any] = {"arch": arch, "history": history + 1}
    if width is not None:
        config[WIDTH_KEY[arch]] = int(width)
        if arch == "transformer":
            config["d_ff"] = 2 * int(width)
    if depth is not None:
        config[DEPTH_KEY[arch]] = int(depth)
    config.update(sizes or {})
    return config


class NeuralActuatorModule(L.LightningModule):
    """Rollout training of a :class:`~nactuator.models.NeuralActuator` for one platform.

    Args:
        platform: platform name (``conf/platform/<name>.yaml``) or a platform YAML path.
        arch: ``transformer`` | ``mlp`` | ``gru`` | ``lstm``.
        width: main width of the network (transformer ``d_model``, else ``hidden``).
        depth: number of layers / blocks.
        model_sizes: further size overrides for the architecture (e.g. ``n_heads``,
            ``head_hidden``, ``dropout``); see ``nactuator.models.build_model``.
        features: feature groups (``command``, ``state``, ``telemetry``, ``error``);
            dropping ``telemetry`` gives the telemetry-free variant.
        history: history frames per window (the window is ``history + 1`` frames); must
            match the DataModule's ``history``.
        horizon_schedule: curriculum ``{first_epoch: horizon}``, applied through
            ``datamodule.set_horizon`` (needs ``reload_dataloaders_every_n_epochs=1``).
        val_horizon: rollout length for validation and test, fixed so that validation
            figures compare across curriculum stages (default: the curriculum's longest).
        loss: loss weights (SPEC §5; OMX defaults; SO-101 uses ``w_vel: 5``).
        lr, weight_decay, betas: AdamW.
        warmup_steps: linear LR warm-up from 0, then cosine decay to ``min_lr_ratio · lr``.
        lr_total_steps: length of the cosine (default: the Trainer's estimate).
        ema_decay: decay of the EMA copy used for validation, test and export.
        init_noise_q, init_noise_qd: std of Gaussian noise added to the rollout's start
            state during training (rad or m, rad/s or m/s), for robustness to the
            imperfect initial state of a deployed rollout.
        sim_device: simulator device; default: follow the module's device.
    """

    def __init__(
        self,
        platform: str = "so101",
        arch: str = "transformer",
        width: int | None = None,
        depth: int | None = None,
        model_sizes: dict[str, Any] | None = None,
        features: list[str] | None = None,
        history: int = 8,
        horizon_schedule: dict[int, int] | None = None,
        val_horizon: int | None = None,
        loss: LossWeights | None = None,
        lr: float = 1e-4,
        weight_decay: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 100,
        lr_total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        ema_decay: float = 0.999,
        init_noise_q: float = 0.0,
        init_noise_qd: float = 0.0,
        sim_device: str | None = None,
    ) -> None:
        super().__init__()
        self.platform: Platform = load_platform(platform)
        self.features = list(features) if features is not None else list(DEFAULT_FEATURES)
        window_channels(self.features)  # validates the group names now, not at setup
        if history < 0:
            raise ValueError(f"history must be >= 0, got {history}")
        self.history = history
        self.model_config = resolve_model_config(arch, history, width, depth, model_sizes)
        self.curriculum = HorizonCurriculum(horizon_schedule or {0: 8})
        if val_horizon is not None and val_horizon < 1:
            raise ValueError(f"val_horizon must be >= 1, got {val_horizon}")
        self.val_horizon = val_horizon or self.curriculum.max_horizon
        self.loss_weights = loss if loss is not None else LossWeights()
        if lr <= 0 or warmup_steps < 0 or not 0 <= min_lr_ratio <= 1:
            raise ValueError(
                f"need lr > 0, warmup_steps >= 0 and 0 <= min_lr_ratio <= 1, got lr={lr}, "
                f"warmup_steps={warmup_steps}, min_lr_ratio={min_lr_ratio}"
            )
        if init_noise_q < 0 or init_noise_qd < 0:
            raise ValueError(
                f"initial-state noise must be >= 0, got q {init_noise_q}, qd {init_noise_qd}"
            )
        self.save_hyperparameters()

        self.revolute = [i for i, c in enumerate(self.platform.channels) if c.kind == "revolute"]
        self.prismatic = [i for i, c in enumerate(self.platform.channels)
                          if c.kind == "prismatic"]
        self.actuator: NeuralActuator | None = None
        self.ema: EMA | None = None
        self.skipped_nonfinite = 0
        self._step_skipped = False
        self._ema_step = -1
        self._ema_backup: dict[str, torch.Tensor] | None = None
        self._simulator: Any = None
        self._rank_seeded = False
        self._train_horizon: int | None = None
        self._simulator_device: str | None = None

    # ------------------------------------------------------------------ model and data

    def build_actuator(self, norm_stats: dict) -> None:
        """Create the actuator (and its EMA) from train-split normalisation statistics."""
        self.actuator = NeuralActuator(
            self.features, self.platform.n, norm_stats, dict(self.model_config)
        )
        self.ema = EMA(self.actuator, self.hparams.ema_decay)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if self.actuator is None:
            if datamodule is None or getattr(datamodule, "norm_stats", None) is None:
                raise RuntimeError(
                    "NeuralActuatorModule needs a DataModule with train-split norm_stats "
                    "(Contract 2) to build its model, or a checkpoint (ckpt_path) to load"
                )
            self.check_dataset(datamodule)
            self.build_actuator(datamodule.norm_stats)
        if datamodule is not None:
            self._check_platform_of(datamodule)
            if stage == "fit" and self.trainer.world_size > 1 and not self._rank_seeded:
                # The DataModule serves an IterableDataset, which Lightning cannot shard
                # with a DistributedSampler: give each rank its own sampling stream so the
                # ranks train on different segments (samples_per_epoch is per process).
                datamodule.seed = int(datamodule.seed) + self.trainer.global_rank
                self._rank_seeded = True
            if stage == "fit":
                self.apply_horizon(0)
            else:
                self._set_datamodule_horizon(datamodule, self.val_horizon)
        if stage == "fit" and self.curriculum.changes and self._trainer is not None:
            # The number of segments changes with the horizon, so the train loader must be
            # rebuilt when a new curriculum stage starts.
            self.trainer.reload_dataloaders_every_n_epochs = 1

    def _check_platform_of(self, datamodule: Any) -> None:
        platform = getattr(datamodule, "platform", None)
        name = getattr(platform, "name", platform)
        if isinstance(name, str) and name != self.platform.name:
            raise ValueError(
                f"the model is configured for platform {self.platform.name!r} but the data "
                f"module serves {name!r}; set the same --platform for both"
            )
        data_history = getattr(datamodule, "history", self.history)
        if data_history != self.history:
            raise ValueError(
                f"model history {self.history} != data history {data_history}: the window "
                f"length must match (link data.history and model.history)"
            )

    def check_dataset(self, datamodule: Any) -> None:
        """Every channel the model's feature groups read must be recorded in every dataset.

        A channel a platform does not log (``data.unrecorded``, e.g. Franka's voltage) is
        stored as NaN and would reach the model as a constant 0; that silently wrong
        input is refused here, naming the dataset, the channel and the feature group.
        """
        from nactuator.data.format import FEATURES

        needed = window_channels(self.features)
        for path in getattr(datamodule, "paths", []) or []:
            stats_file = Path(path) / "meta" / "stats.json"
            if not stats_file.is_file():
                continue
            stats = json.loads(stats_file.read_text())
            for key in needed:
                counts = stats.get(FEATURES[key].name, {}).get("count")
                if counts is None or min(counts) > 0:
                    continue
                missing = [c for c, k in zip(self.platform.channel_names, counts,
                                             strict=False) if k == 0]
                groups = [g for g in self.features if key in window_channels([g])]
                keep = [g for g in self.features if g not in groups]
                raise ValueError(
                    f"{path}: the dataset has no recorded {key!r} "
                    f"({FEATURES[key].name}) for channel(s) {missing}, which the model's "
                    f"feature group(s) {groups} need; drop them from model.features "
                    f"(e.g. {keep}) or train on data that records {key!r}"
                )

    def apply_horizon(self, epoch: int) -> None:
        """Set the DataModule's segment length to the curriculum's horizon for ``epoch``."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is not None:
            self._set_datamodule_horizon(datamodule, self.curriculum.horizon_at(epoch))

    def _set_datamodule_horizon(self, datamodule: Any, horizon: int) -> None:
        if getattr(datamodule, "horizon", None) == horizon:
            return
        try:
            datamodule.set_horizon(horizon)
        except ValueError as e:
            raise ValueError(
                f"horizon {horizon} of the curriculum {self.curriculum} does not fit the "
                f"data: {e}"
            ) from e

    @property
    def simulator(self) -> Any:
        """The platform's simulator on the module's device (rebuilt if the device moves)."""
        from nactuator.sim import Simulator

        device = self.hparams.sim_device or str(self.device)
        if self._simulator is None or self._simulator_device != device:
            self._simulator = Simulator(self.platform, device=device)
            self._simulator_device = device
        return self._simulator

    # ----------------------------------------------------------------------- rollout

    def forward(self, batch: dict[str, torch.Tensor], noise: bool = False) -> Rollout:
        if self.actuator is None:
            raise RuntimeError("the model is not built yet: call setup() or load a checkpoint")
        horizon = batch["q"].shape[1] - self.history - 1
        if horizon < 1:
            raise ValueError(
                f"batch has {batch['q'].shape[1]} frames; with history {self.history} that "
                f"leaves no rollout step (Contract 2: T = history + H + 1)"
            )
        q0 = batch["q"][:, self.history]
        qd0 = batch["qd"][:, self.history]
        if noise and self.hparams.init_noise_q > 0:
            q0 = q0 + self.hparams.init_noise_q * torch.randn_like(q0)
        if noise and self.hparams.init_noise_qd > 0:
            qd0 = qd0 + self.hparams.init_noise_qd * torch.randn_like(qd0)
        sim = self.simulator
        return rollout(self.actuator, sim.step, batch, self.history, horizon, q0, qd0)

    def compute_losses(self, r: Rollout, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The weighted SPEC §5 loss and its parts (see :mod:`nactuator.training.losses`)."""
        w = self.loss_weights
        h, horizon = self.history, r.tau.shape[1]
        q_next = batch["q"][:, h + 1 : h + 1 + horizon]  # frames s+1 .. s+H
        q_path = batch["q"][:, h : h + 1 + horizon]  # frames s .. s+H
        now = slice(h, h + horizon)  # frames whose force/condition the windows describe
        rev, pri = self.revolute, self.prismatic
        force, force_valid = batch["force"][:, now], batch["force_valid"][:, now]
        if w.unlabelled_force_as_zero:  # the DataModule already serves unlabelled axes as 0 N
            force_valid = torch.ones_like(force_valid)
        parts = {
            "joint": joint_loss(r.q[:, 1:, rev], q_next[..., rev]),
            "grip": gripper_loss(r.q[:, 1:, pri], q_next[..., pri]),
            "force": force_loss(r.force, force, force_valid, w.force_beta, w.w_focal),
            "gate": gate_loss(r.gate_logit, force, force_valid),
            "cond": condition_loss(
                r.condition_logit, batch["condition"][:, now], batch["condition_valid"][:, now]
            ),
        }
        if w.w_vel > 0:
            dt = self.platform.control_dt
            parts["vel"] = velocity_loss(r.q[..., rev], q_path[..., rev], dt)
        weights = {"joint": w.w_pos, "grip": w.w_grip, "force": w.w_force, "gate": w.w_gate,
                   "cond": w.w_cond, "vel": w.w_vel}
        parts["loss"] = sum(weights[k] * v for k, v in parts.items())
        return parts

    @torch.no_grad()
    def rollout_metrics(
        self, r: Rollout, batch: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Human-unit errors of a rollout: joints in degrees, gripper in mm, force in N."""
        h, horizon = self.history, r.tau.shape[1]
        error = (r.q[:, 1:] - batch["q"][:, h + 1 : h + 1 + horizon]).abs()
        metrics = {}
        if self.revolute:
            metrics["joint_mae_deg"] = torch.rad2deg(error[..., self.revolute]).mean()
        if self.prismatic:
            metrics["grip_mae_mm"] = 1000.0 * error[..., self.prismatic].mean()
        valid = batch["force_valid"][:, h : h + horizon]
        if valid.any():
            f_err = (r.force - batch["force"][:, h : h + horizon]).abs().mean(-1)
            metrics["force_mae_n"] = f_err[valid].mean()
        return metrics

    # ---------------------------------------------------------------------- training

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        try:
            r = self(batch, noise=True)
        except NonFiniteRollout:
            # The model produced a non-finite effort: no rollout to score. A NaN loss that
            # touches every parameter makes every gradient NaN, so this update is skipped
            # below exactly like one whose loss diverged (and identically on every DDP rank).
            return self._nan_loss()
        parts = self.compute_losses(r, batch)
        batch_size = batch["q"].shape[0]
        self.log("train/loss", parts["loss"], prog_bar=True, batch_size=batch_size)
        self.log_dict({f"train/{k}": v for k, v in parts.items() if k != "loss"},
                      batch_size=batch_size)
        self.log("train/horizon", float(r.tau.shape[1]), batch_size=batch_size)
        if self._trainer is not None and self.trainer.optimizers:
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            self.log("train/lr", lr, batch_size=batch_size)
        return parts["loss"]

    def _nan_loss(self) -> torch.Tensor:
        return sum(p.sum() for p in self.actuator.parameters()) * float("nan")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Called after backward (and the DDP all-reduce), before clipping and the step.
        # A non-finite gradient anywhere means this update would corrupt the weights:
        # drop all gradients (optimisers skip parameters whose .grad is None, so neither
        # the Adam moments nor weight decay move) and count it.
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) \
            if grads else True
        self._step_skipped = not finite
        if not finite:
            self.skipped_nonfinite += 1
            for p in self.parameters():
                p.grad = None
        self.log("train/skipped_nonfinite", float(self.skipped_nonfinite))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = self.trainer.global_step
        if step != self._ema_step and not self._step_skipped:
            self.ema.update(self.actuator)
        self._ema_step = step

    def on_train_start(self) -> None:
        # A resumed run gets the DataModule state of the checkpoint, whose horizon is the
        # one at save time (the validation horizon if saved during validation). Batches
        # are drawn at the DataModule's current horizon, so setting it here still counts.
        self.apply_horizon(self.trainer.current_epoch)

    def on_train_epoch_start(self) -> None:
        self.apply_horizon(self.trainer.current_epoch)

    def on_train_epoch_end(self) -> None:
        # Set before the next epoch's loader is rebuilt, so its length is right too.
        self.apply_horizon(self.trainer.current_epoch + 1)

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        optimizer = torch.optim.AdamW(
            self.actuator.parameters(), lr=hp.lr, weight_decay=hp.weight_decay,
            betas=tuple(hp.betas),
        )
        total = hp.lr_total_steps or self.trainer.estimated_stepping_batches
        total = max(int(total) if math.isfinite(total) else 10**9, 1)
        warmup, floor = hp.warmup_steps, hp.min_lr_ratio

        def lr_factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -------------------------------------------------------------- validation / test

    def _start_evaluation(self) -> None:
        """EMA weights in, and the fixed evaluation horizon (the loader's batches are
        drawn after this hook, so they already have the new length)."""
        if self.ema is not None and self._ema_backup is None:
            self._ema_backup = self.ema.swap_in(self.actuator)
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None:
            self._train_horizon = getattr(datamodule, "horizon", None)
            self._set_datamodule_horizon(datamodule, self.val_horizon)

    def _end_evaluation(self) -> None:
        if self._ema_backup is not None:
            self.ema.restore(self.actuator, self._ema_backup)
            self._ema_backup = None
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and self._train_horizon is not None:
            self._set_datamodule_horizon(datamodule, self._train_horizon)
            self._train_horizon = None

    def on_validation_start(self) -> None:
        self._start_evaluation()

    def on_validation_end(self) -> None:
        self._end_evaluation()

    def on_test_start(self) -> None:
        self._start_evaluation()

    def on_test_end(self) -> None:
        self._end_evaluation()

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str) -> torch.Tensor:
        r = self(batch)
        parts = self.compute_losses(r, batch)
        parts.update(self.rollout_metrics(r, batch))
        batch_size = batch["q"].shape[0]
        self.log(f"{stage}/loss", parts.pop("loss"), prog_bar=True, batch_size=batch_size,
                 sync_dist=True)
        self.log_dict({f"{stage}/{k}": v for k, v in parts.items()}, batch_size=batch_size,
                      sync_dist=True)
        return parts.get("joint_mae_deg", parts["joint"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "test")

    # ------------------------------------------------------------------- checkpoints

    def training_config(self) -> dict[str, Any]:
        """The resolved configuration, as plain data, for the bundle."""
        config = {k: v for k, v in self.hparams.items() if k != "loss"}
        config["loss"] = asdict(self.loss_weights)
        config["model_config"] = dict(self.actuator.model_config) if self.actuator else None
        config["horizon_schedule"] = dict(self.curriculum.stages)
        config["val_horizon"] = self.val_horizon
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is not None and getattr(datamodule, "hparams", None) is not None:
            config["data"] = _plain(dict(datamodule.hparams))
        return _plain(config)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["nactuator"] = bundle_to_dict(
            self.actuator,
            platform=self.platform.name,
            extra={
                "ema_state_dict": self.ema.averaged_state_dict(self.actuator),
                "training_config": self.training_config(),
            },
        )
        checkpoint["nactuator_training"] = {
            "ema": self.ema.state_dict(),
            "skipped_nonfinite": self.skipped_nonfinite,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        bundle = checkpoint.get("nactuator")
        if not isinstance(bundle, dict):
            raise ValueError(
                "checkpoint has no 'nactuator' bundle: it was not written by "
                "NeuralActuatorModule (keys: " + ", ".join(sorted(checkpoint)[:8]) + ")"
            )
        if bundle.get("platform") != self.platform.name:
            raise ValueError(
                f"checkpoint was trained for platform {bundle.get('platform')!r}, but this "
                f"run is configured for {self.platform.name!r} ({self.platform.source})"
            )
        if bundle.get("features") != self.features:
            raise ValueError(
                f"checkpoint uses feature groups {bundle.get('features')}, this run is "
                f"configured for {self.features}"
            )
        if self.actuator is None:
            self.build_actuator(bundle["norm_stats"])
        expected = dict(self.actuator.model_config)
        if bundle.get("model_config") != expected:
            diff = sorted(k for k in set(expected) | set(bundle["model_config"])
                          if expected.get(k) != bundle["model_config"].get(k))
            raise ValueError(
                f"checkpoint model config differs from this run's in {diff}: checkpoint "
                f"{bundle['model_config']}, run {expected}"
            )
        state = checkpoint.get("nactuator_training")
        if state is not None:
            self.ema.load_state_dict(state["ema"])
            self.skipped_nonfinite = int(state["skipped_nonfinite"])
        elif bundle.get("ema_state_dict") is not None:
            ema = bundle["ema_state_dict"]
            self.ema.load_state_dict({"decay": self.ema.decay, "num_updates": 0,
                                      "shadow": {k: ema[k] for k in self.ema.shadow}})


def _plain(value: Any) -> Any:
    """Config values as YAML/JSON-friendly plain data."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, int) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, LossWeights):
        return asdict(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
