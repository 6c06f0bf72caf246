"""nactuator.policy: success criteria in the hidden world, the scripted expert, the
policy's windows and file, the Wilson interval, the config's one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nactuator.errors import UserError
from nactuator.platforms import load_platform
from nactuator.policy.config import load_config
from nactuator.policy.evaluate import PolicyController, load_policy, wilson_interval
from nactuator.policy.expert import ScriptedExpert, servo_stiffness
from nactuator.policy.fit import POLICY_FORMAT, history_windows
from nactuator.policy.network import PolicyNet
from nactuator.policy.sensing import condition_features, feature_width
from nactuator.policy.task_world import TaskWorld
from nactuator.world import load_world
from nactuator.world.protection import STS_OVERCURRENT_BIT

CFG = load_config(actuator=__file__)  # any existing path: these tests load no actuator


def test_wilson_interval_matches_the_closed_form() -> None:
    # Reference values (Wilson 1927; e.g. statsmodels proportion_confint(method="wilson")).
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    assert wilson_interval(46, 50) == pytest.approx((0.81159, 0.96840), abs=1e-4)


def test_history_windows_repeat_the_first_frame_before_the_start() -> None:
    f = np.arange(4 * 2 * 1, dtype=float).reshape(4, 2, 1)  # (T=4, E=2, d=1)
    w = history_windows(f, 3)
    assert w.shape == (8, 3, 1)
    # step 0 of episode 1: frame 0 three times; step 3 of episode 0: frames 1, 2, 3.
    np.testing.assert_array_equal(w[1, :, 0], [1, 1, 1])
    np.testing.assert_array_equal(w[6, :, 0], [2, 4, 6])


def test_condition_features_hold_what_each_condition_may_read() -> None:
    q, est, eff, f = (np.full((2, 6), 1.0), np.full((2, 4), 2.0), np.full((2, 6), 3.0),
                      np.full((2, 3), 4.0))
    for c, extra in (("position", []), ("force_estimate", [2.0] * 4),
                     ("telemetry", [3.0] * 6), ("oracle", [4.0] * 3)):
        x = condition_features(c, q, est, eff, f)
        assert x.shape == (2, feature_width(c, 6))
        np.testing.assert_array_equal(x[0, 6:], extra)


def _world(task: str, grams: float, n: int = 2) -> TaskWorld:
    p = load_platform("so101")
    return TaskWorld(p, load_world(p, None, 0), task, grams / 1000.0, CFG, list(range(n)))


def test_expert_stiffness_matches_the_servo_law() -> None:
    tw = _world("lift_hold", 0.0, 1)
    # 16 / 4 PWM per count, 4096 / 2 pi counts per rad, 12 V / 6.2 ohm, 0.6 * 345 * 0.0074
    expected = 4 * 4096 / (2 * np.pi) / 1000 * 12.0 / 6.2 * 0.6 * 345 * 0.0074
    m = tw.world.motors
    scale = (m["kp"][1] / 16 * 6.2 / m["resistance"][1] * m["efficiency"][1] / 0.6
             * m["kt_motor"][1] / 0.0074)
    assert servo_stiffness(tw)[1] == pytest.approx(expected * scale, rel=1e-9)


def test_the_expert_lifts_and_holds_and_a_dropping_controller_fails() -> None:
    secs = 2.5
    cfg = dict(CFG, tasks=dict(CFG["tasks"], lift_hold=dict(CFG["tasks"]["lift_hold"],
                                                            hold_seconds=0.5)))
    tw = _world("lift_hold", 300.0, 1)
    tw.cfg = cfg
    seeds = [0]
    expert = ScriptedExpert(tw, seeds, secs, cfg["expert"], np.random.default_rng(0))
    log = tw.run(expert, secs, tw.start_pose(seeds))
    assert log.success.all() and not log.tripped.any()
    ee = log.frames["ee"][-1]
    assert np.linalg.norm(ee - tw.target, axis=1).max() < cfg["tasks"]["lift_hold"]["tolerance_m"]
    # The same motion with the jaw opened half way: the object falls, the task fails.
    def opener(obs):
        cmd = expert(obs)
        if obs.step > 100:
            cmd[:, tw.grip] = 0.8
        return cmd
    expert = ScriptedExpert(tw, seeds, secs, cfg["expert"], np.random.default_rng(0))
    log = tw.run(opener, secs, tw.start_pose(seeds))
    assert not log.success.any() and not log.frames["attached"][-1].any()
    assert (log.frames["force"][-1] == 0).all()


def test_a_controller_that_tears_at_the_arm_trips_the_over_current_protection() -> None:
    tw = _world("lift_hold", 500.0, 1)
    q0 = tw.start_pose([0])

    def reach_out(obs):  # stretch the loaded arm far forward: the shoulder stalls
        cmd = q0.copy()
        cmd[:, 1], cmd[:, 2], cmd[:, 3] = 0.8, -1.0, 0.0
        return cmd
    log = tw.run(reach_out, 1.5, q0)
    assert log.tripped.all() and not log.success.any()
    assert log.meta["errors"][0, 1] == STS_OVERCURRENT_BIT  # shoulder_lift, torque off
    assert log.frames["torque_enable"][-1, 0, 1] == 0
    assert log.peak_current[0] > tw.world.protection.current_limit


def test_policy_file_round_trip_and_controller_commands(tmp_path) -> None:
    net = PolicyNet(7, 6, history=8, width=16, depth=1, heads=2)
    stats = {"mean": [0.1] * 7, "std": [2.0] * 7}
    hp = dict(d_in=7, n_out=6, history=8, width=16, depth=1, heads=2)
    path = tmp_path / "p.pt"
    torch.save({"format": POLICY_FORMAT, "condition": "position", "hparams": hp,
                "seconds_per_episode": 4.0, "feature_stats": stats,
                "action_stats": {"mean": [0.5] * 6, "std": [0.1] * 6},
                "state_dict": net.state_dict()}, path)
    loaded, payload = load_policy(path)

    class NoSensor:
        estimate = np.zeros((1, 4))
    ctrl = PolicyController(loaded, payload, NoSensor())
    q = np.linspace(-0.3, 0.3, 6)[None]
    obs = type("O", (), {"telemetry": {"q": q, "effort": np.zeros((1, 6))}, "t": 1.0,
                         "force_true": np.zeros((1, 3))})()
    cmd = ctrl(obs)
    frame = np.concatenate([q, [[1.0 / 4.0]]], axis=1)  # q and the phase t / seconds
    x = torch.from_numpy(((frame - 0.1) / 2.0).astype(np.float32))[:, None].repeat(1, 8, 1)
    expect = net.eval()(x).detach().numpy() * 0.1 + 0.5
    np.testing.assert_allclose(cmd, expect, atol=1e-5)
    with pytest.raises(UserError, match="no policy file"):
        load_policy(tmp_path / "missing.pt")


def test_config_errors_are_one_line(tmp_path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("platform: so101\n")
    with pytest.raises(UserError, match="missing sections"):
        load_config(bad)
    with pytest.raises(UserError, match="does not exist"):
        load_config(actuator=str(tmp_path / "none.ckpt"))


def test_the_actuator_may_be_a_shipped_bundle_by_name() -> None:
    # --actuator pretrained/so101, as --ckpt takes it everywhere else
    assert load_config(actuator="pretrained/so101")["actuator"] == "pretrained/so101"
    with pytest.raises(UserError, match="no pretrained actuator 'nope'"):
        load_config(actuator="pretrained/nope")


def test_demo_episodes_are_written_as_a_nactuator_dataset(tmp_path) -> None:
    """`action` = the commanded joints, the payload mass only while the object is held."""
    from nactuator.data import read_dataset
    from nactuator.policy.demos import _write_dataset
    from nactuator.policy.task_world import EpisodeLog

    p = load_platform("so101")
    rng = np.random.default_rng(0)
    T, E, n = 5, 2, p.n
    frames = {k: rng.normal(size=(T, E, n)) for k in ("q_cmd", "q", "qd", "effort")}
    frames.update(voltage=np.full((T, E, n), 12.0), temperature=np.full((T, E, n), 30.0),
                  current=np.full((T, E, n), np.nan), torque_enable=np.ones((T, E, n)),
                  force=np.zeros((T, E, 3)), attached=np.zeros((T, E), bool),
                  environment_state=rng.normal(size=(T, E, 4)))
    frames["attached"][2:, 1] = True
    frames["force"][2:, 1, 2] = -0.2 * 9.81
    ok = np.array([True, False])
    log = EpisodeLog(frames, ok, ~ok, ~ok, np.ones(E), np.zeros(E), ok)
    _write_dataset(tmp_path / "ds", p, [("lift_hold", 200, log)])
    ds = read_dataset(tmp_path / "ds")
    assert len(ds.episodes) == 2
    ep = ds.episodes[1]
    np.testing.assert_allclose(ep.frames["q_cmd"], frames["q_cmd"][:, 1], atol=1e-6)
    np.testing.assert_allclose(ep.frames["payload_mass"], [0, 0, 0.2, 0.2, 0.2], atol=1e-7)
    np.testing.assert_allclose(ep.frames["environment_state"],
                               frames["environment_state"][:, 1], atol=1e-6)
    assert ep.task == "lift_hold_200g" and ep.meta["success"] is False
    # LeRobot reads the column by its info.json feature (ACT takes it as env-state input)
    feat = ds.info["features"]["observation.environment_state"]
    assert feat["shape"] == [4] and feat["names"][3] == "contact_gate"


def test_demo_environment_state_is_the_actuator_estimate_infer_gives(tmp_path) -> None:
    """observation.environment_state[k] is the frozen model's [f̂, gate] of frame k - 1: what
    `nactuator infer` computes from the stored telemetry with the same checkpoint."""
    import pandas as pd

    from nactuator.data import read_dataset
    from nactuator.eval.infer import infer
    from nactuator.policy.demos import make_demos

    cfg = load_config(actuator="pretrained/so101")
    cfg["demos"].update(payloads_g=[300], episodes=2)
    for task in cfg["tasks"].values():
        task["seconds"] = 1.0
    make_demos(cfg, tmp_path / "demos")
    ds = read_dataset(tmp_path / "demos" / "dataset")
    infer("pretrained/so101", tmp_path / "demos" / "dataset", out=tmp_path / "infer.csv",
          force_only=True)
    csv = pd.read_csv(tmp_path / "infer.csv")
    assert len(ds.episodes) == 4
    for ep in ds.episodes:
        env = ep.frames["environment_state"]
        rows = csv[csv.episode == ep.index].sort_values("frame")
        expect = rows[["fx", "fy", "fz", "gate"]].to_numpy()
        np.testing.assert_array_equal(env[0], 0.0)  # nothing estimated before frame 0
        np.testing.assert_allclose(env[1:], expect[:-1], atol=2e-4)
        assert np.abs(env[1:, :3]).max() > 0.05  # a real estimate, not a constant
