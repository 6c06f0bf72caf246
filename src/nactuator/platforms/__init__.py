"""Platform descriptions: one YAML file per robot in ``conf/platform/``.

A :class:`Platform` is the single source of truth every room agrees on: channel order,
units, control period, substeps, torque bounds, joint dynamics, end effector, effort
signal and the servo bus. Rooms read the core fields; room-specific extras live in the
``sim``/``data``/``hardware`` sections, which belong to those rooms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nactuator.errors import UserError
from nactuator.paths import conf_dir

__all__ = [
    "Channel",
    "EndEffector",
    "Platform",
    "PlatformError",
    "conf_dir",
    "list_platforms",
    "load_platform",
    "read_yaml_mapping",
]

_KINDS = {"revolute": "rad", "prismatic": "m"}
_TORQUE_UNITS = {"revolute": "N*m", "prismatic": "N"}
EFFORT_SIGNALS = ("current", "load", "torque", "pwm")


class PlatformError(UserError, ValueError):
    """A platform name or platform file is wrong; the message says which and why."""


@dataclass(frozen=True)
class Channel:
    """One actuated degree of freedom, in the platform's channel order."""

    name: str
    kind: str  # "revolute" (rad, N*m) or "prismatic" (m, N)
    torque_min: float  # bounds of the joint torque (N*m; N on a prismatic channel)
    torque_max: float
    limit_lower: float
    limit_upper: float
    armature: float  # kg*m^2 (revolute) or kg (prismatic): reflected rotor inertia
    damping: float  # N*m*s/rad or N*s/m: viscous + back-EMF
    is_gripper: bool = False

    @property
    def unit(self) -> str:
        return _KINDS[self.kind]

    @property
    def torque_unit(self) -> str:
        return _TORQUE_UNITS[self.kind]


@dataclass(frozen=True)
class EndEffector:
    body: str  # MJCF body name the point is attached to
    offset: tuple[float, float, float]  # point in that body's frame [m]


@dataclass(frozen=True)
class Platform:
    name: str
    description: str
    robot_model: str  # MJCF file name under nactuator/sim/robots/
    robot_type: str  # LeRobot-style robot_type written into datasets
    fps: float  # nominal data rate [Hz]; control_dt is the simulator's step
    control_dt: float  # seconds per control step (one model prediction)
    substeps: int
    effort_signal: str  # which telemetry is the effort `u`: current | load | torque | pwm
    channels: tuple[Channel, ...]
    end_effector: EndEffector
    velocity_limit: float  # |qd| clip inside the simulator [rad/s or m/s]
    sim: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the YAML file this came from

    @property
    def n(self) -> int:
        return len(self.channels)

    @property
    def channel_names(self) -> list[str]:
        return [c.name for c in self.channels]

    @property
    def arm_indices(self) -> list[int]:
        return [i for i, c in enumerate(self.channels) if not c.is_gripper]

    @property
    def gripper_indices(self) -> list[int]:
        return [i for i, c in enumerate(self.channels) if c.is_gripper]

    @property
    def substep_dt(self) -> float:
        return self.control_dt / self.substeps

    @property
    def torque_min(self) -> list[float]:
        return [c.torque_min for c in self.channels]

    @property
    def torque_max(self) -> list[float]:
        return [c.torque_max for c in self.channels]

    def robot_model_path(self) -> Path:
        return Path(__file__).resolve().parent.parent / "sim" / "robots" / self.robot_model


def list_platforms() -> list[str]:
    return sorted(p.stem for p in (conf_dir() / "platform").glob("*.yaml"))


def _require(d: dict, key: str, where: str) -> Any:
    if key not in d:
        raise PlatformError(f"{where}: missing required field '{key}'")
    return d[key]


