"""Image-space point tracking (issue 21 item 1–2): d(pixel)/du by the chain rule against
finite differences of a hand-written pinhole projection of FK (and of the actuator model's
prediction), pixel targets tracked in the hidden world and judged by projecting the world's
own end-effector, pixel errors of a 3-D run, and the pixel path file's errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from nactuator.control.image import ImageView, load_view, read_pixel_path, write_pixel_path
from nactuator.control.jacobian import ActuatorJacobian, Points, kinematic_jacobian
from nactuator.control.plants import WorldPlant
from nactuator.control.track import PathError, Tracker, run_tracking
from nactuator.control.track_run import load_track_config, track
from nactuator.errors import UserError
from nactuator.models import NeuralActuator
from nactuator.paths import conf_dir
from nactuator.platforms import load_platform

CAMERA = conf_dir() / "vision" / "cameras" / "so101_front.yaml"
STATS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")


@pytest.fixture(scope="module")
def so101(sims):
    return load_platform("so101"), sims["so101"]


@pytest.fixture(scope="module")
def view() -> ImageView:
    return load_view(CAMERA)


def pinhole(view: ImageView, x: np.ndarray) -> np.ndarray:
    """The pinhole model written out (independent of Camera.project): base-frame points
    (..., 3) -> pixels (..., 2) from the file's K and the camera's starting pose T_cb."""
    t = view.camera.t0.numpy()
    k = view.camera.intrinsics
    pc = np.asarray(x) @ t[:3, :3].T + t[:3, 3]
    return np.stack([k.fx * pc[..., 0] / pc[..., 2] + k.cx,
                     k.fy * pc[..., 1] / pc[..., 2] + k.cy], -1)


def test_the_image_jacobian_is_the_finite_difference_of_projected_fk(so101, view) -> None:
    """d(pixel)/du of the kinematic loop (command reached at once: u = q) is the central
    difference of the pinhole projection of the simulator's FK under a small command
    change, for two link points and the end-effector."""
    p, sim = so101
    q0, _ = load_track_config(p)
    for pts in (Points.end_effector(sim.kinematics),
                Points.on_links(sim.kinematics, [(2, (0.05, 0.0, 0.01)),
                                                 (3, (0.0, 0.02, -0.03))])):
        x, J = kinematic_jacobian(sim.kinematics, pts, q0)
        px, Jpx = view.image_jacobian(x, J)
        assert Jpx.shape == (2 * len(pts), p.n)
        np.testing.assert_allclose(px, pinhole(view, x), atol=1e-9)

        def seen(q: np.ndarray, pts=pts) -> np.ndarray:
            qt = torch.tensor(q[None], dtype=torch.float64)
            return pinhole(view, pts.positions(sim.kinematics, qt)[0].numpy()).reshape(-1)

        eps = 1e-4
        for j in range(p.n):
            up, dn = q0.copy(), q0.copy()
            up[j] += eps
            dn[j] -= eps
            np.testing.assert_allclose(Jpx[:, j], (seen(up) - seen(dn)) / (2 * eps),
                                       rtol=1e-5, atol=1e-5)
    # A pixel moves by tens of px per rad for the arm joints at ~0.6 m: not a zero test.
    assert np.abs(Jpx[:, :4]).max() > 10


def test_the_actuator_image_jacobian_is_the_finite_difference_of_its_projection(
        so101, view) -> None:
    """The same chain rule on the actuator model's dx/du: the pixel of its predicted point
    under u ± δ."""
    p, sim = so101
    q0, _ = load_track_config(p)
    torch.manual_seed(0)
    stats = {k: {"mean": [0.0] * 6, "std": [1.0] * 6} for k in STATS}
    stats["error"] = {"mean": [0.0] * 6, "std": [0.05] * 6}
    act = NeuralActuator(features=["command", "state", "error"], n_motors=6, norm_stats=stats,
                         model_config={"arch": "mlp", "hidden": 16, "n_layers": 1,
                                       "tau_init_scale": 1.0}).eval()
    aj = ActuatorJacobian(act, sim, Points.end_effector(sim.kinematics), horizon=3)
    u = q0 + np.array([0.05, -0.03, 0.04, 0.02, 0.0, 0.0])
    x, J, _ = aj({}, q0, np.zeros(6), u)
    _, Jpx = view.image_jacobian(x, J)
    eps = 2e-3  # float32 rollout, as in test_track's finite-difference check
    for j in range(5):
        up, dn = u.copy(), u.copy()
        up[j] += eps
        dn[j] -= eps
        fd = (pinhole(view, aj({}, q0, np.zeros(6), up)[0])
              - pinhole(view, aj({}, q0, np.zeros(6), dn)[0])).reshape(-1) / (2 * eps)
        np.testing.assert_allclose(Jpx[:, j], fd, atol=0.02 + 0.03 * np.abs(fd).max())


def test_a_pixel_path_the_arm_is_already_on_gives_zero_error(so101, view) -> None:
    """Hold the pixel where the world's settled end-effector projects: the error stays
    far below a pixel and the commands barely move. (Not exactly 0: the world's servos
    still creep ~0.5 mm in the first seconds, which the loop corrects once the error
    passes the 0.1 px dead-zone.)"""
    p, sim = so101
    q0, settings = load_track_config(p)
    pts = Points.end_effector(sim.kinematics)
    plant = WorldPlant(p, pts, sim.kinematics, q0, payload_kg=0.2)
    here = pinhole(view, plant.world.ee_position()[0])
    t = np.array([0.0, 1.0])
    settings.extra_s = 0.5
    tracker = Tracker("kinematic", p, sim.kinematics, pts, settings, image=view)
    r = run_tracking(plant, tracker, t, np.stack([here, here]))
    m = r.metrics()
    assert r.space == "image" and r.stop == "settled" and m["settling_s"] == 0.0
    assert m["rms_px"] < 0.2 and m["max_px"] < 0.25 and m["final_px"] < 0.25, m
    assert np.abs(r.u - r.u[0]).max() < 0.02  # rad: only the creep to correct
    # The reported pixels are the world's own end-effector, projected.
    np.testing.assert_allclose(r.x_px, pinhole(view, r.x), atol=1e-9)


def test_an_image_reach_with_an_unknown_payload_is_tracked_in_pixels(tmp_path, so101,
                                                                     view) -> None:
    """`track --camera` with a relative pixel path: 6 px right and 4 px up under 200 g. The
    world's end-effector, projected by hand, ends within the settle tolerance of the
    target pixel; the pixel path's --relative offset is taken in the image."""
    t = np.arange(0.0, 1.51, 0.05)
    s = 0.5 - 0.5 * np.cos(np.pi * np.clip(t / 1.0, 0, 1))
    path = write_pixel_path(tmp_path / "reach_px.csv", t, s[:, None] * np.array([6.0, -4.0]))
    track(path, platform="so101", camera=CAMERA, relative=True, payloads_g=(200.0,),
          out=tmp_path / "run")
    report = json.loads((tmp_path / "run" / "track.json").read_text())
    m = report["runs"][0]["metrics"]
    assert report["space"] == "image" and m["stop"] == "settled", m
    log = np.genfromtxt(tmp_path / "run" / "kinematic_200g.csv", delimiter=",", names=True)
    x = np.stack([log["x"], log["y"], log["z"]], 1)
    seen = pinhole(view, x)
    target = np.stack([log["target_pixel_u"], log["target_pixel_v"]], 1)
    np.testing.assert_allclose(target[-1] - target[0], [6.0, -4.0], atol=0.35)
    assert np.linalg.norm(seen[-1] - target[-1]) < 0.7  # settle_tol_px
    assert np.linalg.norm(seen[-1] - seen[0]) > 5.0  # it did move
    assert m["final_px"] == pytest.approx(np.linalg.norm(seen[-1] - target[-1]), abs=1e-3)
    assert m["rms_mm"] is None  # no 3-D target: no mm errors (null in the JSON)
    assert (tmp_path / "run" / "track_px.png").exists()


