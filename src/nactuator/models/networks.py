"""``build_model``: one encoder (transformer | mlp | gru | lstm | jointwise) plus its heads.

Every arch but ``jointwise`` pools the window into one whole-arm feature read by
``ActuatorHeads``; ``jointwise`` keeps one feature per joint, read by ``JointwiseHeads``
(the same output keys and shapes, so training, eval, bundle, export and live do not
know the difference)."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from nactuator.models.baselines import GRUEncoder, LSTMEncoder, MLPEncoder
from nactuator.models.heads import ActuatorHeads
from nactuator.models.jointwise import JointwiseEncoder, JointwiseHeads
from nactuator.models.transformer import TransformerEncoder

ENCODERS: dict[str, Any] = {
    "transformer": TransformerEncoder,
    "mlp": MLPEncoder,
    "gru": GRUEncoder,
    "lstm": LSTMEncoder,
    "jointwise": JointwiseEncoder,
}
# Heads of each arch (default: the whole-arm ActuatorHeads); both take the same sizes.
HEADS: dict[str, Any] = {"jointwise": JointwiseHeads}


def _defaults(fn: Any) -> dict[str, Any]:
    """Keyword defaults of a constructor, minus the window length (passed separately)."""
    params = inspect.signature(fn).parameters
    return {k: p.default for k, p in params.items()
            if p.default is not inspect.Parameter.empty and k not in ("window_length",
                                                                       "n_motors")}


class ActuatorNet(nn.Module):
    """Tokens (B, L, n_in) -> dict of the head outputs (Contract 4).

    ``config`` holds every size, resolved against the defaults, so that a bundle can
    rebuild exactly this network without any config file.
    """

    def __init__(self, encoder: nn.Module, heads: nn.Module, n_in: int, window_length: int,
                 config: dict[str, Any]) -> None:
        super().__init__()
        self.encoder = encoder
        self.heads = heads
        self.n_in = n_in
        self.window_length = window_length
        self.config = config

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        expected = (self.window_length, self.n_in)
        if not torch.jit.is_tracing() and tuple(tokens.shape[1:]) != expected:
            raise ValueError(f"tokens must have shape (B, {self.window_length}, {self.n_in}), "
                             f"got {tuple(tokens.shape)}")
        return self.heads(self.encoder(tokens))


def build_model(arch: str, n_in: int, n_motors: int, window_length: int = 9,
                **sizes: Any) -> ActuatorNet:
    """Build one actuator network. ``sizes`` override the architecture's defaults
    (see ``conf/model/<arch>.yaml``); an unknown size name is an error."""
    if arch not in ENCODERS:
        raise ValueError(f"unknown model arch {arch!r}; expected one of {sorted(ENCODERS)}")
    if n_in < 1 or n_motors < 1 or window_length < 1:
        raise ValueError(f"n_in, n_motors and window_length must be >= 1, got "
                         f"n_in={n_in}, n_motors={n_motors}, window_length={window_length}")
    encoder_cls = ENCODERS[arch]
    encoder_sizes = _defaults(encoder_cls)
    heads_cls = HEADS.get(arch, ActuatorHeads)
    head_sizes = _defaults(heads_cls)
    unknown = sorted(set(sizes) - set(encoder_sizes) - set(head_sizes))
    if unknown:
        raise ValueError(f"unknown size(s) {unknown} for arch {arch!r}; allowed: "
                         f"{sorted(encoder_sizes) + sorted(head_sizes)}")
    encoder_sizes.update({k: v for k, v in sizes.items() if k in encoder_sizes})
    head_sizes.update({k: v for k, v in sizes.items() if k in head_sizes})

    # A per-joint encoder needs the motor count to split the tokens into joints.
    per_joint = ({"n_motors": n_motors}
                 if "n_motors" in inspect.signature(encoder_cls).parameters else {})
    encoder = encoder_cls(n_in=n_in, window_length=window_length, **per_joint, **encoder_sizes)
    heads = heads_cls(encoder.width, n_motors, **head_sizes)
    config = {"arch": arch, "window_length": window_length, **encoder_sizes, **head_sizes}
    if not config.get("uncertainty"):  # off: the config of models before the option
        config.pop("uncertainty", None)
    if config.get("dynamics") == "torque":  # the default: as before the next-state mode
        config.pop("dynamics")
    return ActuatorNet(encoder, heads, n_in, window_length, config)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
