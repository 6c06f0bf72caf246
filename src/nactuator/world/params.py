"""World files (``conf/world/<platform>.yaml``): load, validate, randomise, resolve.

A world file describes the *hidden* physical robot: per-motor servo firmware, motor and
gearbox parameters, supply, sensors, link-mass errors, the elastic band, the workspace and the
task list. ``randomize`` gives spreads; :func:`resolve_world` draws one concrete robot from
them for a seed. The result, :class:`WorldParams`, is plain JSON-able data (``to_dict``) so a
dataset's ``info.json`` can carry it and :meth:`WorldParams.from_dict` can rebuild the world.

A user world file (``--world FILE``) names its ``platform`` and is deep-merged onto that
platform's default world file, so it only needs the keys it changes. Unknown keys, wrong
types and out-of-range values are errors that name the file, the key and what was expected.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nactuator.errors import UserError
from nactuator.platforms import Platform, conf_dir, load_platform, read_yaml_mapping

__all__ = [
    "CONTROLLERS",
    "REGISTER_MAPS",
    "WorldError",
    "WorldParams",
    "default_world_path",
    "load_world_config",
    "resolve_world",
]

REGISTER_MAPS = ("xm430", "xl330", "sts3215", "franka")
CONTROLLERS = ("position_pid", "joint_impedance")


class WorldError(UserError, ValueError):
    """A world file or world parameter is wrong; the message says where and what was expected."""


# Per-motor keys. Units are at the servo output shaft (rad, N*m); `transmission` converts
# to the joint coordinate (m per rad for the OMX gripper finger, 1 for revolute joints).
_PID_SERVO_KEYS = {
    "firmware_hz": "firmware position-loop rate [Hz]",
    "kp": "Position P register value",
    "ki": "Position I register value",
    "kd": "Position D register value",
    "kp_divisor": "firmware scale: PWM counts = kp / kp_divisor * error counts",
    "ki_divisor": "firmware scale of the integral term (error counts summed per tick)",
    "kd_divisor": "firmware scale of the derivative term (error counts per tick)",
    "pwm_limit": "PWM saturation [PWM counts]",
    "pwm_full": "PWM counts for 100 % duty",
    "integral_limit": "anti-windup clamp of the integral term [PWM counts]",
    "counts_per_rev": "encoder counts per output revolution",
    "zero_count": "raw encoder count at joint q = 0",
    "transmission": "joint units per output radian (1 for revolute joints)",
    "resistance": "winding + driver resistance at 25 degC [ohm]",
    "kt_motor": "motor torque constant at 25 degC, motor side [N*m/A] (= back-EMF V*s/rad)",
    "gear_ratio": "gearbox ratio (motor turns per output turn)",
    "efficiency": "gearbox efficiency on the driving torque (0..1]",
    "current_limit": "firmware current limit [A]",
    "rotor_inertia": "rotor inertia, motor side [kg*m^2]; armature = rotor_inertia * ratio^2",
    "coulomb": "gearbox Coulomb friction at the output [N*m]",
    "stribeck": "extra static friction near zero speed [N*m]",
    "stribeck_velocity": "Stribeck velocity [rad/s]",
    "viscous": "viscous friction at the output [N*m*s/rad]",
    "load_friction": "friction added per N*m of transmitted torque (BAM M3 style) [-]",
    "backlash": "total gearbox play at the output [rad]",
    "thermal_capacity": "winding heat capacity [J/K]",
    "thermal_resistance": "winding-to-ambient thermal resistance [K/W]",
    "kt_temp_coeff": "relative change of kt per kelvin [1/K] (magnets weaken: < 0)",
    "resistance_temp_coeff": "relative change of R per kelvin [1/K] (copper 0.00393)",
    "velocity_filter": "time constant of the firmware's velocity estimate [s]",
}
_IMPEDANCE_SERVO_KEYS = {
    "firmware_hz": "joint torque controller rate [Hz]",
    "kp": "joint stiffness [N*m/rad]",
    "kd": "joint damping of the controller [N*m*s/rad]",
    "torque_limit": "commanded torque limit [N*m]",
    "transmission": "joint units per output radian (1 for revolute joints)",
    "armature": "reflected rotor inertia [kg*m^2]",
    "coulomb": "Coulomb friction [N*m]",
    "stribeck": "extra static friction near zero speed [N*m]",
    "stribeck_velocity": "Stribeck velocity [rad/s]",
    "viscous": "viscous friction [N*m*s/rad]",
    "load_friction": "friction added per N*m of transmitted torque [-]",
    "backlash": "play at the joint [rad]",
}
_SERVO_KEYS = {"position_pid": _PID_SERVO_KEYS, "joint_impedance": _IMPEDANCE_SERVO_KEYS}

# Section schemas: key -> kind. "num" finite number, "range" [lo, hi] with lo <= hi,
# "vec" list of numbers, "str", "bool", "int", "map" (free-form mapping checked elsewhere).
_SECTIONS: dict[str, dict[str, str]] = {
    "physics": {"dt": "num", "settle_seconds": "num"},
    "supply": {"voltage": "num", "source_resistance": "num", "quiescent_current": "num"},
    "thermal": {"ambient": "num", "initial_rise": "range"},
    "links": {"mass_scale": "range", "com_shift": "num"},
    "band": {"channel": "str", "stiffness": "range", "damping": "num", "rest_offset": "num"},
    "sensors": {
        "current_noise": "num",
        "voltage_noise": "num",
        "torque_noise": "num",
        "temperature_glitch_prob": "num",
        "temperature_glitch": "range",
        "load_multiple": "int",
        "load_deadband": "int",
        "velocity_window": "num",
    },
    "workspace": {
        "rest_pose": "vec",
        "circle_center": "vec",
        "circle_radius": "range",
        "pick": "vec",
        "place": "vec",
        "lift": "vec",
        "push_pose": "vec",
        "gripper_open": "num",
        "gripper_closed": "num",
        "grasp_jaw": "num",
        "grasp_stiffness": "num",
        "grasp_damping": "num",
        "reach": "num",
        "hover": "num",
    },
    "variation": {
        "time_scale": "range",
        "joint_offset": "num",
        "posture": "num",
        "position_offset": "num",
        "amplitude": "num",
        "tremor": "num",
        "tremor_cutoff": "num",
    },
}
_TOP = {
    "platform": "str",
    "registers": "str",
    "controller": "str",
    "description": "str",
    "servo": "map",
    "motors": "map",
    "randomize": "map",
    "tasks": "map",
    **{k: "map" for k in _SECTIONS},
}
TASK_KINDS = {
    "circle": {"direction"},
    "sweep": {"channel"},
    "backward_forward": set(),
    "pick_place": {"payload_g"},
    "lift_hold": {"payload_g"},
    "push": {"axis", "sign", "ref"},
    "bam": {"profile"},
    "hold": {"payload_g"},
    "perturb": {"payload_g"},
}
BAM_PROFILES = ("sin_sin", "lift_and_drop", "up_and_down", "sin_time_square", "random_sines")
_TASK_KEYS = {
    "kind": "str",
    "seconds": "num",
    "direction": "str",
    "channel": "str",
    "payload_g": "num",
    "axis": "str",
    "sign": "num",
    "ref": "bool",
    "degrade": "bool",
    "onset": "num",
    "fault": "str",
    "fault_channel": "str",
    "wear": "num",
    "profile": "str",
    "kp_values": "vec",
    "force_max": "num",
    "force_min": "num",
    "pushes": "int",
}


# Mid-run faults (``onset`` tasks): what switches on at the onset frame.
FAULT_KINDS = ("band", "wear")


def _check_fault(t: dict, platform: Platform, where: str) -> None:
    """A task with ``onset`` degrades a motor mid-run: ``fault`` band (the elastic band the
    ``degrade`` tasks wear) or wear (gearbox friction and backlash times ``wear``), on
    ``fault_channel`` (default: the band channel)."""
    keys = {"fault", "fault_channel", "wear"} & set(t)
    if "onset" not in t:
        if keys:
            raise WorldError(f"{where}: {sorted(keys)} need onset (seconds into the run)")
        return
    if t.get("degrade"):
        raise WorldError(f"{where}: degrade (whole run) and onset (mid-run) exclude each other")
    if not 0 < t["onset"] < t.get("seconds", 0):
        raise WorldError(f"{where}.onset: expected 0 < onset < seconds, got {t['onset']!r}")
    fault = t.get("fault", "band")
    if fault not in FAULT_KINDS:
        raise WorldError(f"{where}.fault: expected one of {list(FAULT_KINDS)}, got {fault!r}")
    ch = t.get("fault_channel")
    if ch is not None and ch not in platform.channel_names:
        raise WorldError(f"{where}.fault_channel: {ch!r} is not one of {platform.channel_names}")
    if fault == "wear" and not t.get("wear", 0) > 1:
        raise WorldError(f"{where}.wear: a wear fault needs a factor > 1, got {t.get('wear')!r}")


def default_world_path(platform: str) -> Path:
    return conf_dir() / "world" / f"{platform}.yaml"


def _read_yaml(path: Path) -> dict:
    return read_yaml_mapping(path, WorldError, "world file")


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "tasks":
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_world_config(platform: str, world: str | Path | None = None) -> tuple[dict, str]:
    """The validated world configuration for ``platform`` and where it came from.

    ``world`` is None (the platform's default world file) or a YAML path whose ``platform``
    must match; it is merged onto the default (``tasks`` is replaced as a whole).
    """
    base_path = default_world_path(platform)
    cfg = _read_yaml(base_path)
    source = str(base_path)
    if world is not None:
        path = Path(world)
        over = _read_yaml(path)
        theirs = over.get("platform")
        if theirs != platform:
            raise WorldError(
                f"{path}: key 'platform' is {theirs!r}, expected {platform!r} "
                "(the platform this world file describes)"
            )
        cfg = _deep_merge(cfg, over)
        source = str(path)
    validate_world_config(cfg, load_platform(platform), source)
    return cfg, source


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check(kind: str, v: Any, where: str) -> None:
    ok = {
        "num": _is_num(v),
        "int": isinstance(v, int) and not isinstance(v, bool),
        "str": isinstance(v, str),
        "bool": isinstance(v, bool),
        "map": isinstance(v, dict),
        "vec": isinstance(v, list) and all(_is_num(x) for x in v),
        "range": isinstance(v, list) and len(v) == 2 and all(_is_num(x) for x in v)
        and v[0] <= v[1],
    }[kind]
    if not ok:
        expected = {
            "num": "a finite number",
            "int": "an integer",
            "str": "a string",
            "bool": "true or false",
            "map": "a mapping",
            "vec": "a list of numbers",
            "range": "[low, high] with low <= high",
        }[kind]
        raise WorldError(f"{where}: expected {expected}, got {v!r}")


def _check_section(d: dict, schema: dict[str, str], where: str) -> None:
    unknown = sorted(set(d) - set(schema))
    if unknown:
        raise WorldError(f"{where}: unknown key(s) {unknown}; expected keys {sorted(schema)}")
    missing = sorted(set(schema) - set(d))
    if missing:
        raise WorldError(f"{where}: missing key(s) {missing}")
    for k, kind in schema.items():
        _check(kind, d[k], f"{where}.{k}")


def validate_world_config(cfg: dict, platform: Platform, source: str) -> None:
    """Raise :class:`WorldError` naming ``source`` and the key if ``cfg`` is not a valid world."""
    unknown = sorted(set(cfg) - set(_TOP))
    if unknown:
        raise WorldError(f"{source}: unknown top-level key(s) {unknown}; expected {sorted(_TOP)}")
    for k, kind in _TOP.items():
        if k == "description":
            continue
        if k not in cfg:
            raise WorldError(f"{source}: missing key '{k}'")
        _check(kind, cfg[k], f"{source}: {k}")
    if cfg["platform"] != platform.name:
        raise WorldError(f"{source}: platform is {cfg['platform']!r}, expected {platform.name!r}")
    if cfg["registers"] not in REGISTER_MAPS:
        raise WorldError(
            f"{source}: registers must be one of {REGISTER_MAPS}, got {cfg['registers']!r}"
        )
    if cfg["controller"] not in CONTROLLERS:
        raise WorldError(
            f"{source}: controller must be one of {CONTROLLERS}, got {cfg['controller']!r}"
        )
    for name, schema in _SECTIONS.items():
        _check_section(cfg[name], schema, f"{source}: {name}")
    keys = _SERVO_KEYS[cfg["controller"]]
    _check_section(cfg["servo"], dict.fromkeys(keys, "num"), f"{source}: servo")
    for ch, over in cfg["motors"].items():
        if ch not in platform.channel_names:
            raise WorldError(
                f"{source}: motors.{ch}: unknown channel; expected one of {platform.channel_names}"
            )
        _check("map", over, f"{source}: motors.{ch}")
        bad = sorted(set(over) - set(keys))
        if bad:
            raise WorldError(
                f"{source}: motors.{ch}: unknown key(s) {bad}; expected {sorted(keys)}"
            )
        for k, v in over.items():
            _check("num", v, f"{source}: motors.{ch}.{k}")
    for k, v in cfg["randomize"].items():
        if k not in keys:
            raise WorldError(
                f"{source}: randomize.{k}: not a servo parameter; expected {sorted(keys)}"
            )
        _check("num", v, f"{source}: randomize.{k}")
        if not 0.0 <= v < 1.0:
            raise WorldError(f"{source}: randomize.{k}: relative spread must be in [0, 1), got {v}")
    for k in ("firmware_hz", "resistance", "gear_ratio", "efficiency", "counts_per_rev",
              "pwm_full", "transmission", "thermal_capacity", "thermal_resistance"):
        if k in keys:
            for ch in platform.channel_names:
                v = cfg["motors"].get(ch, {}).get(k, cfg["servo"][k])
                if v <= 0:
                    raise WorldError(f"{source}: {k} for motor {ch!r} must be > 0, got {v}")
    if cfg["physics"]["dt"] <= 0 or cfg["physics"]["dt"] > platform.control_dt:
        raise WorldError(
            f"{source}: physics.dt must be in (0, control_dt={platform.control_dt}], "
            f"got {cfg['physics']['dt']}"
        )
    if platform.n > 1 and cfg["band"]["channel"] not in platform.channel_names:
        raise WorldError(
            f"{source}: band.channel {cfg['band']['channel']!r} is not a channel of "
            f"{platform.name}; expected one of {platform.channel_names}"
        )
    ws = cfg["workspace"]
    if len(ws["rest_pose"]) != platform.n:
        raise WorldError(
            f"{source}: workspace.rest_pose has {len(ws['rest_pose'])} values, "
            f"expected {platform.n} (one per channel)"
        )
    for k in ("circle_center", "pick", "place", "lift", "push_pose"):
        if len(ws[k]) != 3:
            raise WorldError(f"{source}: workspace.{k} must be [x, y, z], got {ws[k]!r}")
    if not cfg["tasks"]:
        raise WorldError(f"{source}: tasks is empty; expected at least one task")
    for name, t in cfg["tasks"].items():
        where = f"{source}: tasks.{name}"
        _check("map", t, where)
        bad = sorted(set(t) - set(_TASK_KEYS))
        if bad:
            raise WorldError(f"{where}: unknown key(s) {bad}; expected {sorted(_TASK_KEYS)}")
        for k, v in t.items():
            _check(_TASK_KEYS[k], v, f"{where}.{k}")
        kind = t.get("kind")
        if kind not in TASK_KINDS:
            raise WorldError(f"{where}.kind: expected one of {sorted(TASK_KINDS)}, got {kind!r}")
        need = sorted(TASK_KINDS[kind] - set(t) - {"payload_g", "ref"})
        if need:
            raise WorldError(f"{where}: kind {kind!r} needs key(s) {need}")
        if "seconds" not in t or t["seconds"] <= 0:
            raise WorldError(f"{where}.seconds: expected a positive number")
        if kind == "sweep" and t["channel"] not in platform.channel_names:
            raise WorldError(
                f"{where}.channel: {t['channel']!r} is not one of {platform.channel_names}"
            )
        _check_fault(t, platform, where)
        if kind == "push" and (t["axis"] not in ("x", "y", "z") or t["sign"] not in (-1, 1)):
            raise WorldError(f"{where}: push needs axis in x|y|z and sign +1|-1")
        if kind == "bam" and t["profile"] not in BAM_PROFILES:
            raise WorldError(
                f"{where}.profile: expected one of {list(BAM_PROFILES)}, got {t['profile']!r}"
            )
        if kind == "circle" and t["direction"] not in ("cw", "ccw"):
            raise WorldError(f"{where}.direction: expected 'cw' or 'ccw', got {t['direction']!r}")


# --------------------------------------------------------------------------- resolved world


@dataclass
class WorldParams:
    """One concrete hidden robot: everything needed to rebuild a :class:`World` exactly."""

    platform: str
    registers: str
    controller: str
    seed: int
    source: str
    motors: dict[str, list[float]]  # servo key -> one value per channel
    body_mass_scale: list[float]  # per MuJoCo body (index order), 1 = nominal
    body_com_shift: list[list[float]]  # per body, metres in the body frame
    physics: dict[str, float]
    supply: dict[str, float]
    thermal: dict[str, Any]
    sensors: dict[str, Any]
    band: dict[str, Any]  # channel index, stiffness (resolved), damping, rest_offset
    workspace: dict[str, Any]
    variation: dict[str, Any]
    tasks: dict[str, dict]

    def to_dict(self) -> dict:
        return {k: copy.deepcopy(getattr(self, k)) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict) -> WorldParams:
        missing = sorted(set(cls.__dataclass_fields__) - set(d))
        if missing:
            raise WorldError(f"resolved world parameters: missing key(s) {missing}")
        return cls(**{k: copy.deepcopy(d[k]) for k in cls.__dataclass_fields__})

    def motor_array(self, key: str) -> np.ndarray:
        return np.asarray(self.motors[key], dtype=np.float64)


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), *stream]))


def resolve_world(
    platform: Platform,
    cfg: dict,
    seed: int,
    source: str = "",
    n_bodies: int | None = None,
) -> WorldParams:
    """Draw one robot from ``cfg``'s spreads for ``seed`` (per-motor values, link errors)."""
    rng = _rng(seed, 1)
    keys = _SERVO_KEYS[cfg["controller"]]
    motors: dict[str, list[float]] = {}
    for k in keys:  # fixed key order: the draws do not depend on YAML ordering
        nominal = [float(cfg["motors"].get(ch, {}).get(k, cfg["servo"][k]))
                   for ch in platform.channel_names]
        spread = float(cfg["randomize"].get(k, 0.0))
        factors = rng.uniform(1.0 - spread, 1.0 + spread, size=platform.n)
        motors[k] = [float(v * f) for v, f in zip(nominal, factors, strict=True)]
    n_bodies = int(n_bodies or 0)
    lo, hi = cfg["links"]["mass_scale"]
    link_rng = _rng(seed, 2)
    mass_scale = link_rng.uniform(lo, hi, size=n_bodies).tolist()
    shift = cfg["links"]["com_shift"]
    com_shift = link_rng.uniform(-shift, shift, size=(n_bodies, 3)).tolist()
    band_cfg = cfg["band"]
    band_rng = _rng(seed, 3)
    band = {
        "channel": (platform.channel_names.index(band_cfg["channel"])
                    if band_cfg["channel"] in platform.channel_names else -1),
        "stiffness": float(band_rng.uniform(*band_cfg["stiffness"])),
        "damping": float(band_cfg["damping"]),
        "rest_offset": float(band_cfg["rest_offset"]),
    }
    return WorldParams(
        platform=platform.name,
        registers=cfg["registers"],
        controller=cfg["controller"],
        seed=int(seed),
        source=source,
        motors=motors,
        body_mass_scale=[float(x) for x in mass_scale],
        body_com_shift=[[float(x) for x in row] for row in com_shift],
        physics=dict(cfg["physics"]),
        supply=dict(cfg["supply"]),
        thermal=copy.deepcopy(cfg["thermal"]),
        sensors=copy.deepcopy(cfg["sensors"]),
        band=band,
        workspace=copy.deepcopy(cfg["workspace"]),
        variation=copy.deepcopy(cfg["variation"]),
        tasks=copy.deepcopy(cfg["tasks"]),
    )
