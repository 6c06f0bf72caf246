"""nactuator.vision: camera, se(3), soft silhouettes against MuJoCo ray casting, calibration,
mask storage (issue 20)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.linalg import expm
from scipy.spatial.transform import Rotation

from nactuator.platforms import load_platform
from nactuator.vision.camera import Camera, Intrinsics, load_camera, look_at
from nactuator.vision.raycast import RayCastRenderer
from nactuator.vision.scene import ArmScene
from nactuator.vision.se3 import rotation_angle, se3_exp
from nactuator.vision.silhouette import SilhouetteRenderer, hard_iou, soft_iou_loss


@pytest.fixture(scope="module")
def scene() -> ArmScene:
    torch.set_num_threads(1)
    return ArmScene("so101")


def _states(n: int, seed: int) -> np.ndarray:
    p = load_platform("so101")
    lo = np.array([c.limit_lower for c in p.channels])
    hi = np.array([c.limit_upper for c in p.channels])
    return np.random.default_rng(seed).uniform(0.6 * lo, 0.6 * hi, (n, p.n))


def test_projection_matches_hand_computed_pixels():
    k = Intrinsics(width=160, height=120, fx=100.0, fy=120.0, cx=80.0, cy=60.0)
    cam = Camera(k, np.eye(4))
    uv, z = cam.project(torch.tensor([[0.1, -0.05, 1.0], [0.0, 0.0, 2.0], [-0.2, 0.3, 0.5]],
                                     dtype=torch.float64))
    # u = fx x / z + cx, v = fy y / z + cy, by hand:
    expected = np.array([[90.0, 54.0], [80.0, 60.0], [40.0, 132.0]])
    assert uv.detach().numpy() == pytest.approx(expected)
    assert z.detach().numpy() == pytest.approx([1.0, 2.0, 0.5])
    # A camera 1 m out on +x looking at the origin, z up: the origin lands on the principal
    # point, a point 10 cm above it 12 px higher (image y down), one 10 cm towards +y 10 px
    # right (facing −x with z up, +y is on the right).
    cam = Camera(k, look_at([1.0, 0.0, 0.0], [0.0, 0.0, 0.0]))
    uv, z = cam.project(torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.1], [0.0, 0.1, 0.0]],
                                     dtype=torch.float64))
    expected = np.array([[80.0, 60.0], [80.0, 48.0], [90.0, 60.0]])
    assert uv.detach().numpy() == pytest.approx(expected)
    assert z.detach().numpy() == pytest.approx([1.0, 1.0, 1.0])


def test_se3_exp_matches_scipy():
    rng = np.random.default_rng(3)
    xi = np.concatenate([rng.normal(0, 0.3, (20, 3)), rng.normal(0, 1.0, (20, 3))], 1)
    xi[0, 3:] = 0.0        # pure translation
    xi[1, 3:] = 1e-7       # the series branch
    t = se3_exp(torch.tensor(xi)).numpy()
    for x, got in zip(xi, t, strict=True):
        assert got[:3, :3] == pytest.approx(Rotation.from_rotvec(x[3:]).as_matrix(), abs=1e-12)
        twist = np.zeros((4, 4))
        twist[:3, :3] = [[0, -x[5], x[4]], [x[5], 0, -x[3]], [-x[4], x[3], 0]]
        twist[:3, 3] = x[:3]
        assert got == pytest.approx(expm(twist), abs=1e-10)  # matrix exponential of ξ^
    r = Rotation.from_rotvec(xi[2:, 3:]).as_matrix()
    assert rotation_angle(torch.tensor(r)).numpy() == pytest.approx(
        np.linalg.norm(xi[2:, 3:], axis=1) % (2 * np.pi), abs=1e-9)


def test_soft_silhouette_matches_mujoco_ray_casting(scene):
    """Hard IoU of our soft union mask vs an independent renderer (MuJoCo ray casting, its
    own FK) at the true camera and state."""
    cam = load_camera("so101_front")
    q = _states(6, seed=11)
    labels = RayCastRenderer("so101", cam).render(q)
    assert (labels > 0).mean() > 0.03  # the arm is in view
    out = SilhouetteRenderer(scene)(torch.tensor(q, dtype=torch.float32), cam)
    iou = hard_iou(out["mask"], torch.tensor(labels > 0, dtype=torch.float32))
    assert iou.min().item() >= 0.9, iou
    # Per link, where nothing occludes it (the base, under the arm), it is the same shape.
    base = hard_iou(out["link"][:, 0], torch.tensor(labels == 1, dtype=torch.float32))
    assert base.min().item() >= 0.7, base


def test_loss_gradient_wrt_extrinsic_matches_finite_differences(scene):
    cam = load_camera("so101_front").at_resolution(40, 30)
    q = torch.tensor(_states(2, seed=5), dtype=torch.float64)
    target = torch.tensor(RayCastRenderer("so101", cam).render(q.numpy()) > 0,
                          dtype=torch.float64)
    renderer = SilhouetteRenderer(scene)
    with torch.no_grad():
        cam.xi.copy_(torch.tensor([0.01, -0.008, 0.005, 0.02, -0.015, 0.01]))

    def loss() -> torch.Tensor:
        return soft_iou_loss(renderer(q, cam, sigma=1.5)["mask"], target)

    cam.xi.grad = None
    loss().backward()
    grad = cam.xi.grad.clone()
    numeric = torch.zeros(6, dtype=torch.float64)
    h = 1e-6
    with torch.no_grad():
        for i in range(6):
            cam.xi[i] += h
            up = loss()
            cam.xi[i] -= 2 * h
            down = loss()
            cam.xi[i] += h
            numeric[i] = (up - down) / (2 * h)
    assert grad.abs().max() > 0.05  # the loss does depend on the pose
    assert grad.numpy() == pytest.approx(numeric.numpy(), rel=1e-4, abs=1e-6)


def _render_and_grads(device: str, q: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Soft mask, dloss/dq and dloss/dxi of the SO-101 at ``q`` through so101_front (80x60),
    against the ray caster's masks, computed on ``device``; returned on the CPU."""
    cam = load_camera("so101_front").at_resolution(80, 60)
    target = torch.tensor(RayCastRenderer("so101", cam).render(q) > 0, dtype=torch.float32)
    cam = cam.to(device)
    renderer = SilhouetteRenderer(ArmScene("so101"), device=device)
    qt = torch.tensor(q, dtype=torch.float32, device=device, requires_grad=True)
    mask = renderer(qt, cam, sigma=1.0)["mask"]
    soft_iou_loss(mask, target.to(device)).backward()
    return mask.detach().cpu(), qt.grad.cpu(), cam.xi.grad.cpu()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (CPU-only machine)")
