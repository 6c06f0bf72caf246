"""``NeuralActuatorModule``: training the actuator model *through* the simulator (SPEC §5).

Each training batch is a set of recorded segments (Contract 2). The module rolls the model
closed loop through the differentiable simulator for the whole segment
(:func:`nactuator.rollout.closed_loop_rollout`; whole episodes through
:func:`~nactuator.rollout.rollout_episodes`, the rollout ``nactuator eval`` runs),
compares the simulated joint path with the recorded one, supervises the force / gate /
condition heads at every step, and backpropagates through time. Validation and test roll
every episode out from frame 0 to its end with the evaluation protocol (start at rest,
nothing reset), so the checkpoint picked by ``val/score`` is the one that drifts least over
whole episodes. Around that sit the training mechanics the reference trainer uses: AdamW
with warm-up + cosine LR, gradient clipping (the Trainer's ``gradient_clip_val``), skipping
of non-finite updates, an EMA copy of the weights for validation / test / export, and
initial-state noise. The rollout horizon (and its curriculum) belongs to the DataModule.

The model is built in :meth:`setup`, once the DataModule's train-split normalisation
statistics exist (or from a checkpoint's bundle when loading one). With ``init_from`` it is
instead the pretrained actuator of another run's checkpoint -- its architecture, its
normalisation statistics and its EMA weights -- and the optimiser can move its encoder (the
backbone) more slowly than its heads (``backbone_lr_scale``): fine-tuning, and what
``nactuator adapt`` runs (:mod:`nactuator.training.finetune`). What a run refuses about its
data is :mod:`~nactuator.training.dataset_checks`'s, what it refuses about a checkpoint
:mod:`~nactuator.training.checkpoints`'s, what a rollout is scored on
:mod:`~nactuator.training.objective`'s, the learning-rate schedule
:mod:`~nactuator.training.schedule`'s; this module holds the rollout, the optimiser and the
Lightning hooks.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import lightning as L
import torch

from nactuator.models import NeuralActuator, bundle_to_dict
from nactuator.models.actuator import upgrade_model_config
from nactuator.models.config import dynamics_config, firmware_config, resolve_model_config
from nactuator.models.features import DEFAULT_FEATURES, window_channels
from nactuator.platforms import Platform, load_platform
from nactuator.rollout import (
    WINDOW_LENGTH,
    NonFiniteRollout,
    Rollout,
    closed_loop_rollout,
    rollout_episodes,
    teacher_forced_rollout,
)
from nactuator.training.checkpoints import (
    CheckpointMismatchError,
    InitFromError,
    check_checkpoint,
    plain,
    require_bundle,
)
from nactuator.training.dataset_checks import check_datamodule_matches, check_dataset_channels
from nactuator.training.ema import EMA
from nactuator.training.finetune import load_pretrained, log_normalisation_shift, parameter_groups
from nactuator.training.losses import LossWeights, condition_loss
from nactuator.training.objective import rollout_errors, rollout_losses, step_mask
from nactuator.training.schedule import warmup_cosine
from nactuator.training.selection import ValidationScore

# Raised by the checkpoint checks; importable from here as before the split.
__all__ = ["CheckpointMismatchError", "InitFromError", "NeuralActuatorModule"]


def _constant_factor(step: int) -> float:
    """The learning-rate factor of a group trained at its peak throughout."""
    return 1.0


class NeuralActuatorModule(L.LightningModule):
    """Rollout training of a :class:`~nactuator.models.NeuralActuator` for one platform.

    Args:
        platform: platform name (``conf/platform/<name>.yaml``) or a platform YAML path.
        arch: ``transformer`` | ``mlp`` | ``gru`` | ``lstm`` | ``jointwise``.
        width: main width of the network (transformer ``d_model``, else ``hidden``).
        depth: number of layers / blocks.
        model_sizes: further size overrides for the architecture (e.g. ``n_heads``,
            ``head_hidden``, ``dropout``); see ``nactuator.models.build_model``.
        features: feature groups (``command``, ``state``, ``telemetry``, ``error``);
            dropping ``telemetry`` gives the telemetry-free variant.
        window_length: frames per input window (L = 9); must match the DataModule's
            (LightningCLI links ``data.window_length`` to it).
        loss: loss weights (SPEC §5; OMX defaults; SO-101 uses ``w_vel: 5``).
        lr, weight_decay, betas: AdamW.
        warmup_steps: linear LR warm-up from 0, then cosine decay to ``min_lr_ratio · lr``.
        lr_total_steps: length of the cosine (default: the Trainer's estimate).
        ema_decay: decay of the EMA copy used for validation, test and export.
        init_noise_q, init_noise_qd: std of Gaussian noise added to the rollout's start
            state during training (rad or m, rad/s or m/s), for robustness to the
            imperfect initial state of a deployed rollout.
        state_noise_q, state_noise_qd: std of Gaussian noise added to the simulated state
            after every training rollout step (not in validation): the windows then show
            the model states slightly off the recorded path, so it learns to steer back
            instead of only replaying it (drift on long open-loop rollouts).
        sim_device: simulator device; default: follow the module's device.
        init_from: a checkpoint (``.ckpt`` of ``nactuator train``/``fit``) or saved bundle
            to start from instead of random weights: the actuator is rebuilt from its bundle
            (its model config, its normalisation statistics, its EMA weights), so ``arch``,
            ``width``, ``depth`` and ``model_sizes`` of this run are not used; the new data's
            statistics are only compared with the checkpoint's (one log line). Another
            platform, other feature groups or another window length are refused.
        backbone_lr_scale: learning rate of the encoder (the backbone) relative to ``lr``,
            which the heads keep; 1 = one parameter group, as without fine-tuning; 0 freezes
            the encoder.
        physics_lr: learning rate of a physics actuator's parameters (``model_sizes.physics``,
            docs/counterfactual.md; no weight decay), default ``lr``: a handful of log-scale
            physical constants take larger steps than the network's weights.
        uncertainty: add the heteroscedastic force head (log σ² per axis, trained with
            β-NLL: ``loss.w_nll``, ``loss.nll_beta``); ``infer``, ``live``, ``export`` and
            ``eval`` then give the force interval (docs/uncertainty.md). Off by default.
        dynamics: ``torque`` (default: the model's torque drives the simulator, trained by
            rollouts through it) or ``next_state`` (``arch: jointwise`` only; DexNDM): each
            joint predicts its own next position and velocity, trained by a supervised
            one-step loss on the recorded windows (``loss.w_next``; no simulator), and in
            validation / ``eval`` the model replaces the simulator step of the open-loop
            rollout from frame 0.
        condition_head: ``{kind: pooled, hidden: H}``: the condition score from each motor's
            pooled statistics alone (feature group ``pooled``, ``data.pool_frames``;
            ``models.heads.PooledConditionHead``); None (default): the network's head.
        condition_lr: learning rate of that pooled condition head (default ``lr``).
        condition_lr_schedule: ``cosine`` (default: the head's group follows the warm-up
            and cosine of every group) or ``constant`` (with ``condition_lr``: the head
            trains at ``condition_lr`` from the first to the last step; docs/results.md
            §6.3.3: windows OMX 94.9 vs 94.1 %, SO-101 88.6 vs 87.6 %, 4 folds).
            With ``data.condition_frames`` the head also learns, every step, from the
            DataModule's frames drawn from the whole train split (``loss.w_cond_frames``;
            :meth:`condition_frames_loss`, conf/train/condition_frames.yaml).
        external_torque: apply the labelled external forces of the data in every training
            rollout's simulator step as their joint torque at the recorded pose: the
            contacts (``contact_link``, ``contact_point``, ``contact_force``;
            docs/contact.md) as ``J_p(q)^T f``, and on frames without one the end-effector
            force label (``force``: a payload's weight) as ``J_ee(q)^T f`` at the
            end-effector point (:meth:`contact_torque`), so that ``tau`` learns the motor's
            torque alone instead of the net torque that reproduces the motion (issue 23:
            the learned residual ``ID - tau`` then holds the external load; issue 26: the
            payload's weight read from it, ``nactuator.contact.residual_ee_force``). Off by
            default (SPEC: the net torque).
    """

    def __init__(
        self,
        platform: str = "so101",
        arch: str = "transformer",
        width: int | None = None,
        depth: int | None = None,
        model_sizes: dict[str, Any] | None = None,
        features: list[str] | None = None,
        window_length: int = WINDOW_LENGTH,
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
        state_noise_q: float = 0.0,
        state_noise_qd: float = 0.0,
        sim_device: str | None = None,
        init_from: str | None = None,
        backbone_lr_scale: float = 1.0,
        physics_lr: float | None = None,
        uncertainty: bool = False,
        dynamics: str = "torque",
        condition_head: dict[str, Any] | None = None,
        condition_lr: float | None = None,
        condition_lr_schedule: str = "cosine",
        external_torque: bool = False,
    ) -> None:
        super().__init__()
        self.platform: Platform = load_platform(platform)
        self.features = list(features) if features is not None else list(DEFAULT_FEATURES)
        window_channels(self.features)  # validates the group names now, not at setup
        if window_length < 1:
            raise ValueError(f"window_length must be >= 1, got {window_length}")
        self.window_length = window_length
        self.model_config = resolve_model_config(arch, window_length, width, depth, model_sizes)
        if uncertainty:
            self.model_config["uncertainty"] = True
        if condition_head is not None:  # checked when the actuator is built
            self.model_config["condition_head"] = dict(condition_head)
        self.model_config.update(dynamics_config(dynamics, arch, self.model_config))
        self.model_config.update(firmware_config(self.platform, self.features,
                                                 self.model_config))
        self.loss_weights = loss if loss is not None else LossWeights()
        if lr <= 0 or warmup_steps < 0 or not 0 <= min_lr_ratio <= 1:
            raise ValueError(
                f"need lr > 0, warmup_steps >= 0 and 0 <= min_lr_ratio <= 1, got lr={lr}, "
                f"warmup_steps={warmup_steps}, min_lr_ratio={min_lr_ratio}"
            )
        if not (math.isfinite(backbone_lr_scale) and backbone_lr_scale >= 0):
            raise ValueError(f"backbone_lr_scale must be a finite number >= 0, got "
                             f"{backbone_lr_scale!r}")
        if physics_lr is not None and not physics_lr > 0:
            raise ValueError(f"physics_lr must be > 0 (or None: lr), got {physics_lr!r}")
        if condition_lr is not None and not condition_lr > 0:
            raise ValueError(f"condition_lr must be > 0 (or None: lr), got {condition_lr!r}")
        if condition_lr_schedule not in ("cosine", "constant"):
            raise ValueError(f"condition_lr_schedule must be 'cosine' or 'constant', got "
                             f"{condition_lr_schedule!r}")
        if condition_lr_schedule == "constant" and condition_lr is None:
            raise ValueError("condition_lr_schedule 'constant' needs condition_lr (the head's "
                             "own parameter group)")
        if min(init_noise_q, init_noise_qd, state_noise_q, state_noise_qd) < 0:
            raise ValueError(
                f"state noise must be >= 0, got init q {init_noise_q}, qd {init_noise_qd}, "
                f"per step q {state_noise_q}, qd {state_noise_qd}"
            )
        self.save_hyperparameters()

        self.revolute = [i for i, c in enumerate(self.platform.channels) if c.kind == "revolute"]
        self.prismatic = [i for i, c in enumerate(self.platform.channels)
                          if c.kind == "prismatic"]
        self.command_prior = self._command_channels(self.loss_weights.command_joints)
        self.actuator: NeuralActuator | None = None
        self.ema: EMA | None = None
        self.skipped_nonfinite = 0
        self._step_skipped = False
        self._ema_step = -1
        self._ema_backup: dict[str, torch.Tensor] | None = None
        self._simulator: Any = None
        self._simulator_device: str | None = None
        self.val_score = ValidationScore(self.platform.arm_indices, window_length)
        self.val_history: list[dict[str, float]] = []  # one row per validation epoch
        # The silhouette loss's renderers (loss.w_silhouette > 0), one per (camera file,
        # device), built on first use from the DataModule's camera files; a plain dict so
        # the cameras are no submodules.
        self._silhouette: dict[tuple[str, str], Any] = {}
        # The nominal arm's inverse dynamics of loss.w_motor, built on first use.
        self._physics: dict[str, Any] = {}

    # ------------------------------------------------------------------ model and data

    def _command_channels(self, names: tuple[str, ...]) -> list[int]:
        """Channels of ``loss.command_joints`` (empty: every revolute joint)."""
        if not names:
            return list(self.revolute)
        revolute = [self.platform.channels[i].name for i in self.revolute]
        unknown = [n for n in names if n not in revolute]
        if unknown:
            raise ValueError(f"model.loss.command_joints {unknown} are not revolute joints of "
                             f"{self.platform.name} ({', '.join(revolute)})")
        return [self.revolute[revolute.index(n)] for n in names]

    def build_actuator(self, norm_stats: dict) -> None:
        """Create the actuator (and its EMA) from train-split normalisation statistics."""
        self.actuator = NeuralActuator(
            self.features, self.platform.n, norm_stats, dict(self.model_config)
        )
        self.ema = EMA(self.actuator, self.hparams.ema_decay)

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if self.actuator is None and self.hparams.init_from:
            self.init_from_checkpoint(self.hparams.init_from, datamodule)
            if datamodule is not None:
                self.check_dataset(datamodule)
        elif self.actuator is None:
            if datamodule is None or getattr(datamodule, "norm_stats", None) is None:
                raise RuntimeError(
                    "NeuralActuatorModule needs a DataModule with train-split norm_stats "
                    "(Contract 2) to build its model, or a checkpoint (ckpt_path) to load"
                )
            self.check_dataset(datamodule)
            if self.model_config.get("dynamics") == "next_state":
                self.model_config["state_step"] = datamodule.state_step
            self.build_actuator(datamodule.norm_stats)
        if datamodule is not None:
            self._check_platform_of(datamodule)
            if getattr(datamodule, "condition_frames", None) is not None and \
                    getattr(self.actuator, "condition_head", None) is None:
                raise ValueError("data.condition_frames trains the pooled condition head: set "
                                 "model.condition_head {kind: pooled} (conf/train/"
                                 "pooled_condition.yaml) or leave data.condition_frames unset")
            if self.loss_weights.w_silhouette > 0 and \
                    getattr(datamodule, "masks_camera", None) is None:
                raise ValueError("model.loss.w_silhouette > 0 needs masks: set "
                                 "data.masks_camera to a camera whose masks the dataset has "
                                 "(docs/vision.md, 'Training from masks')")

    def init_from_checkpoint(self, source: str, datamodule: Any = None) -> None:
        """Make the pretrained actuator of ``source`` this run's starting point
        (:mod:`nactuator.training.finetune`): its architecture, its normalisation
        statistics and its EMA weights, which become the raw weights; the EMA restarts
        from them."""
        self.actuator, self.model_config = load_pretrained(source, self.model_config,
                                                           self.check_checkpoint)
        self.ema = EMA(self.actuator, self.hparams.ema_decay)
        log_normalisation_shift(source, self.actuator, datamodule)

    def check_checkpoint(self, where: str, platform: str | None, features: Any,
                         config: dict[str, Any], error: type[Exception],
                         expected: dict[str, Any] | None = None) -> None:
        """:func:`nactuator.training.checkpoints.check_checkpoint` against this run."""
        check_checkpoint(where, platform, features, config, error,
                         run_platform=self.platform.name,
                         run_platform_source=str(self.platform.source),
                         run_features=self.features, run_window_length=self.window_length,
                         expected=expected)

    def _check_platform_of(self, datamodule: Any) -> None:
        check_datamodule_matches(self.platform, self.window_length, datamodule)

    def check_dataset(self, datamodule: Any) -> None:
        """Every channel the model reads must be recorded in every dataset
        (:mod:`nactuator.training.dataset_checks`)."""
        check_dataset_channels(self.features, self.model_config, datamodule)

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
        """Roll the batch out from its start frame: a training segment from its recorded
        state (plus noise if ``noise``), or whole episodes (a batch with ``length``) from
        rest, as the evaluation protocol does."""
        if self.actuator is None:
            raise RuntimeError("the model is not built yet: call setup() or load a checkpoint")
        if "length" in batch:  # whole episodes from rest: the evaluation protocol's rollout
            return rollout_episodes(self.actuator, self.simulator.step, batch,
                                    grad=torch.is_grad_enabled())
        if self.actuator.dynamics == "next_state":  # supervised one-step, no simulator
            return teacher_forced_rollout(self.actuator, batch, self.window_length)
        start = self.window_length - 1
        q0, qd0 = batch["q"][:, start], batch["qd"][:, start]
        if noise and self.hparams.init_noise_q > 0:
            q0 = q0 + self.hparams.init_noise_q * torch.randn_like(q0)
        if noise and self.hparams.init_noise_qd > 0:
            qd0 = qd0 + self.hparams.init_noise_qd * torch.randn_like(qd0)
        step = self.simulator.step
        sigma_q, sigma_qd = self.hparams.state_noise_q, self.hparams.state_noise_qd
        if noise and (sigma_q > 0 or sigma_qd > 0):
            def step(q, qd, tau, _step=self.simulator.step, **external):
                q1, qd1 = _step(q, qd, tau, **external)
                return (q1 + sigma_q * torch.randn_like(q1),
                        qd1 + sigma_qd * torch.randn_like(qd1))
        return closed_loop_rollout(self.actuator, step, batch, self.window_length,
                                   q0=q0, qd0=qd0, tau_ext=self.contact_torque(batch))

    def contact_torque(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """With ``external_torque``: the joint torque (B, T, n) of the batch's labelled
        external forces from its start frame on, at the recorded pose (no gradient: it is
        data); None otherwise or when the batch has none.

        A frame with a labelled contact (``contact_link`` >= 0) gets that contact's
        ``J_p(q)^T f``; any other frame with a nonzero end-effector force label (``force``:
        a payload's weight, a push at the tip; unlabelled frames and axes are 0 N in the
        batch) gets ``J_ee(q)^T f`` at the platform's end-effector point, where the world
        applies a payload. A frame with a contact label uses it alone (the contact columns
        describe the whole external force of that frame)."""
        if not self.hparams.get("external_torque", False):
            return None
        start = self.window_length - 1
        q_dtype, q_device = batch["q"].dtype, batch["q"].device
        link = batch["contact_link"][:, start:] if "contact_link" in batch else None
        has_contact = link is not None and bool((link >= 0).any())
        ee_force = batch["force"][:, start:] if "force" in batch else None
        if ee_force is not None and has_contact:
            ee_force = torch.where((link >= 0)[..., None], torch.zeros_like(ee_force), ee_force)
        has_ee = ee_force is not None and bool((ee_force != 0).any())
        if not (has_contact or has_ee):
            return None
        sim = self.simulator
        B, T = batch["q"].shape[0], batch["q"].shape[1] - start
        tau = None
        with torch.no_grad():
            q = batch["q"][:, start:].reshape(B * T, -1).to(torch.float64).to(sim.device)
            if has_contact:
                body = sim.chain_bodies(link.reshape(-1))
                tau = sim.kinematics.point_torque(
                    q, body.to(sim.device),
                    batch["contact_point"][:, start:].reshape(B * T, 3).to(sim.device),
                    batch["contact_force"][:, start:].reshape(B * T, 3).to(sim.device))
            if has_ee:
                f = ee_force.reshape(B * T, 3).to(torch.float64).to(sim.device)
                tip = sim.kinematics.ee_torque(q, f)
                tau = tip if tau is None else tau + tip
        return tau.reshape(B, T, -1).to(q_dtype).to(q_device)

    def silhouette_renderer(self, camera_file: Any, device: torch.device) -> Any:
        """``q (K, n) -> soft silhouettes (K, h, w)`` through the camera in ``camera_file``
        at its size / ``loss.silhouette_downsample`` (``nactuator.vision``: link poses
        from the simulator's torch FK, so the gradient reaches the simulated state)."""
        from nactuator.vision.camera import load_camera
        from nactuator.vision.scene import ArmScene
        from nactuator.vision.silhouette import SilhouetteRenderer

        key = (str(camera_file), str(device))
        if key not in self._silhouette:
            w = self.loss_weights
            camera = load_camera(camera_file)
            k = camera.intrinsics
            if k.width % w.silhouette_downsample or k.height % w.silhouette_downsample:
                raise ValueError(f"loss.silhouette_downsample {w.silhouette_downsample} must "
                                 f"divide the camera size {k.width}x{k.height} "
                                 f"({camera_file})")
            camera = camera.at_resolution(k.width // w.silhouette_downsample,
                                          k.height // w.silhouette_downsample).to(device)
            camera.requires_grad_(False)  # the extrinsic is not refined here
            renderer = SilhouetteRenderer(ArmScene(self.platform), device)
            sigma = w.silhouette_sigma

            def render(q: torch.Tensor) -> torch.Tensor:
                return renderer(q, camera, sigma)["mask"]

            self._silhouette[key] = render
        return self._silhouette[key]

    def compute_losses(self, r: Rollout, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The weighted SPEC §5 loss and its parts (:mod:`nactuator.training.objective`)."""
        next_state = self.actuator.dynamics == "next_state"
        render = None
        if self.loss_weights.w_silhouette > 0:
            datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
            files = getattr(datamodule, "masks_camera_files", None)
            if not files:
                raise ValueError("model.loss.w_silhouette > 0 needs a DataModule serving "
                                 "masks (data.masks_camera)")
            renders = {camera: self.silhouette_renderer(f, r.q.device)
                       for camera, f in files.items()}
            # one camera: the batch's plain mask keys; several: each camera's own
            render = next(iter(renders.values())) if len(renders) == 1 else renders
        parts = rollout_losses(r, batch, self.loss_weights, self.window_length, self.revolute,
                               self.prismatic, self.platform.control_dt,
                               next_state_scale=self.actuator.state_scale if next_state else None,
                               render=render, command=self.command_prior)
        if self.loss_weights.w_motor > 0 and not next_state:
            parts["motor"] = self.motor_torque_loss(r, batch)
            parts["loss"] = parts["loss"] + self.loss_weights.w_motor * parts["motor"]
        return parts

    def motor_torque_target(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, T - L + 1, n) the torque the nominal simulator needs at the batch's recorded
        states from its start frame on: ``ID(q, qd, qdd) + damping qd - tau_ext`` (qd through
        the causal 5-frame mean of :func:`nactuator.contact.smoothed_velocity`, qdd its
        backward difference; ``tau_ext`` the labelled external forces, :meth:`contact_torque`).
        No gradient: a target made of data."""
        from nactuator.contact.estimate import smoothed_velocity
        from nactuator.sim.dynamics import ArmDynamics

        if "dynamics" not in self._physics:  # a plain dict: not a submodule, not saved
            self._physics["dynamics"] = ArmDynamics.for_platform(self.platform)
        dyn = self._physics["dynamics"]
        start = self.window_length - 1
        with torch.no_grad():
            q = batch["q"].to(torch.float64).cpu()
            B, T, n = q.shape
            # the contact residual's own causal filter, along time (axis 0 of (T, B, n))
            qd_s, qdd = (torch.from_numpy(x).transpose(0, 1) for x in smoothed_velocity(
                batch["qd"].detach().cpu().transpose(0, 1).numpy(), self.platform.control_dt))
            rows = slice(start, T)
            shape = (B * (T - start), n)
            tau_id = dyn.inverse_dynamics(q[:, rows].reshape(shape), qd_s[:, rows].reshape(shape),
                                          qdd[:, rows].reshape(shape))
            damping = torch.tensor([c.damping for c in self.platform.channels],
                                   dtype=torch.float64)
            target = tau_id.reshape(B, T - start, n) + damping * qd_s[:, rows]
            ext = self.contact_torque(batch)
            if ext is not None:
                target = target - ext.to(torch.float64).cpu()
        return target.to(batch["q"].dtype).to(batch["q"].device)

    def motor_torque_loss(self, r: Rollout, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Huber (``loss.motor_beta``) of the rollout's arm-joint torque against
        :meth:`motor_torque_target` on the scored steps (the gripper's grip is unlabelled)."""
        steps = r.tau.shape[1]
        target = self.motor_torque_target(batch)[:, :steps]
        arm = list(self.platform.arm_indices)
        err = torch.nn.functional.smooth_l1_loss(
            r.tau[..., arm], target[..., arm], beta=self.loss_weights.motor_beta,
            reduction="none").mean(-1)
        return err[step_mask(r, batch)].mean()

    def rollout_metrics(self, r: Rollout, batch: dict[str, torch.Tensor]
                        ) -> dict[str, torch.Tensor]:
        """The rollout's errors in degrees, mm and N, as ``nactuator eval`` reports them."""
        return rollout_errors(r, batch, self.window_length, self.platform.arm_indices,
                              self.prismatic)

    # ---------------------------------------------------------------------- training

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        try:
            r = self(batch, noise=True)
        except NonFiniteRollout:
            # The model produced a non-finite torque: no rollout to score. A NaN loss that
            # touches every parameter makes every gradient NaN, so this update is skipped
            # below exactly like one whose loss diverged (and identically on every DDP rank).
            return self._nan_loss()
        parts = self.compute_losses(r, batch)
        if "condition_frames" in batch:
            parts["cond_frames"] = self.condition_frames_loss(batch["condition_frames"])
            parts["loss"] = parts["loss"] + self.loss_weights.w_cond_frames * parts["cond_frames"]
        batch_size = batch["q"].shape[0]
        self.log("train/loss", parts["loss"], prog_bar=True, batch_size=batch_size)
        self.log_dict({f"train/{k}": v for k, v in parts.items() if k != "loss"},
                      batch_size=batch_size)
        self.log("train/horizon", float(r.tau.shape[1]), batch_size=batch_size)
        if self._trainer is not None and self.trainer.optimizers:
            for group in self.trainer.optimizers[0].param_groups:
                name = group.get("name", "all")
                key = "train/lr" if name in ("all", "heads") else f"train/lr_{name}"
                self.log(key, group["lr"], batch_size=batch_size)
        return parts["loss"]

    def condition_frames_loss(self, frames: dict[str, torch.Tensor]) -> torch.Tensor:
        """BCE of the pooled condition head on the DataModule's condition frames (windows
        of one frame, ``data.condition_frames``), through
        :meth:`~nactuator.models.NeuralActuator.pooled_condition_logit`: the logits
        ``forward`` gives at those frames (the head reads only the current frame's pooled
        statistics, which no rollout changes), on every labelled (frame, motor)."""
        logit = self.actuator.pooled_condition_logit(frames)
        return condition_loss(logit, frames["condition"][:, -1],
                              frames["condition_valid"][:, -1])

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

    def parameter_groups(self) -> list[dict[str, Any]]:
        """AdamW parameter groups (:func:`nactuator.training.finetune.parameter_groups`)."""
        hp = self.hparams
        return parameter_groups(self.actuator, hp.lr, hp.get("backbone_lr_scale", 1.0),
                                hp.get("physics_lr"), hp.get("condition_lr"))

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        optimizer = torch.optim.AdamW(
            self.parameter_groups(), lr=hp.lr, weight_decay=hp.weight_decay,
            betas=tuple(hp.betas),
        )
        total = hp.lr_total_steps or self.trainer.estimated_stepping_batches
        total = int(total) if math.isfinite(total) else 10**9
        lr_factor = warmup_cosine(hp.warmup_steps, total, hp.min_lr_ratio)
        # One factor for every group: each keeps its own peak (lr, lr * backbone_lr_scale);
        # with condition_lr_schedule 'constant' the condition head's group keeps its lr.
        if hp.get("condition_lr_schedule", "cosine") == "constant":
            lr_factor = [_constant_factor if group.get("name") == "condition" else lr_factor
                         for group in optimizer.param_groups]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -------------------------------------------------------------- validation / test

    def _start_evaluation(self) -> None:
        """Validation and test use the EMA weights."""
        if self.ema is not None and self._ema_backup is None:
            self._ema_backup = self.ema.swap_in(self.actuator)

    def _end_evaluation(self) -> None:
        if self._ema_backup is not None:
            self.ema.restore(self.actuator, self._ema_backup)
            self._ema_backup = None

    def on_validation_start(self) -> None:
        self._start_evaluation()

    def on_validation_epoch_start(self) -> None:
        self.val_score.reset()

    def on_validation_epoch_end(self) -> None:
        """Log ``val/score`` (the checkpoint selection metric) and keep the epoch's
        figures for the end-of-training summary."""
        if self.trainer.world_size > 1:
            self.val_score.reduce(lambda t: self.trainer.strategy.reduce(
                t.to(self.device), reduce_op="sum").cpu())
        figures = self.val_score.compute()
        for key, value in figures.items():
            self.log(f"val/{key}", value, sync_dist=False, prog_bar=key == "score")
        if self.trainer.sanity_checking:
            return
        self.val_history.append({"epoch": self.current_epoch, "step": self.global_step,
                                 **figures})

    def on_validation_end(self) -> None:
        self._end_evaluation()

    def on_test_start(self) -> None:
        self._start_evaluation()

    def on_test_end(self) -> None:
        self._end_evaluation()

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str) -> torch.Tensor:
        r = self(batch)
        if stage == "val":
            self.val_score.update(r.q, r.force, r.condition, batch, step_mask(r, batch))
        parts = self.compute_losses(r, batch)
        parts.update(self.rollout_metrics(r, batch))
        batch_size = batch["q"].shape[0]
        self.log(f"{stage}/loss", parts.pop("loss"), prog_bar=True, batch_size=batch_size,
                 sync_dist=True)
        self.log_dict({f"{stage}/{k}": v for k, v in parts.items()}, batch_size=batch_size,
                      sync_dist=True)
        if "joint_mae_deg" in parts:
            return parts["joint_mae_deg"]
        return parts["next"] if "next" in parts else parts["joint"]

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
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is not None and getattr(datamodule, "hparams", None) is not None:
            config["data"] = plain(dict(datamodule.hparams))
        return plain(config)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        checkpoint["nactuator"] = bundle_to_dict(
            self.actuator,
            platform=self.platform.name,
            extra={
                "ema_state_dict": self.ema.averaged_state_dict(self.actuator),
                "training_config": self.training_config(),
                # how the DataModule filtered the inputs: eval, infer and live do the same
                "input_filters": getattr(datamodule, "input_filters", None),
            },
        )
        checkpoint["nactuator_training"] = {
            "ema": self.ema.state_dict(),
            "skipped_nonfinite": self.skipped_nonfinite,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        bundle = require_bundle(checkpoint)
        saved = upgrade_model_config(bundle.get("model_config") or {})
        self.check_checkpoint("checkpoint", bundle.get("platform"), bundle.get("features"),
                              saved, CheckpointMismatchError,
                              expected=None if self.actuator is None else
                              dict(self.actuator.model_config))
        if self.actuator is None:
            if self.hparams.init_from:  # the architecture came from the init checkpoint
                self.model_config = upgrade_model_config(bundle.get("model_config") or {})
            if "state_step" in saved:  # a next-state model's scale: data, kept in the bundle
                self.model_config["state_step"] = saved["state_step"]
            self.build_actuator(bundle["norm_stats"])
            self.check_checkpoint("checkpoint", bundle.get("platform"), bundle.get("features"),
                                  saved, CheckpointMismatchError,
                                  expected=dict(self.actuator.model_config))
        state = checkpoint.get("nactuator_training")
        if state is not None:
            self.ema.load_state_dict(state["ema"])
            self.skipped_nonfinite = int(state["skipped_nonfinite"])
        elif bundle.get("ema_state_dict") is not None:
            ema = bundle["ema_state_dict"]
            self.ema.load_state_dict({"decay": self.ema.decay, "num_updates": 0,
                                      "shadow": {k: ema[k] for k in self.ema.shadow}})

