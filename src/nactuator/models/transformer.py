"""The gated-attention Transformer encoder of SPEC §4.

Per pre-norm block::

    U  = LayerNorm(H)
    A  = [MHA(U) ⊙ sigmoid(U W_g)] W_o      # query-dependent elementwise gate
    Z  = H + A
    H' = Z + FFN_GELU(LayerNorm(Z))

then a final LayerNorm and mean pooling over the L tokens gives ``h``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.dropout = dropout
        # Q, K, V and the gate pre-activation all read U, so one matmul produces all four
        # (same parameters as four separate d x d projections, fewer kernel launches).
        self.in_proj = nn.Linear(d_model, 4 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        batch, length, d_model = u.shape
        # (B, L, 4d) -> (4, B, heads, L, d / heads): Q, K, V and the gate, split per head
        q, k, v, gate = self.in_proj(u).view(batch, length, 4, self.n_heads, -1).permute(
            2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0)
        # The gate is elementwise, so applying it per head before merging the heads is
        # the same as MHA(U) ⊙ sigmoid(U W_g) on the merged (B, L, d) output.
        gated = attended * torch.sigmoid(gate)
        return self.out_proj(gated.transpose(1, 2).reshape(batch, length, d_model))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.norm_attn = nn.LayerNorm(d_model)
        self.attn = GatedSelfAttention(d_model, n_heads, dropout)
        self.norm_ffn = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        # Called only when training: in eval the dropout call is skipped altogether.
        return F.dropout(x, self.dropout, training=True) if self.dropout > 0 else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            x = x + self._drop(self.attn(self.norm_attn(x)))
            return x + self._drop(self.ffn(self.norm_ffn(x)))
        x = x + self.attn(self.norm_attn(x))
        return x + self.ffn(self.norm_ffn(x))


class TransformerEncoder(nn.Module):
    """Tokens (B, L, n_in) -> pooled feature (B, d_model)."""

    def __init__(self, n_in: int, window_length: int = 9, d_model: int = 192, n_layers: int = 4,
                 n_heads: int = 4, d_ff: int = 384, dropout: float = 0.1) -> None:
        super().__init__()
        self.width = d_model
        self.input_proj = nn.Linear(n_in, d_model)
        self.pos_embedding = nn.Parameter(torch.randn(1, window_length, d_model) * 0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.input_proj(tokens) + self.pos_embedding
        if self.training:
            x = self.drop(x)
        return self.norm(self.blocks(x)).mean(dim=1)