def test_the_silhouette_renderer_runs_on_cuda_like_on_cpu():
    """Issue 20: one renderer for CPU and CUDA. The same states give the same soft masks and
    the same gradients (joints and camera extrinsic) on both devices, to float32 rounding."""
    q = _states(4, seed=3)
    cpu, gpu = _render_and_grads("cpu", q), _render_and_grads("cuda", q)
    assert cpu[0].sum() > 100  # the arm is in view
    torch.testing.assert_close(gpu[0], cpu[0], rtol=0, atol=1e-4)
    for a, b in zip(gpu[1:], cpu[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_calibrate_raises_the_iou_from_a_perturbed_camera(scene):
    """A small case (2 frames, 30 iterations): silhouettes alone pull a camera that is 2 cm /
    2 deg off back onto the masks. Few frames constrain depth weakly, so this asserts the IoU;
    the pose error is the slow test's."""
    from nactuator.vision.calibrate import calibrate_extrinsic, mask_iou, perturb_camera

    truth = load_camera("so101_front")
    q = torch.tensor(_states(2, seed=2), dtype=torch.float32)
    masks = torch.tensor(RayCastRenderer("so101", truth).render(q.numpy().astype(float)) > 0,
                         dtype=torch.float32)
    start = perturb_camera(truth, 0.02, 2.0, seed=4)
    before = mask_iou(scene, q, masks, start).mean()
    result = calibrate_extrinsic(scene, q, masks, start, iterations=30)
    after = mask_iou(scene, q, masks, result.camera).mean()
    assert before < 0.6 and after > 0.85, (before, after)


@pytest.mark.slow
def test_calibrate_recovers_the_camera_within_1cm_1deg():
    """The issue's target on clean masks: +-5 cm / 5 deg -> <= 1 cm / 1 deg (8 frames)."""
    from nactuator.vision.run import calibrate_synthetic

    r = calibrate_synthetic("so101_front", frames=8, held_out=4, seed=1, noise=False)
    assert r["final_error"]["translation_m"] <= 0.01, r
    assert r["final_error"]["rotation_deg"] <= 1.0, r
    assert r["iou_held_out_after"] >= 0.9, r


@pytest.mark.slow
def test_calibrate_from_noisy_masks_within_1cm_1deg():
    """The issue's target with the default mask noise (jitter, erosion/dilation, occluders,
    missed frames) at the default 16 frames: +-5 cm / 5 deg -> <= 1 cm / 1 deg (~100 CPU s).
    At 8 frames this seed stopped at 3 cm / 2 deg (docs/vision.md)."""
    from nactuator.vision.run import calibrate_synthetic

    r = calibrate_synthetic("so101_front", held_out=4, seed=0, noise=True)
    assert r["frames"] == 16
    assert r["final_error"]["translation_m"] <= 0.01, r
    assert r["final_error"]["rotation_deg"] <= 1.0, r


def test_bad_camera_file_names_the_field(tmp_path):
    from nactuator.errors import UserError

    with pytest.raises(UserError, match="does not exist"):
        load_camera(tmp_path / "none.yaml")
    bad = tmp_path / "cam.yaml"
    bad.write_text("intrinsics: {width: 160, height: 120, fx: 100, fy: 100, cx: 80}\n"
                   "extrinsic: {look_at: {eye: [1, 0, 0], target: [0, 0, 0]}}\n")
    with pytest.raises(UserError, match=r"cam\.yaml: intrinsics needs .*cy"):
        load_camera(bad)
    bad.write_text("intrinsics: {width: 160, height: 120, fx: 100, fy: 100, cx: 80, cy: 60}\n"
                   "extrinsic: {T_cb: [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]}\n")
    with pytest.raises(UserError, match="not orthonormal"):
        load_camera(bad)
