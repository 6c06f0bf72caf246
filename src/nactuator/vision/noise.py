"""Realistic damage to reference masks, as a segmenter (SAM, background subtraction) makes it:
boundary jitter, a one-pixel erosion or dilation, a partial occlusion, missed frames."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

__all__ = ["MaskNoise", "add_mask_noise"]


@dataclass(frozen=True)
class MaskNoise:
    boundary_flip: float = 0.3   # probability that a boundary pixel flips
    morph: float = 0.5           # probability of a 1-px erosion or dilation (half each)
    occlusion: float = 0.2       # probability of a rectangle hiding part of the arm
    occlusion_size: float = 0.15  # its side, as a fraction of the image width
    missed: float = 0.05         # probability that a frame has no mask at all


def add_mask_noise(masks: np.ndarray, noise: MaskNoise, seed: int = 0) -> np.ndarray:
    """Bool masks (N, H, W) -> float32 masks in {0, 1} with NaN frames where missed."""
    rng = np.random.default_rng(seed)
    out = np.empty(masks.shape, dtype=np.float32)
    for i, m in enumerate(np.asarray(masks, dtype=bool)):
        if rng.random() < noise.missed:
            out[i] = np.nan
            continue
        if rng.random() < noise.morph:
            m = (ndimage.binary_dilation if rng.random() < 0.5 else ndimage.binary_erosion)(m)
        edge = m ^ ndimage.binary_erosion(m)
        edge |= ndimage.binary_dilation(m) & ~m
        m = m ^ (edge & (rng.random(m.shape) < noise.boundary_flip))
        if rng.random() < noise.occlusion:
            ys, xs = np.nonzero(m)
            if len(ys):
                side = max(1, int(noise.occlusion_size * m.shape[1]))
                j = rng.integers(len(ys))  # centred on an arm pixel: it hides something
                y0, x0 = max(0, ys[j] - side // 2), max(0, xs[j] - side // 2)
                m = m.copy()
                m[y0:y0 + side, x0:x0 + side] = False
        out[i] = m
    return out
