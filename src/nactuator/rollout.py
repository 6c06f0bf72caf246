"""The causal window and the closed-loop rollout: one definition for training, evaluation,
offline inference and the live loop.

**Window.** The model reads ``window_length`` consecutive frames (L = 9 by default): the
current frame and the L − 1 frames before it. Before an episode starts there are no frames;
those slots hold zeros and are flagged in ``pad``, which the feature builder turns into
neutral tokens, so the first frames of an episode are seen exactly as in training.

**Rollout.** A *block* holds, per batch row, the L − 1 frames before a start frame ``s``
(recorded frames, or padding before an episode's first frame) followed by frames
``s .. s + T − 1``. Step ``i`` builds the window ending at frame ``s + i`` from the
*recorded* commands and telemetry and the *simulated* state (frames before ``s`` keep their
recorded state: nothing was simulated there), asks the actuator for a joint torque, and
steps the simulator to the state of frame ``s + i + 1``. Gradients flow back through every
step (BPTT) when the caller lets them. :func:`rollout_episodes` is the whole-episode case
every caller shares (validation, ``eval``, ``bench-bam``, ``plan``): from each episode's
frame 0, in eval mode, without autograd unless asked.

**Next-state models.** An actuator whose outputs hold ``dq`` and ``dqd`` (the joint-wise
model with ``dynamics: next_state``, DexNDM) predicts the state change itself: every rollout
here then advances ``q + dq, qd + dqd`` instead of stepping the simulator (the model *is*
the step; ``tau`` is NaN). It is trained one step ahead on the recorded windows
(:func:`teacher_forced_rollout`) and evaluated by the same open-loop rollout from frame 0.

**Inputs.** Windows hold telemetry as the input filters (:mod:`nactuator.input_filters`,
the spec in the actuator bundle) left it: offline callers filter whole episodes first,
:class:`StreamingWindow` filters each pushed frame with the same function.

This module imports only torch, numpy and the input filters: the actuator and the simulator
step are callables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from nactuator.input_filters import (
    POOL_SOURCES,
    POOLED_KEYS,
    FilterState,
    check_spec,
    filter_inputs,
    pooled_keys,
)

__all__ = [
    "RECORDED_KEYS",
    "STATE_KEYS",
    "WINDOW_LENGTH",
    "NonFiniteRollout",
    "Rollout",
    "StreamingWindow",
    "causal_outputs",
    "causal_windows",
    "closed_loop_rollout",
    "closed_loop_rollout_stepwise",
    "episode_block",
    "eval_mode",
    "model_inputs",
    "rollout_episodes",
    "teacher_forced_rollout",
]

WINDOW_LENGTH = 9  # SPEC §4: 8 history frames + the current frame
# Replayed from the recording: the commands and what is known before execution
# (nactuator.data.commands), the telemetry a telemetry-conditioned model reads and the input
# filters' pooled statistics of it (of effort and commands only: never the state).
RECORDED_KEYS = ("q_cmd", "q_cmd_next", "torque_enable", "kp", "supply_voltage",
                 "initial_temperature", "effort", "voltage", "temperature", *POOLED_KEYS)
STATE_KEYS = ("q", "qd")  # simulated during a rollout

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
ActuatorFn = Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]


class NonFiniteRollout(RuntimeError):
    """The model produced a NaN/inf torque; the simulator must not be stepped with it."""


def _frames_before(window_length: int) -> int:
    if not isinstance(window_length, int | np.integer) or window_length < 1:
        raise ValueError(f"window_length must be a positive integer, got {window_length!r}")
    return int(window_length) - 1


def _as_tensor(values) -> torch.Tensor:
    if isinstance(values, torch.Tensor):  # keeps the graph: planning differentiates commands
        return torch.nan_to_num(values.to(torch.float32), nan=0.0).reshape(len(values), -1)
    array = np.nan_to_num(np.asarray(values, dtype=np.float32), nan=0.0)
    return torch.from_numpy(array.reshape(len(array), -1))


# --------------------------------------------------------------------------- windows


def causal_windows(frames: Mapping[str, object], keys: Sequence[str],
                   window_length: int) -> dict[str, torch.Tensor]:
    """Every window of one recording: ``frames[key]`` (T, n) -> (T, L, n), plus ``pad``
    (T, L). Window t holds frames t − L + 1 .. t; NaN (unrecorded) reads as 0."""
    before = _frames_before(window_length)
    length = len(frames[keys[0]])
    frame = torch.arange(length).unsqueeze(1) - before + torch.arange(window_length)
    windows = {"pad": frame < 0}
    for key in keys:
        values = _as_tensor(frames[key])
        padded = torch.cat([values.new_zeros(before, values.shape[1]), values])
        # unfold -> (T, n, L); the window axis goes second, as in (B, L, n).
        windows[key] = padded.unfold(0, window_length, 1).permute(0, 2, 1)
    return windows


INTERVAL_OUTPUTS = ("force_sigma", "force_lo", "force_hi")  # (T, 3) each, with the head


def causal_outputs(actuator, recordings: Sequence[Mapping[str, object]],
                   batch_size: int = 4096) -> list[dict[str, np.ndarray]]:
    """The actuator on every causal window of each recording (``{key: (T, n)}`` frames, the
    input filters already applied): per recording ``tau`` (T, n), ``force`` (T, 3),
    ``gate`` (T,), ``condition`` (T, n), and ``force_sigma/_lo/_hi`` (T, 3) from a model
    with the uncertainty head; float64. All windows go through the network in batches of
    ``batch_size``, in eval mode, without autograd (the actuator's mode is restored).
    """
    keys = list(actuator.inputs)
    lengths = [len(r[keys[0]]) for r in recordings]
    per_rec = [causal_windows(r, keys, actuator.window_length) for r in recordings]
    stacked = {k: torch.cat([w[k] for w in per_rec]) for k in [*keys, "pad"]}
    total = stacked[keys[0]].shape[0]
    # An exported model (models.exported) has no parameters and runs on the CPU.
    device = next((p.device for p in actuator.parameters()), torch.device("cpu"))
    outs: dict[str, list[torch.Tensor]] = {"tau": [], "force": [], "gate": [], "condition": []}
    with eval_mode(actuator), torch.no_grad():
        for start in range(0, total, batch_size):
            window = {k: v[start:start + batch_size].to(device) for k, v in stacked.items()}
            out = actuator(window)
            outs["tau"].append(out["tau"].float().cpu())
            outs["force"].append(out["force"].float().cpu())
            outs["gate"].append(out["gate"].reshape(-1).float().cpu())
            outs["condition"].append(out["condition"].float().cpu())
            for key in INTERVAL_OUTPUTS:
                if key in out:
                    outs.setdefault(key, []).append(out[key].float().cpu())
    flat = {k: torch.cat(v).numpy().astype(np.float64) for k, v in outs.items()}
    results, offset = [], 0
    for length in lengths:
        results.append({k: v[offset:offset + length] for k, v in flat.items()})
        offset += length
    return results


class StreamingWindow:
    """The window of a live stream: :meth:`push` one frame, read the (1, L, n) tensors.

    Identical to :func:`causal_windows` on the frames pushed so far (zeros flagged as
    padding until L frames exist). With ``filters`` (the bundle's input filter spec) each
    pushed frame first goes through :func:`nactuator.input_filters.filter_inputs`, the
    function training and ``infer`` run over whole episodes, with the stream's state
    carried from push to push. The pooled channels (``pool_*``, when the spec has ``pool``)
    are computed there, so a frame pushed holds :attr:`frame_keys`: the window's other
    channels plus the pool's sources. On the CPU the tensors handed out are views of one
    (K, L, n) buffer, so a cycle copies nothing but the new row.
    """

    def __init__(self, keys: Sequence[str], window_length: int, n: int,
                 device: str | torch.device = "cpu",
                 filters: Mapping[str, object] | None = None) -> None:
        _frames_before(window_length)
        self.filters = None if filters is None else check_spec(filters)
        self._filter_state: FilterState | None = None
        self.keys, self.window_length, self.n = list(keys), int(window_length), n
        pooled = [k for k in self.keys if k in POOLED_KEYS]
        if pooled and not pooled_keys(self.filters):
            raise ValueError(f"the window reads pooled channels {pooled} but the input "
                             "filters have no 'pool' (the bundle's spec computes them)")
        # What push reads: the channels not computed by the filters, and the pool's sources.
        self.frame_keys = [k for k in self.keys if k not in POOLED_KEYS]
        if pooled:
            self.frame_keys += [k for k in POOL_SOURCES if k not in self.frame_keys]
        self.data = np.zeros((len(self.keys), self.window_length, n), dtype=np.float32)
        self.count = 0
        self.device = torch.device(device)
        self._shared = torch.from_numpy(self.data)
        self._tensor = self._shared if self.device.type == "cpu" else self._shared.to(self.device)
        self._views: dict[str, torch.Tensor] = {
            k: self._tensor[i : i + 1] for i, k in enumerate(self.keys)}
        self._pad = torch.ones(1, self.window_length, dtype=torch.bool, device=self.device)
        self._views["pad"] = self._pad
        # The newest frame as the model sees it (after the filters, NaN kept), per key (n,):
        # what `live --contact` takes q and qd from, as `infer` takes them from the filtered
        # recording.
        self.frame: dict[str, np.ndarray] = {}

    def push(self, values: Mapping[str, np.ndarray], valid: np.ndarray | None = None) -> None:
        """Append the newest frame (``values[key]`` of shape (n,) for every key of
        :attr:`frame_keys`); ``valid`` (n,) is 1 where the motor was read this cycle
        (default: all). The frame goes through the input filters if the window has them;
        NaN reads as 0."""
        frame = {k: np.asarray(values[k], dtype=np.float32).reshape(1, self.n)
                 for k in self.frame_keys}
        if self.filters is not None:
            if valid is not None:
                frame["telemetry_valid"] = np.asarray(valid).reshape(1, self.n)
            frame, self._filter_state = filter_inputs(frame, self.filters, self._filter_state)
        row = np.stack([frame[k][0] for k in self.keys])
        self.frame = dict(zip(self.keys, row, strict=True))
        self.data[:, :-1] = self.data[:, 1:]
        self.data[:, -1] = np.nan_to_num(row, nan=0.0)
        self.count += 1
        if self.count <= self.window_length:  # the newest `count` slots are real frames
            self._pad[0, self.window_length - self.count :] = False

    @property
    def warm(self) -> bool:
        """True once every slot holds a real frame."""
        return self.count >= self.window_length

    def tensors(self) -> dict[str, torch.Tensor]:
        if self._tensor is not self._shared:
            self._tensor.copy_(self._shared, non_blocking=True)
        return self._views


# ------------------------------------------------------------------------- rollouts


def episode_block(episodes: Sequence[Mapping[str, object]], keys: Sequence[str],
                  window_length: int) -> dict[str, torch.Tensor]:
    """Whole episodes as one rollout block starting at each episode's frame 0.

    ``episodes[b][key]`` is (T_b, n). Returns (B, L − 1 + T_max, n) float32 per key with the
    L − 1 padding frames in front (``pad`` (B, L − 1 + T_max) flags them), short episodes
    repeating their last frame at the end (their steps past the end are to be ignored), and
    ``length`` (B,): each episode's frame count.
    """
    before = _frames_before(window_length)
    lengths = [len(ep[keys[0]]) for ep in episodes]
    total = before + max(lengths)
    block: dict[str, torch.Tensor] = {}
    for key in keys:
        rows = []
        for ep in episodes:
            values = _as_tensor(ep[key])
            tail = values[-1:].expand(total - before - len(values), -1)
            rows.append(torch.cat([values.new_zeros(before, values.shape[1]), values, tail]))
        block[key] = torch.stack(rows)
    block["pad"] = torch.zeros(len(episodes), total, dtype=torch.bool)
    block["pad"][:, :before] = True
    block["length"] = torch.tensor(lengths)
    return block


@dataclass
class Rollout:
    """What one rollout produced. States have T frames (frame s .. s + T − 1, the first is
    the start state); per-step outputs have T − 1 steps: step i describes frame s + i.
    Batched torch tensors (B, ...) as returned; :meth:`episode` gives one row as numpy."""

    q: torch.Tensor  # (B, T, n) simulated positions
    qd: torch.Tensor  # (B, T, n) simulated velocities
    tau: torch.Tensor  # (B, T-1, n) predicted joint torques (before the simulator's clip)
    force: torch.Tensor  # (B, T-1, 3)
    gate: torch.Tensor  # (B, T-1) contact probability
    gate_logit: torch.Tensor  # (B, T-1)
    condition: torch.Tensor  # (B, T-1, n) probability of nominal condition
    condition_logit: torch.Tensor  # (B, T-1, n)
    # (B, T-1, 3) log σ² of the force, from a model with the uncertainty head; else None
    force_log_var: torch.Tensor | None = None

    def episode(self, row: int, length: int) -> Rollout:
        """Row ``row`` cut to an episode of ``length`` frames, as float64 numpy arrays
        (states (length, n), steps (length − 1, ...)): what evaluation scores and plots."""
        def cut(t: torch.Tensor, frames: int) -> np.ndarray:
            return t[row, :frames].detach().cpu().numpy().astype(np.float64)

        states = {k: cut(getattr(self, k), length) for k in ("q", "qd")}
        steps = {k: cut(getattr(self, k), length - 1) for k in
                 ("tau", "force", "gate", "gate_logit", "condition", "condition_logit")}
        steps.update({k: cut(getattr(self, k), length - 1) for k in _OPTIONAL_KEYS
                      if getattr(self, k) is not None})
        return Rollout(**states, **steps)


def _check_steps(block: Mapping[str, torch.Tensor], window_length: int,
                 steps: int | None) -> tuple[int, int]:
    """(frames before the start, steps) of a rollout of ``block``; refuses a short block."""
    before = _frames_before(window_length)
    frames = block["q"].shape[1]
    steps = frames - before - 1 if steps is None else int(steps)
    if steps < 1 or frames < before + steps + 1:
        raise ValueError(
            f"the block has {frames} frames; {steps} rollout step(s) with window length "
            f"{window_length} need {window_length + max(steps, 1)} (L - 1 before the start, "
            "the start frame and one frame per step)")
    return before, steps


_OUTPUT_KEYS = ("tau", "force", "gate", "gate_logit", "condition", "condition_logit")
_OPTIONAL_KEYS = ("force_log_var",)  # kept when the actuator gives them


def _finish(actuator_out: Mapping[str, torch.Tensor], outs: dict[str, list[torch.Tensor]],
            step: int) -> torch.Tensor:
    """Check one step's torque (a next-state model's state change) and keep its outputs;
    returns the torque."""
    tau = actuator_out["tau"]
    if "dq" in actuator_out:
        if not (torch.isfinite(actuator_out["dq"]).all()
                and torch.isfinite(actuator_out["dqd"]).all()):
            raise NonFiniteRollout(f"non-finite next state predicted at rollout step {step}")
    elif not torch.isfinite(tau).all():
        raise NonFiniteRollout(f"non-finite torque predicted at rollout step {step}")
    batch = tau.shape[0]
    for key in _OUTPUT_KEYS:
        value = actuator_out[key]
        outs[key].append(value.reshape(batch) if key.startswith("gate") else value)
    for key in _OPTIONAL_KEYS:
        if key in actuator_out:
            outs.setdefault(key, []).append(actuator_out[key])
    return tau


def _advance(step: StepFn, q: torch.Tensor, qd: torch.Tensor, tau: torch.Tensor,
             out: Mapping[str, torch.Tensor], tau_ext: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The next state: the simulator's step under the torque (plus ``tau_ext``, the joint
    torque of labelled external forces, when given), or a next-state model's own
    prediction (``dq``, ``dqd`` in its outputs: the model replaces the simulator)."""
    if "dq" in out:
        return q + out["dq"], qd + out["dqd"]
    if tau_ext is None:
        return step(q, qd, tau)
    return step(q, qd, tau, tau_ext=tau_ext)


def teacher_forced_rollout(actuator, block: Mapping[str, torch.Tensor], window_length: int,
                           steps: int | None = None) -> Rollout:
    """One-step predictions of a next-state model on the *recorded* path (DexNDM's
    supervised training): step i's window is the recorded frames ending at ``s + i`` and its
    state is ``q[s + i] + dq_i`` (likewise qd), scored against the recorded frame
    ``s + i + 1``; no simulator, no prediction fed back. All windows go through the network
    in one batch. Returns a :class:`Rollout` (q, qd (B, steps + 1, n): the recorded start
    state, then the one-step predictions) that the training losses read as any other."""
    before, steps = _check_steps(block, window_length, steps)
    recorded = [k for k in (*RECORDED_KEYS, *STATE_KEYS) if k in block]
    frames = {k: block[k][:, : before + steps] for k in recorded}
    if "pad" in block:
        frames["pad"] = block["pad"][:, : before + steps]
    tokens = actuator.frame_tokens(frames)  # (B, L - 1 + steps, d)
    batch = tokens.shape[0]
    windows = tokens.unfold(1, window_length, 1).permute(0, 1, 3, 2)  # (B, steps, L, d)
    out = actuator.forward_tokens(windows.reshape(batch * steps, window_length, -1))
    if "dq" not in out:
        raise ValueError("teacher_forced_rollout needs a next-state model (dq, dqd outputs)")

    def per_step(key: str) -> torch.Tensor:
        value = out[key]
        return value.reshape(batch, steps, *value.shape[1:])

    if not (torch.isfinite(out["dq"]).all() and torch.isfinite(out["dqd"]).all()):
        raise NonFiniteRollout("non-finite next state predicted in a teacher-forced step")
    now = slice(before, before + steps)
    q = block["q"][:, now] + per_step("dq")
    qd = block["qd"][:, now] + per_step("dqd")
    stacked = {k: per_step(k) for k in _OUTPUT_KEYS}
    stacked["gate"] = stacked["gate"].reshape(batch, steps)
    stacked["gate_logit"] = stacked["gate_logit"].reshape(batch, steps)
    optional = {k: per_step(k) for k in _OPTIONAL_KEYS if k in out}
    return Rollout(q=torch.cat([block["q"][:, before : before + 1], q], dim=1),
                   qd=torch.cat([block["qd"][:, before : before + 1], qd], dim=1),
                   **stacked, **optional)


def closed_loop_rollout(actuator: ActuatorFn, step: StepFn, block: Mapping[str, torch.Tensor],
                        window_length: int, steps: int | None = None,
                        q0: torch.Tensor | None = None,
                        qd0: torch.Tensor | None = None,
                        tau_ext: torch.Tensor | None = None) -> Rollout:
    """Roll ``steps`` control steps from the block's start frame (see the module docstring).

    ``block`` holds ``q`` and ``qd`` (B, L − 1 + T, n), the recorded channels the actuator
    reads, and optionally ``pad`` (B, L − 1 + T). ``steps`` defaults to T − 1. ``q0``/``qd0``
    (B, n) replace the recorded start state (noise in training; qd = 0 in the evaluation
    protocol). ``tau_ext`` (B, ≥ steps, n): a known external joint torque added to step i's
    simulator step (``step(q, qd, tau, tau_ext=...)``), e.g. of labelled contacts.

    An actuator that splits into a per-frame token function and a window network
    (``frame_wise`` true, ``frame_tokens(frames)`` on (B, T, n) channels -> (B, T, d),
    ``forward_tokens(tokens)`` on (B, L, d), as :class:`~nactuator.models.NeuralActuator`
    without a physics actuator does) is rolled out
    frame-wise: each frame's token is built once, when its state exists, and every window
    is a stack of L tokens, instead of slicing, stacking and normalising L frames of every
    channel at every step (:func:`closed_loop_rollout_stepwise`, the same function of the
    inputs; the tokens are bit-identical, gradients agree to float rounding).
    """
    if not getattr(actuator, "frame_wise", False):
        return closed_loop_rollout_stepwise(actuator, step, block, window_length, steps,
                                            q0, qd0, tau_ext)
    before, steps = _check_steps(block, window_length, steps)
    recorded = [k for k in RECORDED_KEYS if k in block]
    start = before  # the start frame's index in the block
    q, qd = (block["q"][:, start] if q0 is None else q0,
             block["qd"][:, start] if qd0 is None else qd0)
    # The first window: recorded frames before the start, then the start state.
    first = {k: block[k][:, :window_length] for k in recorded}
    first["q"] = torch.cat([block["q"][:, :before], q.unsqueeze(1)], dim=1)
    first["qd"] = torch.cat([block["qd"][:, :before], qd.unsqueeze(1)], dim=1)
    if "pad" in block:
        first["pad"] = block["pad"][:, :window_length]
    tokens = list(actuator.frame_tokens(first).unbind(1))
    qs, qds = [q], [qd]
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in _OUTPUT_KEYS}
    for i in range(steps):
        out = actuator.forward_tokens(torch.stack(tokens[i : i + window_length], dim=1))
        tau = _finish(out, outs, i)
        q, qd = _advance(step, q, qd, tau, out, None if tau_ext is None else tau_ext[:, i])
        qs.append(q)
        qds.append(qd)
        if i + 1 < steps:  # the token of the frame the next window ends on
            frame = start + i + 1
            new = {k: block[k][:, frame : frame + 1] for k in recorded}
            new["q"], new["qd"] = q.unsqueeze(1), qd.unsqueeze(1)
            if "pad" in block:
                new["pad"] = block["pad"][:, frame : frame + 1]
            tokens.append(actuator.frame_tokens(new)[:, 0])
    stacked = {k: torch.stack(v, dim=1) for k, v in outs.items()}
    return Rollout(q=torch.stack(qs, dim=1), qd=torch.stack(qds, dim=1), **stacked)


