"""The hidden ground-truth world: servo law sanity, register quantisation, world files."""

from __future__ import annotations

import json
import math

import mujoco
import numpy as np
import pytest
import yaml

from nactuator.platforms import load_platform
from nactuator.servo_units import decode_sign_magnitude
from nactuator.world import World, WorldError, WorldParams, load_world

TWO_PI = 2 * math.pi


def _world(platform: str, seed: int = 0, n_envs: int = 1) -> World:
    return World(platform, load_world(platform, seed=seed), seed=seed, n_envs=n_envs)


def _rest(w: World) -> np.ndarray:
    return np.asarray(w.params.workspace["rest_pose"], dtype=float)


def _is_multiple(x: np.ndarray, quantum: float) -> bool:
    k = np.asarray(x, dtype=np.float64) / quantum
    return bool(np.all(np.abs(k - np.round(k)) < 1e-6))


def _gravity_torque(w: World, q: np.ndarray) -> np.ndarray:
    """Joint torque the nominal-but-perturbed arm needs to hold still at q (MuJoCo RNE)."""
    m, d = w.models[0], mujoco.MjData(w.models[0])
    d.qpos[:] = q
    mujoco.mj_forward(m, d)
    return d.qfrc_bias.copy()


def test_steady_state_tracking_under_gravity_so101():
    w = _world("so101")
    w.reset(np.zeros(w.n))  # arm stretched out: the largest gravity load
    w.step(2.0)
    tel = w.telemetry()
    q, effort = tel["q"][0], tel["effort"][0]
    err = w.goal()[0] - q
    # Settled: still, and within a few degrees of the goal on the loaded joints.
    assert np.all(np.abs(tel["qd"][0]) <= 50 * TWO_PI / 4096 + 1e-9)
    assert np.all(np.abs(np.degrees(err)) < 8.0)
    # The P law holds at rest: load = -(PWM duty) = -kp / kp_divisor * error counts / 1000,
    # up to the register's 4-count quantisation and the dead band (Present_Load reads
    # positive while the motor drives toward lower positions, as on the real STS3215).
    m = w.motors
    counts = np.round(err * 4096 / TWO_PI)
    predicted = -m["kp"] / m["kp_divisor"] * counts / 1000.0
    loaded = np.abs(predicted) > 0.03
    assert loaded[[1, 2]].all(), "shoulder and elbow must carry gravity"
    np.testing.assert_allclose(effort[loaded], predicted[loaded], atol=0.0041)
    # The delivered torque balances gravity within the friction budget.
    need = _gravity_torque(w, q)
    budget = m["coulomb"] + m["stribeck"] + m["load_friction"] * np.abs(need) + 1e-3
    assert np.all(np.abs(tel["torque_true"][0] - need) <= budget)


def test_steady_state_current_matches_motor_model_omx():
    w = _world("omx")
    w.reset(_rest(w))
    w.step(1.5)
    tel = w.telemetry()
    s = w.servo
    # At rest there is (almost) no back-EMF: i = duty * V / R(T).
    expected = s.duty[0] * w.bus_voltage[0, 0] / s.resistance()[0]
    np.testing.assert_allclose(s.current[0], expected, rtol=0.03, atol=1e-3)
    assert abs(tel["current"][0, 2]) > 0.08, "joint3 holds the forearm against gravity"
    assert np.all(np.abs(tel["current"][0] - s.current[0]) < 0.03)  # noise + 2.69 mA steps


def test_current_saturates_at_limit_and_winding_heats():
    w = _world("omx")
    w.reset(np.array([0.0, -1.0, 0.3, 0.7, 0.01]))  # upper arm back, forearm out
    w.step(0.5)
    t0 = w.servo.temperature[0].copy()
    r0 = w.servo.resistance()[0].copy()
    w.set_external_force([0.0, 0.0, -60.0])  # far beyond what joint3 can hold
    w.step(3.0)  # stalled joint3 heats ~1.6 K/s: +4.9 K, +1.9 % resistance by then
    j = 2  # joint3 folds onto its limit; its servo stalls at full PWM
    limit = w.motors["current_limit"][j]
    assert abs(w.servo.pwm[0, j]) == 885
    assert abs(w.servo.current[0, j]) == pytest.approx(limit, rel=1e-12)
    tel = w.telemetry()
    assert abs(tel["current"][0, j]) == pytest.approx(limit, abs=0.015)
    rise = w.servo.temperature[0] - t0
    assert rise[j] > 3.0, f"stalled joint3 must heat up, rose {rise[j]:.2f} K"
    assert rise[j] > 5 * max(rise[0], 0.05)
    assert w.servo.resistance()[0, j] > r0[j] * 1.01  # copper: +0.393 %/K


