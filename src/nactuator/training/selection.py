"""``val/score``: how many times better than the obvious answer the model is on validation.

The checkpoint ``train`` links as ``best.ckpt`` is the one with the lowest ``val/score``.
Each term divides one of the model's errors by a trivial reference measured on the same
validation episodes and frames, so every term is a ratio (1 = no better than the trivial
answer) and none can swamp the others the way the force term swamped ``val/loss`` on SO-101
(docs/results.md, "Checkpoint selection"):

- ``joints``: the arm joints' mean absolute rollout error over the command-following
  reference (q[i+1] predicted as q_cmd[i], :func:`nactuator.data.references.command_following`);
- ``force``: the 3-axis force MAE over the better of "always 0 N" and the linear force
  reference fit on the train split (the DataModule serves its estimate as ``force_linear``);
- ``condition``: the condition head's error rate over chance (0.5).

``val/score`` is the mean of the terms the validation data can score (a dataset without
force labels has no force term). Sums are accumulated over the whole validation epoch, so
the ratios are of epoch-level errors, not means of per-batch ratios.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

CHANCE_ERROR = 0.5  # the error rate of a coin flip for nominal / restricted
TERMS = ("joints", "force", "condition")

# The sums one validation epoch accumulates (their order is the order they are reduced in).
_SUMS = ("joint_model", "joint_command", "joint_steps", "force_model", "force_zero",
         "force_linear", "force_frames", "force_labelled", "cond_wrong", "cond_valid")


class ValidationScore:
    """Accumulates one validation epoch's errors and their references; :meth:`compute`
    gives ``val/score``, its terms and the human-unit figures the verdict line prints."""

    def __init__(self, arm: Sequence[int], window_length: int) -> None:
        self.arm = list(arm)
        self.start = window_length - 1
        self.reset()

    def reset(self) -> None:
        self.sums = {k: 0.0 for k in _SUMS}

    @torch.no_grad()
    def update(self, q_sim: torch.Tensor, force: torch.Tensor, condition: torch.Tensor,
               batch: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
        """Add one batch: ``q_sim`` (B, H + 1, n) simulated path from the start frame,
        ``force`` (B, H, 3), ``condition`` (B, H, n) probabilities, ``mask`` (B, H) steps."""
        s, steps = self.start, force.shape[1]
        if self.arm:
            q_next = batch["q"][:, s + 1 : s + 1 + steps][..., self.arm]
            command = batch["q_cmd"][:, s : s + steps][..., self.arm]
            m = mask.unsqueeze(-1).expand_as(q_next)
            self._add("joint_model", (q_sim[:, 1:, self.arm] - q_next).abs()[m].sum())
            self._add("joint_command", (command - q_next).abs()[m].sum())
            self._add("joint_steps", m.sum())
        now = slice(s, s + steps)
        label = batch["force"][:, now]
        self._add("force_model", (force - label).abs().mean(-1)[mask].sum())
        self._add("force_zero", label.abs().mean(-1)[mask].sum())
        if "force_linear" in batch:
            linear = batch["force_linear"][:, now]
            self._add("force_linear", (linear - label).abs().mean(-1)[mask].sum())
        else:
            self.sums["force_linear"] = float("inf")
        self._add("force_frames", mask.sum())
        self._add("force_labelled", (batch["force_valid"][:, now] & mask).sum())
        valid = batch["condition_valid"][:, now] & mask.unsqueeze(-1)
        wrong = (condition > 0.5) != (batch["condition"][:, now] > 0.5)
        self._add("cond_wrong", (wrong & valid).sum())
        self._add("cond_valid", valid.sum())

    def _add(self, key: str, value: torch.Tensor) -> None:
        self.sums[key] += float(value)

    def reduce(self, all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Sum the accumulators over processes (DDP) with ``all_reduce``."""
        total = all_reduce(torch.tensor([self.sums[k] for k in _SUMS], dtype=torch.float64))
        self.sums = {k: float(v) for k, v in zip(_SUMS, total.tolist(), strict=True)}

    def compute(self) -> dict[str, float]:
        """``score`` and its terms (``score/<term>``), plus the figures in human units:
        ``joints_deg`` / ``joints_command_deg`` and ``force_n`` / ``force_reference_n``."""
        s = self.sums
        out: dict[str, float] = {}
        terms: dict[str, float] = {}
        if s["joint_steps"] > 0 and s["joint_command"] > 0:
            terms["joints"] = s["joint_model"] / s["joint_command"]
            per = s["joint_steps"]
            out["joints_deg"] = float(torch.rad2deg(torch.tensor(s["joint_model"] / per)))
            out["joints_command_deg"] = float(torch.rad2deg(torch.tensor(
                s["joint_command"] / per)))
        if s["force_labelled"] > 0 and s["force_frames"] > 0:
            reference = min(s["force_zero"], s["force_linear"])
            out["force_n"] = s["force_model"] / s["force_frames"]
            out["force_reference_n"] = reference / s["force_frames"]
            if reference > 0:
                terms["force"] = s["force_model"] / reference
        if s["cond_valid"] > 0:
            terms["condition"] = (s["cond_wrong"] / s["cond_valid"]) / CHANCE_ERROR
        for name, value in terms.items():
            out[f"score/{name}"] = value
        if terms:
            out["score"] = sum(terms.values()) / len(terms)
        return out
