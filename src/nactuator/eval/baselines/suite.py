"""Family 7: the classical baselines in the evaluation's own tables.

``fit_baselines`` fits every requested method on the **train** split of the evaluated
dataset(s); ``score_baselines`` adds, per evaluated episode, one force block per force
baseline (same prefix-window MAE as the model), their contact decisions on the no-contact
frames, and -- pooled over all windows of the split -- the condition classifiers beside the
model's condition head scored on the same windows. ``evaluation.evaluate(...,
baselines=...)`` calls both; the tables are rendered by ``report.baseline_report``.

The baselines read the recorded state (the paper's "true state at each step") causally,
so beside them the model is also scored on the recorded state through its deployment path
(``infer.predict_episodes``, row "model (causal, recorded state)"), not only along its
open-loop rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nactuator.data import Episode
from nactuator.eval import metrics as M
from nactuator.eval.baselines.calibration import TorqueCalibration
from nactuator.eval.baselines.condition import CONDITION_METHODS, ConditionBaselines
from nactuator.eval.baselines.force_map import contact_decision
from nactuator.eval.baselines.id_friction import IDFriction
from nactuator.eval.baselines.id_linear import IDLinear
from nactuator.eval.baselines.momentum_observer import MomentumObserver
from nactuator.eval.baselines.settings import BaselineSettings
from nactuator.eval.baselines.signals import EpisodeSignals, episode_signals
from nactuator.eval.episodes import EvalDataError, force_labels, is_no_contact
from nactuator.platforms import Platform
from nactuator.sim.dynamics import ee_force_from_joint_torques

__all__ = ["ALL_METHODS", "FORCE_METHODS", "FittedBaselines", "fit_baselines",
           "parse_baselines", "score_baselines"]

FORCE_METHODS = ("id-linear", "id-friction", "gmo", "gmo-friction")
ALL_METHODS = FORCE_METHODS + CONDITION_METHODS
MODEL_CAUSAL = "model_causal"


def parse_baselines(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"all"``, ``"none"``/None, or a comma list such as ``"id-linear,gmo,svm"``."""
    if spec is None:
        return ()
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    items = [s for s in items if s]
    if items in ([], ["none"]):
        return ()
    if items == ["all"]:
        return ALL_METHODS
    unknown = [s for s in items if s not in ALL_METHODS]
    if unknown:
        raise EvalDataError(f"--baselines: unknown baseline(s) {unknown}; expected 'all', "
                            f"'none' or a comma list of {list(ALL_METHODS)}")
    return tuple(m for m in ALL_METHODS if m in items)  # protocol order, no repeats


@dataclass
class FittedBaselines:
    platform: Platform
    settings: BaselineSettings
    dynamics: object  # nactuator.sim.dynamics.ArmDynamics
    force_methods: dict = field(default_factory=dict)
    condition: ConditionBaselines | None = None
    info: dict = field(default_factory=dict)

    def signals(self, ep: Episode) -> EpisodeSignals:
        s = self.settings
        return episode_signals(ep, self.dynamics, self.platform.control_dt, s.cutoff_hz,
                               s.filter_order, s.max_force_n)

    def force_estimates(self, ep: Episode) -> dict[str, np.ndarray]:
        """(T, 3) force estimate of every fitted force baseline for every frame of ``ep``."""
        if not self.force_methods:
            return {}
        sig = self.signals(ep)
        return {name: ee_force_from_joint_torques(self.dynamics, sig.q,
                                                  method.joint_torques(sig),
                                                  self.platform.arm_indices,
                                                  self.settings.pinv_damping)
                for name, method in self.force_methods.items()}


def fit_baselines(train: Sequence[Episode], platform: Platform, names: Sequence[str],
                  settings: BaselineSettings) -> FittedBaselines:
    """Fit ``names`` on the train episodes. A method that cannot be fitted on this data
    (no free motion, no condition labels) is reported as unavailable, with the reason."""
    from nactuator.sim.dynamics import ArmDynamics

    dyn = ArmDynamics.for_platform(platform, settings.armature_for(platform))
    fitted = FittedBaselines(platform, settings, dyn)
    channels = platform.channel_names
    fitted.info["settings"] = settings.source
    fitted.info["armature"] = [float(a) for a in dyn.armature]
    fitted.info["train_episodes"] = len(train)
    force_names = [m for m in names if m in FORCE_METHODS]
    if force_names:
        try:
            sigs = [fitted.signals(ep) for ep in train]
            calibration = TorqueCalibration.fit(sigs, settings.min_correlation)
        except EvalDataError as err:
            for m in force_names:
                fitted.info[m] = {"unavailable": str(err)}
        else:
            fitted.info["calibration"] = calibration.info(channels)
            friction = None
            if {"id-friction", "gmo-friction"} & set(force_names):
                try:
                    friction = IDFriction.fit(sigs, calibration, settings.stribeck_velocities,
                                              settings.deadzone_quantiles,
                                              settings.smooth_velocity, settings.min_correlation)
                except EvalDataError as err:
                    for m in ("id-friction", "gmo-friction"):
                        fitted.info[m] = {"unavailable": str(err)}
                    force_names = [m for m in force_names if m not in fitted.info]
                else:
                    fitted.info["friction"] = friction.model.info(channels)
            for m in force_names:
                if m == "id-linear":
                    fitted.force_methods[m] = IDLinear(calibration)
                elif m == "id-friction":
                    fitted.force_methods[m] = friction
                elif m == "gmo":
                    fitted.force_methods[m] = MomentumObserver.linear(
                        calibration, settings.observer_gain, dyn)
                else:
                    fitted.force_methods[m] = MomentumObserver.with_friction(
                        friction.model, settings.observer_gain, dyn)
            fitted.info["momentum_observer"] = {"gain": settings.observer_gain}
            fitted.info["force"] = {"damping": settings.pinv_damping,
                                    "contact_threshold_n": settings.contact_threshold_n,
                                    "arm_channels": [channels[i] for i in platform.arm_indices]}
    cond_names = [m for m in names if m in CONDITION_METHODS]
    if cond_names:
        try:
            fitted.condition = ConditionBaselines.fit(
                train, platform.n, cond_names, settings.window, settings.stride, settings.svm,
                settings.random_forest)
        except EvalDataError as err:
            for m in cond_names:
                fitted.info[m] = {"unavailable": str(err)}
        else:
            fitted.info["condition"] = fitted.condition.info(channels)
    return fitted