def test_torque_off_opens_the_bridge():
    w = _world("omx")
    w.reset(_rest(w))
    w.step(0.5)
    before = w.telemetry()["q"][0]
    w.set_torque_enabled(False)
    w.step(0.3)
    tel = w.telemetry()
    assert np.all(w.servo.current[0] == 0.0)
    assert np.all(tel["pwm"][0] == 0.0)
    assert abs(tel["q"][0, 2] - before[2]) > 0.1, "the unpowered forearm must fall"


def test_backlash_gives_dead_time_on_reversal():
    w = _world("so101")
    s = w.servo
    j = 1
    omega = np.zeros((1, w.n))
    tau = np.zeros((1, w.n))
    tau[0, j] = 0.5
    delivered = []
    for sign in (1.0, -1.0):
        for _ in range(200):
            delivered.append(s._backlash(sign * tau, omega)[0, j])
    delivered = np.array(delivered)
    gap_steps = int((delivered[200:] == 0.0).sum())
    expected = math.sqrt(2 * s.p["backlash"][j] * s.armature[j] / 0.5) / w.dt
    assert delivered[199] == pytest.approx(0.5) and delivered[-1] == pytest.approx(-0.5)
    assert gap_steps == pytest.approx(expected, rel=0.15)


def test_xm430_registers_are_quantised():
    w = _world("omx")
    rng = np.random.default_rng(0)
    w.reset(_rest(w))
    seen = []
    for k in range(40):
        w.set_goal(_rest(w) + 0.3 * np.sin(0.2 * k) + 0.01 * rng.normal(size=w.n))
        w.step(0.017)
        seen.append(w.telemetry())
    tel = {k: np.concatenate([s[k] for s in seen]) for k in seen[0]}
    trans = w.motors["transmission"]
    assert _is_multiple(tel["q"][:, :4], TWO_PI / 4096)
    assert _is_multiple(tel["q"][:, 4], 0.011491 * TWO_PI / 4096)  # gripper slide
    assert _is_multiple(tel["qd"] / trans, 0.229 * TWO_PI / 60)
    assert _is_multiple(tel["current"], 0.00269)
    assert _is_multiple(tel["effort"], 0.00269)  # omx effort = Present Current [A]
    assert _is_multiple(tel["pwm"], 1 / 885)
    assert _is_multiple(tel["voltage"], 0.1)
    assert _is_multiple(tel["temperature"], 1.0)
    assert np.abs(tel["qd"]).max() > 0.1, "the arm moved"
    regs = w.read_registers(0)
    assert abs(regs[1]["present_current"] * 0.00269 - w.servo.current[0, 1]) < 0.03
    assert set(regs[0]) >= {"present_position", "present_velocity", "present_pwm",
                            "present_input_voltage", "present_temperature", "goal_position"}


def test_sts3215_registers_are_quantised():
    w = _world("so101")
    w.reset(_rest(w))
    seen = []
    for k in range(40):
        w.set_goal(_rest(w) + 0.4 * np.sin(0.15 * k))
        w.step(0.01605)
        seen.append(w.telemetry())
        seen[-1]["raw_load"] = np.array([[r["present_load"] for r in w.read_registers(0)]])
    tel = {k: np.concatenate([s[k] for s in seen]) for k in seen[0]}
    steps = tel["qd"] * 4096 / TWO_PI
    assert _is_multiple(steps, 50.0) and np.abs(steps).max() >= 50
    assert _is_multiple(tel["q"], TWO_PI / 4096)
    load = tel["effort"]
    assert _is_multiple(load, 0.004)
    assert np.all((load == 0) | (np.abs(load) >= 0.02 - 1e-9))
    assert (load < 0).any() and (load > 0).any()
    # Present_Load on the wire: sign-magnitude with the sign in bit 10.
    np.testing.assert_array_equal(decode_sign_magnitude(tel["raw_load"], 10),
                                  np.round(tel["effort"] * 1000))
    assert _is_multiple(tel["voltage"], 0.1)
    assert np.all(np.isnan(tel["pwm"]))


def test_band_loads_joint3():
    # Arm 0 free, arm 1 banded, in one World stepped once: both arms get seed 0's noise
    # stream, and an arm does not depend on its batch mates (test_synth), so arm 0 is the
    # standalone free arm and arm 1 the standalone banded one.
    w = World("omx", load_world("omx", seed=0), seed=[0, 0], n_envs=2)
    w.reset(_rest(w))
    w.set_band([False, True], rest=_rest(w)[2] + 0.5)
    w.step(1.5)
    j = w.params.band["channel"]
    assert j == 2
    diff = w.servo.tau_out[1, j] - w.servo.tau_out[0, j]
    k = w.params.band["stiffness"]
    # The servo must now also hold the stretched band: about -k * (q - rest) more torque.
    assert diff == pytest.approx(-k * 0.5, rel=0.35)


