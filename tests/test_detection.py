"""Mid-run fault tasks (conf/world/*_onset.yaml) and the detection metrics of eval.detection."""

from __future__ import annotations

import numpy as np
import pytest

from nactuator.eval.detection import (
    causal_flags,
    detect,
    detection_delay,
    false_flag_rate,
    localisation,
)
from nactuator.platforms import load_platform
from nactuator.world import World, WorldError, load_world
from nactuator.world.params import load_world_config, validate_world_config
from nactuator.world.tasks import Kinematics, plan_episode

ONSET_WORLDS = [("omx", "conf/world/omx_onset.yaml"), ("so101", "conf/world/so101_onset.yaml")]


@pytest.mark.parametrize(("platform", "world"), ONSET_WORLDS)
def test_onset_label_switches_at_the_onset_frame_on_the_faulted_motor(platform, world):
    plat = load_platform(platform)
    params = load_world(plat, world, seed=0)
    channels = set()
    kin = Kinematics(plat)
    for task, spec in params.tasks.items():
        plan = plan_episode(plat, params, kin, task, rep=0, seed=0)
        k, j = plan.fault["onset_frame"], plan.fault["channel"]
        assert k == round(spec["onset"] / plat.control_dt)  # seconds -> frame, unscaled
        assert (plan.condition[:k] == 1).all()  # nominal everywhere before the onset
        assert (plan.condition[k:, j] == 0).all()  # degraded from the onset frame on
        others = np.delete(plan.condition, j, axis=1)
        assert (others == 1).all()  # only the faulted motor is labelled
        channels.add(j)
    # A restriction on another joint than the trained band joint is among the tasks.
    assert channels - {params.band["channel"]}


def test_onset_task_errors_name_the_field():
    plat = load_platform("omx")
    cfg, _ = load_world_config("omx", "conf/world/omx_onset.yaml")
    cfg["tasks"] = {"x": {"kind": "circle", "seconds": 5.0, "direction": "cw", "onset": 6.0}}
    with pytest.raises(WorldError, match=r"tasks\.x\.onset"):
        validate_world_config(cfg, plat, "w.yaml")
    cfg["tasks"]["x"].update(onset=2.0, fault="wear")
    with pytest.raises(WorldError, match=r"tasks\.x\.wear"):
        validate_world_config(cfg, plat, "w.yaml")


def test_worn_gearbox_scales_friction_and_backlash_of_one_motor_of_one_arm():
    w = World("omx", load_world("omx", seed=0), seed=[0, 0], n_envs=2)
    before = {k: np.array(np.broadcast_to(w.servo.p[k], (2, w.n))) for k in
              ("coulomb", "stribeck", "load_friction", "backlash", "viscous")}
    damping = [m.dof_damping[:w.n].copy() for m in w.models]
    w.wear_gearbox([1], channel=2, factor=3.0)
    for key, b in before.items():
        expect = b.copy()
        expect[1, 2] *= 3.0
        np.testing.assert_allclose(w.servo.p[key], expect, err_msg=key)
    np.testing.assert_allclose(w.models[0].dof_damping[:w.n], damping[0])
    np.testing.assert_allclose(w.models[1].dof_damping[2], 3.0 * damping[1][2])


def test_band_on_another_channel_loads_that_joint():
    w = World("omx", load_world("omx", seed=0), seed=[0, 0], n_envs=2)
    rest = np.asarray(w.params.workspace["rest_pose"], dtype=float)
    w.reset(rest)
    w.set_band([False, True], rest=rest[1] + 0.5, channel=1)
    w.step(1.0)
    # The band pulls joint2 of arm 1 toward its rest (+0.5 rad); arm 0 is free.
    assert w.q[1, 1] - w.q[0, 1] > 0.002
    assert abs(w.q[1, 2] - w.q[0, 2]) < abs(w.q[1, 1] - w.q[0, 1])


def test_causal_flags_and_delay_match_hand_computed_values():
    score = np.array([0.1, 0.6, 0.2, 0.7, 0.8, 0.9])
    # hold 2: runs above 0.5 are 0,1,0,1,2,3 -> flagged at frames 4 and 5.
    flags = causal_flags(score, 0.5, hold=2)
    assert flags.tolist() == [False, False, False, False, True, True]
    assert detection_delay(flags, onset=2) == 2
    assert false_flag_rate(flags, onset=2) == 0.0
    # hold 1: frame 1 is a false flag before onset 2 (1 of 2 frames).
    flags1 = causal_flags(score, 0.5, hold=1)
    assert false_flag_rate(flags1, onset=2) == 0.5
    assert detection_delay(flags1, onset=2) == 1
    assert detection_delay(causal_flags(score, 0.95), onset=2) is None
    # Causal: changing the future does not change the flags of the past.
    later = score.copy()
    later[5] = 0.0
    assert causal_flags(later, 0.5, 2)[:5].tolist() == flags[:5].tolist()


