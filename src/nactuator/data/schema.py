"""What a nactuator dataset is: the LeRobot v3.0 layout constants (version, paths, sizes), the
mapping from the library's canonical per-frame keys (Contract 1 of docs/architecture.md) to
on-disk features with their widths and units, the ``info.json`` ``features`` block built from
a platform, the in-memory :class:`Episode` and :class:`Dataset` a reader returns, and
:class:`DataFormatError`, raised for bad input or a damaged dataset; ``docs/data-format.md``
describes every file and field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nactuator.errors import UserError
from nactuator.platforms import Platform

__all__ = [
    "CHUNKS_SIZE",
    "CODEBASE_VERSION",
    "DECLARED_KEYS",
    "DATA_FILE_SIZE_IN_MB",
    "DATA_PATH",
    "EPISODES_PATH",
    "FEATURES",
    "FORMAT_TAG",
    "LATER_OPTIONAL_KEYS",
    "PRIVATE_DIR",
    "REQUIRED_KEYS",
    "SPLITS",
    "DataFormatError",
    "Dataset",
    "Episode",
    "FeatureSpec",
    "declared_keys",
    "feature_schema",
    "feature_width",
    "nominal_fps",
]

CODEBASE_VERSION = "v3.0"
FORMAT_TAG = "nactuator-nad/1"
SPLITS = ("train", "validation", "test")
CHUNKS_SIZE = 1000  # files per chunk folder, as LeRobot
DATA_FILE_SIZE_IN_MB = 100  # a flush starts a new data file beyond this much buffered data
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
PRIVATE_DIR = ".nactuator"  # beside meta/ and data/; LeRobot readers never look in it


def nominal_fps(fps: float) -> int:
    """The integer frame rate ``info.json`` ``fps`` holds: LeRobot's loaders and tools take
    ``fps`` as an int, so the recorded rate (SO-101 62.3 Hz) is rounded half up (62) and kept
    exactly in ``info.json`` ``nactuator.fps``, which nactuator reads (docs/data-format.md)."""
    return max(1, math.floor(fps + 0.5))


class DataFormatError(UserError, ValueError):
    """Bad dataset input or a damaged dataset; the message names the file/key and the problem."""


@dataclass(frozen=True)
class FeatureSpec:
    name: str  # on-disk feature name
    width: str  # "n" (one value per channel), "3" (force), "1" (scalar per frame)
    required: bool
    default: float  # fill value when an optional key is not given
    unit: str  # unit description ("joint" = rad / m by channel kind)
    names: tuple[str, ...] | None = None  # entry names of a fixed-width vector (info.json)


# Canonical key -> on-disk feature. Order here is the column order in the data files.
FEATURES: dict[str, FeatureSpec] = {
    "q_cmd": FeatureSpec("action", "n", True, math.nan, "joint"),
    "q": FeatureSpec("observation.state", "n", True, math.nan, "joint"),
    "qd": FeatureSpec("observation.velocity", "n", True, math.nan, "joint/s"),
    "effort": FeatureSpec("observation.effort", "n", True, math.nan, "effort"),
    "voltage": FeatureSpec("observation.voltage", "n", True, math.nan, "V"),
    "temperature": FeatureSpec("observation.temperature", "n", True, math.nan, "degC"),
    "pwm": FeatureSpec("observation.pwm", "n", False, math.nan, "duty"),
    "current": FeatureSpec("observation.current", "n", False, math.nan, "A"),
    "force": FeatureSpec("observation.ee_force", "3", False, math.nan, "N"),
    "payload_mass": FeatureSpec("observation.payload_mass", "1", False, math.nan, "kg"),
    "condition": FeatureSpec("observation.condition", "n", False, math.nan, "1"),
    "telemetry_valid": FeatureSpec("observation.telemetry_valid", "n", False, 1.0, "1"),
    "torque_enable": FeatureSpec("observation.torque_enable", "n", False, 1.0, "1"),
    # Contact anywhere on the arm (issue 23; docs/contact.md): the touched body's index in the
    # robot MJCF (NaN: no contact / unlabelled), the point in that body's frame, the force in
    # the base frame (environment on robot).
    "contact_link": FeatureSpec("observation.contact_link", "1", False, math.nan, "1"),
    "contact_point": FeatureSpec("observation.contact_point", "3", False, math.nan, "m"),
    "contact_force": FeatureSpec("observation.contact_force", "3", False, math.nan, "N"),
    # What a policy observed besides the joints (issue 19; docs/policy.md): the frozen
    # actuator model's causal force estimate and contact gate, one control period old.
    "environment_state": FeatureSpec("observation.environment_state", "4", False, math.nan,
                                     "N, N, N, 1",
                                     names=("force_x", "force_y", "force_z", "contact_gate")),
}
# Optional columns added after datasets were written without them: a reader fills them with
# their default when a data file lacks the column (older datasets still read).
LATER_OPTIONAL_KEYS = ("contact_link", "contact_point", "contact_force")
# Columns only a dataset that declares them holds (``DatasetWriter(declared=...)``); a reader
# fills them with their default elsewhere. LeRobot policies (ACT, Diffusion) take
# ``observation.environment_state`` as an input whenever the dataset has it, so a NaN column
# in every recording would poison them.
DECLARED_KEYS = ("environment_state",)
REQUIRED_KEYS = tuple(k for k, s in FEATURES.items() if s.required)
_EFFORT_SIGNAL_UNITS = {"current": "A", "load": "fraction of max torque", "torque": None,
                        "pwm": "duty"}


def feature_width(spec: FeatureSpec, n: int) -> int:
    """Values per frame of a feature on a platform with ``n`` channels."""
    return n if spec.width == "n" else int(spec.width)


def _channel_units(spec: FeatureSpec, platform: Platform) -> list[str] | str:
    if spec.width != "n":
        return spec.unit
    units = []
    for c in platform.channels:
        if spec.unit == "joint":
            units.append(c.unit)
        elif spec.unit == "joint/s":
            units.append(f"{c.unit}/s")
        elif spec.unit == "effort":
            units.append(_EFFORT_SIGNAL_UNITS[platform.effort_signal] or c.torque_unit)
        else:
            units.append(spec.unit)
    return units


def feature_schema(platform: Platform, declared: tuple[str, ...] = ()) -> dict[str, dict]:
    """The info.json ``features`` block (LeRobot style, plus our ``unit`` and ``key``);
    of :data:`DECLARED_KEYS`, only those in ``declared``."""
    unknown = sorted(set(declared) - set(DECLARED_KEYS))
    if unknown:
        raise DataFormatError(f"cannot declare {unknown}: only {list(DECLARED_KEYS)} are "
                              "declared per dataset")
    features: dict[str, dict] = {
        "timestamp": {"dtype": "float32", "shape": [1], "names": None, "unit": "s"},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    for key, spec in FEATURES.items():
        if key in DECLARED_KEYS and key not in declared:
            continue
        if spec.width == "n":
            shape, names = [platform.n], platform.channel_names
        elif spec.names is not None:
            shape, names = [len(spec.names)], list(spec.names)
        elif spec.width == "3":
            shape, names = [3], ["x", "y", "z"]
        else:
            shape, names = [1], None
        features[spec.name] = {
            "dtype": "float32",
            "shape": shape,
            "names": names,
            "unit": _channel_units(spec, platform),
            "key": key,
        }
    return features


def declared_keys(info: dict) -> tuple[str, ...]:
    """The :data:`DECLARED_KEYS` a dataset's ``info.json`` declares."""
    return tuple(k for k in DECLARED_KEYS if FEATURES[k].name in info["features"])


@dataclass
class Episode:
    """One episode: frames as views into the dataset's concatenated arrays."""

    index: int
    task: str
    split: str
    length: int
    payload_mass: float
    meta: dict
    frames: dict[str, np.ndarray]  # canonical key -> float32 (T, w); payload_mass, timestamp (T,)


@dataclass
class Dataset:
    """A whole dataset in memory: ``frames`` concatenated over episodes (row = global index)."""

    root: Path
    platform: str
    fps: float
    info: dict
    stats: dict
    frames: dict[str, np.ndarray]
    episodes: list[Episode] = field(default_factory=list)

    @property
    def starts(self) -> np.ndarray:
        """Row offset of each episode in :attr:`frames`."""
        return np.cumsum([0] + [e.length for e in self.episodes[:-1]], dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([e.length for e in self.episodes], dtype=np.int64)

    def split_indices(self, split: str) -> list[int]:
        return [i for i, e in enumerate(self.episodes) if e.split == split]
