"""Importers: NAD CSV folders (OMX, SO-101, Franka) and BAM XL330 JSON logs -> nactuator datasets.

Raw register units are converted to SI here, once, using the unit table in each platform's
``data:`` section (conf/platform/*.yaml). Every file is parsed and validated before the
first byte is written, so a bad file leaves the output dataset untouched. Each episode
keeps its source file's sha256 (``source_sha256``), so importing a file whose content is
already in the dataset is skipped and reported (``allow_duplicates=True`` imports it anyway).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from nactuator.data.schema import SPLITS, DataFormatError
from nactuator.data.writer import DatasetWriter
from nactuator.platforms import Platform, list_platforms, load_platform

__all__ = ["import_bam", "import_nad", "read_bam_log", "read_nad_csv"]

NAD_SENTINEL = -999.0  # "no force reading on this frame" (nad-format.md §6)
FPS_TOLERANCE = 0.25  # measured frame rate may differ from the platform's by this fraction
UTF8_BOM = b"\xef\xbb\xbf"


@dataclass
class ParsedEpisode:
    """One source file, converted: canonical frames plus its labels."""

    source: Path
    platform: Platform
    frames: dict[str, np.ndarray]
    task: str
    split: str
    meta: dict


# --------------------------------------------------------------------------- NAD CSV


def expand_header(spec: str) -> list[str]:
    """``"timestamp pos1-5 aperture"`` -> ``["timestamp", "pos1", ..., "pos5", "aperture"]``."""
    names: list[str] = []
    for token in spec.split():
        m = re.fullmatch(r"(.*?)(\d+)-(\d+)", token)
        if m:
            names += [f"{m[1]}{i}" for i in range(int(m[2]), int(m[3]) + 1)]
        else:
            names.append(token)
    return names


def _nad_layouts(platform: str | None) -> dict[str, tuple[Platform, list[str]]]:
    names = [platform] if platform else list_platforms()
    layouts = {}
    for name in names:
        p = load_platform(name)
        spec = p.data.get("nad", {}).get("header")
        if spec:
            layouts[p.name] = (p, expand_header(spec))
    if platform and not layouts:
        raise DataFormatError(
            f"platform {platform!r} has no NAD CSV layout (data.nad.header in {p.source})"
        )
    return layouts


def _expected_csv(layouts: dict) -> str:
    sizes = ", ".join(f"{name} {len(cols)}" for name, (_, cols) in layouts.items())
    first = next(iter(layouts.values()))[1]
    return (f"expected comma-separated UTF-8 text whose first line is a NAD header like "
            f"'{','.join(first[:3])},...' ({sizes} columns)")


def _not_nad(path: Path, found: str, layouts: dict) -> DataFormatError:
    return DataFormatError(f"{path}: not a NAD CSV: {found}; {_expected_csv(layouts)}")


def _csv_header(path: Path, raw: bytes, layouts: dict) -> list[str]:
    """The header cells of a NAD CSV, or a "not a NAD CSV" error saying what the file is."""
    nul = raw.find(b"\x00", 0, 1 << 16)
    if nul >= 0:
        raise _not_nad(path, f"binary data (NUL byte at offset {nul})", layouts)
    line = raw.split(b"\n", 1)[0].rstrip(b"\r")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_nad(path, f"the first line is not UTF-8 text (byte 0x{line[e.start]:02x} at "
                       f"offset {e.start})", layouts) from None
    preview = text if len(text) <= 60 else text[:57] + "..."
    for sep, name in ((";", "semicolons"), ("\t", "tabs")):
        if text.count(sep) > text.count(","):
            raise _not_nad(path, f"the header is separated by {name} ('{preview}')", layouts)
    header = [h.strip() for h in text.split(",")]
    best = max(len(set(cols) & set(header)) for _, cols in layouts.values())
    if "timestamp" not in header or best < len(header) / 2:
        raise _not_nad(path, f"its first line '{preview}' is not a NAD header "
                       f"({best} of its {len(header)} cells are NAD column names)", layouts)
    return header


def _detect_layout(path: Path, header: list[str], layouts: dict) -> tuple[Platform, list[str]]:
    for platform, expected in layouts.values():
        if set(header) == set(expected) and len(header) == len(expected):
            return platform, expected
    # A NAD header, but not exactly one layout: report against the closest, naming the diff.
    platform, expected = max(layouts.values(), key=lambda pe: len(set(pe[1]) & set(header)))
    missing = [c for c in expected if c not in header]
    extra = [c for c in header if c not in expected]
    dupes = [c for c, k in Counter(header).items() if k > 1]
    raise DataFormatError(
        f"{path}: header does not match the NAD {platform.name} layout "
        f"({len(expected)} columns; file has {len(header)}): "
        f"missing columns {missing}, unexpected columns {extra}"
        + (f", duplicated columns {dupes}" if dupes else "")
    )


def _labels_from_path(path: Path, platform: Platform,
                      labels: tuple[str, str] | None = None) -> tuple[str, str, float, dict]:
    """Task, split, payload mass [kg] and extra meta from the NAD folder layout (§2), or
    from ``labels`` = (task, split) given by the user (``--task``/``--split``)."""
    path = Path(os.path.abspath(path))  # 'so101/500g/..' must not make a task named '..'
    cfg = platform.data["nad"]
    depth = int(cfg.get("task_depth", 1))
    if labels is not None:
        task, split = labels
        source = path.name
    else:
        split = path.parent.name
        if split not in SPLITS:
            raise DataFormatError(
                f"{path}: expected the file inside a split folder {SPLITS} "
                f"(NAD layout .../<task>/<split>/NNN.csv), found folder {split!r}; "
                f"or label it with --task NAME --split train|validation|test"
            )
        task = "/".join(path.parent.parent.parts[-depth:])
        source = "/".join(path.parts[-depth - 2 :])
    grams = 0.0
    pattern = cfg.get("payload_pattern")
    if pattern:
        m = re.search(pattern, f"{task}/{path.name}")
        if m:
            grams = float(m[1])
    meta = {"source": source, "payload_g": grams}
    return task, split, grams / 1000.0, meta


def _condition(task: str, n_frames: int, platform: Platform) -> np.ndarray | None:
    cfg = platform.data["nad"].get("condition")
    if not cfg or task.split("/")[0] != cfg["family"]:
        return None  # unlabelled
    cond = np.ones((n_frames, platform.n))
    if task.endswith(cfg["degrade_suffix"]):
        for name in cfg["restricted"]:
            cond[:, platform.channel_names.index(name)] = 0.0
    return cond


def _check_units(path: Path, frames: dict, platform: Platform, columns: dict) -> None:
    """Catch the usual unit slips (degrees, mm, V vs dV, ms timestamps) with a clear error."""
    cfg = platform.data["nad"]
    for j, ch in enumerate(platform.channels):
        bound = 2 * math.pi if ch.kind == "revolute" else 0.1
        for key in ("q", "q_cmd"):
            worst = np.nanmax(np.abs(frames[key][:, j]))
            if worst > bound:
                raise DataFormatError(
                    f"{path}: {key} of channel {ch.name!r} reaches {worst:.4g} {ch.unit} after "
                    f"conversion; expected |value| <= {bound:.3g} {ch.unit} (wrong units in "
                    f"column {columns[key][j]!r}?)"
                )
    lo, hi = cfg.get("voltage_range", (-math.inf, math.inf))
    volts = frames["voltage"]
    if np.isfinite(volts).any():
        j = int(np.nanargmax(np.abs(volts - (lo + hi) / 2).max(axis=0)))
        vmin, vmax = float(np.nanmin(volts[:, j])), float(np.nanmax(volts[:, j]))
        if vmin < lo or vmax > hi:
            raw = platform.data["nad"]["columns"]["voltage"]
            raise DataFormatError(
                f"{path}: column '{raw}{j + 1}' gives {vmin:.4g}..{vmax:.4g} V after scaling by "
                f"{cfg['scale'].get('voltage', 1.0)}; expected {lo}..{hi} V "
                f"(is the column in the unit the {platform.name} layout expects?)"
            )
    dt = np.diff(frames["timestamp"])
    if len(dt) and (dt <= 0).any():
        row = int(np.argmax(dt <= 0)) + 1
        raise DataFormatError(f"{path}: timestamp does not increase at data row {row + 1}")
    if len(dt) >= 2:
        fps = 1.0 / float(np.median(dt))
        if abs(fps / platform.fps - 1.0) > FPS_TOLERANCE:
            raise DataFormatError(
                f"{path}: timestamps imply {fps:.4g} Hz but platform {platform.name!r} records at "
                f"{platform.fps} Hz (timestamp column not in seconds, or wrong platform?)"
            )


def read_nad_csv(
    path: str | Path, platform: str | None = None, layouts: dict | None = None,
    labels: tuple[str, str] | None = None,
) -> ParsedEpisode:
    """Parse and convert one NAD CSV file; raises :class:`DataFormatError` on bad input.

    ``layouts`` (from :func:`_nad_layouts`) saves re-reading the platform files per file.
    ``labels`` = (task, split) replaces the labels the NAD folder layout would give.
    """
    path = Path(path)
    layouts = layouts or _nad_layouts(platform)
    raw = path.read_bytes()
    sha256 = hashlib.sha256(raw).hexdigest()
    raw = raw.removeprefix(UTF8_BOM)  # spreadsheet programs save CSV with one
    if not raw.strip():
        raise DataFormatError(f"{path}: empty file (expected a NAD CSV header and rows)")
    header = _csv_header(path, raw, layouts)
    p, expected = _detect_layout(path, header, layouts)
    if not raw.endswith(b"\n"):
        # A complete last row without a line ending is fine; a row cut short is not. (A cut
        # inside the last cell leaves a shorter number that no reader can tell from a real one.)
        last = raw.rsplit(b"\n", 1)[-1].rstrip(b"\r")
        cells = last.count(b",") + 1
        if cells != len(header):
            line_no = raw.count(b"\n") + 1
            raise DataFormatError(
                f"{path}: truncated file: the last row (line {line_no}) has "
                f"{cells} of {len(header)} cells and no line ending; expected complete CSV rows"
            )
    try:
        table = pacsv.read_csv(
            io.BytesIO(raw),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.float64() for c in header}),
        )
    except pa.ArrowInvalid as e:
        raise DataFormatError(f"{path}: malformed CSV (truncated or damaged row?): {e}") from e
    if table.num_rows == 0:
        raise DataFormatError(f"{path}: empty episode: header but no data rows")
    col = {c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in header}

    cfg = p.data["nad"]
    n = p.n
    frames: dict[str, np.ndarray] = {"timestamp": col["timestamp"]}
    sources: dict[str, list[str]] = {}
    for key, prefix in cfg["columns"].items():
        names = [f"{prefix}{j + 1}" for j in range(n)]
        frames[key] = np.stack([col[c] for c in names], axis=1) * float(cfg["scale"].get(key, 1.0))
        sources[key] = names
    gripper = cfg.get("gripper")
    if gripper:
        # The gripper channel is a prismatic finger in metres (architecture.md conventions).
        for j in p.gripper_indices:
            for key in ("q", "q_cmd"):
                frames[key][:, j] = col[gripper[key]] * float(gripper["scale"])
                sources[key][j] = gripper[key]
            if gripper.get("qd") == "finite_difference" and table.num_rows >= 2:
                t = frames["timestamp"]
                if (np.diff(t) > 0).all():
                    frames["qd"][:, j] = np.gradient(frames["q"][:, j], t)
                sources["qd"][j] = f"d({gripper['q']})/dt"

    for key, names in sources.items():  # NaN in a required channel: name the column and row
        if key in ("q_cmd", "q", "qd", "effort", "voltage", "temperature"):
            bad = np.isnan(frames[key])
            if bad.any():
                row, j = np.argwhere(bad)[0]
                raise DataFormatError(
                    f"{path}: column {names[j]!r} is empty/NaN at data row {row + 1} "
                    f"(line {row + 2}) (required channel '{key}')"
                )
    force = np.stack([col["force_x"], col["force_y"], col["force_z"]], axis=1)
    frames["force"] = np.where(force == NAD_SENTINEL, np.nan, force)
    for key in ("voltage", "temperature"):
        if key not in frames:  # not logged on this platform (data.unrecorded)
            frames[key] = np.full((table.num_rows, n), np.nan)
    _check_units(path, frames, p, sources)

    task, split, mass, meta = _labels_from_path(path, p, labels)
    # Payload is on the arm while the weight label is present (pick-and-place: the carry).
    held = np.isfinite(frames["force"]).any(axis=1) if mass > 0 else np.zeros(table.num_rows, bool)
    frames["payload_mass"] = np.where(held, mass, 0.0)
    cond = _condition(task, table.num_rows, p)
    if cond is not None:
        frames["condition"] = cond
    meta |= {"payload_mass": mass, "rows": table.num_rows, "source_sha256": sha256}
    return ParsedEpisode(path, p, frames, task, split, meta)


def _find_files(src: Path, suffix: str) -> list[Path]:
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise DataFormatError(f"{src}: no such file or folder")
    files = sorted(p for p in src.rglob(f"*{suffix}") if p.is_file())
    if not files:
        raise DataFormatError(f"{src}: no *{suffix} files found")
    return files


def _write(out: Path, episodes: list[ParsedEpisode], metadata: dict,
           allow_duplicates: bool) -> str:
    platforms = {e.platform.name for e in episodes}
    if len(platforms) > 1:
        by = {name: next(str(e.source) for e in episodes if e.platform.name == name)
              for name in sorted(platforms)}
        raise DataFormatError(f"mixed platforms in one import: {by}; import them separately")
    platform = episodes[0].platform
    fps = platform.fps
    with DatasetWriter(out, platform, fps, metadata=metadata) as writer:
        for e in episodes:  # validate all first: a large import may flush more than once
            try:
                writer.check_episode(e.frames, e.task, e.split, e.meta)
            except DataFormatError as err:
                raise DataFormatError(f"{e.source}: {err}") from err
        new, duplicates = _new_episodes(episodes, writer, allow_duplicates)
        for e in new:
            writer.add_episode(e.frames, e.task, e.split, e.meta)
    lines = [_summary(out, new, fps)] if new else [
        f"nothing imported: every file is already in {out}"]
    if duplicates:
        names = [f"{e.source.name} (= {dup})" for e, dup in duplicates]
        shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
        lines.append(f"skipped {len(duplicates)} file(s) whose content is already in the "
                     f"dataset (same sha256): {shown}; --allow-duplicates imports them again")
    return "\n".join(lines)


def _new_episodes(episodes: list[ParsedEpisode], writer: DatasetWriter,
                  allow_duplicates: bool) -> tuple[list[ParsedEpisode], list]:
    """Split off files whose content (sha256) the dataset holds, or an earlier file here."""
    if allow_duplicates:
        return episodes, []
    seen = {m["source_sha256"]: f"episode {i} ({m.get('source', '?')})"
            for i, m in enumerate(writer.episode_metas()) if m.get("source_sha256")}
    new, duplicates = [], []
    for e in episodes:
        digest = e.meta["source_sha256"]
        if digest in seen:
            duplicates.append((e, seen[digest]))
        else:
            seen[digest] = f"{e.source} in this import"
            new.append(e)
    return new, duplicates


def _summary(out: Path, episodes: list[ParsedEpisode], fps: float) -> str:
    frames = sum(len(e.frames["timestamp"]) for e in episodes)
    splits = Counter(e.split for e in episodes)
    tasks = Counter(e.task for e in episodes)
    labelled = [np.isfinite(e.frames["force"]).any(axis=1) for e in episodes if "force" in e.frames]
    force = int(sum(m.sum() for m in labelled))
    lines = [
        f"imported {len(episodes)} episodes ({frames} frames, {frames / fps:.1f} s at {fps} Hz) "
        f"into {out}",
        f"platform: {episodes[0].platform.name}",
        "splits: " + ", ".join(f"{s} {splits[s]}" for s in SPLITS if splits[s]),
        f"tasks ({len(tasks)}): " + ", ".join(f"{t} x{k}" for t, k in sorted(tasks.items())),
        f"force-labelled frames: {force} of {frames}",
    ]
    return "\n".join(lines)


def _labelled_files(src: Path, task: str | None, split: str | None) -> tuple[list[Path], tuple]:
    """The CSVs that ``--task``/``--split`` label: ``src`` itself, or the ``*.csv`` directly
    in a flat folder (a folder with CSVs in sub-folders is the NAD layout's job)."""
    if task is None or split is None:
        given, missing = ("--task", "--split") if split is None else ("--split", "--task")
        raise DataFormatError(f"{given} needs {missing} too: together they label a CSV file "
                              "or a flat folder of CSVs that is not in the NAD layout")
    if not task.strip():
        raise DataFormatError("--task: the task name is empty")
    if split not in SPLITS:
        raise DataFormatError(f"--split must be one of {list(SPLITS)}, got {split!r}")
    if src.is_file():
        return [src], (task.strip(), split)
    if not src.is_dir():
        raise DataFormatError(f"{src}: no such file or folder")
    files = sorted(p for p in src.glob("*.csv") if p.is_file())
    nested = sorted(p for p in src.rglob("*.csv") if p.is_file() and p.parent != src)
    if nested:
        raise DataFormatError(
            f"{src}: --task/--split label a CSV file or a flat folder of CSVs, but "
            f"{len(nested)} CSV(s) sit in sub-folders (e.g. {nested[0]}); import a NAD "
            "layout (<task>/<split>/NNN.csv) without --task/--split")
    if not files:
        raise DataFormatError(f"{src}: no *.csv files found")
    return files, (task.strip(), split)


def import_nad(src: str | Path, out: str | Path, platform: str | None = None,
               allow_duplicates: bool = False, task: str | None = None,
               split: str | None = None) -> str:
    """Import every NAD CSV under ``src`` into the dataset at ``out``; returns a summary.

    The platform is detected from each header. Given ``platform`` and a folder, files that
    are exactly another platform's layout are skipped (so a whole NAD ``data/`` folder can
    be imported one platform at a time); without it, a mix of platforms is an error. Task, split and
    payload come from the NAD folder layout, unless ``task`` and ``split`` (both) are given:
    then ``src`` is one CSV or a flat folder of them, every file gets those labels, and the
    payload (and the OMX condition) are read from the task name. Appends when ``out``
    already holds a dataset of the same platform and fps; files whose content is already in
    it are skipped (and listed) unless ``allow_duplicates``.
    """
    src, out = Path(src), Path(out)
    layouts = _nad_layouts(None)
    if platform is not None and load_platform(platform).name not in layouts:
        _nad_layouts(platform)  # raises: that platform has no NAD layout
    labels = None
    if task is not None or split is not None:
        files, labels = _labelled_files(src, task, split)
    else:
        files = _find_files(src, ".csv")
    episodes, skipped = [], []
    for f in files:
        other = _other_platform(f, platform, layouts) if src.is_dir() else None
        if other:
            skipped.append((f, other))
            continue
        episodes.append(read_nad_csv(f, layouts={platform: layouts[platform]} if platform
                                     else layouts, labels=labels))
    if not episodes:
        raise DataFormatError(f"{src}: no NAD CSV of platform {platform!r} "
                              f"({len(skipped)} files of other platforms)")
    summary = _write(out, episodes, {"source": "NAD (Frank-ZY-Dou/Dynamics-Modeling)"},
                     allow_duplicates)
    if skipped:
        kinds = Counter(name for _, name in skipped)
        summary += "\nskipped (other platforms): " + ", ".join(
            f"{k} {name}" for name, k in sorted(kinds.items()))
    return summary


def _other_platform(path: Path, platform: str | None, layouts: dict) -> str | None:
    """The platform name if ``path``'s header is exactly another platform's NAD layout."""
    if platform is None:
        return None
    with open(path, "rb") as f:
        line = f.readline().removeprefix(UTF8_BOM)
    header = [h.strip() for h in line.decode("utf-8", "replace").split(",")]
    for name, (_, expected) in layouts.items():
        if name != platform and header == expected:
            return name
    return None


# --------------------------------------------------------------------------- BAM JSON

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
    episodes = [read_bam_log(f, platform, splits, grid) for f in _find_files(src, ".json")]
    episodes = [e for e in episodes if e.split != "excluded"]
    if not episodes:
        raise DataFormatError(f"{src}: every log's kp is excluded by the splits {splits}")
    return _write(out, episodes, {"source": "BAM XL330 raw logs (Rhoban/bam @ af22604)"},
                  allow_duplicates)
