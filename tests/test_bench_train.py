"""Smoke test of bench/train.py: the training-step bench runs end to end at tiny sizes
(B = 2, H = 4, one repeat) and prints its tables, so it cannot rot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench" / "train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _check_quick_tables(out: str) -> None:
    cells = [line.split("|") for line in out.splitlines() if line.startswith("| 2 | 4 |")]
    rows = [r for r in cells if len(r) == 14]  # the training-step table (12 columns)
    assert [r[3].strip() for r in rows] == ["stepwise", "frame-wise"]
    for row in rows:
        arm_steps, step_s, floor_s = (float(row[i].replace(",", "")) for i in (4, 5, 10))
        # arm-steps/s is B x H / step time; the step is printed to 1e-4 s, the rate to 1
        low, high = 2 * 4 / (step_s + 5e-5), 2 * 4 / max(step_s - 5e-5, 1e-9)
        assert low - 1 <= arm_steps <= high + 1
        assert floor_s > 0
        # simulator + model take part of the step, so removing the rest speeds it up >= 1x
        # (the model share is capped at what the step leaves after the simulator)
        assert float(row[12].strip().rstrip("x")) >= 1.0
    (evaluation,) = [r for r in cells if len(r) == 7]  # the evaluation-rollout table
    assert float(evaluation[3].replace(",", "")) > 0 < float(evaluation[4].replace(",", ""))
    assert "load average" in out


def test_bench_train_quick_prints_both_paths(monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(sys, "argv", ["train.py", "--quick"])
    bench.main()
    out = capsys.readouterr().out
    _check_quick_tables(out)
    assert ", cpu, " in out


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="checks the message a machine without CUDA gets; this one has CUDA")
def test_bench_train_cuda_without_a_gpu_says_so(monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(sys, "argv", ["train.py", "--quick", "--device", "cuda"])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "no CUDA device" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device")
def test_bench_train_quick_on_cuda(monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(sys, "argv", ["train.py", "--quick", "--device", "cuda"])
    bench.main()
    out = capsys.readouterr().out
    _check_quick_tables(out)
    assert ", cuda" in out
