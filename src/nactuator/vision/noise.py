"""Realistic damage to reference masks, as a segmenter (SAM, background subtraction) makes it:
boundary jitter, a one-pixel erosion or dilation, a partial occlusion, missed frames."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage

from nactuator.errors import UserError
from nactuator.paths import conf_dir
from nactuator.platforms import read_yaml_mapping

__all__ = ["MaskNoise", "add_mask_noise", "load_mask_noise", "noise_path"]


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


def noise_path(name_or_path: str | Path) -> Path:
    """``conf/vision/noise/<name>.yaml``, or the path itself if it names a YAML file."""
    p = Path(name_or_path)
    return p if p.suffix in (".yaml", ".yml") else conf_dir() / "vision" / "noise" / f"{p}.yaml"


def load_mask_noise(name_or_path: str | Path) -> MaskNoise:
    """A :class:`MaskNoise` from a YAML file; every field must be there, a probability in
    [0, 1] (``occlusion_size`` in (0, 1])."""
    path = noise_path(name_or_path)
    cfg = read_yaml_mapping(path, UserError, "mask noise file")
    fields = list(MaskNoise.__dataclass_fields__)
    unknown, missing = sorted(set(cfg) - set(fields)), [f for f in fields if f not in cfg]
    if unknown or missing:
        raise UserError(f"{path}: unknown key(s) {unknown}, missing key(s) {missing}; expected "
                        f"{fields}")
    values = {}
    for f in fields:
        v = cfg[f]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1 \
                or (f == "occlusion_size" and v == 0):
            raise UserError(f"{path}: {f}: expected a number in [0, 1], got {v!r}")
        values[f] = float(v)
    return MaskNoise(**values)
