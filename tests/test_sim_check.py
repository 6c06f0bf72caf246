"""`nactuator sim-check`: the report has the documented keys, is JSON, and passes."""

from __future__ import annotations

import json

from nactuator.sim.check import run_sim_check

KEYS = {
    "passed", "summary", "fd_ratio_torques", "fd_ratio_initial_state", "fd_cosine",
    "parity_max_dev", "parity_mujoco_euler_rk4_gap", "parity_ratio", "stock_solver_rel_error",
    "timings",
}


def test_sim_check_report_for_the_pendulum():
    report = run_sim_check("pendulum")
    assert KEYS <= set(report)
    assert report["passed"] is True, report["summary"]
    assert "PASSED" in report["summary"] and "FD ratio" in report["summary"]
    assert 0.99 <= report["fd_ratio_torques"] <= 1.01
    assert report["parity_ratio"] <= 2.0
    assert report["stock_solver_rel_error"] is None  # 1 DoF: the bug cannot show
    assert json.loads(json.dumps(report))["platform"] == "pendulum"
