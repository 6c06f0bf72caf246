"""Jacobian-field control (issue 21): dx/du through model + simulator against finite
differences, the damped-least-squares loop judged in the hidden world by the world's own
end-effector, and the emulated-bus run ending with torque off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nactuator.control.jacobian import ActuatorJacobian, JacobianError, Points, kinematic_jacobian
from nactuator.control.plants import WorldPlant
from nactuator.control.track import (
    PathError,
    Tracker,
    TrackSettings,
    dls_step,
    read_path,
    run_tracking,
    write_path,
)
from nactuator.models import NeuralActuator
from nactuator.paths import conf_dir
from nactuator.platforms import load_platform

Q0 = np.array([0.0, -0.5, 0.5, 0.9, 0.0, 0.3])
STATS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")


@pytest.fixture(scope="module")
def so101(sims):
    return load_platform("so101"), sims["so101"]


def counterfactual_actuator(seed: int = 0) -> NeuralActuator:
    """A small untrained counterfactual model (commands + simulated state): its dx/du is
    as differentiable as a trained one's, which is what the finite-difference test needs."""
    torch.manual_seed(seed)
    stats = {k: {"mean": [0.0] * 6, "std": [1.0] * 6} for k in STATS}
    stats["error"] = {"mean": [0.0] * 6, "std": [0.05] * 6}
    act = NeuralActuator(features=["command", "state", "error"], n_motors=6, norm_stats=stats,
                         model_config={"arch": "mlp", "hidden": 16, "n_layers": 1,
                                       "tau_init_scale": 1.0})
    return act.eval()