def _no_contact(gate: np.ndarray, force: np.ndarray) -> dict:
    return M.no_contact_metrics(gate, force)


def score_baselines(fitted: FittedBaselines, episodes: Sequence[Episode],
                    per_episode: Sequence[dict], horizons: Sequence[int],
                    rollouts: Sequence | None = None,
                    causal: Sequence[dict] | None = None) -> dict:
    """Add the baselines' per-episode figures to ``per_episode`` (in place) and return the
    pooled per-window condition metrics.

    ``rollouts`` (the model's open-loop rollouts) and ``causal`` (``predict_episodes`` on the
    recorded state) put the model beside the baselines in the condition and no-contact rows;
    (``score_episode`` has already added the model's causal force row, ``model_causal``).
    """
    threshold = fitted.settings.contact_threshold_n
    for i, (ep, entry) in enumerate(zip(episodes, per_episode, strict=True)):
        steps = entry["steps"]
        label = force_labels(ep)[:steps]
        estimates = {k: v[:steps] for k, v in fitted.force_estimates(ep).items()}
        gates = {k: contact_decision(v, threshold) for k, v in estimates.items()}
        if causal is not None:
            estimates[MODEL_CAUSAL] = causal[i]["force"][:steps]
            gates[MODEL_CAUSAL] = causal[i]["gate"][:steps]
        if not estimates:
            continue
        for name, f in estimates.items():
            if name != MODEL_CAUSAL:  # score_episode already scored the model's causal path
                entry["force"][name] = M.force_block(f, label, horizons)
        labelled = np.isfinite(label).any(axis=1)
        magnitude = np.linalg.norm(np.nan_to_num(label, nan=0.0), axis=1)
        quiet = np.ones(steps, bool) if is_no_contact(ep) else labelled & (
            magnitude <= M.CONTACT_THRESHOLD_N)
        block = {"no_contact_frames": {k: _no_contact(gates[k][quiet], f[quiet])
                                       for k, f in estimates.items()}}
        if is_no_contact(ep):
            block["no_contact_run"] = {k: _no_contact(gates[k], f) for k, f in estimates.items()}
        else:
            block["unlabelled_frames"] = {k: _no_contact(gates[k][~labelled], f[~labelled])
                                          for k, f in estimates.items()}
        entry["baselines"] = block
    return _condition_scores(fitted, episodes, rollouts, causal)


def _window_mean(x: np.ndarray, starts: np.ndarray, window: int) -> np.ndarray:
    return np.array([x[s:s + window].mean() for s in starts])


def _condition_scores(fitted: FittedBaselines, episodes: Sequence[Episode],
                      rollouts: Sequence | None, causal: Sequence[dict] | None) -> dict:
    from nactuator.eval.baselines.condition import labelled_windows

    cond = fitted.condition
    if cond is None:
        return {}
    blocks = labelled_windows(episodes, cond.channels, cond.window, cond.stride)
    index = {id(ep): i for i, ep in enumerate(episodes)}
    if not blocks:
        return {"unavailable": f"no episode of the split has a whole labelled {cond.window}-"
                               f"frame window on {cond.channels}"}
    target = np.concatenate([b["labels"] for b in blocks]) > 0.5
    x = np.concatenate([b["features"] for b in blocks])
    scores = {name: method.score(x) for name, method in cond.methods.items()}
    # The model says degraded where 1 - c > 0.5; a window's score is its frames' mean.
    if rollouts is not None:
        scores["model_rollout"] = np.concatenate([
            _window_mean(1.0 - rollouts[index[id(b["episode"])]].condition[:, b["channel"]],
                         b["starts"], cond.window) - 0.5 for b in blocks])
    if causal is not None:
        scores[MODEL_CAUSAL] = np.concatenate([
            _window_mean(1.0 - causal[index[id(b["episode"])]]["condition"][:, b["channel"]],
                         b["starts"], cond.window) - 0.5 for b in blocks])
    return {"windows": int(target.size), "positives": int(target.sum()),
            "methods": {k: M.binary_metrics(v, target, 0.0) for k, v in scores.items()}}