def test_a_3d_run_with_a_camera_reports_pixel_errors(tmp_path, so101, view) -> None:
    """A 3-D reach with --camera: the px errors are the projected world end-effector
    against the projected target (recomputed from the run's log by hand), and the
    projected path is written in the pixel format, which reads back."""
    p, sim = so101
    q0, _ = load_track_config(p)
    x0 = kinematic_jacobian(sim.kinematics, Points.end_effector(sim.kinematics), q0)[0][0]
    t = np.arange(0.0, 1.51, 0.05)
    s = 0.5 - 0.5 * np.cos(np.pi * np.clip(t / 1.0, 0, 1))
    pts = x0 + s[:, None] * np.array([0.02, 0.01, 0.02])
    from nactuator.control.track import write_path

    path = write_path(tmp_path / "reach.csv", t, pts)
    track(path, platform="so101", camera=CAMERA, out=tmp_path / "run")
    m = json.loads((tmp_path / "run" / "track.json").read_text())["runs"][0]["metrics"]
    log = np.genfromtxt(tmp_path / "run" / "kinematic_0g.csv", delimiter=",", names=True)
    err = np.linalg.norm(
        pinhole(view, np.stack([log["x"], log["y"], log["z"]], 1))
        - pinhole(view, np.stack([log["target_x"], log["target_y"], log["target_z"]], 1)), axis=1)
    steady = (log["t"] >= 0.5) & (log["t"] <= t[-1])
    # The log keeps µm (6 decimals): ~2e-4 px at this camera.
    assert m["rms_px"] == pytest.approx(np.sqrt((err[steady] ** 2).mean()), abs=2e-3)
    assert m["max_px"] == pytest.approx(err[steady].max(), abs=2e-3)
    assert m["final_px"] == pytest.approx(err[-1], abs=2e-3)
    assert m["rms_mm"] < 5.0 and m["rms_px"] < 1.5
    tp, uv = read_pixel_path(tmp_path / "run" / "path_px.csv", view)
    np.testing.assert_allclose(uv, pinhole(view, pts), atol=1e-3)  # 4 decimals in the file


