"""What a training rollout is scored on: the SPEC §5 loss of one rollout, and its errors in
human units.

:func:`rollout_losses` puts the plain loss functions of :mod:`nactuator.training.losses` on
the right frames of a batch (Contract 2's time alignment) and weights them;
:func:`rollout_errors` gives the arm's mean joint error in degrees, the gripper's in mm and
the force's in N, as ``nactuator eval`` reports them. Both take a segment batch (every step
scored) or a whole-episode batch (a ``length`` per row: the steps before each episode's last
frame are scored).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from nactuator.rollout import Rollout
from nactuator.training.losses import (
    LossWeights,
    condition_loss,
    force_loss,
    gate_loss,
    gripper_loss,
    joint_loss,
    next_state_loss,
    velocity_loss,
)
from nactuator.uncertainty import beta_nll

__all__ = ["rollout_errors", "rollout_losses", "silhouette_loss", "silhouette_steps",
           "step_mask"]

# q (K, n) -> soft silhouettes (K, h, w) in [0, 1], differentiable in q
Render = Callable[[torch.Tensor], torch.Tensor]


def step_mask(r: Rollout, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, H) true on the steps that are scored: all of a segment; of a whole-episode
    batch, the steps before each episode's last frame."""
    steps = r.tau.shape[1]
    if "length" not in batch:
        return torch.ones(r.tau.shape[:2], dtype=torch.bool, device=r.tau.device)
    step = torch.arange(steps, device=r.tau.device)
    return step.unsqueeze(0) < (batch["length"].to(r.tau.device) - 1).unsqueeze(1)


def silhouette_steps(valid: torch.Tensor, every: int) -> torch.Tensor:
    """(B, H) true on every ``every``-th step (1st, (every+1)-th, ...) of each row among the
    steps where ``valid`` (B, H) is true."""
    count = valid.long().cumsum(1)
    return valid & ((count - 1) % every == 0)