def test_detect_localises_the_motor_whose_score_moved():
    T, onset, dt = 20, 10, 0.017
    score = np.full((T, 3), 0.1)
    score[onset + 3:, 2] = 0.9  # motor 2 crosses 3 frames after the onset
    score[onset:, 0] = 0.3  # motor 0 moves a little, stays below threshold
    r = detect(score, onset, channel=2, dt=dt, hold=2)
    assert r.delay_frames == 4 and r.delay_s == pytest.approx(4 * dt)
    assert r.false_flag_rate == 0.0 and r.localised and not r.flagged_before_onset
    np.testing.assert_allclose(localisation(score, onset), [0.2, 0.0, 0.8 * 7 / 10])
    # The same scores judged for a fault on motor 0: flagged never, not localised.
    r0 = detect(score, onset, channel=0, dt=dt, hold=2)
    assert not r0.flagged and not r0.localised
    # A motor high before its onset: flagged at once, but marked as flagged beforehand.
    score[:, 1] = 0.9
    r1 = detect(score, onset, channel=1, dt=dt, hold=2)
    assert r1.delay_frames == 0 and r1.flagged_before_onset
    assert r1.false_flag_rate == pytest.approx((onset - 1) / (onset * 3))


def test_fault_onset_reads_the_label_switch():
    from nactuator.eval.detection_run import fault_onset
    lab = np.ones((10, 3))
    lab[7:, 1] = 0.0
    assert fault_onset(lab) == (7, 1)
    assert fault_onset(np.ones((10, 3))) is None  # nominal throughout
    lab[:, 2] = 0.0
    assert fault_onset(lab) is None  # degraded from frame 0 (a `_degrade` run): no onset


def test_the_flag_rule_comes_from_conf_per_platform(tmp_path):
    import yaml

    from nactuator.eval.detection_run import default_rule
    from nactuator.eval.episodes import EvalDataError
    from nactuator.paths import conf_dir

    shipped = yaml.safe_load((conf_dir() / "eval" / "detection.yaml").read_text())
    # the holds docs/results.md §6.3.6 measured: SO-101 30 frames, OMX 6, others the default
    assert default_rule("so101") == (0.5, 30) == (shipped["threshold"],
                                                   shipped["hold_frames"]["so101"])
    assert default_rule("omx") == (0.5, 6)
    assert default_rule("pendulum") == (0.5, shipped["hold_frames"]["default"])
    bad = tmp_path / "rule.yaml"
    bad.write_text("threshold: 0.5\nhold_frames: {default: 6, omx: 0}\n")
    with pytest.raises(EvalDataError, match=r"rule.yaml: hold_frames.omx must be an integer"):
        default_rule("omx", bad)
    bad.write_text("threshold: 2\nhold_frames: {default: 6}\n")
    with pytest.raises(EvalDataError, match="threshold must be a number in"):
        default_rule("omx", bad)
    bad.write_text("threshold: 0.5\nhold_frames: 6\n")
    with pytest.raises(EvalDataError, match="'default' entry"):
        default_rule("omx", bad)


def test_summary_median_leaves_out_runs_flagged_before_their_onset():
    from nactuator.eval.detection import DetectionResult, summarise

    def run(delay, pre):
        return DetectionResult(task="t", fault="band", channel=2, onset=10,
                               delay_frames=None if delay is None else int(delay * 100),
                               delay_s=delay, false_flag_rate=0.0, flagged_before_onset=pre,
                               shift=[0.0, 0.0, 1.0], localised=True)

    s = summarise([run(0.0, True), run(0.0, True), run(0.4, False), run(0.8, False),
                   run(None, False)])["band@2"]
    assert s["median_delay_s"] == pytest.approx(0.2)  # median of 0, 0, 0.4, 0.8
    assert s["median_delay_not_preflagged_s"] == pytest.approx(0.6)  # of 0.4, 0.8
    assert s["flagged"] == 4 and s["flagged_before_onset"] == 2
