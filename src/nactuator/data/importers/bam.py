"""The BAM importer: Rhoban/bam's XL330 raw JSON logs -> a pendulum dataset."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from nactuator.data.importers.common import ParsedEpisode, find_files, write_episodes
from nactuator.data.schema import SPLITS, DataFormatError
from nactuator.platforms import Platform, load_platform

__all__ = ["BAM_GRIDS", "import_bam", "read_bam_log"]


_BAM_HEADER = ("mass", "length", "kp", "vin", "motor", "trajectory", "entries")
_BAM_FIELDS = ("timestamp", "position", "speed", "load", "input_volts", "temp",
               "goal_position", "torque_enable")


BAM_GRIDS = ("first_sample", "bam")


def _lerp_extrapolated(grid: np.ndarray, t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Linear interpolation that extends the first and last segments beyond the samples
    (scipy's ``interp1d(fill_value="extrapolate")``, which BAM's processing uses)."""
    out = np.interp(grid, t, v)
    if len(t) >= 2:
        before, after = grid < t[0], grid > t[-1]
        out[before] = v[0] + (grid[before] - t[0]) * (v[1] - v[0]) / (t[1] - t[0])
        out[after] = v[-1] + (grid[after] - t[-1]) * (v[-1] - v[-2]) / (t[-1] - t[-2])
    return out


def read_bam_log(path: str | Path, platform: Platform | None = None,
                 splits: dict | None = None, grid: str | None = None) -> ParsedEpisode:
    """Parse one raw BAM XL330 log (real-data.md §2.3) onto the pendulum's control grid.

    ``splits`` ({kp: split}) overrides the platform's ``data.bam.splits``. ``grid`` is
    ``first_sample`` (t = t0, t0 + dt, ...: the platform default) or ``bam``: BAM's own
    processed grid, t = 0, dt, ... up to the last sample, values linearly
    interpolated and extrapolated at the ends and torque_enable re-thresholded at 0.5,
    which reproduces BAM's ``processed/`` files from the raw ones (for its scoring protocol)
    while decoding the PWM before interpolating.
    """
    path = Path(path)
    p = platform or load_platform("pendulum")
    cfg = p.data["bam"]
    grid_kind = grid or cfg.get("grid", "first_sample")
    if grid_kind not in BAM_GRIDS:
        raise DataFormatError(f"BAM import grid must be one of {BAM_GRIDS}, got {grid_kind!r}")
    content = path.read_bytes()
    try:
        log = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataFormatError(f"{path}: not valid JSON (truncated file?): {e}") from e
    if not isinstance(log, dict):
        raise DataFormatError(f"{path}: expected a JSON object (a BAM log), got "
                              f"{type(log).__name__}")
    missing = [k for k in _BAM_HEADER if k not in log]
    if missing:
        raise DataFormatError(f"{path}: missing BAM header fields {missing}")
    entries = log["entries"]
    if not entries:
        raise DataFormatError(f"{path}: empty episode: 'entries' is empty")
    for i, e in enumerate(entries):
        absent = [k for k in _BAM_FIELDS if k not in e]
        if absent:
            raise DataFormatError(f"{path}: entry {i} lacks fields {absent}")
    raw = {k: np.array([e[k] for e in entries], dtype=np.float64) for k in _BAM_FIELDS}
    splits = {int(k): v for k, v in (cfg["splits"] if splits is None else splits).items()}
    bad = {k: v for k, v in splits.items() if v not in (*SPLITS, "excluded")}
    if bad:
        raise DataFormatError(f"BAM splits must map kp to one of {SPLITS}, got {bad}")
    kp = int(log["kp"])
    if kp not in splits:
        raise DataFormatError(
            f"{path}: kp {kp} has no split in {p.source} data.bam.splits (known: {sorted(splits)})"
        )

    # `load` is the raw Present PWM register, unsigned-wrapped 16-bit: decode before any
    # interpolation (interpolating the wrapped value is what corrupts BAM's processed files).
    counts = np.where(raw["load"] > 32767, raw["load"] - 65536, raw["load"])
    limit = float(cfg["pwm_limit"])
    if (np.abs(counts) > limit).any():
        i = int(np.argmax(np.abs(counts) > limit))
        raise DataFormatError(
            f"{path}: entry {i} 'load' = {int(raw['load'][i])} decodes to PWM {int(counts[i])}, "
            f"outside +-{int(limit)} (expected the raw Present PWM register)"
        )
    duty = counts / limit
    t = raw["timestamp"]
    if (np.diff(t) <= 0).any():
        i = int(np.argmax(np.diff(t) <= 0)) + 1
        raise DataFormatError(f"{path}: timestamp does not increase at entry {i}")

    if grid_kind == "bam":
        grid = np.arange(int(np.floor(t[-1] / p.control_dt + 1e-9)) + 1) * p.control_dt
        lerp = lambda v: _lerp_extrapolated(grid, t, v)  # noqa: E731
        torque = (lerp(raw["torque_enable"]) > 0.5).astype(np.float64)
    elif cfg.get("resample", True):
        grid = np.arange(t[0], t[-1] + 1e-9, p.control_dt)
        lerp = lambda v: np.interp(grid, t, v)  # noqa: E731
        hold = np.clip(np.searchsorted(t, grid, side="right") - 1, 0, len(t) - 1)
        torque = raw["torque_enable"][hold]
    else:
        grid, lerp, torque = t, (lambda v: v), raw["torque_enable"]
    col = lambda v: lerp(v)[:, None]  # noqa: E731
    frames = {
        "timestamp": grid - grid[0],
        "q_cmd": col(raw["goal_position"]),
        "q": col(raw["position"]),
        "qd": col(raw["speed"]),
        "effort": col(duty),
        "pwm": col(duty),
        "voltage": col(raw["input_volts"]),
        "temperature": col(raw["temp"]),
        "payload_mass": np.zeros(len(grid)),
        "torque_enable": torque[:, None].astype(np.float64),
    }
    meta = {
        "source": path.name,
        "kp": kp,
        "mass": float(log["mass"]),
        "length": float(log["length"]),
        "vin": float(log["vin"]),
        "motor": str(log["motor"]),
        "raw_samples": len(entries),
        "t0": float(t[0]),
        "grid": grid_kind if cfg.get("resample", True) or grid_kind == "bam" else "raw",
        "payload_mass": 0.0,
        "source_sha256": hashlib.sha256(content).hexdigest(),
    }
    return ParsedEpisode(path, p, frames, str(log["trajectory"]), splits[kp], meta)


def import_bam(src: str | Path, out: str | Path, allow_duplicates: bool = False,
               splits: dict | None = None, grid: str | None = None) -> str:
    """Import BAM XL330 raw JSON logs (a file or a folder of them) as a pendulum dataset.

    Logs whose content is already in ``out`` are skipped (and listed) unless
    ``allow_duplicates``. ``splits`` and ``grid``: see :func:`read_bam_log`."""
    src, out = Path(src), Path(out)
    platform = load_platform("pendulum")
    episodes = [read_bam_log(f, platform, splits, grid) for f in find_files(src, ".json")]
    episodes = [e for e in episodes if e.split != "excluded"]
    if not episodes:
        raise DataFormatError(f"{src}: every log's kp is excluded by the splits {splits}")
    return write_episodes(out, episodes, {"source": "BAM XL330 raw logs (Rhoban/bam @ af22604)"},
                  allow_duplicates)