def test_bad_pixel_paths_and_cameras_give_one_clear_error(tmp_path, view) -> None:
    bad = tmp_path / "bad_px.csv"
    bad.write_text("time,u,w\n0,80,60\n1,81,60\n")
    with pytest.raises(PathError, match=r"bad_px\.csv: missing column\(s\) \['v'\]"):
        read_pixel_path(bad)
    with pytest.raises(PathError, match=r"bad_px\.csv: missing column\(s\) \['v'\]"):
        track(bad, platform="so101", camera=CAMERA)
    bad.write_text("time,u,v\n0,80,60\n1,80,nan\n")
    with pytest.raises(PathError, match=r"bad_px\.csv: non-finite value in data row 2, "
                                        r"column 'v'"):
        read_pixel_path(bad)
    bad.write_text("time,u,v\n0,80,60\n1,170,60\n")  # the image is 160 px wide
    with pytest.raises(UserError, match=r"bad_px\.csv: data row 2 \(u, v\) = \(170\.0, "
                                        r"60\.0\) px lies outside the 160x120 image"):
        read_pixel_path(bad, view)
    bad.write_text("time,u,v\n0,80,60\n1,81,60\n")
    with pytest.raises(PathError, match=r"bad_px\.csv: a pixel path .* needs --camera"):
        track(bad, platform="so101")
    other = tmp_path / "omx_cam.yaml"
    cfg = yaml.safe_load(CAMERA.read_text())
    other.write_text(yaml.safe_dump({**cfg, "platform": "omx"}))
    with pytest.raises(UserError, match=r"omx_cam\.yaml: the camera is set up for 'omx', "
                                        r"not 'so101'"):
        track(bad, platform="so101", camera=other)


def test_an_image_reach_on_the_emulated_bus_ends_with_torque_off(
        tmp_path, so101, view, world_follower, patient_track_config) -> None:
    """`track --port --camera` with a relative pixel path against the STS3215 emulator
    running the hidden world: the observed point is rigid FK of the measured joints,
    projected; the emulator's own end-effector, projected by hand, moves by the path's
    pixel displacement, and torque is off after."""
    p, _ = so101
    q0, _ = load_track_config(p)
    t = np.arange(0.0, 1.51, 0.05)
    s = 0.5 - 0.5 * np.cos(np.pi * np.clip(t / 1.0, 0, 1))
    d = np.array([5.0, -4.0])
    path = write_pixel_path(tmp_path / "reach_px.csv", t, s[:, None] * d)
    with world_follower(p, q0) as (follower, arm, patient):
        start = pinhole(view, arm.world.ee_position()[0])
        report = track(path, platform=patient, port=follower.port, camera=CAMERA,
                       relative=True, out=tmp_path / "out", config=patient_track_config)
        assert [tb.get("Torque_Enable") for tb in follower.tables.values()] == [0] * 6
        end = pinhole(view, arm.world.ee_position()[0])
    assert "bus" in report and (tmp_path / "out" / "track_px.png").exists()
    assert "| settled |" in report, report
    # Observed by rigid FK of the measured joints, judged by the world's own arm.
    assert np.linalg.norm(end - (start + d)) < 0.7, (start, end)  # settle_tol_px
    assert np.linalg.norm(end - start) > 4.0
