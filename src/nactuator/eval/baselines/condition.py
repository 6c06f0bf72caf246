"""Family 6: motor-condition classifiers on the 20 window features (``features.py``).

- **threshold** on mean |effort|: the one cut (and direction) that classifies the train
  windows best;
- **svm**: scikit-learn ``SVC`` with an RBF kernel on standardised features;
- **random-forest**: 200 trees of depth at most 15 (SPEC §6).

Hyper-parameters are in ``conf/eval/baselines.yaml`` (``condition``). Each is trained on the
labelled windows of the **condition channels** of the train split -- the motors that are
labelled degraded somewhere in it (NAD: joint 3) -- and scores windows of the same motors.
``score`` returns a number whose ``> 0`` means "degraded", so that
``metrics.binary_metrics(score, target, 0.0)`` gives accuracy, precision, recall, F1 and AUC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nactuator.data import Episode
from nactuator.eval.baselines.features import (
    MEAN_ABS_EFFORT,
    window_features,
    window_labels,
    window_starts,
)
from nactuator.eval.episodes import EvalDataError, condition_labels

__all__ = ["CONDITION_METHODS", "ConditionBaselines", "ThresholdClassifier",
           "condition_channels", "labelled_windows"]

CONDITION_METHODS = ("threshold", "svm", "random-forest")


def condition_channels(episodes: Sequence[Episode], n: int) -> list[int]:
    """Motors labelled degraded (label < 0.5) on some frame of ``episodes``."""
    hit = np.zeros(n, dtype=bool)
    for ep in episodes:
        c = condition_labels(ep, n)
        hit |= np.any(np.isfinite(c) & (c < 0.5), axis=0)
    return [int(j) for j in np.flatnonzero(hit)]


def labelled_windows(episodes: Sequence[Episode], channels: Sequence[int], window: int,
                     stride: int) -> list[dict]:
    """Per episode and condition channel: window starts, features and labels (NaN-free)."""
    out = []
    for ep in episodes:
        starts = window_starts(ep.length, window, stride)
        for j in channels:
            labels = window_labels(ep, j, starts, window)
            keep = np.isfinite(labels)
            if keep.any():
                out.append({"episode": ep, "channel": j, "starts": starts[keep],
                            "features": window_features(ep, j, starts[keep], window),
                            "labels": labels[keep]})
    return out


@dataclass
class ThresholdClassifier:
    """``direction * (mean|u| - cut) > 0`` means degraded; cut and direction from train."""

    cut: float = 0.0
    direction: float = 1.0

    def fit(self, x: np.ndarray, y: np.ndarray) -> ThresholdClassifier:
        v = x[:, MEAN_ABS_EFFORT]
        values = np.unique(v)
        cuts = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2,
                               [values[-1] + 1.0]])
        best = -1.0
        for direction in (1.0, -1.0):
            acc = np.array([np.mean((direction * (v - c) > 0) == (y > 0.5)) for c in cuts])
            i = int(np.argmax(acc))
            if acc[i] > best:
                best, self.cut, self.direction = float(acc[i]), float(cuts[i]), direction
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        return self.direction * (x[:, MEAN_ABS_EFFORT] - self.cut)


class _Sklearn:
    """A scikit-learn classifier behind the ``fit``/``score`` interface (score > 0: degraded)."""

    def __init__(self, kind: str, params: dict) -> None:
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        from sklearn.svm import SVC

        try:
            if kind == "svm":
                self.model = make_pipeline(StandardScaler(), SVC(kernel="rbf", **params))
            else:
                self.model = RandomForestClassifier(n_jobs=1, **params)
        except TypeError as e:
            raise EvalDataError(f"condition.{kind.replace('-', '_')}: bad scikit-learn "
                                f"argument ({e})") from e
        self.kind = kind

    def fit(self, x: np.ndarray, y: np.ndarray) -> _Sklearn:
        self.model.fit(x, y.astype(int))
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        if self.kind == "svm":
            return self.model.decision_function(x)
        return self.model.predict_proba(x)[:, list(self.model.classes_).index(1)] - 0.5


@dataclass
class ConditionBaselines:
    """The fitted classifiers, the channels they watch and the training-set summary."""

    channels: list[int]
    window: int
    stride: int
    methods: dict = field(default_factory=dict)
    train_windows: int = 0
    train_positives: int = 0

    @classmethod
    def fit(cls, train: Sequence[Episode], n: int, names: Sequence[str], window: int,
            stride: int, svm: dict, random_forest: dict) -> ConditionBaselines:
        channels = condition_channels(train, n)
        if not channels:
            raise EvalDataError("the train split has no motor labelled degraded (condition "
                                "< 0.5); the condition baselines need both classes")
        blocks = labelled_windows(train, channels, window, stride)
        if not blocks:
            raise EvalDataError(f"no train episode has a whole labelled {window}-frame window")
        x = np.concatenate([b["features"] for b in blocks])
        y = np.concatenate([b["labels"] for b in blocks])
        if y.min() == y.max():
            raise EvalDataError("the train windows of the condition channels hold one class "
                                "only; the condition baselines need both")
        fitted = cls(channels, window, stride, train_windows=int(len(y)),
                     train_positives=int(y.sum()))
        for name in names:
            if name == "threshold":
                fitted.methods[name] = ThresholdClassifier().fit(x, y)
            elif name == "svm":
                fitted.methods[name] = _Sklearn("svm", svm).fit(x, y)
            elif name == "random-forest":
                fitted.methods[name] = _Sklearn("random-forest", random_forest).fit(x, y)
            else:
                raise ValueError(f"unknown condition baseline {name!r}")
        return fitted

    def info(self, channel_names: Sequence[str]) -> dict:
        out = {"channels": [channel_names[j] for j in self.channels], "window": self.window,
               "stride": self.stride, "train_windows": self.train_windows,
               "train_positives": self.train_positives}
        if "threshold" in self.methods:
            t = self.methods["threshold"]
            out["threshold"] = {"cut": t.cut, "degraded_when": "above" if t.direction > 0
                                else "below"}
        return out
