"""Training from silhouettes (issue 20 item 5): the DataModule serves each frame's mask, the
silhouette loss's gradient reaches the actuator's weights through renderer -> FK ->
simulator, and a weight of 0 leaves the objective exactly as it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from nactuator.data import DataFormatError
from nactuator.data.datamodule import NADDataModule
from nactuator.data.masks import read_episode_masks
from nactuator.data.synth import synthesize
from nactuator.training.losses import LossWeights
from nactuator.training.module import NeuralActuatorModule
from nactuator.training.objective import rollout_losses, silhouette_steps
from nactuator.vision.masks import render_masks

W, H = 40, 30  # the front camera at a quarter of 160x120 (same field of view)
L = 9


@pytest.fixture(scope="module")
def camera_file(tmp_path_factory) -> Path:
    cfg = yaml.safe_load(Path("conf/vision/cameras/so101_front.yaml").read_text())
    k = cfg["intrinsics"]
    s = W / k["width"]
    cfg["name"] = "tiny"
    cfg["intrinsics"] = {"width": W, "height": H, "fx": k["fx"] * s, "fy": k["fy"] * s,
                         "cx": k["cx"] * s, "cy": k["cy"] * s}
    path = tmp_path_factory.mktemp("cam") / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, camera_file) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sil") / "ds"
    synthesize("so101", str(root), seed=3, trajectories_per_task=2, seconds=1.0,
               tasks=["circular_cw"])
    # masks on every 3rd frame of episode 0 only: episode 1 has none
    render_masks(str(root), str(camera_file), every=3, state="stored", episodes=[0])
    return root


def _dm(dataset: Path, masks: bool, **kw) -> NADDataModule:
    return NADDataModule(str(dataset), "so101", window_length=L, horizon=12, batch_size=6,
                         seed=0, masks_camera="tiny" if masks else None, **kw)


def _check_masks(batch: dict, dataset: Path, episodes: list, frame0: np.ndarray) -> int:
    """Every frame of every row against read_episode_masks; returns the masks checked."""
    checked = 0
    for b in range(batch["q"].shape[0]):
        info = episodes[int(batch["episode_index"][b])]
        m = (read_episode_masks(dataset, info.dataset_episode, "tiny")
             if info.dataset_episode == 0 else None)
        for t in range(batch["q"].shape[1]):
            frame = int(frame0[b]) + t
            if "length" in batch:
                frame = min(frame, int(batch["length"][b]) - 1)
            have = m is not None and frame >= 0 and bool(m.valid[frame])
            assert bool(batch["mask_valid"][b, t]) == have, (b, t, frame)
            assert (int(batch["mask_index"][b, t]) >= 0) == have
            if have:
                assert torch.equal(batch["masks"][batch["mask_index"][b, t]], m.masks[frame])
                checked += 1
    return checked


def test_datamodule_serves_each_frames_mask(dataset):
    dm = _dm(dataset, masks=True)
    batch = next(iter(dm.train_dataloader()))
    assert batch["masks"].dtype == torch.bool and batch["masks"].shape[1:] == (H, W)
    assert batch["masks"].shape[0] == int(batch["mask_valid"].sum())
    frame0 = (batch["start"] - (L - 1)).numpy()
    checked = _check_masks(batch, dataset, dm.episodes, frame0)
    assert checked > 0
    # padding frames never have a mask
    assert not (batch["mask_valid"] & batch["pad"]).any()
    # whole episodes from frame 0 (validation / test) index the same way
    for split in ("validation", "test", "train"):
        if any(e.split == split for e in dm.episodes):
            whole = dm.split_episodes(split)
            _check_masks(whole, dataset, dm.episodes,
                         np.full(whole["q"].shape[0], -(L - 1)))
    assert dm.masks_camera_file is not None and dm.masks_camera_file.name == "camera.yaml"


def test_datamodule_without_masks_is_unchanged(dataset):
    plain = _dm(dataset, masks=False)
    with_masks = _dm(dataset, masks=True)
    a = next(iter(plain.train_dataloader()))
    b = next(iter(with_masks.train_dataloader()))
    assert not {"masks", "mask_index", "mask_valid"} & set(a)
    assert set(b) - set(a) == {"masks", "mask_index", "mask_valid"}
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_missing_camera_is_named(dataset):
    dm = NADDataModule(str(dataset), "so101", horizon=12, masks_camera="so101_side")
    with pytest.raises(DataFormatError, match="so101_side.*it has: tiny"):
        dm.norm_stats  # noqa: B018 (loading is what fails)


def test_silhouette_steps_take_every_kth_valid_step():
    valid = torch.tensor([[1, 0, 1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 1]], dtype=torch.bool)
    got = silhouette_steps(valid, 2)
    # valid steps of row 0: 0, 2, 3, 5, 6, 7 -> 1st, 3rd, 5th: 0, 3, 6; row 1: its only one
    assert got.nonzero().tolist() == [[0, 0], [0, 3], [0, 6], [1, 7]]


def _module(dataset, weights: LossWeights) -> tuple[NeuralActuatorModule, NADDataModule]:
    torch.manual_seed(0)
    dm = _dm(dataset, masks=True)
    module = NeuralActuatorModule("so101", arch="mlp", width=16, depth=1, loss=weights,
                                  warmup_steps=0)
    module.build_actuator(dm.norm_stats)
    return module, dm


def _episode0_batch(dm: NADDataModule) -> dict:
    """Segments of episode 0 (the one with masks) from a few starts."""
    ep = next(e for e in dm.episodes if e.dataset_episode == 0)
    starts = dm._first[ep.index] + np.array([0, 5, 20, 31]) - (L - 1)
    return dm._gather(starts, 12)


def _loss(module, batch, render, weights) -> torch.Tensor:
    r = module(batch)
    return rollout_losses(r, batch, weights, L, module.revolute, module.prismatic,
                          module.platform.control_dt, render=render)["loss"]


def test_silhouette_gradient_reaches_the_actuator_through_the_simulator(dataset):
    # silhouette only: no joint, gripper, velocity, force, gate or condition term
    weights = LossWeights(w_pos=0, w_grip=0, w_vel=0, w_force=0, w_gate=0, w_cond=0,
                          w_silhouette=1.0, silhouette_sigma=2.0)
    module, dm = _module(dataset, weights)
    module.actuator.eval()  # no dropout: the finite differences see one function
    batch = _episode0_batch(dm)
    render = module.silhouette_renderer(dm.masks_camera_file, torch.device("cpu"))
    loss = _loss(module, batch, render, weights)
    assert 0 < float(loss.detach()) < 1
    params = dict(module.actuator.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    grads = {k: g for k, g in zip(params, grads, strict=True) if g is not None}
    assert grads and all(torch.isfinite(g).all() for g in grads.values())
    # Finite difference on the weight element with the largest gradient (float64 would
    # be cleaner, but the simulator is float32: a relative step of the loss ~1e-3).
    name, g = max(grads.items(), key=lambda kv: float(kv[1].abs().max()))
    assert float(g.abs().max()) > 0
    idx = np.unravel_index(int(g.abs().argmax()), g.shape)
    p, eps = params[name], 1e-3
    with torch.no_grad():
        base = float(p[idx])
        p[idx] = base + eps
        up = float(_loss(module, batch, render, weights))
        p[idx] = base - eps
        down = float(_loss(module, batch, render, weights))
        p[idx] = base
    fd = (up - down) / (2 * eps)
    assert fd == pytest.approx(float(g[idx]), rel=0.15), (name, idx)


def test_zero_silhouette_weight_changes_nothing(dataset):
    weights = LossWeights()  # w_silhouette = 0
    module, dm = _module(dataset, weights)
    plain = _dm(dataset, masks=False)
    plain._load()
    ep = next(e for e in dm.episodes if e.dataset_episode == 0)
    starts = dm._first[ep.index] + np.array([0, 5, 20]) - (L - 1)
    with_masks, without = dm._gather(starts, 12), plain._gather(starts, 12)

    def never(q):
        raise AssertionError("the renderer must not run with w_silhouette = 0")

    module.actuator.eval()  # no dropout: the two rollouts are the same computation
    with torch.no_grad():
        a = _loss(module, without, None, weights)
        b = _loss(module, with_masks, never, weights)
    assert float(a) == float(b) and float(a) > 0


def test_silhouette_weight_needs_masks(dataset):
    weights = LossWeights(w_silhouette=1.0)
    module, _ = _module(dataset, weights)
    plain = _dm(dataset, masks=False)
    plain._load()
    batch = plain._gather(np.array([0]), 12)
    with pytest.raises(ValueError, match="masks_camera"):
        _loss(module, batch, None, weights)
    with pytest.raises(ValueError, match="silhouette_every"):
        LossWeights(silhouette_every=0)
    with pytest.raises(ValueError, match="silhouette_sigma"):
        LossWeights(silhouette_sigma=0.0)
