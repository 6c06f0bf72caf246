"""What a policy sees: per-condition observation features, and the frozen force sensor.

Conditions (the issue's baselines; one name each):

- ``position``: joint positions q (every channel, the gripper included);
- ``force_estimate``: q + the frozen actuator model's force f̂ (3) and contact gate (1),
  from the causal path ``live`` uses (:class:`nactuator.rollout.StreamingWindow` with the
  checkpoint's input filters, one window per arm);
- ``telemetry``: q + the raw servo effort signal (no actuator model: the cheap trick);
- ``oracle``: q + the true force the payload puts on the end effector.

Every condition also reads the episode's phase (time since the start / the task's length,
in [0, 1]): the demonstrator waits a moment at rest before lifting, which no joint reading
can tell apart from "stay"; the clock is the same in every condition, the payload in none.

The force sensor needs the command of the frame it reads, which a controller only decides
after seeing the frame; so the f̂ a policy sees at step k is the model's output for frame
k − 1 (one control period old), in demonstrations and evaluation alike.
"""

from __future__ import annotations

import numpy as np
import torch

from nactuator.rollout import StreamingWindow

__all__ = ["CONDITIONS", "ForceSensor", "condition_features", "feature_width", "phase"]

CONDITIONS = ("position", "force_estimate", "telemetry", "oracle")


def feature_width(condition: str, n: int) -> int:
    """Features per frame as stored by the demos (the phase is appended at fit time)."""
    extra = {"position": 0, "force_estimate": 4, "telemetry": n, "oracle": 3}
    if condition not in extra:
        raise ValueError(f"unknown condition {condition!r}; expected one of {CONDITIONS}")
    return n + extra[condition]


def phase(t: np.ndarray | float, seconds: float) -> np.ndarray:
    """Episode phase in [0, 1] at time ``t`` [s] of a ``seconds`` long task."""
    return np.clip(np.asarray(t, dtype=np.float32) / np.float32(seconds), 0.0, 1.0)


def condition_features(condition: str, q: np.ndarray, estimate: np.ndarray,
                       effort: np.ndarray, force_true: np.ndarray) -> np.ndarray:
    """(n_envs, feature_width) for one step; ``estimate`` is [f̂, gate] (n_envs, 4)."""
    extra = {"position": q[:, :0], "force_estimate": estimate, "telemetry": effort,
             "oracle": force_true}[condition]
    return np.concatenate([q, extra], axis=1).astype(np.float32)


class ForceSensor:
    """The frozen actuator model on ``n_envs`` live streams; :meth:`push` one frame each."""

    def __init__(self, actuator: torch.nn.Module, meta: dict, n_envs: int, n: int) -> None:
        self.actuator = actuator
        self.windows = [StreamingWindow(actuator.inputs, actuator.window_length, n,
                                        filters=meta.get("input_filters"))
                        for _ in range(n_envs)]
        self.estimate = np.zeros((n_envs, 4), dtype=np.float32)  # [fx, fy, fz, gate]

    def push(self, telemetry: dict[str, np.ndarray], q_cmd: np.ndarray) -> np.ndarray:
        """Frame k's telemetry and command in; the model's [f̂, gate] for frame k out."""
        values = dict(telemetry, q_cmd=q_cmd)
        for e, w in enumerate(self.windows):
            w.push({k: values[k][e] for k in w.frame_keys})
        batch = {k: torch.cat([w.tensors()[k] for w in self.windows])
                 for k in [*self.windows[0].keys, "pad"]}
        with torch.inference_mode():
            out = self.actuator(batch)
        self.estimate = np.concatenate([out["force"].float().numpy(),
                                        out["gate"].reshape(-1, 1).float().numpy()], axis=1)
        return self.estimate