def test_seed_draws_a_robot_and_params_round_trip():
    a, b, a2 = (load_world("omx", seed=s) for s in (0, 1, 0))
    assert a.motors == a2.motors and a.body_mass_scale == a2.body_mass_scale
    assert a.motors["kt_motor"] != b.motors["kt_motor"]
    again = WorldParams.from_dict(json.loads(json.dumps(a.to_dict())))
    w1, w2 = World("omx", a, seed=3), World("omx", again, seed=3)
    for w in (w1, w2):
        w.reset(_rest(w))
        w.set_goal(_rest(w) + 0.2)
        w.step(0.3)
    t1, t2 = w1.telemetry(), w2.telemetry()
    for k in ("q", "qd", "effort", "voltage", "temperature"):
        np.testing.assert_array_equal(t1[k], t2[k])


def test_franka_effort_is_commanded_torque():
    w = _world("franka")
    w.reset(_rest(w))
    w.step(1.0)
    tel = w.telemetry()
    need = _gravity_torque(w, tel["q"][0])
    assert abs(tel["effort"][0, 1]) > 10.0  # joint2 holds the arm
    assert np.all(np.abs(tel["effort"][0] - need) < 1.5)
    assert np.all(np.isnan(tel["current"]))


def test_pendulum_pwm_follows_p_law():
    w = _world("pendulum")
    w.reset([0.0])
    w.set_goal([0.8])
    w.step(0.002)
    tel = w.telemetry()
    # First firmware tick: PWM = kp * error_counts / 256 (BAM's XL330 law), 885 = 100 %.
    counts = round(0.8 * 4096 / TWO_PI)
    assert tel["pwm"][0, 0] == pytest.approx(round(400 * counts / 256) / 885)
    assert tel["effort"][0, 0] == tel["pwm"][0, 0]  # pendulum effort = PWM duty


# --------------------------------------------------------------------------- world files


def _write(tmp_path, text: str):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("platform: so101\nservo: {kp: fast}\n", "servo.kp: expected a finite number, got 'fast'"),
        ("platform: so101\nservo: {kpp: 3}\n", "servo: unknown key(s) ['kpp']"),
        ("platform: omx\n", "key 'platform' is 'omx', expected 'so101'"),
        ("platform: so101\nmotors: {elbow: {kp: 3}}\n", "motors.elbow: unknown channel"),
        ("platform: so101\nrandomize: {kt_motor: 2.0}\n", "randomize.kt_motor: relative spread"),
        ("platform: so101\nthermal: {initial_rise: [5, 1]}\n",
         "thermal.initial_rise: expected [low, high] with low <= high"),
        ("platform: so101\nservo: {resistance: -1}\n", "resistance for motor"),
        ("platform: so101\ntasks: {spin: {kind: twirl, seconds: 3}}\n", "tasks.spin.kind"),
        ("platform: so101\nband: {channel: joint9}\n", "band.channel 'joint9'"),
        ("platform: so101\n: [\n", "not valid YAML"),
    ],
)
def test_bad_world_file_names_file_key_and_expectation(tmp_path, text, needle):
    path = _write(tmp_path, text)
    with pytest.raises(WorldError) as e:
        load_world("so101", world=path)
    assert needle in str(e.value)
    assert str(path) in str(e.value)


def test_user_world_overrides_defaults(tmp_path):
    path = tmp_path / "strong.yaml"
    path.write_text(yaml.safe_dump({"platform": "so101", "servo": {"kp": 32},
                                    "randomize": {"kt_motor": 0.0}}))
    w = load_world("so101", world=path, seed=0)
    assert w.motors["kp"] == [32.0] * 6
    assert w.motors["kt_motor"] == [0.0074] * 6
    assert w.source == str(path)
    assert load_platform("so101").n == len(w.motors["kp"])


def test_step_until_tracks_wall_time_without_drift():
    w = _world("pendulum")
    w.reset([0.0])
    total = sum(w.step_until(0.0037 * k) for k in range(1, 101))
    assert w.time == pytest.approx(0.37, abs=w.dt) and total == w.step_count
    assert w.step_until(0.1) == 0


