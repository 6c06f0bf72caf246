"""The policy: a small transformer over the last ``history`` observation frames that
predicts the next command (absolute joint goals), and its LightningModule (behaviour
cloning: mean squared error on normalised commands)."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

__all__ = ["PolicyModule", "PolicyNet"]


class PolicyNet(nn.Module):
    """(B, history, d_in) normalised features -> (B, n_out) normalised command."""

    def __init__(self, d_in: int, n_out: int, history: int = 8, width: int = 64,
                 depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(d_in, width)
        self.position = nn.Parameter(torch.zeros(1, history, width))
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x) + self.position)
        return self.head(h[:, -1])  # the newest frame's token decides


class PolicyModule(L.LightningModule):
    def __init__(self, d_in: int, n_out: int, history: int, width: int, depth: int,
                 heads: int, lr: float, weight_decay: float, max_steps: int) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = PolicyNet(d_in, n_out, history, width, depth, heads)

    def training_step(self, batch, _idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr,
                                weight_decay=self.hparams.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, self.hparams.max_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
