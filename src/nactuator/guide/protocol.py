"""The recording protocol of ``calibrate-arm`` (``conf/calibrate/<platform>.yaml``), the
weights a user owns, the plan of steps they make, the fine-tuning steps scaled to the data,
and the resumable state file. Pure: no bus, no training (unit-tested without an arm).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from nactuator.atomic import write_json
from nactuator.errors import UserError
from nactuator.paths import conf_dir

__all__ = ["CalibrateError", "State", "Step", "adapt_steps", "load_protocol", "parse_weights",
           "plan_steps", "protocol_path", "weights_advice"]

STATE_FILE = "calibrate.json"
PAYLOADS = ("none", "weight", "heaviest", "lightest")
_TOP_KEYS = {"platform", "pretrained", "weights", "check", "steps", "adapt"}
_STEP_KEYS = {"id", "task", "payload", "per_weight", "episodes", "seconds", "split", "prompt"}
_ADAPT_KEYS = {"config", "steps_per_minute", "min_steps", "max_steps"}


class CalibrateError(UserError, ValueError):
    """``calibrate-arm`` cannot go on with these inputs; the message says which and why."""


@dataclass(frozen=True)
class Step:
    """One recording step: ``episodes`` runs of ``seconds`` each, one payload."""

    key: str  # unique, ordered: "03-lift_hold-200g"
    task: str
    payload_g: float  # 0: free motion (labelled 0 N)
    episodes: int
    seconds: float
    split: str
    prompt: str


def protocol_path(platform: str, path: str | os.PathLike | None = None) -> Path:
    return Path(path) if path is not None else conf_dir() / "calibrate" / f"{platform}.yaml"


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise CalibrateError(f"{where}: {what}")


def load_protocol(platform: str, path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The protocol YAML, checked; ``source`` added (the file it came from)."""
    p = protocol_path(platform, path)
    try:
        raw = yaml.safe_load(p.read_text())
    except FileNotFoundError as err:
        have = sorted(x.stem for x in p.parent.glob("*.yaml"))
        raise CalibrateError(f"{p}: no calibrate-arm protocol for platform {platform!r} "
                             f"({p.parent} has {have})") from err
    except yaml.YAMLError as err:
        raise CalibrateError(f"{p}: not valid YAML ({err})") from err
    _need(isinstance(raw, dict) and set(raw) == _TOP_KEYS, str(p),
          f"expected the keys {sorted(_TOP_KEYS)}, got "
          f"{sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
    _need(raw["platform"] == platform, f"{p}: platform",
          f"is {raw['platform']!r}, but the arm is {platform!r}")
    w = raw["weights"]
    _need(isinstance(w, dict) and {"count", "min_g", "max_g"} <= set(w), f"{p}: weights",
          "needs count [min, max], min_g and max_g")
    lo, hi = w["count"]
    _need(1 <= lo <= hi and 0 < w["min_g"] < w["max_g"], f"{p}: weights",
          f"count {w['count']} / min_g {w['min_g']} / max_g {w['max_g']} are inconsistent")
    _need(isinstance(w.get("advice", ""), str), f"{p}: weights.advice",
          f"must be text (printed when fewer than {hi} weights are given), got "
          f"{w.get('advice')!r}")
    steps = raw["steps"]
    _need(isinstance(steps, list) and steps, f"{p}: steps", "must be a non-empty list")
    for i, s in enumerate(steps):
        where = f"{p}: steps[{i}]"
        _need(isinstance(s, dict) and {"id", "task", "payload", "episodes", "seconds",
                                       "prompt"} <= set(s) and set(s) <= _STEP_KEYS, where,
              f"needs id, task, payload, episodes, seconds, prompt (optional per_weight, "
              f"split); got {sorted(s) if isinstance(s, dict) else s!r}")
        _need(s["payload"] in PAYLOADS, f"{where}.payload", f"must be one of {list(PAYLOADS)}, "
              f"got {s['payload']!r}")
        _need(isinstance(s["episodes"], int) and s["episodes"] >= 1, f"{where}.episodes",
              f"must be an integer >= 1, got {s['episodes']!r}")
        _need(isinstance(s["seconds"], int | float) and s["seconds"] > 0, f"{where}.seconds",
              f"must be > 0, got {s['seconds']!r}")
        _need(s.get("split", "train") in ("train", "test"), f"{where}.split",
              f"must be train or test, got {s.get('split')!r}")
        _need(not s.get("per_weight") or s["payload"] == "weight", f"{where}",
              "per_weight needs payload: weight")
    splits = [s.get("split", "train") for s in steps]
    _need("test" in splits and "train" in splits, f"{p}: steps",
          "needs at least one train step and one held-out step (split: test)")
    a = raw["adapt"]
    _need(isinstance(a, dict) and set(a) == _ADAPT_KEYS, f"{p}: adapt",
          f"expected the keys {sorted(_ADAPT_KEYS)}")
    _need(0 < a["min_steps"] <= a["max_steps"] and a["steps_per_minute"] > 0, f"{p}: adapt",
          "needs 0 < min_steps <= max_steps and steps_per_minute > 0")
    return {**raw, "source": str(p)}


def parse_weights(text: str | Sequence[float], protocol: dict[str, Any],
                  where: str = "--weights-g") -> list[float]:
    """``"100,200"`` (grams) → [100.0, 200.0], checked against the protocol's count and range."""
    w = protocol["weights"]
    if isinstance(text, str):
        try:
            values = [float(x) for x in text.replace(" ", "").split(",") if x]
        except ValueError as err:
            raise CalibrateError(f"{where} {text!r}: expected grams separated by commas, "
                                 "e.g. 100,200") from err
    else:
        values = [float(x) for x in text]
    lo, hi = w["count"]
    if not lo <= len(values) <= hi:
        raise CalibrateError(f"{where} {text!r}: give {lo} to {hi} known weights in grams "
                             f"({protocol['source']}: weights.count), got {len(values)}")
    for v in values:
        if not (math.isfinite(v) and w["min_g"] <= v <= w["max_g"]):
            raise CalibrateError(f"{where} {text!r}: {v:g} g is outside {w['min_g']:g}-"
                                 f"{w['max_g']:g} g ({protocol['source']}: weights)")
    if len(set(values)) != len(values):
        raise CalibrateError(f"{where} {text!r}: the weights must differ from one another")
    return sorted(values)


def _grams(g: float) -> str:
    return f"{g:g}"


def weights_advice(weights_g: Sequence[float] | None, protocol: dict[str, Any]) -> str | None:
    """The protocol's advice on which weights to bring, on one line: always before the
    question (``weights_g`` None), else when fewer weights than it takes were given."""
    w = protocol["weights"]
    if w.get("advice") and (weights_g is None or len(weights_g) < w["count"][1]):
        return " ".join(w["advice"].split())
    return None


def plan_steps(protocol: dict[str, Any], weights_g: Sequence[float],
               episode_seconds: float | None = None) -> list[Step]:
    """The protocol's steps for these weights, in recording order.
    ``episode_seconds`` replaces every step's episode length (a quick trial, the tests)."""
    steps: list[Step] = []
    for s in protocol["steps"]:
        kind = s["payload"]
        if s.get("per_weight"):
            payloads = list(weights_g)
        else:
            payloads = [{"none": 0.0, "weight": weights_g[0], "heaviest": max(weights_g),
                         "lightest": min(weights_g)}[kind]]
        for g in payloads:
            fill = {"weight_g": _grams(g)}
            suffix = f"-{_grams(g)}g" if kind != "none" else ""
            steps.append(Step(
                key=f"{len(steps) + 1:02d}-{s['id']}{suffix}", task=s["task"].format(**fill),
                payload_g=float(g), episodes=int(s["episodes"]),
                seconds=float(episode_seconds or s["seconds"]),
                split=s.get("split", "train"), prompt=" ".join(s["prompt"].format(**fill).split())))
    return steps


def adapt_steps(train_seconds: float, protocol: dict[str, Any]) -> int:
    """Optimiser steps of the fine-tune for this many seconds of training recordings."""
    a = protocol["adapt"]
    steps = round(a["steps_per_minute"] * train_seconds / 60.0)
    return int(min(a["max_steps"], max(a["min_steps"], steps)))


def plan_digest(steps: Sequence[Step]) -> str:
    """What a resumed run must match: the steps (keys, tasks, payloads, lengths, splits)."""
    text = json.dumps([{k: v for k, v in asdict(s).items() if k != "prompt"} for s in steps],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class State:
    """``OUT/calibrate.json``: what is done. Each finished step is written at once
    (atomically), so a rerun after Ctrl-C, a crash or a closed laptop skips it."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.path = Path(out) / STATE_FILE
        self.data: dict[str, Any] = {"steps": {}}
        if self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text())
            except json.JSONDecodeError as err:
                raise CalibrateError(f"{self.path}: not valid JSON ({err}); delete it to start "
                                     "over") from err

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, **values: Any) -> None:
        self.data.update(values)
        self.save()

    def done(self, step: str) -> bool:
        return bool(self.data["steps"].get(step, {}).get("done"))

    def mark(self, step: str, **info: Any) -> None:
        self.data["steps"][step] = {"done": True, **info}
        self.save()

    def forget(self, step: str) -> None:
        if self.data["steps"].pop(step, None) is not None:
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, self.data)


def resolve_weights(given: str | None, state: State, protocol: dict[str, Any],
                    ask: Callable[[str], str] | None) -> list[float]:
    """The weights of this run: ``--weights-g``, else those of the run being resumed, else
    asked for (``ask``: a prompt function, None where nobody can answer)."""
    stored = state.get("weights_g")
    if given is not None:
        weights = parse_weights(given, protocol)
        if stored is not None and weights != stored:
            raise CalibrateError(
                f"--weights-g {given}: {state.path} was started with "
                f"{','.join(_grams(g) for g in stored)} g; use the same weights to resume, or "
                "another --out to start over")
        return weights
    if stored is not None:
        return [float(g) for g in stored]
    w = protocol["weights"]
    if ask is None:
        raise CalibrateError(f"give the {w['count'][0]}-{w['count'][1]} known weights you own "
                             "with --weights-g, e.g. --weights-g 100,200,300 (nobody is at a "
                             "terminal to ask)")
    if advice := weights_advice(None, protocol):
        print(advice)
    while True:
        answer = ask(f"Which known weights do you own? {w['count'][0]} to {w['count'][1]} "
                     f"of them, in grams, {w['min_g']:g}-{w['max_g']:g} g, e.g. 100,200,300: ")
        try:
            return parse_weights(answer, protocol, where="weights")
        except CalibrateError as err:
            print(err)