def reach(x0: np.ndarray, d: np.ndarray, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(0.0, seconds + 1e-9, 0.05)
    s = 0.5 - 0.5 * np.cos(np.pi * np.clip(t / (0.6 * seconds), 0, 1))
    return t, x0 + s[:, None] * d


def test_kinematic_jacobian_matches_finite_differences_of_fk(so101) -> None:
    _, sim = so101
    pts = Points.on_links(sim.kinematics, [(2, (0.05, 0.0, 0.01)), (4, (0.0, 0.02, -0.05))])
    x, J = kinematic_jacobian(sim.kinematics, pts, Q0)
    assert x.shape == (2, 3) and J.shape == (6, 6)
    eps = 1e-3
    for j in range(6):
        up, dn = Q0.copy(), Q0.copy()
        up[j] += eps
        dn[j] -= eps
        fd = (kinematic_jacobian(sim.kinematics, pts, up)[0]
              - kinematic_jacobian(sim.kinematics, pts, dn)[0]).reshape(-1) / (2 * eps)
        np.testing.assert_allclose(J[:, j], fd, atol=2e-4)
    # The end-effector point is the simulator's own EE.
    ee = Points.end_effector(sim.kinematics)
    q = torch.tensor(Q0[None], dtype=torch.float32)
    np.testing.assert_allclose(kinematic_jacobian(sim.kinematics, ee, Q0)[0][0],
                               sim.ee_position(q)[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(kinematic_jacobian(sim.kinematics, ee, Q0)[1],
                               sim.ee_jacobian(q)[0].numpy(), atol=1e-5)


def test_actuator_dxdu_matches_finite_differences_of_model_and_sim(so101) -> None:
    _, sim = so101
    pts = Points.end_effector(sim.kinematics)
    aj = ActuatorJacobian(counterfactual_actuator(), sim, pts, horizon=3)
    rng = np.random.default_rng(0)
    hist = {"q_cmd": Q0 + 0.02 * rng.standard_normal((5, 6)),
            "q": Q0 + 0.02 * rng.standard_normal((5, 6)), "qd": 0.1 * rng.standard_normal((5, 6))}
    u = Q0 + np.array([0.05, -0.03, 0.04, 0.02, 0.0, 0.0])
    x, J, q_end = aj(hist, Q0, np.zeros(6), u)
    assert J.shape == (3, 6) and np.abs(J).max() > 1e-4  # the command moves the point
    eps = 2e-3  # float32 rollout: a larger step, a looser tolerance
    for j in range(5):
        up, dn = u.copy(), u.copy()
        up[j] += eps
        dn[j] -= eps
        fd = (aj(hist, Q0, np.zeros(6), up)[0] - aj(hist, Q0, np.zeros(6), dn)[0]).reshape(-1)
        np.testing.assert_allclose(J[:, j], fd / (2 * eps), atol=3e-4 + 0.03 * np.abs(fd).max()
                                   / (2 * eps))
    # The prediction is FK of the predicted joints.
    np.testing.assert_allclose(x[0], kinematic_jacobian(sim.kinematics, pts, q_end)[0][0],
                               atol=1e-5)


def test_a_telemetry_model_is_refused_for_dxdu(so101) -> None:
    _, sim = so101
    stats = {k: {"mean": [0.0] * 6, "std": [1.0] * 6} for k in STATS}
    act = NeuralActuator(n_motors=6, norm_stats=stats, model_config={"arch": "mlp",
                                                                     "hidden": 8, "n_layers": 1})
    with pytest.raises(JacobianError, match="counterfactual"):
        ActuatorJacobian(act, sim, Points.end_effector(sim.kinematics))


def test_dls_step_solves_the_damped_normal_equations() -> None:
    rng = np.random.default_rng(1)
    J, e = rng.standard_normal((3, 5)), rng.standard_normal(3)
    du = dls_step(J, e, 0.1)
    # Stationary point of ‖J du − e‖² + λ²‖du‖².
    np.testing.assert_allclose(J.T @ (J @ du - e) + 0.01 * du, 0.0, atol=1e-12)
    tall, y = rng.standard_normal((5, 3)), rng.standard_normal(5)  # undamped: least squares
    np.testing.assert_allclose(dls_step(tall, y, 0.0), np.linalg.lstsq(tall, y)[0], atol=1e-9)


def test_kinematic_loop_converges_in_the_world_with_an_unknown_payload(so101) -> None:
    p, sim = so101
    pts = Points.end_effector(sim.kinematics)
    x0 = kinematic_jacobian(sim.kinematics, pts, Q0)[0][0]
    t, path = reach(x0, np.array([0.02, 0.015, 0.03]), 1.5)
    settings = TrackSettings(extra_s=1.5)
    plant = WorldPlant(p, pts, sim.kinematics, Q0, payload_kg=0.2)
    world = plant.world
    r = run_tracking(plant, Tracker("kinematic", p, sim.kinematics, pts, settings), t, path)
    # Judged by the world's own end-effector (MuJoCo FK of the perturbed arm), not ours.
    final = np.linalg.norm(world.ee_position()[0] - path[-1])
    assert r.stop == "settled" and final < 0.004, (r.stop, final)
    assert np.linalg.norm(r.x[0] - path[-1]) > 0.02  # it did have to move
    # Safety: no command step larger than the clip, all commands inside the limits.
    du = np.abs(np.diff(r.u, axis=0)).max()
    assert du <= settings.step_clip + 1e-9
    lo = np.array([c.limit_lower for c in p.channels]) + settings.joint_margin
    assert (r.u >= lo - 1e-9).all()


def test_actuator_loop_keeps_its_safety_rules(so101) -> None:
    """An untrained model steers badly; the clip, lead limit and stop rule still hold."""
    p, sim = so101
    pts = Points.end_effector(sim.kinematics)
    x0 = kinematic_jacobian(sim.kinematics, pts, Q0)[0][0]
    t, path = reach(x0, np.array([0.0, 0.0, 0.02]), 0.6)
    s = TrackSettings(horizon=2, extra_s=0.3, step_clip=0.05, max_lead=0.1)
    aj = ActuatorJacobian(counterfactual_actuator(1), sim, pts, horizon=s.horizon)
    plant = WorldPlant(p, pts, sim.kinematics, Q0)
    r = run_tracking(plant, Tracker("actuator", p, sim.kinematics, pts, s, aj), t, path)
    assert r.stop in ("settled", "timeout") and r.t[-1] <= t[-1] + s.extra_s + 0.1
    assert np.abs(np.diff(r.u, axis=0)).max() <= s.step_clip + 1e-9
    assert (np.abs(r.u - r.q) <= s.max_lead + 1e-9).all()
    assert len(r.decide_ms) >= len(r.t) // s.period


def test_a_bad_path_file_gives_one_clear_error(tmp_path) -> None:
    with pytest.raises(PathError, match="does not exist"):
        read_path(tmp_path / "none.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("time,x,y\n0,0,0\n1,0,0\n")
    with pytest.raises(PathError, match=r"missing column\(s\) \['z'\]"):
        read_path(bad)
    bad.write_text("time,x,y,z\n0,0,0,0\n0,0,0,1\n")
    with pytest.raises(PathError, match="strictly increase.*row 2"):
        read_path(bad)
    ok = write_path(tmp_path / "ok.csv", np.array([1.0, 2.0]), np.ones((2, 3)))
    t, x = read_path(ok)
    np.testing.assert_allclose(t, [0.0, 1.0])
    np.testing.assert_allclose(x, 1.0)


def test_track_on_the_emulated_bus_ends_with_torque_off(tmp_path, so101, world_follower,
                                                        patient_track_config) -> None:
    """`nactuator track --port` against the STS3215 emulator running the hidden world: the
    end-effector reaches the path (scored by the emulator's world) and torque is off after."""
    from nactuator.control.track_run import track

    p, sim = so101
    t, d = reach(np.zeros(3), np.array([0.02, 0.0, 0.02]), 1.5)
    path = write_path(tmp_path / "reach.csv", t, d)
    with world_follower(p, Q0) as (follower, arm, patient):
        start_world = arm.world.ee_position()[0].copy()
        report = track(path, platform=patient, methods=("kinematic",), port=follower.port,
                       relative=True, out=tmp_path / "out", config=patient_track_config)
        assert [tb.get("Torque_Enable") for tb in follower.tables.values()] == [0] * 6
        end = arm.world.ee_position()[0]
    assert "bus" in report and (tmp_path / "out" / "track.png").exists()
    assert "| settled |" in report, report
    assert np.linalg.norm(end - start_world) > 0.02  # it moved by about the path's 2.8 cm
    # Scored by the emulator's hidden world: its own EE moved by the path's displacement.
    assert np.linalg.norm(end - (start_world + d[-1])) < 0.005
    # The observed point is rigid FK of the measured joints; the world's own EE ends near
    # where the path ends relative to the world's start (sag and FK differences < 5 mm).
    log = np.genfromtxt(tmp_path / "out" / "kinematic_0g.csv", delimiter=",", names=True)
    target_end = np.array([log["target_x"][-1], log["target_y"][-1], log["target_z"][-1]])
    seen_end = np.array([log["x"][-1], log["y"][-1], log["z"][-1]])
    assert np.linalg.norm(seen_end - target_end) < 0.004


def test_the_worlds_own_dxdu_is_a_softer_rigid_fk(so101) -> None:
    """The judge of bench/jacobian.py: the hidden world's response to ±δ command steps is
    rigid FK's direction, smaller (servo lag, gravity sag, friction), and stays that way."""
    from nactuator.control.jacobian_check import world_dxdu

    p, sim = so101
    truth = world_dxdu(p, Q0, [0, 1, 2, 3], horizon=16)
    Jk = kinematic_jacobian(sim.kinematics, Points.end_effector(sim.kinematics),
                            truth["q"])[1][:, :4]
    Jw = truth["J"]
    ratio = np.linalg.norm(Jw) / np.linalg.norm(Jk)
    assert 0.3 < ratio < 0.95, ratio
    cos = (Jw * Jk).sum(0) / (np.linalg.norm(Jw, axis=0) * np.linalg.norm(Jk, axis=0))
    assert (cos > 0.8).all(), cos  # each joint moves the point the way FK says
    assert truth["history"]["q"].shape == (8, 6)


def test_the_perturb_task_steps_commands_around_a_wandering_pose(so101) -> None:
    from nactuator.world import load_world
    from nactuator.world.tasks import plan_episode

    p, _ = so101
    params = load_world(p, None, 0)
    plan = plan_episode(p, params, None, "joint_perturbations_300g", 0, 0)
    q = plan.q_goal
    rest = np.asarray(params.workspace["rest_pose"], float)
    steps = np.abs(np.diff(q, axis=0)).max(axis=1)
    assert (steps > 0.02).sum() >= 10  # many command steps (tremor alone is far smaller)
    assert np.abs(q[:, :5] - rest[:5]).max() < 0.4 + 0.12 + 0.1  # pose drift + step + offsets
    assert np.ptp(q[:, 5]) < 0.05  # the gripper is held
    assert (plan.payload_mass == 0.3).all()  # the payload hangs for the whole episode


def test_a_field_fitted_to_world_point_tracks_learns_the_worlds_dxdu(so101) -> None:
    """Self-supervised: commands in, noisy world point tracks out; the fitted J_θ(q) at the
    start pose points the way the world's own ±δ response does (checked independently)."""
    from nactuator.control.field import collect_perturbations, fit_field
    from nactuator.control.jacobian_check import world_dxdu

    p, _ = so101
    joints = [0, 1, 2, 3]
    data = collect_perturbations(p, Q0, joints, poses=10, per_pose=5, horizon=16, spread=0.2)
    field, fit = fit_field(data, p.n, joints, steps=300, lr=1e-2)
    assert fit["heldout_r2"] > 0.3, fit
    truth = world_dxdu(p, Q0, joints, horizon=16)["J"]
    J = field.jacobian(Q0, p.n)[:, joints]
    cos = (J * truth).sum() / (np.linalg.norm(J) * np.linalg.norm(truth))
    assert cos > 0.9, cos
    assert np.all(field.jacobian(Q0, p.n)[:, [4, 5]] == 0)  # uncontrolled columns


def test_a_saved_field_file_tracks_a_reach_in_the_world(tmp_path, so101) -> None:
    """`nactuator field fit` → file → `track --method field`: the field loaded from the file
    gives the same J as the one fitted, and it brings the world's end-effector to the
    reach's end (judged by the world's own FK, as the kinematic loop is)."""
    import json

    from nactuator.control.field import fit_field, load_field
    from nactuator.control.track_run import fit_field_file, track
    from nactuator.errors import UserError

    p, _ = so101
    out = tmp_path / "so101.pt"
    # The joints-only recipe at 0 g (the config's default is several payloads and the load
    # telemetry: tests/test_field.py).
    info = fit_field_file(out, platform=p, poses=10, per_pose=5, steps=300, payload_g=[0.0],
                          observation=["q"], prior="none", signed=False)
    field = load_field(out, expect_platform="so101")
    assert field.info["samples"] == 50 and field.info["heldout_r2"] > 0.2, field.info
    # The file holds the fitted weights: a refit from the same seed gives the same J.
    from nactuator.control.field import collect_perturbations
    from nactuator.control.track_run import load_track_config

    q0, s = load_track_config(p)
    joints = s.joints or [j for j in range(p.n) if j not in p.gripper_indices]
    again, _ = fit_field(collect_perturbations(p, q0, joints, 10, 5, s.horizon, noise=0.0005),
                         p.n, joints, steps=300)
    np.testing.assert_allclose(field.jacobian(q0, p.n), again.jacobian(q0, p.n), atol=1e-6)
    assert info["horizon"] == s.horizon

    path = conf_dir() / "track" / "paths" / "so101_reach.csv"
    track(path, platform="so101", methods=("field",), field=out, out=tmp_path / "run")
    run = json.loads((tmp_path / "run" / "track.json").read_text())["runs"][0]
    assert run["method"] == "field" and run["metrics"]["final_mm"] < 5.0, run["metrics"]

    with pytest.raises(UserError, match="fitted on 'so101', not 'omx'"):
        load_field(out, expect_platform="omx")
    bad = tmp_path / "bad.pt"
    torch.save({"weights": 1}, bad)
    with pytest.raises(UserError, match="not a Jacobian field file"):
        load_field(bad)
    with pytest.raises(UserError, match="--method field and --field FILE go together"):
        track(path, platform="so101", methods=("field",))
