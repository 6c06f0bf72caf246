"""Two trivial references every evaluation table shows beside the model, and that
validation scores the model against (``val/score``, checkpoint selection).

- **Command following** for the joints: predict q[i+1] = q_cmd[i]. It needs no model at
  all, so a learned actuator that cannot beat it has learned nothing about the servo.
- **Linear force regression**: ridge least squares from the current frame's telemetry,
  joint state, command and tracking error (+ bias) to the 3-D force, fit on the train
  split of the same dataset(s). On NAD it already lands near the published force figures,
  so it is the bar a force head must clear.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nactuator.data.schema import DataFormatError, Episode

__all__ = ["FORCE_FEATURE_KEYS", "LinearForceReference", "command_following", "force_labels",
           "is_worse", "losing_terms", "verdict"]

FORCE_FEATURE_KEYS = ("effort", "voltage", "temperature", "q", "qd", "q_cmd", "error")


def command_following(episode: Episode) -> np.ndarray:
    """Predicted q for frames 1..T-1 when the arm is assumed to reach its goal: q_cmd[i]."""
    return episode.frames["q_cmd"][:-1].astype(np.float64)


def force_labels(ep: Episode) -> np.ndarray:
    """(T, 3) force labels, NaN where unlabelled (all NaN if the dataset has none)."""
    f = ep.frames.get("force")
    return np.full((ep.length, 3), np.nan) if f is None else np.asarray(f, np.float64)


def force_features(episode: Episode) -> np.ndarray:
    """(T, 7n) features of each frame: effort, voltage, temperature, q, qd, q_cmd, error."""
    ch = episode.frames
    cols = []
    for key in FORCE_FEATURE_KEYS:
        value = ch["q_cmd"] - ch["q"] if key == "error" else ch.get(key)
        if value is None:
            raise DataFormatError(f"episode {episode.index} ({episode.task}): the linear force "
                                f"reference needs channel '{key}', which is missing")
        cols.append(value)
    return np.concatenate(cols, axis=1).astype(np.float64)


@dataclass
class LinearForceReference:
    """Ridge regression f ≈ W·standardise(x) + b; ``label_offset`` frames ahead of x.

    ``label_offset`` matches the model's scoring: features of frame i predict the label of
    frame i + label_offset. Unlabelled (NaN) force counts as 0 N, the convention of the
    force MAE it is scored with.
    """

    weight: np.ndarray  # (d, 3) on standardised features
    bias: np.ndarray  # (3,)
    mean: np.ndarray  # (d,)
    std: np.ndarray  # (d,)
    label_offset: int
    train_frames: int

    @classmethod
    def fit(cls, episodes: Sequence[Episode], ridge: float = 1e-6,
            label_offset: int = 0) -> LinearForceReference:
        if not episodes:
            raise DataFormatError("the linear force reference needs training episodes; the "
                                "train split is empty")
        xs, ys = [], []
        for ep in episodes:
            x, y = _pairs(ep, label_offset)
            xs.append(x)
            ys.append(y)
        x = np.concatenate(xs)
        y = np.concatenate(ys)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
            mean = np.nan_to_num(np.nanmean(x, axis=0))
            std = np.nan_to_num(np.nanstd(x, axis=0))
        # Constant features (e.g. a bus voltage that never moves) get std 1 so they just
        # fold into the bias instead of dividing by zero.
        std = np.where(std > 1e-9, std, 1.0)
        z = _standardise(x, mean, std)
        # Centred data: the bias is the label mean and stays unpenalised.
        y_mean = y.mean(axis=0)
        gram = z.T @ z + ridge * len(z) * np.eye(z.shape[1])
        weight = np.linalg.solve(gram, z.T @ (y - y_mean))
        return cls(weight=weight, bias=y_mean, mean=mean, std=std,
                   label_offset=label_offset, train_frames=len(z))

    def predict(self, episode: Episode) -> np.ndarray:
        """(T, 3) force estimate from each frame's own features."""
        z = _standardise(force_features(episode), self.mean, self.std)
        return z @ self.weight + self.bias


def _standardise(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(x − mean) / std; a value never recorded (NaN) becomes 0, i.e. the train mean."""
    return np.nan_to_num((x - mean) / std, nan=0.0)


def _pairs(ep: Episode, offset: int) -> tuple[np.ndarray, np.ndarray]:
    x = force_features(ep)
    y = np.nan_to_num(force_labels(ep), nan=0.0)
    if offset:
        x, y = x[:-offset], y[offset:]
    return x, y


def verdict(figures: dict[str, float],
            force_reference: str = "best of 0 N and linear regression") -> str:
    """One line: the model against the trivial references, and whether it beats them
    ("joints 0.90° vs 1.40° command following: better; ...").

    ``figures`` holds ``joints_deg``/``joints_command_deg`` (arm mean) and/or ``force_n``/
    ``force_reference_n`` (3-axis MAE); ``force_reference`` names the force reference."""
    parts = []
    if "joints_deg" in figures:
        model, ref = figures["joints_deg"], figures["joints_command_deg"]
        parts.append(f"joints {model:.2f}° vs {ref:.2f}° command following: "
                     f"{'better' if model < ref else 'WORSE'}")
    if "force_n" in figures:
        model, ref = figures["force_n"], figures["force_reference_n"]
        parts.append(f"force {model:.3f} N vs {ref:.3f} N ({force_reference}): "
                     f"{'better' if model < ref else 'WORSE'}")
    return "; ".join(parts) if parts else "no joint or force reference to compare with"


def is_worse(figures: dict[str, float]) -> bool:
    """True if the model loses to a trivial reference on joints or force."""
    return bool(losing_terms(figures))


def losing_terms(figures: dict[str, float]) -> list[str]:
    """What the model loses on, each with the reference it loses to ("the joints (command
    following)", "the force (the force reference)"); empty when it loses on nothing."""
    terms = []
    if "joints_deg" in figures and figures["joints_deg"] >= figures["joints_command_deg"]:
        terms.append("the joints (command following)")
    if "force_n" in figures and figures["force_n"] >= figures["force_reference_n"]:
        terms.append("the force (the force reference)")
    return terms