def test_held_object_stops_the_jaw():
    """A jaw commanded shut closes fully on nothing and stops on an object between the jaws,
    the servo then squeezing it (Present_Load positive: driving toward lower positions)."""
    free, holding = _world("so101"), _world("so101")
    jaw = holding.params.workspace["grasp_jaw"]
    for w in (free, holding):
        w.reset(_rest(w))
        goal = _rest(w)
        goal[5] = 0.01
        w.set_goal(goal)
    holding.set_grasp(jaw)
    for w in (free, holding):
        w.step(1.5)
    assert free.telemetry()["q"][0, 5] < 0.05
    tel = holding.telemetry()
    assert jaw - 0.03 < tel["q"][0, 5] < jaw + 0.005
    assert tel["effort"][0, 5] > 0.3
    holding.set_grasp(np.nan)  # released: the jaw closes the rest of the way
    holding.step(1.5)
    assert holding.telemetry()["q"][0, 5] < 0.05


def test_emulated_payload_is_held_between_the_jaws_as_synth_holds_it():
    """The emulator's grasped payload (``WorldArm(payload_kg=, grasp=True)``) is the object of
    ``data synth``'s lift-and-hold: set up here as synth's plan does it (weight -m g at the
    end effector and the grasp stop at ``grasp_jaw`` on every frame), the emulated arm with
    the jaw commanded shut reads the same: the jaw stopped at the object, the gripper servo
    squeezing it, the arm sagging under its weight. Jaw open: the object is set down (no
    weight); no payload: nothing changes."""
    from nactuator.constants import GRAVITY
    from nactuator.hardware.emulator.world_arm import WorldArm

    p = load_platform("so101")
    kg, seconds = 0.4, 1.5
    ws = load_world(p, seed=3).workspace
    jaw, shut, opened = ws["grasp_jaw"], ws["gripper_closed"], ws["gripper_open"]

    def run(goal: float, payload: float, synth: bool) -> dict[str, np.ndarray]:
        # the jaw starts at the object's width, closing on it (or opening off it)
        q0 = np.asarray(ws["rest_pose"], dtype=float)
        q0[5] = jaw
        if synth:  # synth's frame loop for a payload task (tasks.plan_episode's force, grasp)
            w = World(p, load_world(p, seed=3), seed=3, n_envs=1)
            w.reset(q0)
            if payload:
                w.set_external_force([0.0, 0.0, -payload * GRAVITY])
                w.set_grasp(jaw)
        else:
            arm = WorldArm(p, seed=3, q0=q0, payload_kg=payload, grasp=True)
            w = arm.world
        q0[5] = goal
        w.set_goal(q0)
        w.set_torque_enabled(True)
        w.step(seconds)
        return {k: w.telemetry()[k][0] for k in ("q", "effort")}

    emu, synth = run(shut, kg, False), run(shut, kg, True)
    empty = run(shut, 0.0, True)
    assert jaw - 0.03 < emu["q"][5] < jaw + 0.005  # stopped by the object, not shut
    assert emu["effort"][5] > 0.3 and empty["effort"][5] < 0.1  # squeezing it / not
    assert empty["q"][5] < 0.05
    np.testing.assert_array_equal(emu["q"], synth["q"])  # held on every step: the same
    np.testing.assert_allclose(emu["effort"], synth["effort"], atol=1e-9)
    assert np.abs(synth["q"][1:4] - empty["q"][1:4]).max() > 0.01  # and it is a weight
    # no payload: exactly the bare world; jaw opened: the object is set down, no weight
    for payload, goal in ((0.0, shut), (kg, opened)):
        emu, bare = run(goal, payload, False), run(goal, 0.0, True)
        for k in emu:
            np.testing.assert_array_equal(emu[k], bare[k])


def test_carried_object_without_a_jaw_stop_hangs_for_as_long_as_it_is_carried():
    """OMX has no object stop (``grasp_stiffness`` 0): ``set_carried`` cannot feel the jaw,
    so it is the whole-run weight of ``set_external_force`` exactly; 0 kg is nothing."""
    from nactuator.constants import GRAVITY

    runs = []
    for how in ("carried", "hung", "none"):
        w = _world("omx")
        w.reset(_rest(w))
        if how == "carried":
            w.set_carried(0.3)
        elif how == "hung":
            w.set_external_force([0.0, 0.0, -0.3 * GRAVITY])
        else:
            w.set_carried(0.0)
        assert not np.isfinite(w.grasp_jaw).any()
        w.step(0.5)
        runs.append(w.telemetry()["q"][0])
    np.testing.assert_array_equal(runs[0], runs[1])
    assert np.abs(runs[0] - runs[2]).max() > 1e-3
    with pytest.raises(WorldError, match="carried mass"):
        _world("omx").set_carried(-1.0)
