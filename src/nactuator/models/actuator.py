"""``NeuralActuator``: FeatureBuilder + network, the module every other room uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from nactuator.input_filters import POOLED_KEYS
from nactuator.models.features import DEFAULT_FEATURES, FeatureBuilder, actuator_mode
from nactuator.models.firmware import FirmwareLaw
from nactuator.models.heads import PooledConditionHead
from nactuator.models.networks import build_model
from nactuator.models.physics import build_physics
from nactuator.uncertainty import GATE_CONTACT, GAUSSIAN_Z90

# What a model with the heteroscedastic force head adds to its outputs (each (B, 3), N):
# σ per axis and the interval f̂ ∓ scale·σ of the bundle's calibration.
INTERVAL_KEYS = ("force_sigma", "force_lo", "force_hi")


def upgrade_model_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A model config in today's names: checkpoints before 0.2 called the window length
    ``history`` (it was 9, the window, not the 8 frames before the current one)."""
    config = dict(config)
    if "history" in config and "window_length" not in config:
        config["window_length"] = config.pop("history")
    return config


class NeuralActuator(nn.Module):
    """Window of raw channels (Contract 1 keys, each (B, L, n)) -> head outputs.

    ``features`` lists feature groups (``models.FEATURE_GROUPS``; ``DEFAULT_FEATURES`` is
    all four), ``norm_stats`` is the DataModule's ``{key: {"mean": [n], "std": [n]}}``,
    ``model_config`` is ``{"arch": ..., "window_length": 9, **sizes}`` (``conf/model/*.yaml``;
    default: the transformer). The resolved config (every size filled in) is kept in
    ``self.model_config``.

    Two optional entries of ``model_config`` make a counterfactual actuator
    (docs/counterfactual.md): ``firmware`` (the servo's position-law constants,
    :class:`~nactuator.models.firmware.FirmwareLaw`), needed by the ``duty`` feature group,
    and ``physics`` (e.g. ``{"kind": "dc_motor", **priors}``,
    :mod:`nactuator.models.physics`): a physical actuator model whose torque the network's
    output is added to, as a learned residual.

    ``condition_head: {"kind": "pooled", "hidden": H}`` (needs the feature group ``pooled``)
    replaces the network's condition output by :class:`~nactuator.models.heads.
    PooledConditionHead` on the current frame's pooled statistics, and the network then
    reads the tokens without them: torque and force see what they saw without pooling.
    """

    def __init__(self, features: Sequence[str] = DEFAULT_FEATURES, n_motors: int | None = None,
                 norm_stats: Mapping | None = None,
                 model_config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        if not isinstance(n_motors, int) or n_motors < 1:
            raise ValueError(f"NeuralActuator needs n_motors >= 1 (the platform's channel "
                             f"count), got {n_motors!r}")
        if not isinstance(norm_stats, Mapping):
            raise ValueError("NeuralActuator needs norm_stats (the DataModule's train-split "
                             "statistics, {key: {'mean': [n], 'std': [n]}}), got "
                             f"{type(norm_stats).__name__}")
        config = upgrade_model_config(model_config or {"arch": "transformer"})
        if "arch" not in config:
            raise ValueError(f"model_config needs an 'arch' key, got keys {sorted(config)}")
        firmware_config = config.pop("firmware", None)
        physics_config = config.pop("physics", None)
        state_step = config.pop("state_step", None)
        condition_head = config.pop("condition_head", None)
        if config.get("dynamics", "torque") == "next_state":
            if physics_config is not None:
                raise ValueError("a next-state model predicts the state, not a torque: it "
                                 "cannot add a physics actuator's torque")
            if not (isinstance(state_step, Mapping) and len(state_step.get("dq", [])) ==
                    n_motors and len(state_step.get("dqd", [])) == n_motors):
                raise ValueError(f"a next-state model needs model_config 'state_step' "
                                 f"{{'dq': [{n_motors}], 'dqd': [{n_motors}]}} (the DataModule's "
                                 f"state_step), got {state_step!r}")
        firmware = (None if firmware_config is None
                    else FirmwareLaw.from_config(firmware_config, "model_config 'firmware'"))
        self.feature_builder = FeatureBuilder(features, n_motors, norm_stats, firmware=firmware)
        self.n_motors = n_motors
        self.condition_head = self._build_condition_head(condition_head)
        n_in = (self.feature_builder.n_in if self.condition_head is None
                else len(self.net_columns))
        self.net = build_model(n_in=n_in, n_motors=n_motors, **config)
        self.physics = (None if physics_config is None
                        else build_physics(physics_config, n_motors, firmware))
        self.model_config = dict(self.net.config)
        # next_state: the per-step std of q and qd the network's state_delta is in
        self.register_buffer("state_scale", None if state_step is None else torch.tensor(
            [state_step["dq"], state_step["dqd"]], dtype=torch.float32).T,  # (n, 2)
            persistent=False)  # rebuilt from model_config
        if state_step is not None:
            self.model_config["state_step"] = {k: [float(v) for v in state_step[k]]
                                               for k in ("dq", "dqd")}
        if firmware is not None:
            self.model_config["firmware"] = firmware.to_config()
        if physics_config is not None:
            self.model_config["physics"] = dict(physics_config)
        if self.condition_head is not None:
            self.model_config["condition_head"] = {"kind": "pooled",
                                                   "hidden": self.condition_head.hidden}
            if self.condition_head.shared:  # only when set: older bundles' config unchanged
                self.model_config["condition_head"]["shared"] = True
        # The interval calibration (bundle data, nactuator.uncertainty.calibration_record);
        # None: not calibrated, the Gaussian 90 % half-width z = 1.645 σ.
        self.interval_calibration: dict[str, Any] | None = None

    def _build_condition_head(self, spec: Any) -> PooledConditionHead | None:
        """The pooled condition head of ``model_config["condition_head"]`` (None: the
        network's own); sets the token columns the network and the head read."""
        if spec is None:
            return None
        if not isinstance(spec, Mapping) or spec.get("kind") != "pooled":
            raise ValueError(f"model_config 'condition_head' must be {{'kind': 'pooled', "
                             f"'hidden': H, 'shared': bool}}, got {spec!r}")
        unknown = set(spec) - {"kind", "hidden", "shared"}
        if unknown:
            raise ValueError(f"condition_head: unknown keys {sorted(unknown)} (kind, hidden, "
                             f"shared)")
        shared = spec.get("shared", False)
        if not isinstance(shared, bool):
            raise ValueError(f"condition_head.shared must be true or false, got {shared!r}")
        hidden = spec.get("hidden", 32)
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise ValueError(f"condition_head.hidden must be a positive integer, got {hidden!r}")
        channels, n = self.feature_builder.channels, self.n_motors
        if not set(POOLED_KEYS) <= set(channels):
            raise ValueError("condition_head 'pooled' reads the feature group 'pooled' (the "
                             f"input filters' pool); the features are {self.features}")
        # Tokens are channel-major: channel c of motor m is column c * n + m.
        pooled = [channels.index(k) for k in POOLED_KEYS]
        self.register_buffer("pool_columns", torch.tensor(
            [[c * n + m for m in range(n)] for c in pooled]), persistent=False)  # (P, n)
        self.register_buffer("net_columns", torch.tensor(
            [c * n + m for c in range(len(channels)) if c not in pooled for m in range(n)]),
            persistent=False)
        return PooledConditionHead(n, len(pooled), hidden, shared=shared)

    def _network(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """The network on a token window (B, L, n_in); with the pooled condition head, the
        network reads the other columns and the head the current frame's pooled ones."""
        if self.condition_head is None:
            return self.net(tokens)
        out = self.net(tokens.index_select(-1, self.net_columns))
        logit = self._pooled_condition(tokens)
        out["condition_logit"], out["condition"] = logit, torch.sigmoid(logit)
        return out

    def _pooled_condition(self, tokens: torch.Tensor) -> torch.Tensor:
        """The pooled condition head's logits (B, n) on the current (last) frame's pooled
        token columns of ``tokens`` (B, L, n_in)."""
        return self.condition_head(tokens[:, -1][:, self.pool_columns])

    def pooled_condition_logit(self, window: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The condition logits (B, n) that :meth:`forward` gives for ``window`` (its
        ``condition_logit``) with the pooled condition head, without running the network:
        the head reads only the current frame's pooled statistics, so a window of one
        frame suffices (the DataModule's ``condition_frames``, which training fits the head
        on). Needs ``condition_head: pooled``."""
        if self.condition_head is None:
            raise ValueError("pooled_condition_logit needs model_config condition_head "
                             "{kind: pooled}; this actuator's condition is the network's")
        return self._pooled_condition(self.feature_builder(window))

    @property
    def has_uncertainty(self) -> bool:
        """True when the network has the heteroscedastic force head (``force_lo/hi``)."""
        return bool(self.model_config.get("uncertainty"))

    @property
    def interval_scale(self) -> float:
        """Half-width of the force interval in σ: the calibrated scale, else z_0.95."""
        calibration = self.interval_calibration
        return GAUSSIAN_Z90 if not calibration else float(calibration["scale"])

    @property
    def interval_gate_scales(self) -> tuple[float, float] | None:
        """(free, contact) half-widths in σ of a gate-conditional calibration, else None."""
        by_gate = (self.interval_calibration or {}).get("by_gate")
        return None if not by_gate else (float(by_gate["free"]), float(by_gate["contact"]))

    @property
    def dynamics(self) -> str:
        """``"torque"`` (a simulator turns the output torque into the next state) or
        ``"next_state"`` (the model predicts the next state itself: ``dq``, ``dqd``)."""
        return self.model_config.get("dynamics", "torque")

    @property
    def window_length(self) -> int:
        """Frames per input window (L: the current frame and the L - 1 before it)."""
        return self.net.window_length

    @property
    def features(self) -> list[str]:
        """The feature groups, e.g. ``["command", "state", "telemetry", "error"]``."""
        return list(self.feature_builder.features)

    @property
    def inputs(self) -> list[str]:
        """The window keys this actuator reads."""
        extra = [] if self.physics is None else [
            k for k in self.physics.inputs if k not in self.feature_builder.inputs]
        return [*self.feature_builder.inputs, *extra]

    @property
    def mode(self) -> str:
        """``"counterfactual"`` (reads only what exists before execution) or ``"telemetry"``
        (replays recorded telemetry of the motion it predicts)."""
        return actuator_mode(self.inputs)

    @property
    def frame_wise(self) -> bool:
        """True when the output is ``forward_tokens(frame_tokens(window))``: the tokens are
        a per-frame function of the channels, so a rollout builds each frame's token once
        (:func:`nactuator.rollout.closed_loop_rollout`). A physics actuator reads the raw
        window, so it is not."""
        return self.physics is None

    def frame_tokens(self, frames: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Normalised tokens (B, T, n_in) of T frames (channels (B, T, n)): frame by frame
        what :meth:`forward` feeds the network."""
        return self.feature_builder(frames)

    def forward_tokens(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """The network on one window of tokens (B, L, n_in) (no physics actuator)."""
        return self._state_outputs(self._network(tokens))

    def _state_outputs(self, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A next-state network's ``state_delta`` (B, n, 2) in SI: ``dq``, ``dqd`` (B, n),
        the change of q and qd from the window's current frame to the next."""
        if "state_delta" in out:
            delta = out["state_delta"] * self.state_scale
            out["dq"], out["dqd"] = delta[..., 0], delta[..., 1]
        return out

    def forward(self, window: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = self._state_outputs(self._network(self.feature_builder(window)))
        if self.physics is not None:
            out["tau"] = self.physics(window) + out["tau"]
        if "force_log_var" in out:
            sigma = torch.exp(0.5 * out["force_log_var"])
            gated = self.interval_gate_scales
            if gated is None:
                half = self.interval_scale * sigma
            else:  # the gate picks the scale: contact frames get the wider one
                contact = out["gate"] >= GATE_CONTACT
                half = torch.where(contact, gated[1], gated[0]) * sigma
            out.update(force_sigma=sigma, force_lo=out["force"] - half,
                       force_hi=out["force"] + half)
        return out
