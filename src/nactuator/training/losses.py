"""The training losses of SPEC §5, computed from one rollout.

Every loss is a plain function of tensors so it can be read and tested on its own. Units:
joint errors in radians (revolute channels), gripper errors in millimetres (prismatic
channels, metres × 1000), forces in newtons.

Time alignment (Contract 2): rollout step ``i`` uses the window ending at recorded frame
``s + i``; its simulated state is compared with frame ``s + i + 1``, and its force, gate and
condition estimates (which describe the *current* frame of the window) with frame ``s + i``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from nactuator.constants import CONTACT_THRESHOLD_N


@dataclass
class LossWeights:
    """Weights and shape parameters of the combined loss (SPEC §5; OMX values by default)."""

    w_pos: float = 100.0  # L_joint, radians
    w_grip: float = 0.02  # L_grip, millimetres
    w_force: float = 30.0
    w_gate: float = 1.0
    w_cond: float = 100.0
    w_vel: float = 0.0  # finite-difference velocity loss (SO-101 uses 5)
    force_beta: float = 1.0  # Huber beta for L_force (0.15 for F/T and known-weight fine-tuning)
    w_focal: float = 5.0  # per-sample weight of frames with non-zero force (3 for F/T runs)
    # Unlabelled force frames count as 0 N (NAD's OMX convention) instead of being masked.
    unlabelled_force_as_zero: bool = True
    # β-NLL of the heteroscedastic force head (only a model with ``uncertainty`` has one;
    # nactuator.uncertainty.beta_nll): its weight and β (Seitzer et al. 2022: 0.5).
    w_nll: float = 1.0
    nll_beta: float = 0.5
    # A next-state model's supervised one-step loss (model.dynamics: next_state; replaces
    # the joint, gripper and velocity terms): squared error of Δq and Δqd in per-step stds.
    w_next: float = 1.0
    # Silhouette loss (issue 20, docs/vision.md "Training from masks"): 1 − soft IoU of the
    # rolled-out state's rendered silhouette against the observed mask (data.masks_camera),
    # on every `silhouette_every`-th rollout step that has a mask, rendered with a sigmoid
    # edge of `silhouette_sigma` px at the mask size / `silhouette_downsample` (the observed
    # masks are area-averaged to that size).
    w_silhouette: float = 0.0
    silhouette_every: int = 1
    silhouette_sigma: float = 1.0
    silhouette_downsample: int = 1
    # Command prior (issue 20 §11.4): L_joint of the rolled-out revolute joints against the
    # command that drove each step (q_cmd of frame s + i, what command following predicts
    # for frame s + i + 1). It uses the commands, which a silhouette-only run always has,
    # not measured joints: it ties a joint no camera sees to its command; 0 (default): off.
    # `command_joints`: the revolute joints it applies to, by name (empty: all of them);
    # joints that sag under gravity or load sit degrees off their command.
    w_command: float = 0.0
    command_joints: tuple[str, ...] = ()
    # Motor-torque consistency (issue 26, docs/results.md §12.4; needs model.external_torque):
    # Huber (knee `motor_beta` N m) of the rollout's arm-joint torque against what the
    # nominal simulator needs at the recorded state, ID(q, qd, qdd) + damping qd - J^T f of
    # the labelled external forces (causal 5-frame velocity filter), so that `tau` is the
    # motor's torque frame by frame, not only through the motion it produces; 0: off.
    w_motor: float = 0.0
    motor_beta: float = 0.05
    # The pooled condition head's loss on the DataModule's condition frames (data.
    # condition_frames: single frames drawn from the whole train split a step, not only the
    # rollout's segments; docs/results.md §6.3.4): BCE like L_cond, at this weight. Only
    # computed when the batches carry them.
    w_cond_frames: float = 100.0

    def __post_init__(self) -> None:
        if isinstance(self.command_joints, str) or not all(
                isinstance(j, str) for j in self.command_joints):
            raise ValueError(f"loss 'command_joints' must be a list of joint names, got "
                             f"{self.command_joints!r}")
        self.command_joints = tuple(self.command_joints)
        for name, value in asdict(self).items():
            if name == "command_joints":
                continue
            if not (isinstance(value, int | float) and value >= 0 and value == value):
                raise ValueError(f"loss weight '{name}' must be a number >= 0, got {value!r}")
        if self.force_beta <= 0:
            raise ValueError(f"loss weight 'force_beta' must be > 0, got {self.force_beta!r}")
        if self.silhouette_sigma <= 0:
            raise ValueError(f"loss weight 'silhouette_sigma' must be > 0 px, got "
                             f"{self.silhouette_sigma!r}")
        for name in ("silhouette_every", "silhouette_downsample"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"loss weight '{name}' must be an integer >= 1, got "
                                 f"{value!r}")


def huber(error: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Elementwise Huber (smooth L1) of an error, quadratic below ``beta``."""
    return F.smooth_l1_loss(error, torch.zeros_like(error), reduction="none", beta=beta)


