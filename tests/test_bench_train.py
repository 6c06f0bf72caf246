"""Smoke test of bench/train.py: the training-step bench runs end to end at tiny sizes
(B = 2, H = 4, one repeat) and prints its tables, so it cannot rot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_train_quick_prints_both_paths(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(sys, "argv", ["train.py", "--quick"])
    bench.main()
    out = capsys.readouterr().out
    cells = [line.split("|") for line in out.splitlines() if line.startswith("| 2 | 4 |")]
    rows = [r for r in cells if len(r) == 13]  # the training-step table (11 columns)
    assert [r[3].strip() for r in rows] == ["stepwise", "frame-wise"]
    for row in rows:
        arm_steps, step_s, floor_s = (float(row[i].replace(",", "")) for i in (4, 5, 10))
        # arm-steps/s is B x H / step time; the step is printed to 1e-4 s, the rate to 1
        low, high = 2 * 4 / (step_s + 5e-5), 2 * 4 / max(step_s - 5e-5, 1e-9)
        assert low - 1 <= arm_steps <= high + 1
        assert floor_s > 0
    (evaluation,) = [r for r in cells if len(r) == 7]  # the evaluation-rollout table
    assert float(evaluation[3].replace(",", "")) > 0 < float(evaluation[4].replace(",", ""))
    assert "load average" in out
