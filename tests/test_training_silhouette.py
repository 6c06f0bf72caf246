"""Training from silhouettes (issue 20 item 5): the DataModule serves each frame's mask, the
silhouette loss's gradient reaches the actuator's weights through renderer -> FK ->
simulator, and a weight of 0 leaves the objective exactly as it was."""

from __future__ import annotations

import re
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
from nactuator.training.objective import rollout_losses, silhouette_loss, silhouette_steps
from nactuator.vision.masks import render_masks

W, H = 40, 30  # the front camera at a quarter of 160x120 (same field of view)
L = 9


def _tiny_camera(source: str, name: str, folder: Path) -> Path:
    """``source`` (a camera of conf/vision/cameras) at W x H, same field of view."""
    cfg = yaml.safe_load(Path(f"conf/vision/cameras/{source}.yaml").read_text())
    k = cfg["intrinsics"]
    s = W / k["width"]
    cfg["name"] = name
    cfg["intrinsics"] = {"width": W, "height": H, "fx": k["fx"] * s, "fy": k["fy"] * s,
                         "cx": k["cx"] * s, "cy": k["cy"] * s}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def camera_file(tmp_path_factory) -> Path:
    return _tiny_camera("so101_front", "tiny", tmp_path_factory.mktemp("cam"))


@pytest.fixture(scope="module")
def side_camera_file(tmp_path_factory) -> Path:
    return _tiny_camera("so101_side", "tiny_side", tmp_path_factory.mktemp("cam"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, camera_file, side_camera_file) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sil") / "ds"
    synthesize("so101", str(root), seed=3, trajectories_per_task=2, seconds=1.0,
               tasks=["circular_cw"])
    # masks on every 3rd frame of episode 0 only: episode 1 has none
    render_masks(str(root), str(camera_file), every=3, state="stored", episodes=[0])
    # a second camera on other frames (every 2nd) and of both episodes
    render_masks(str(root), str(side_camera_file), every=2, state="stored", episodes=[0, 1])
    return root


def _dm(dataset: Path, masks: bool, **kw) -> NADDataModule:
    kw.setdefault("masks_camera", "tiny" if masks else None)
    return NADDataModule(str(dataset), "so101", window_length=L, horizon=12, batch_size=6,
                         seed=0, **kw)


def _check_masks(batch: dict, dataset: Path, episodes: list, frame0: np.ndarray,
                 camera: str = "tiny", keyed: bool = False) -> int:
    """Every frame of every row against read_episode_masks of ``camera`` (batch keys
    suffixed with its name when ``keyed``); returns the masks checked."""
    masks, index, valid = ((f"masks.{camera}", f"mask_index.{camera}", f"mask_valid.{camera}")
                           if keyed else ("masks", "mask_index", "mask_valid"))
    with_masks = {0} if camera == "tiny" else {0, 1}  # what the dataset fixture rendered
    checked = 0
    for b in range(batch["q"].shape[0]):
        info = episodes[int(batch["episode_index"][b])]
        m = (read_episode_masks(dataset, info.dataset_episode, camera)
             if info.dataset_episode in with_masks else None)
        for t in range(batch["q"].shape[1]):
            frame = int(frame0[b]) + t
            if "length" in batch:
                frame = min(frame, int(batch["length"][b]) - 1)
            have = m is not None and frame >= 0 and bool(m.valid[frame])
            assert bool(batch[valid][b, t]) == have, (b, t, frame)
            assert (int(batch[index][b, t]) >= 0) == have
            if have:
                assert torch.equal(batch[masks][batch[index][b, t]], m.masks[frame])
                checked += 1
    assert batch[masks].shape[0] == int(batch[valid].sum())
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
    assert list(dm.masks_camera_files) == ["tiny"]
    assert dm.masks_camera_files["tiny"].name == "camera.yaml"


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
    with pytest.raises(DataFormatError, match="so101_side.*it has: tiny, tiny_side"):
        dm.norm_stats  # noqa: B018 (loading is what fails)
    # in a list too, after a camera that is there
    dm = NADDataModule(str(dataset), "so101", horizon=12, masks_camera=["tiny", "so101_side"])
    missing = re.escape(f"{dataset}: no masks of camera 'so101_side'")
    with pytest.raises(DataFormatError, match=missing):
        dm.norm_stats  # noqa: B018
    for bad in ([], ["tiny", "tiny"], ["tiny", ""]):
        with pytest.raises(ValueError, match="masks_camera"):
            NADDataModule(str(dataset), "so101", horizon=12, masks_camera=bad)


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
    render = module.silhouette_renderer(dm.masks_camera_files["tiny"], torch.device("cpu"))
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


def test_two_cameras_are_served_under_their_own_keys(dataset):
    dm = _dm(dataset, masks=False, masks_camera=["tiny", "tiny_side"])
    batch = next(iter(dm.train_dataloader()))
    frame0 = (batch["start"] - (L - 1)).numpy()
    keys = {f"{k}.{c}" for k in ("masks", "mask_index", "mask_valid")
            for c in ("tiny", "tiny_side")}
    plain = _dm(dataset, masks=False)
    assert set(batch) - set(next(iter(plain.train_dataloader()))) == keys
    for camera in ("tiny", "tiny_side"):
        assert batch[f"masks.{camera}"].shape[1:] == (H, W)
        assert batch[f"mask_index.{camera}"].shape == batch["q"].shape[:2]
        assert _check_masks(batch, dataset, dm.episodes, frame0, camera, keyed=True) > 0
        whole = dm.split_episodes("train")
        _check_masks(whole, dataset, dm.episodes, np.full(whole["q"].shape[0], -(L - 1)),
                     camera, keyed=True)
    assert list(dm.masks_camera_files) == ["tiny", "tiny_side"]
    # the cameras' masks differ (other views, other frames): no key serves the other's
    assert not torch.equal(batch["mask_valid.tiny"], batch["mask_valid.tiny_side"])
    # a list of one camera is served exactly like its plain name
    one, named = _dm(dataset, masks=False, masks_camera=["tiny"]), _dm(dataset, masks=True)
    a, b = next(iter(one.train_dataloader())), next(iter(named.train_dataloader()))
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_two_camera_loss_is_the_mean_of_each_cameras_loss(dataset):
    weights = LossWeights(w_pos=0, w_grip=0, w_vel=0, w_force=0, w_gate=0, w_cond=0,
                          w_silhouette=1.0, silhouette_sigma=2.0)
    module, _ = _module(dataset, weights)
    module.actuator.eval()
    both = _dm(dataset, masks=False, masks_camera=["tiny", "tiny_side"])
    front = _dm(dataset, masks=False, masks_camera="tiny")
    side = _dm(dataset, masks=False, masks_camera="tiny_side")
    for dm in (both, front, side):
        dm._load()
    renders = {c: module.silhouette_renderer(f, torch.device("cpu"))
               for c, f in both.masks_camera_files.items()}
    assert renders["tiny"] is not renders["tiny_side"]  # one renderer per camera file

    def losses(episode: int) -> tuple[float, float | None, float]:
        ep = next(e for e in both.episodes if e.dataset_episode == episode)
        starts = both._first[ep.index] + np.array([0, 5, 20]) - (L - 1)
        with torch.no_grad():
            r = module(both._gather(starts, 12))  # the rollout does not read the masks
            two = float(silhouette_loss(r, both._gather(starts, 12), renders, L))
            # each camera alone, from its own single-camera DataModule (plain keys)
            b_front, b_side = front._gather(starts, 12), side._gather(starts, 12)
            one_side = float(silhouette_loss(r, b_side, renders["tiny_side"], L))
            has_front = bool((b_front["mask_index"][:, L:] >= 0).any())
            one_front = (float(silhouette_loss(r, b_front, renders["tiny"], L))
                         if has_front else None)
        return two, one_front, one_side

    two, one_front, one_side = losses(0)  # both cameras have masks in these segments
    assert one_front is not None and one_front != pytest.approx(one_side, abs=1e-4)
    assert two == pytest.approx((one_front + one_side) / 2, rel=1e-6)
    # episode 1 has masks of the side camera only: the mean is over the cameras seen
    two, one_front, one_side = losses(1)
    assert one_front is None and two == pytest.approx(one_side, rel=1e-6) and two > 0


def test_command_prior_scores_the_rollout_against_the_commands(dataset):
    base = LossWeights(w_silhouette=0)
    prior = LossWeights(w_silhouette=0, w_command=3.0)
    module, dm = _module(dataset, base)
    module.actuator.eval()
    batch = _episode0_batch(dm)
    with torch.no_grad():
        r = module(batch)
        args = (L, module.revolute, module.prismatic, module.platform.control_dt)
        a = rollout_losses(r, batch, base, *args)
        b = rollout_losses(r, batch, prior, *args)
    # independently: Huber (beta 1) of the revolute joints after step i against q_cmd of
    # the frame the step started from, summed over joints, mean over the steps
    steps = r.q.shape[1] - 1
    e = (r.q[:, 1:] - batch["q_cmd"][:, L - 1 : L - 1 + steps])[..., module.revolute]
    expect = torch.where(e.abs() < 1, 0.5 * e**2, e.abs() - 0.5).sum(-1).mean()
    assert "command" not in a and float(b["command"]) == pytest.approx(float(expect), rel=1e-6)
    assert float(b["loss"]) == pytest.approx(float(a["loss"]) + 3.0 * float(expect), rel=1e-6)
    assert float(expect) > 0
    # tied to one joint by name: only that channel's term
    roll = LossWeights(w_silhouette=0, w_command=3.0, command_joints=["wrist_roll"])
    tied = NeuralActuatorModule("so101", arch="mlp", width=16, depth=1, loss=roll)
    channel = module.platform.channel_names.index("wrist_roll")
    assert tied.command_prior == [channel]
    with torch.no_grad():
        c = rollout_losses(r, batch, roll, *args, command=tied.command_prior)
    e = e[..., module.revolute.index(channel)]
    expect = torch.where(e.abs() < 1, 0.5 * e**2, e.abs() - 0.5).mean()
    assert float(c["command"]) == pytest.approx(float(expect), rel=1e-6)
    with pytest.raises(ValueError, match="command_joints.*elbow.*elbow_flex"):
        NeuralActuatorModule("so101", arch="mlp", width=16, depth=1,
                             loss=LossWeights(w_command=1.0, command_joints=["elbow"]))