def _step_mean(per_step: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over (B, T) steps, or over the steps ``mask`` (B, T) keeps."""
    return per_step.mean() if mask is None else _masked_mean(per_step, mask)


def joint_loss(q_sim: torch.Tensor, q_real: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """``mean_t Σ_j Huber_1(q_sim − q_real)`` over the given (revolute) channels, radians;
    ``mask`` (B, T) selects the scored steps (whole episodes of different lengths)."""
    if q_sim.shape[-1] == 0:
        return q_sim.new_zeros(())
    return _step_mean(huber(q_sim - q_real).sum(-1), mask)


def gripper_loss(q_sim: torch.Tensor, q_real: torch.Tensor,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """``mean_t Huber_1(1000 · (q_sim − q_real))`` over prismatic gripper channels (mm)."""
    if q_sim.shape[-1] == 0:
        return q_sim.new_zeros(())
    return _step_mean(huber(1000.0 * (q_sim - q_real)).mean(-1), mask)


def velocity_loss(q_sim: torch.Tensor, q_real: torch.Tensor, dt: float,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """Huber_1 between finite-difference velocities of the simulated and recorded paths.

    ``q_*`` are (B, T, k) position sequences that include the rollout's start frame, so
    the first difference is the first simulated step (``mask`` (B, T − 1) selects steps).
    Finite differences of the recorded path are used instead of the recorded velocity
    because servo velocity registers are coarse (STS3215: multiples of 50 steps/s).
    """
    if q_sim.shape[-1] == 0 or q_sim.shape[1] < 2:
        return q_sim.new_zeros(())
    v_sim = torch.diff(q_sim, dim=1) / dt
    v_real = torch.diff(q_real, dim=1) / dt
    return _step_mean(huber(v_sim - v_real).sum(-1), mask)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is true; 0 (still in the graph) if nothing is."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def force_loss(
    force_pred: torch.Tensor,
    force_true: torch.Tensor,
    valid: torch.Tensor,
    beta: float = 1.0,
    w_focal: float = 5.0,
) -> torch.Tensor:
    """Huber_beta over labelled frames and 3 channels, focal weight on non-zero forces.

    ``force_*`` (B, T, 3), ``valid`` (B, T) bool. Frames whose label magnitude exceeds
    ``constants.CONTACT_THRESHOLD_N`` weigh ``w_focal``, others 1, so the rare contact
    frames are not drowned by free motion. The mean is taken over the labelled frame-channels.
    """
    per = huber(force_pred - force_true, beta=beta)  # (B, T, 3)
    contact = force_true.norm(dim=-1) > CONTACT_THRESHOLD_N
    weight = torch.where(contact, w_focal, 1.0).to(per.dtype).unsqueeze(-1)
    return _masked_mean(weight * per, valid.unsqueeze(-1).expand_as(per))


def gate_loss(
    gate_logit: torch.Tensor, force_true: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """``BCE(g, 1[|f| > 0.01 N])`` on labelled frames; ``gate_logit`` (B, T, 1) or (B, T)."""
    logit = gate_logit.reshape(force_true.shape[:-1])
    target = (force_true.norm(dim=-1) > CONTACT_THRESHOLD_N).to(logit.dtype)
    per = F.binary_cross_entropy_with_logits(logit, target, reduction="none")
    return _masked_mean(per, valid)


def condition_loss(
    condition_logit: torch.Tensor, condition_true: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """``BCE(c, m)`` on every labelled (frame, motor); labels 1 nominal, 0 restricted."""
    per = F.binary_cross_entropy_with_logits(
        condition_logit, condition_true.to(condition_logit.dtype), reduction="none"
    )
    return _masked_mean(per, valid)


def next_state_loss(q_pred: torch.Tensor, q_true: torch.Tensor, qd_pred: torch.Tensor,
                    qd_true: torch.Tensor, scale: torch.Tensor,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """DexNDM's supervised next-state loss: ``mean_t Σ_j`` of the squared errors of the
    predicted next q and qd, each joint's in units of its per-step std (``scale`` (n, 2):
    the model's ``state_scale``), so every joint and both quantities weigh alike. (B, T, n)
    inputs; non-finite recorded values (dropped reads) do not count."""
    parts = []
    for pred, true, s in ((q_pred, q_true, scale[:, 0]), (qd_pred, qd_true, scale[:, 1])):
        finite = torch.isfinite(true)
        err = torch.where(finite, (pred - torch.nan_to_num(true)) / s, 0.0)
        parts.append((err ** 2).sum(-1))
    return _step_mean(parts[0] + parts[1], mask)