def _number(d: dict, key: str, where: str, positive: bool = False) -> float:
    v = _require(d, key, where)
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise PlatformError(f"{where}: field '{key}' must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise PlatformError(f"{where}: field '{key}' must be > 0, got {v!r}")
    return float(v)


def _channel(d: dict, where: str) -> Channel:
    name = _require(d, "name", where)
    where = f"{where} channel '{name}'"
    kind = _require(d, "kind", where)
    if kind not in _KINDS:
        raise PlatformError(f"{where}: kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if "effort" in d and "torque" not in d:
        raise PlatformError(f"{where}: 'effort' was renamed 'torque' (the joint torque bounds, "
                            "N*m or N; 'effort' is the servo telemetry signal)")
    torque = _require(d, "torque", where)
    limit = _require(d, "limit", where)
    if not (isinstance(torque, list) and len(torque) == 2 and torque[0] < torque[1]):
        raise PlatformError(f"{where}: torque must be [min, max] with min < max, got {torque!r}")
    if not (isinstance(limit, list) and len(limit) == 2 and limit[0] < limit[1]):
        raise PlatformError(f"{where}: limit must be [lower, upper], got {limit!r}")
    return Channel(
        name=str(name),
        kind=kind,
        torque_min=float(torque[0]),
        torque_max=float(torque[1]),
        limit_lower=float(limit[0]),
        limit_upper=float(limit[1]),
        armature=_number(d, "armature", where),
        damping=_number(d, "damping", where),
        is_gripper=bool(d.get("gripper", False)),
    )


def platform_from_dict(raw: dict, source: str = "<dict>") -> Platform:
    where = source
    channels = tuple(_channel(c, where) for c in _require(raw, "channels", where))
    if not channels:
        raise PlatformError(f"{where}: 'channels' is empty")
    names = [c.name for c in channels]
    if len(set(names)) != len(names):
        raise PlatformError(f"{where}: duplicate channel names in {names}")
    ee = _require(raw, "end_effector", where)
    offset = tuple(float(x) for x in ee.get("offset", [0.0, 0.0, 0.0]))
    if len(offset) != 3:
        raise PlatformError(f"{where}: end_effector.offset must have 3 values")
    effort_signal = _require(raw, "effort_signal", where)
    if effort_signal not in EFFORT_SIGNALS:
        raise PlatformError(
            f"{where}: effort_signal must be one of {EFFORT_SIGNALS}, got {effort_signal!r}"
        )
    substeps = _require(raw, "substeps", where)
    if not isinstance(substeps, int) or substeps < 1:
        raise PlatformError(f"{where}: substeps must be a positive integer, got {substeps!r}")
    return Platform(
        name=str(_require(raw, "name", where)),
        description=str(raw.get("description", "")),
        robot_model=str(_require(raw, "robot_model", where)),
        robot_type=str(raw.get("robot_type", raw["name"])),
        fps=_number(raw, "fps", where, positive=True),
        control_dt=_number(raw, "control_dt", where, positive=True),
        substeps=substeps,
        effort_signal=effort_signal,
        channels=channels,
        end_effector=EndEffector(body=str(_require(ee, "body", where)), offset=offset),
        velocity_limit=_number(raw, "velocity_limit", where, positive=True),
        sim=dict(raw.get("sim") or {}),
        data=dict(raw.get("data") or {}),
        hardware=dict(raw.get("hardware") or {}),
        source=source,
    )


def load_platform(name_or_path: str | Path) -> Platform:
    """Load ``conf/platform/<name>.yaml`` (or a YAML path) into a :class:`Platform`."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = conf_dir() / "platform" / f"{name_or_path}.yaml"
        if not p.exists():
            raise PlatformError(
                f"unknown platform {str(name_or_path)!r}: expected one of {list_platforms()} "
                f"(files in {conf_dir() / 'platform'})"
            )
    return platform_from_dict(read_yaml_mapping(p, PlatformError, "platform file"), source=str(p))


def read_yaml_mapping(path: Path, error: type[Exception] = PlatformError,
                      what: str = "file") -> dict:
    """A YAML file whose top level is a mapping; anything else raises ``error`` naming it."""
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    return raw