def silhouette_loss(r: Rollout, batch: dict[str, torch.Tensor],
                    render: Render | Mapping[str, Render], window_length: int, every: int = 1,
                    downsample: int = 1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """1 − soft IoU between the silhouette ``render`` draws of the simulated state after
    step ``i`` and the observed mask of frame ``s + i + 1`` (the frame the joint loss scores
    it on), averaged over every ``every``-th step with a mask (and in ``mask`` (B, H)).
    Observed masks are area-averaged by ``downsample`` to the rendered size. 0 (no
    gradient) when no step has a mask.

    ``render`` is one camera's renderer (the batch's plain ``masks`` keys), or several
    cameras' (camera name -> renderer, each reading its own keys,
    :func:`nactuator.data.datamodule.batch_mask_keys`): the loss is then the mean of the cameras'
    losses over the cameras that have a mask in this batch, so ``w_silhouette`` keeps its
    scale whatever the number of cameras."""
    if not isinstance(render, Mapping):
        loss = _camera_silhouette_loss(r, batch, render, None, window_length, every,
                                       downsample, mask)
        return r.q.new_zeros(()) if loss is None else loss
    losses = [_camera_silhouette_loss(r, batch, draw, camera, window_length, every,
                                      downsample, mask) for camera, draw in render.items()]
    seen = [loss for loss in losses if loss is not None]
    return torch.stack(seen).mean() if seen else r.q.new_zeros(())


def _camera_silhouette_loss(r: Rollout, batch: dict[str, torch.Tensor], render: Render,
                            camera: str | None, window_length: int, every: int,
                            downsample: int, mask: torch.Tensor | None
                            ) -> torch.Tensor | None:
    """:func:`silhouette_loss` of one camera (``None``: the plain batch keys); ``None``
    when no scored step has a mask of it."""
    from nactuator.data.datamodule import batch_mask_keys
    from nactuator.vision.silhouette import soft_iou_loss

    masks_key, index_key, _ = batch_mask_keys(camera)
    if index_key not in batch:
        raise ValueError(f"silhouette: the batch has no {index_key!r}: camera "
                         f"{camera or '(the one of data.masks_camera)'} is not served "
                         "(data.masks_camera)")
    start, steps = window_length - 1, r.tau.shape[1]
    index = batch[index_key][:, start + 1 : start + 1 + steps].to(r.q.device)
    valid = index >= 0
    if mask is not None:
        valid = valid & mask
    pick = silhouette_steps(valid, every)
    if not pick.any():
        return None
    target = batch[masks_key].to(r.q.device)[index[pick]].to(r.q.dtype)
    if downsample > 1:
        target = F.avg_pool2d(target[:, None], downsample)[:, 0]
    pred = render(r.q[:, 1:][pick])
    if pred.shape != target.shape:
        where = f" of camera {camera!r}" if camera else ""
        raise ValueError(f"silhouette: rendered masks {tuple(pred.shape[1:])} but observed "
                         f"masks{where} / {downsample} are {tuple(target.shape[1:])}: the "
                         "camera file and the masks' size disagree")
    return soft_iou_loss(pred, target)


def rollout_losses(r: Rollout, batch: dict[str, torch.Tensor], weights: LossWeights,
                   window_length: int, revolute: Sequence[int], prismatic: Sequence[int],
                   control_dt: float, next_state_scale: torch.Tensor | None = None,
                   render: Render | Mapping[str, Render] | None = None,
                   command: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """The weighted loss (``"loss"``) and its parts. Rollout step ``i`` starts from frame
    ``s + i`` (``s = window_length − 1``): its simulated state is compared with frame
    ``s + i + 1``, its force, gate and condition with frame ``s + i``. A next-state model
    (``next_state_scale``: its per-step state scale) is scored on the predicted state
    change instead of the joint, gripper and velocity losses. With ``w_silhouette`` > 0 the
    simulated state is also drawn by ``render`` (one camera's, or camera name -> renderer)
    and compared with the batch's masks (:func:`silhouette_loss`); a weight of 0 computes
    nothing of it. With ``w_command`` > 0 the channels ``command`` (default: ``revolute``)
    are also scored against the commands that drove each step (a prior, not a label)."""
    w = weights
    start, steps = window_length - 1, r.tau.shape[1]
    q_next = batch["q"][:, start + 1 : start + 1 + steps]  # frames s+1 .. s+H
    q_path = batch["q"][:, start : start + 1 + steps]  # frames s .. s+H
    now = slice(start, start + steps)  # frames whose force/condition the windows describe
    mask = step_mask(r, batch)
    rev, pri = list(revolute), list(prismatic)
    force, force_valid = batch["force"][:, now], batch["force_valid"][:, now]
    if w.unlabelled_force_as_zero:  # the DataModule already serves unlabelled axes as 0 N
        force_valid = torch.ones_like(force_valid)
    if next_state_scale is not None:  # one-step (train), open loop (validation)
        parts = {"next": next_state_loss(
            r.q[:, 1:], q_next, r.qd[:, 1:], batch["qd"][:, start + 1 : start + 1 + steps],
            next_state_scale, mask)}
    else:
        parts = {"joint": joint_loss(r.q[:, 1:, rev], q_next[..., rev], mask),
                 "grip": gripper_loss(r.q[:, 1:, pri], q_next[..., pri], mask)}
        if w.w_vel > 0:
            parts["vel"] = velocity_loss(r.q[..., rev], q_path[..., rev], control_dt, mask)
    parts.update({
        "force": force_loss(r.force, force, force_valid & mask, w.force_beta, w.w_focal),
        "gate": gate_loss(r.gate_logit, force, force_valid & mask),
        "cond": condition_loss(r.condition_logit, batch["condition"][:, now],
                               batch["condition_valid"][:, now] & mask.unsqueeze(-1)),
    })
    if w.w_command > 0:  # a prior from the commands, not a measured joint (LossWeights)
        tied = rev if command is None else list(command)
        parts["command"] = joint_loss(r.q[:, 1:, tied], batch["q_cmd"][:, now][..., tied],
                                      mask)
    if r.force_log_var is not None and w.w_nll > 0:
        parts["nll"] = beta_nll(r.force, r.force_log_var, force, force_valid & mask,
                                w.nll_beta)
    if w.w_silhouette > 0:
        if render is None or not any(k.startswith("mask_index") for k in batch):
            raise ValueError("loss.w_silhouette > 0 needs batches with masks "
                             "(data.masks_camera) and a silhouette renderer")
        parts["sil"] = silhouette_loss(r, batch, render, window_length, w.silhouette_every,
                                       w.silhouette_downsample, mask)
    weight = {"joint": w.w_pos, "grip": w.w_grip, "force": w.w_force, "gate": w.w_gate,
              "cond": w.w_cond, "vel": w.w_vel, "nll": w.w_nll, "next": w.w_next,
              "sil": w.w_silhouette, "command": w.w_command}
    parts["loss"] = sum(weight[k] * v for k, v in parts.items())
    return parts


@torch.no_grad()
def rollout_errors(r: Rollout, batch: dict[str, torch.Tensor], window_length: int,
                   arm: Sequence[int], prismatic: Sequence[int]) -> dict[str, torch.Tensor]:
    """Human-unit errors of a rollout, as ``nactuator eval`` reports them: the arm joints'
    mean error in degrees, the gripper's in mm (prismatic), force in N."""
    start, steps = window_length - 1, r.tau.shape[1]
    mask = step_mask(r, batch)
    error = (r.q[:, 1:] - batch["q"][:, start + 1 : start + 1 + steps]).abs()
    metrics = {}
    if arm:
        per_step = error[..., list(arm)].mean(-1)
        metrics["joint_mae_deg"] = torch.rad2deg(per_step[mask].mean())
    if prismatic:
        metrics["grip_mae_mm"] = 1000.0 * error[..., list(prismatic)].mean(-1)[mask].mean()
    valid = batch["force_valid"][:, start : start + steps] & mask
    if valid.any():
        f_err = (r.force - batch["force"][:, start : start + steps]).abs().mean(-1)
        metrics["force_mae_n"] = f_err[valid].mean()
    return metrics
