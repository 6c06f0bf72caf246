"""The NAD CSV importer (OMX, SO-101, Franka): one CSV file per episode, labels from the
folder names, raw register units -> SI with the unit table of each platform's ``data:``
section (nad-format.md)."""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from nactuator.data.importers.common import (
    FPS_TOLERANCE,
    UTF8_BOM,
    ParsedEpisode,
    find_files,
    write_episodes,
)
from nactuator.data.schema import REQUIRED_KEYS, SPLITS, DataFormatError
from nactuator.platforms import Platform, list_platforms, load_platform

__all__ = ["expand_header", "import_nad", "read_nad_csv"]

NAD_SENTINEL = -999.0  # "no force reading on this frame" (nad-format.md §6)


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
        if key in REQUIRED_KEYS:
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
        files = find_files(src, ".csv")
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
    summary = write_episodes(out, episodes, {"source": "NAD (Frank-ZY-Dou/Dynamics-Modeling)"},
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