def closed_loop_rollout_stepwise(actuator: ActuatorFn, step: StepFn,
                                 block: Mapping[str, torch.Tensor], window_length: int,
                                 steps: int | None = None, q0: torch.Tensor | None = None,
                                 qd0: torch.Tensor | None = None,
                                 tau_ext: torch.Tensor | None = None) -> Rollout:
    """:func:`closed_loop_rollout` for any actuator callable: every step slices the L
    frames of every channel into a window and calls ``actuator(window)``. The definition
    the frame-wise path is checked against (tests/test_rollout_fused.py), and the
    baseline ``bench/train.py`` measures it against."""
    before, steps = _check_steps(block, window_length, steps)
    recorded = [k for k in RECORDED_KEYS if k in block]
    qs = [*block["q"][:, :before].unbind(1), block["q"][:, before] if q0 is None else q0]
    qds = [*block["qd"][:, :before].unbind(1), block["qd"][:, before] if qd0 is None else qd0]
    outs: dict[str, list[torch.Tensor]] = {k: [] for k in _OUTPUT_KEYS}
    for i in range(steps):
        window = {k: block[k][:, i : i + window_length] for k in recorded}
        window["q"] = torch.stack(qs[i : i + window_length], dim=1)
        window["qd"] = torch.stack(qds[i : i + window_length], dim=1)
        if "pad" in block:
            window["pad"] = block["pad"][:, i : i + window_length]
        out = actuator(window)
        tau = _finish(out, outs, i)
        q_next, qd_next = _advance(step, qs[-1], qds[-1], tau, out,
                                   None if tau_ext is None else tau_ext[:, i])
        qs.append(q_next)
        qds.append(qd_next)
    stacked = {k: torch.stack(v, dim=1) for k, v in outs.items()}
    return Rollout(q=torch.stack(qs[before:], dim=1), qd=torch.stack(qds[before:], dim=1),
                   **stacked)


