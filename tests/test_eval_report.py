"""metrics.md explains what its numbers cannot say: an accuracy with no degraded motor to
find, and a negative current-to-torque constant."""

from __future__ import annotations

import numpy as np

from nactuator.eval import metrics as M
from nactuator.eval.report import (
    _binary_rows,
    baseline_report,
    negative_kt_note,
    one_class_note,
)


def test_no_degraded_motor_means_no_accuracy_but_a_specificity():
    all_nominal = M.binary_metrics(np.array([0.1, 0.2, 0.7, 0.1]), np.zeros(4, bool))
    row = _binary_rows("condition (c < 0.5 = degraded)", all_nominal)
    assert row[3] == "n/a" and "100" not in " ".join(row)
    note = one_class_note("condition", all_nominal, "degraded motor")
    assert note.startswith("- condition: no degraded motor in these episodes (4 labelled")
    assert "accuracy would only be the nominal-class rate" in note
    assert "specificity (called nominal) 75.0 %" in note
    # with a degraded motor present the accuracy is a score again, and nothing is added
    mixed = M.binary_metrics(np.array([0.9, 0.2, 0.1, 0.3]), np.array([1, 0, 0, 0], bool))
    assert _binary_rows("condition", mixed)[3] == "100.0 %"
    assert one_class_note("condition", mixed, "degraded motor") is None
    # the mirror case: every labelled frame a contact -- accuracy is only the recall
    touching = M.binary_metrics(np.array([0.9, 0.2, 0.8]), np.ones(3, bool))
    assert _binary_rows("contact gate", touching)[3] == "n/a"
    note = one_class_note("contact gate", touching, "contact", negative="free of contact")
    assert "every one of the 3 labelled frames is a contact" in note
    assert "accuracy would only be the recall (66.7 %)" in note


def _calibration(kt: dict[str, tuple[float, str]]) -> dict:
    return {c: {"kt": k, "bias": 0.0, "rms": 0.1, "correlation": 0.5 if k > 0 else -0.1,
                "mode": mode} for c, (k, mode) in kt.items()}


def test_negative_kt_is_explained_in_the_baseline_report():
    cal = _calibration({"shoulder_pan": (-0.06, "torque-on-effort"),
                        "shoulder_lift": (2.1, "effort-on-torque"),
                        "wrist_flex": (-1.3, "effort-on-torque")})
    note = negative_kt_note(cal, {})
    assert note.startswith("Kt < 0 on shoulder_pan, wrist_flex:")
    assert "On shoulder_pan (fit `torque-on-effort`" in note and "not identified" in note
    assert "Present_Load reads positive while the servo drives towards lower" in note
    assert negative_kt_note(_calibration({"a": (1.0, "effort-on-torque")}), {}) is None
    assert "Kt < 0 on a:" in negative_kt_note(_calibration({"a": (1.0, "effort-on-torque")}),
                                              {"a": {"kt": -0.5}})

    result = {"channels": [{"name": c} for c in cal], "aggregate": {"all": {"mean": {}}},
              "baselines": {"methods": ["id-linear"], "wall_time_s": 1.0, "condition": {},
                            "fit": {"settings": "conf/eval/baselines.yaml", "train_episodes": 3,
                                    "calibration": {"frames": 500, "joints": cal}}}}
    text = "\n".join(baseline_report(result))
    table_end = text.index("| wrist_flex |")
    assert text.index("Kt < 0 on shoulder_pan, wrist_flex") > table_end


def test_the_so101_load_register_calibrates_to_a_negative_kt_as_on_the_real_servos():
    """The sign convention end to end: the hidden world encodes its load register as the
    real STS3215 does (positive while it drives towards lower positions, docs/synthetic-
    world.md §4a), the buses decode it, the dataset stores it, and free-motion calibration
    finds Kt < 0 on every identified joint -- the negative Kt of the real SO-101 file is the
    register's sign, not our encoding."""
    from nactuator.data import read_dataset
    from nactuator.data.defaults import default_dataset
    from nactuator.eval.baselines import load_settings
    from nactuator.eval.baselines.calibration import TorqueCalibration
    from nactuator.eval.baselines.signals import episode_signals
    from nactuator.platforms import load_platform
    from nactuator.sim.dynamics import ArmDynamics
    from nactuator.training.cli import cache_dir

    platform = load_platform("so101")
    ds = read_dataset(default_dataset("so101", cache_dir() / "datasets"))
    s = load_settings()
    dyn = ArmDynamics.for_platform(platform, s.armature_for(platform))
    signals = [episode_signals(ep, dyn, platform.control_dt, s.cutoff_hz, s.filter_order,
                               s.max_force_n) for ep in ds.episodes if ep.split == "train"]
    cal = TorqueCalibration.fit(signals, s.min_correlation)
    identified = [j for j, mode in enumerate(cal.modes) if mode == "effort-on-torque"]
    assert len(identified) >= 2  # the gravity-loaded joints at least
    kt = dict(zip(platform.channel_names, cal.kt.round(3), strict=True))
    assert all(cal.kt[j] < 0 and cal.correlation[j] < 0 for j in identified), kt
