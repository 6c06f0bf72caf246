"""`nactuator sim-check`: the report covers both engines, is JSON, and passes."""

from __future__ import annotations

import json

from nactuator.sim.check import run_sim_check

KEYS = {
    "passed", "summary", "engine", "engines", "engine_agreement", "step_accuracy",
    "fd_ratio_torques", "fd_ratio_initial_state", "fd_cosine", "parity_max_dev",
    "parity_mujoco_euler_rk4_gap", "parity_ratio", "stock_solver_rel_error", "timings",
}


def test_sim_check_report_for_the_pendulum_covers_both_engines():
    report = run_sim_check("pendulum")
    assert KEYS <= set(report)
    assert report["passed"] is True, report["summary"]
    assert report["engine"] == "chain"
    assert set(report["engines"]) == {"chain", "newton"}
    for engine in ("chain", "newton"):
        figures = report["engines"][engine]
        assert 0.99 <= figures["fd"]["ratio_torques"] <= 1.01
        assert 0.99 <= figures["closed_loop"]["ratio_weights"] <= 1.01
        assert len(figures["closed_loop"]["ratio_random"]) >= 3
        assert figures["closed_loop"]["random_rel_error"] <= 1e-2
        assert figures["parity"]["max_dev"] <= 1e-3
        assert 0.99 <= figures["limit"]["ratio_torques"] <= 1.01
        assert f"[{engine}] FD ratio" in report["summary"]
        assert report["gates"][f"{engine}_fd_limit_torques"] is True
    assert report["engine_agreement"]["max_dev"] <= 1e-5
    assert "chain vs newton" in report["summary"] and "PASSED" in report["summary"]
    assert 0.99 <= report["fd_ratio_torques"] <= 1.01
    assert report["parity_ratio"] <= 1e-2
    assert report["stock_solver_rel_error"] is None  # 1 DoF: the bug cannot show
    assert json.loads(json.dumps(report))["platform"] == "pendulum"
