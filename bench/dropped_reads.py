"""What the fill rule for dropped servo reads costs (docs/training.md "Measured").

Writes a copy of a dataset with 4 % of its (frame, motor) reads dropped, a servo silent
for 15 frames and one whole-bus failure per episode (``telemetry_valid = 0``, values NaN,
as the recorder stores them; the helper of tests/test_pipeline_consistency.py), then runs
each checkpoint's causal ``infer`` path on a split of the clean and of the dropped copy,
the latter with hold-last-valid and with zero fill:

    .venv/bin/python bench/dropped_reads.py --data DATASET --split validation CKPT [CKPT ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from nactuator.data import read_dataset
from nactuator.data.episodes import filter_episode
from nactuator.data.writer import DatasetWriter
from nactuator.eval import metrics as M
from nactuator.eval.episodes import force_labels, load_episodes
from nactuator.eval.infer import predict_episodes
from nactuator.input_filters import input_filter_spec
from nactuator.models import load_actuator
from nactuator.platforms import load_platform

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from test_pipeline_consistency import with_dropped_reads  # noqa: E402


def scores(actuator, episodes, spec) -> str:
    preds = predict_episodes(actuator, [filter_episode(ep, spec) for ep in episodes])
    err = np.concatenate([M.force_errors(p["force"], force_labels(ep))
                          for ep, p in zip(episodes, preds, strict=True)])
    gate = np.concatenate([p["gate"] for p in preds])
    return f"{err.mean():.4f} N, {100 * np.mean(gate > 0.5):.1f} %"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="validation")
    ap.add_argument("ckpts", nargs="+")
    args = ap.parse_args(argv)
    source = read_dataset(args.data)
    platform = load_platform(source.platform)
    with tempfile.TemporaryDirectory() as tmp:
        dropped = Path(tmp) / "dropped"
        with DatasetWriter(dropped, platform, source.fps) as w:
            for ep in source.episodes:
                w.add_episode(with_dropped_reads(ep.frames, ep.index), ep.task, ep.split,
                              ep.meta)
        clean = load_episodes(args.data, platform, args.split)
        lossy = load_episodes(dropped, platform, args.split)
        lost = sum(int((ep.frames["telemetry_valid"] == 0).sum()) for ep in lossy)
        cells = sum(ep.frames["telemetry_valid"].size for ep in lossy)
        print(f"{args.split}: {len(clean)} episode(s), {lost} of {cells} motor-frames dropped")
        print("| checkpoint (its fill) | clean | dropped, held | dropped, zero-filled |")
        print("|---|---|---|---|")
        for ckpt in args.ckpts:
            actuator, meta = load_actuator(ckpt)
            median = meta["input_filters"]["median"].get("temperature", 1)
            print(f"| {ckpt} ({meta['input_filters']['missing']}) | "
                  f"{scores(actuator, clean, meta['input_filters'])} | "
                  f"{scores(actuator, lossy, input_filter_spec(median, 'hold_last_valid'))} | "
                  f"{scores(actuator, lossy, input_filter_spec(median, 'zero'))} |")


if __name__ == "__main__":
    main()
