"""``policy eval``: every (case, condition) policy in closed loop in the hidden world.

A *case* is a task at a payload (conf/policy ``eval.cases``); each runs ``eval.episodes``
episodes with fixed seeds (``eval.seed`` + i, disjoint from the demonstrations'), the same
seeds for every condition, so conditions differ only in what the policy reads. Per case and
condition: success rate with a Wilson 95 % interval, over-current / overload trips,
joint-limit hits, peak motor current, and the force MAE the frozen actuator model had on
those episodes (it runs on every frame in every condition; only ``force_estimate`` reads it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from nactuator.atomic import write_json
from nactuator.errors import UserError
from nactuator.models import load_model
from nactuator.platforms import load_platform
from nactuator.progress import progress_bar
from nactuator.world import load_world
from nactuator.world.protection import STS_OVERCURRENT_BIT

from .fit import POLICY_FORMAT, policy_path
from .network import PolicyNet
from .plots import plot_rollouts, plot_success, plot_tolerance
from .sensing import ForceSensor, condition_features, phase
from .task_world import EpisodeLog, Observation, TaskWorld

__all__ = ["PolicyController", "evaluate_policies", "load_policy", "wilson_interval"]


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def load_policy(path: str | Path) -> tuple[PolicyNet, dict]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no policy file (run `nactuator policy fit` first)")
    payload = torch.load(path, map_location="cpu", weights_only=True)  # a user file runs no code
    if not isinstance(payload, dict) or payload.get("format") != POLICY_FORMAT:
        raise UserError(f"{path}: not a nactuator policy file (format {POLICY_FORMAT})")
    hp = {k: payload["hparams"][k] for k in ("d_in", "n_out", "history", "width", "depth",
                                             "heads")}
    net = PolicyNet(**hp)
    net.load_state_dict(payload["state_dict"])
    return net.eval(), payload


class PolicyController:
    """A policy as a :meth:`TaskWorld.run` controller: history buffer in, goal positions out."""

    def __init__(self, net: PolicyNet, payload: Mapping, sensor: ForceSensor) -> None:
        self.net, self.sensor = net, sensor
        self.condition = payload["condition"]
        self.history = int(payload["hparams"]["history"])
        self.seconds = float(payload["seconds_per_episode"])
        fs, acts = payload["feature_stats"], payload["action_stats"]
        self.f_mean, self.f_std = np.asarray(fs["mean"]), np.asarray(fs["std"])
        self.a_mean, self.a_std = np.asarray(acts["mean"]), np.asarray(acts["std"])
        self.buffer: np.ndarray | None = None
        self.estimates: list[np.ndarray] = []
        self.forces: list[np.ndarray] = []

    def __call__(self, obs: Observation) -> np.ndarray:
        tel = obs.telemetry
        feats = condition_features(self.condition, tel["q"], self.sensor.estimate,
                                   tel["effort"], obs.force_true)
        clock = np.full((len(feats), 1), phase(obs.t, self.seconds), dtype=np.float32)
        feats = np.concatenate([feats, clock], axis=1)
        x = ((feats - self.f_mean) / self.f_std).astype(np.float32)
        if self.buffer is None:  # the first frame repeated, as in training
            self.buffer = np.repeat(x[:, None], self.history, axis=1)
        else:
            self.buffer = np.concatenate([self.buffer[:, 1:], x[:, None]], axis=1)
        with torch.inference_mode():
            y = self.net(torch.from_numpy(self.buffer)).numpy()
        return y * self.a_std + self.a_mean

    def after_step(self, obs: Observation, q_cmd: np.ndarray) -> None:
        self.estimates.append(self.sensor.push(obs.telemetry, q_cmd)[:, :3].copy())
        self.forces.append(obs.force_true.copy())


def _summary(log: EpisodeLog, ctrl: PolicyController) -> dict:
    n = len(log.success)
    k = int(log.success.sum())
    lo, hi = wilson_interval(k, n)
    # f̂ for frame k is compared with the force on frame k.
    est, true = np.stack(ctrl.estimates), np.stack(ctrl.forces)
    over_current = ((log.meta["errors"] & STS_OVERCURRENT_BIT) != 0).any(axis=1)
    return {"episodes": n, "successes": k, "success_rate": k / n, "wilson95": [lo, hi],
            "trips": int(log.tripped.sum()), "over_current_trips": int(over_current.sum()),
            "limit_hits": int(log.limit_hit.sum()),
            "peak_current_A": float(log.peak_current.max()),
            "peak_current_median_A": float(np.median(log.peak_current)),
            # the largest motor current's 99th percentile over frames, median over episodes:
            # a peak is often one start transient (1.6 A is the motor's current limit)
            "current_p99_A": float(np.median(np.percentile(
                np.abs(log.frames["current_true"]).max(axis=2), 99, axis=0))),
            "force_mae_N": float(np.abs(est - true).mean()),
            "final_error_median_m": float(np.median(log.final_error_m)),
            # per episode, for success at other tolerances (plots.plot_tolerance)
            "final_error_m": [float(x) if np.isfinite(x) else None for x in log.final_error_m],
            "episode_other_ok": [bool(x) for x in log.other_ok],
            "episode_tripped": [bool(x) for x in log.tripped],
            "episode_success": [bool(x) for x in log.success]}


def evaluate_policies(cfg: Mapping, policies: str | Path, out: str | Path,
                      episodes: int | None = None) -> str:
    """Run every case x condition; write ``results.json`` and the plots to ``out``."""
    p = load_platform(cfg["platform"])
    params = load_world(p, cfg.get("world"), 0)
    actuator, meta = load_model(cfg["actuator"], expect_platform=p.name)
    ev = cfg["eval"]
    count = int(episodes or ev["episodes"])
    seeds = [int(ev["seed"]) + i for i in range(count)]
    out = Path(out)
    results: list[dict] = []
    traces: dict[str, dict] = {}
    jobs = [(case, c) for case in ev["cases"] for c in ev["conditions"]]
    bar = progress_bar(total=len(jobs), desc="policy eval", unit="batch")
    for case, condition in jobs:
        task, grams = case["task"], int(case["payload_g"])
        net, payload = load_policy(policy_path(policies, task, condition))
        tw = TaskWorld(p, params, task, grams / 1000.0, cfg, seeds)
        ctrl = PolicyController(net, payload, ForceSensor(actuator, meta, count, p.n))
        secs = float(cfg["tasks"][task]["seconds"])
        log = tw.run(ctrl, secs, tw.start_pose(seeds), after_step=ctrl.after_step)
        row = {"task": task, "payload_g": grams, "condition": condition, **_summary(log, ctrl)}
        results.append(row)
        traces[f"{task}-{grams}g/{condition}"] = {
            "ee": log.frames["ee"][:, 0], "current": log.frames["current_true"][:, 0],
            "estimate": np.stack(ctrl.estimates)[:, 0], "force": log.frames["force"][:, 0],
            "target": tw.target, "trip_A": tw.world.protection.current_limit,
            "success": bool(log.success[0]), "dt": p.control_dt}
        bar.update(1)
    bar.close()
    write_json(out / "results.json", {"episodes": count, "seeds": [seeds[0], seeds[-1]],
                                      "results": results})
    plot_success(results, out / "success.png")
    plot_rollouts(traces, out / "rollouts.png")
    plot_tolerance(results, out / "tolerance.png")
    lines = [f"{r['task']} {r['payload_g']} g {r['condition']}: {r['successes']}/{r['episodes']}"
             f" ({100 * r['wilson95'][0]:.0f}-{100 * r['wilson95'][1]:.0f} %), trips "
             f"{r['trips']}, peak {r['peak_current_A']:.2f} A, force MAE "
             f"{r['force_mae_N']:.3f} N" for r in results]
    return "policy eval:\n  " + "\n  ".join(lines) + f"\nresults in {out}"
