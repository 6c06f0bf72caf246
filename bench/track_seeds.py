"""The spread of `nactuator track` runs over hidden-world seeds (docs/results.md §9, pixels).

Reads the ``track.json`` of runs of the same path with different ``--seed`` and prints, per
(method, payload), the mean ± sample sd and the range over seeds of the errors (px with a
camera, else mm), the settling time and the decision time; ``--out`` writes it as JSON.

    .venv/bin/python bench/track_seeds.py runs/track-px-s{0,1,2}/track.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def summarise(reports: list[dict]) -> tuple[str, list[dict]]:
    """Per (method, payload): seeds, and mean / sd / min / max of each figure."""
    if not reports:
        raise SystemExit("track_seeds: no track.json given")
    unit = "px" if all(r.get("camera") for r in reports) else "mm"
    keys = [f"rms_{unit}", f"max_{unit}", f"final_{unit}", "settling_s", "decide_p50_ms"]
    groups: dict[tuple[str, float], list[tuple[int, dict]]] = defaultdict(list)
    for r in reports:
        for run in r["runs"]:
            groups[(run["method"], run["payload_g"])].append((r["seed"], run["metrics"]))
    rows = []
    for (method, grams), runs in groups.items():
        row: dict = {"method": method, "payload_g": grams,
                     "seeds": sorted(s for s, _ in runs),
                     "stops": sorted({m["stop"] for _, m in runs})}
        for key in keys:
            v = np.array([np.nan if m[key] is None else m[key] for _, m in runs], float)
            row[key] = {"mean": float(np.mean(v)),
                        "sd": float(np.std(v, ddof=1)) if len(v) > 1 else float("nan"),
                        "min": float(np.min(v)), "max": float(np.max(v))}
        rows.append(row)
    head = ("| method | payload [g] | seeds | " + " | ".join(
        f"{k.replace('_', ' ')}" for k in keys) + " | stop |")
    lines = [f"errors in {unit}; mean ± sd (min–max) over seeds", "", head,
             "|" + "---|" * (len(keys) + 4)]
    for row in rows:
        cells = [f"{row[k]['mean']:.2f} ± {row[k]['sd']:.2f} ({row[k]['min']:.2f}–"
                 f"{row[k]['max']:.2f})" for k in keys]
        lines.append(f"| {row['method']} | {row['payload_g']:.0f} | {len(row['seeds'])} | "
                     + " | ".join(cells) + f" | {', '.join(row['stops'])} |")
    return "\n".join(lines) + "\n", rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="track.json files, one per seed")
    ap.add_argument("--out", default=None, help="write the summary here (JSON)")
    a = ap.parse_args(argv)
    reports = [json.loads(Path(p).read_text()) for p in a.reports]
    paths = {r["path"] for r in reports}
    if len(paths) > 1:
        raise SystemExit(f"track_seeds: the reports track different paths {sorted(paths)}")
    text, rows = summarise(reports)
    print(text)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