# ------------------------------------------------------------- whole episodes


def model_inputs(actuator) -> tuple[str, ...]:
    """Window channels a rollout must provide: what the actuator reads, plus the state."""
    need = list(actuator.inputs)
    # The simulator state is always part of the rollout even if a model ignores it.
    need += [k for k in STATE_KEYS if k not in need]
    return tuple(need)


@contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``module`` in eval mode (no dropout) inside the block; its previous mode restored."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def rollout_episodes(actuator, step: StepFn,
                     episodes: Sequence[Mapping[str, object]] | Mapping[str, torch.Tensor],
                     start_velocity: str = "rest", device: str | torch.device | None = None,
                     grad: bool = False, tau_ext: torch.Tensor | None = None) -> Rollout:
    """Whole episodes rolled out together from frame 0 (the evaluation protocol).

    ``episodes``: per-episode frames (``{key: (T_b, n)}``, every channel of
    :func:`model_inputs`), or a block :func:`episode_block` already built (the
    DataModule's whole-episode batches). The simulation starts at each episode's recorded
    q[0], at rest (``start_velocity="rest"``, the protocol) or at the recorded qd[0]
    (``"recorded"``: BAM's logs start moving). The actuator runs in eval mode, under
    ``torch.no_grad`` unless ``grad`` (then autograd is as the caller set it: planning
    differentiates the commands, validation runs under Lightning's inference mode).
    Returns the batched :class:`Rollout`; ``Rollout.episode(b, length)`` cuts one out.
    ``tau_ext`` (B, >= steps, n): a known external joint torque added to step i's simulator
    step (row i: the episode's frame i), e.g. a labelled payload; None (the protocol): none.
    """
    if start_velocity not in ("rest", "recorded"):
        raise ValueError(f"start_velocity must be 'rest' or 'recorded', got {start_velocity!r}")
    window_length = actuator.window_length
    block = (episodes if isinstance(episodes, Mapping)
             else episode_block(episodes, model_inputs(actuator), window_length))
    if device is not None:
        block = {k: v.to(device) for k, v in block.items()}
    start = window_length - 1
    q0, qd0 = block["q"][:, start], block["qd"][:, start]
    if start_velocity == "rest":
        qd0 = torch.zeros_like(qd0)
    with eval_mode(actuator), (nullcontext() if grad else torch.no_grad()):
        return closed_loop_rollout(actuator, step, block, window_length, q0=q0, qd0=qd0,
                                   tau_ext=None if tau_ext is None else tau_ext.to(
                                       block["q"].device, block["q"].dtype))
