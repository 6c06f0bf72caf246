"""Smoke test of bench/train.py: the training-step bench runs end to end at tiny sizes
(B = 2, H = 4, one repeat) and prints its table, so it cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_train_quick_prints_both_paths():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "train.py"), "--quick"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    cells = [line.split("|") for line in out.stdout.splitlines()
             if line.startswith("| 2 | 4 |")]
    rows = [r for r in cells if len(r) == 13]  # the training-step table (11 columns)
    assert [r[3].strip() for r in rows] == ["stepwise", "frame-wise"]
    (evaluation,) = [r for r in cells if len(r) == 7]  # the evaluation-rollout table
    assert float(evaluation[3].replace(",", "")) > 0 < float(evaluation[4].replace(",", ""))
    for row in rows:
        arm_steps, step_s, floor_s = (float(row[i].replace(",", "")) for i in (4, 5, 10))
        # arm-steps/s is B x H / step time (both printed rounded)
        assert abs(arm_steps - 2 * 4 / step_s) <= 0.03 * arm_steps + 1
        assert floor_s > 0
    assert "load average" in out.stdout
