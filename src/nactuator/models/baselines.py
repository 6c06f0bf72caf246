"""Matched-size ablation encoders of SPEC §4: an MLP on the flattened window, GRU and LSTM.

Each maps tokens (B, L, n_in) to one feature vector (B, width) for the shared heads, and
each ends in a LayerNorm like the Transformer, so the heads see features on one scale.
Default sizes give ~1.4 M parameters with the heads, matching the Transformer.
"""

from __future__ import annotations

import torch
from torch import nn


class MLPEncoder(nn.Module):
    """The whole window flattened into one vector, then ``n_layers`` SiLU layers."""

    def __init__(self, n_in: int, window_length: int = 9, hidden: int = 416, n_layers: int = 7,
                 dropout: float = 0.1) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"mlp n_layers must be >= 1, got {n_layers}")
        self.width = hidden
        layers: list[nn.Module] = []
        width_in = n_in * window_length
        for _ in range(n_layers):
            layers += [nn.Linear(width_in, hidden), nn.SiLU(), nn.Dropout(dropout)]
            width_in = hidden
        self.layers = nn.Sequential(*layers, nn.LayerNorm(hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.layers(tokens.flatten(1))


class RecurrentEncoder(nn.Module):
    """Input projection, a stacked GRU or LSTM over the window, the last step's output.

    The projection to ``hidden`` before the first recurrent layer keeps every layer the
    same size, which is what lets hidden 325 (GRU) / 275 (LSTM) reach ~1.4 M parameters.
    """

    cell: type[nn.RNNBase]

    def __init__(self, n_in: int, window_length: int, hidden: int, n_layers: int,
                 dropout: float) -> None:
        super().__init__()
        self.width = hidden
        self.input_proj = nn.Linear(n_in, hidden)
        self.rnn = self.cell(hidden, hidden, num_layers=n_layers, batch_first=True,
                             dropout=dropout if n_layers > 1 else 0.0)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # A fresh zero state on every call: the window is the model's whole memory, so the
        # output depends on the given window only (no state carried between calls).
        outputs, _ = self.rnn(self.input_proj(tokens))
        return self.norm(outputs[:, -1])


class GRUEncoder(RecurrentEncoder):
    cell = nn.GRU

    def __init__(self, n_in: int, window_length: int = 9, hidden: int = 325, n_layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__(n_in, window_length, hidden, n_layers, dropout)


class LSTMEncoder(RecurrentEncoder):
    cell = nn.LSTM

    def __init__(self, n_in: int, window_length: int = 9, hidden: int = 275, n_layers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__(n_in, window_length, hidden, n_layers, dropout)
