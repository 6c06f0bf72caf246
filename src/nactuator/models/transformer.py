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
        q, k, v, gate = self.in_proj(u).chunk(4, dim=-1)
        # (B, L, d) -> (B, heads, L, d / heads)
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0)
        attended = attended.transpose(1, 2).reshape(batch, length, d_model)
        return self.out_proj(attended * torch.sigmoid(gate))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(d_model)
        self.attn = GatedSelfAttention(d_model, n_heads, dropout)
        self.norm_ffn = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout))
        self.drop_attn = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_attn(self.attn(self.norm_attn(x)))
        return x + self.ffn(self.norm_ffn(x))


class TransformerEncoder(nn.Module):
    """Tokens (B, L, n_in) -> pooled feature (B, d_model)."""

    def __init__(self, n_in: int, history: int = 9, d_model: int = 192, n_layers: int = 4,
                 n_heads: int = 4, d_ff: int = 384, dropout: float = 0.1) -> None:
        super().__init__()
        self.width = d_model
        self.input_proj = nn.Linear(n_in, d_model)
        self.pos_embedding = nn.Parameter(torch.randn(1, history, d_model) * 0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.input_proj(tokens) + self.pos_embedding)
        return self.norm(self.blocks(x)).mean(dim=1)
