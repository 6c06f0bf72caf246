"""The classical baselines' fixed settings: ``conf/eval/baselines.yaml`` (+ a user file).

Everything a baseline uses that is not fitted on the train split (filter cutoff, observer
gain, pseudo-inverse damping, contact threshold, friction grids, window size, classifier
hyper-parameters) is read here, validated, and handed around as one frozen object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nactuator.eval.episodes import EvalDataError
from nactuator.platforms import Platform, conf_dir, read_yaml_mapping

__all__ = ["BaselineSettings", "default_settings_path", "load_settings"]

_SECTIONS = {
    "dynamics": {"armature"},
    "acceleration": {"cutoff_hz", "order"},
    "calibration": {"min_correlation"},
    "free_motion": {"max_force_n"},
    "friction": {"smooth_velocity", "stribeck_velocities", "deadzone_quantiles"},
    "momentum_observer": {"gain"},
    "force": {"damping", "contact_threshold_n"},
    "condition": {"window", "stride", "svm", "random_forest"},
}


def default_settings_path() -> Path:
    return conf_dir() / "eval" / "baselines.yaml"


@dataclass(frozen=True)
class BaselineSettings:
    armature: dict[str, list[float]]  # platform -> per-channel override ("platform" = none)
    cutoff_hz: float
    filter_order: int
    max_force_n: float
    min_correlation: float
    smooth_velocity: float
    stribeck_velocities: tuple[float, ...]
    deadzone_quantiles: tuple[float, ...]
    observer_gain: float
    pinv_damping: float
    contact_threshold_n: float
    window: int
    stride: int
    svm: dict[str, Any]
    random_forest: dict[str, Any]
    source: str = ""

    def armature_for(self, platform: Platform) -> list[float] | None:
        """Per-channel armature for ``platform``, or None to keep the platform's own."""
        values = self.armature.get(platform.name)
        if values is None:
            return None
        if len(values) != platform.n:
            raise EvalDataError(f"{self.source}: dynamics.armature.{platform.name} needs "
                                f"{platform.n} values (one per channel), got {len(values)}")
        return list(values)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _number(raw: dict, section: str, key: str, source: str, positive: bool = True,
            integer: bool = False) -> float:
    v = raw[section].get(key)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > 0 if positive else v >= 0) and (not integer or float(v).is_integer())
    if not ok:
        want = ("a positive integer" if integer
                else "a number > 0" if positive else "a number >= 0")
        raise EvalDataError(f"{source}: {section}.{key}: expected {want}, got {v!r}")
    return int(v) if integer else float(v)


def _fraction(raw: dict, section: str, key: str, source: str) -> float:
    v = raw[section].get(key)
    if not (isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1):
        raise EvalDataError(f"{source}: {section}.{key}: expected a number in [0, 1], got {v!r}")
    return float(v)


def _numbers(raw: dict, section: str, key: str, source: str, lo: float, hi: float) -> tuple:
    v = raw[section].get(key)
    if not isinstance(v, list) or not v or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and lo <= x <= hi for x in v):
        raise EvalDataError(f"{source}: {section}.{key}: expected a non-empty list of numbers "
                            f"in [{lo}, {hi}], got {v!r}")
    return tuple(float(x) for x in v)


def load_settings(path: str | Path | None = None) -> BaselineSettings:
    """The default settings, with ``path`` (a partial YAML) deep-merged onto them."""
    default = default_settings_path()
    raw = read_yaml_mapping(default, EvalDataError, "baseline settings")
    # Project-relative in reports ("conf/eval/baselines.yaml"), not a machine path.
    source = str(Path(conf_dir().name) / default.relative_to(conf_dir()))
    if path is not None:
        raw = _merge(raw, read_yaml_mapping(Path(path), EvalDataError, "baseline settings"))
        source = str(path)
    for section, keys in _SECTIONS.items():
        if not isinstance(raw.get(section), dict):
            raise EvalDataError(f"{source}: section '{section}' is missing or not a mapping")
        unknown = sorted(set(raw[section]) - keys)
        if unknown:
            raise EvalDataError(f"{source}: {section}: unknown key(s) {unknown}; expected some "
                                f"of {sorted(keys)}")
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise EvalDataError(f"{source}: unknown section(s) {unknown}; expected {sorted(_SECTIONS)}")

    armature = raw["dynamics"].get("armature", "platform")
    if armature == "platform" or armature is None:
        armature = {}
    if not isinstance(armature, dict) or not all(
            isinstance(v, list) and all(isinstance(x, int | float) and x >= 0 for x in v)
            for v in armature.values()):
        raise EvalDataError(f"{source}: dynamics.armature: expected 'platform' or a mapping "
                            f"platform -> list of numbers >= 0, got {armature!r}")
    window = _number(raw, "condition", "window", source, integer=True)
    stride = _number(raw, "condition", "stride", source, integer=True)
    for name in ("svm", "random_forest"):
        if not isinstance(raw["condition"].get(name), dict):
            raise EvalDataError(f"{source}: condition.{name}: expected a mapping of "
                                f"scikit-learn arguments, got {raw['condition'].get(name)!r}")
    return BaselineSettings(
        armature={str(k): [float(x) for x in v] for k, v in armature.items()},
        cutoff_hz=_number(raw, "acceleration", "cutoff_hz", source),
        filter_order=_number(raw, "acceleration", "order", source, integer=True),
        max_force_n=_number(raw, "free_motion", "max_force_n", source, positive=False),
        min_correlation=_fraction(raw, "calibration", "min_correlation", source),
        smooth_velocity=_number(raw, "friction", "smooth_velocity", source),
        stribeck_velocities=_numbers(raw, "friction", "stribeck_velocities", source, 1e-6, 1e3),
        deadzone_quantiles=_numbers(raw, "friction", "deadzone_quantiles", source, 0.0, 0.99),
        observer_gain=_number(raw, "momentum_observer", "gain", source),
        pinv_damping=_number(raw, "force", "damping", source, positive=False),
        contact_threshold_n=_number(raw, "force", "contact_threshold_n", source),
        window=window,
        stride=stride,
        svm=dict(raw["condition"]["svm"]),
        random_forest=dict(raw["condition"]["random_forest"]),
        source=source,
    )
