"""Masks beside a dataset (issue 20 items 3 and 6): render-masks -> store -> load round trip,
the PNG importer's alignment and its errors, datasets without masks, overlays."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from nactuator.data import DataFormatError, read_dataset
from nactuator.data.masks import mask_cameras, read_episode_masks
from nactuator.data.synth import synthesize
from nactuator.vision.camera import load_camera
from nactuator.vision.masks import MaskImportError, import_masks, overlay, render_masks
from nactuator.vision.noise import MaskNoise
from nactuator.vision.raycast import RayCastRenderer

W, H = 40, 30  # tiny: the front camera at a quarter of 160x120 (same field of view)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("masks") / "ds"
    synthesize("so101", str(root), seed=3, trajectories_per_task=2, seconds=1.0,
               tasks=["circular_cw"])
    return root


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


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_render_store_load_round_trip(dataset, camera_file, tmp_path):
    ds_path = _copy(dataset, tmp_path / "ds")
    r = render_masks(str(ds_path), str(camera_file), every=3, state="stored")
    ds = read_dataset(ds_path)
    assert mask_cameras(ds_path) == ["tiny"]
    assert r["masks_stored"] == sum(len(range(0, e.length, 3)) for e in ds.episodes)
    ray = RayCastRenderer("so101", load_camera(camera_file))
    for ep in ds.episodes:
        got = read_episode_masks(ds_path, ep.index)
        frames = np.arange(0, ep.length, 3)
        # (T, H, W) over the whole episode, True only where a mask is stored
        assert got.masks.shape == (ep.length, H, W) and got.masks.dtype == torch.bool
        assert got.valid.nonzero().flatten().tolist() == frames.tolist()
        expect = ray.render(ep.frames["q"][frames].astype(np.float64)) > 0
        assert np.array_equal(got.masks[frames].numpy(), expect)
        assert not got.masks[~got.valid].any()
        assert got.time == pytest.approx(ep.frames["timestamp"][frames])
        assert got.meta["state"] == "stored" and got.meta["every"] == 3
        assert expect.any(axis=(1, 2)).all()  # the arm is in view: the check is not vacuous
    # the camera file travels with the masks
    assert got.camera_file.read_text() == camera_file.read_text()
    # the dataset itself reads exactly as before
    assert np.array_equal(read_dataset(ds_path).frames["q"], read_dataset(dataset).frames["q"])
    from nactuator.data.info import describe

    assert (f"observation.masks.tiny ({W}x{H}): {len(ds.episodes)} episode(s), "
            f"{r['masks_stored']} masks (render-masks)") in describe(ds_path)


def test_true_state_is_the_worlds_unquantised_position(dataset, camera_file, tmp_path):
    from nactuator.vision.masks import episode_states

    ds = read_dataset(dataset)
    true = episode_states(ds, [0], "true")[0]
    q = ds.episodes[0].frames["q"]
    # the stored q is the encoder's reading of the true position: within half a count
    half_count = np.pi / 4096
    assert np.abs(true - q).max() <= half_count * 1.001
    assert np.abs(true - q).max() > 0  # and not the same numbers
    # an edited dataset no longer regenerates: refused, not silently re-rendered
    import pyarrow.parquet as pq

    edited = _copy(dataset, tmp_path / "edited")
    f = next((edited / "data").rglob("*.parquet"))
    table = pq.read_table(f)
    state = np.array(table["observation.state"].to_pylist(), dtype=np.float32)
    state[5, 0] += 0.01
    import pyarrow as pa

    i = table.schema.get_field_index("observation.state")
    table = table.set_column(i, table.schema.field(i),
                             pa.array(state.tolist(), type=table.schema.field(i).type))
    pq.write_table(table, f)
    with pytest.raises(DataFormatError, match="does not reproduce the stored q"):
        episode_states(read_dataset(edited), [0], "true")


def test_noise_drops_missed_frames_and_is_seeded(dataset, camera_file, tmp_path):
    noise = MaskNoise(boundary_flip=0.3, morph=0.0, occlusion=0.0, missed=0.5)
    a = _copy(dataset, tmp_path / "a")
    r = render_masks(str(a), str(camera_file), noise=noise, episodes=[1], state="stored")
    got = read_episode_masks(a, 1)
    assert r["missed"] == int((~got.valid).sum()) and 0 < r["missed"] < got.masks.shape[0]
    b = _copy(dataset, tmp_path / "b")
    render_masks(str(b), str(camera_file), noise=noise, episodes=[1], state="stored")
    assert torch.equal(read_episode_masks(b, 1).masks, got.masks)
    # only episode 1 was rendered
    with pytest.raises(DataFormatError, match="no masks of episode 0"):
        read_episode_masks(a, 0)


def test_dataset_without_masks_reads_unchanged(dataset):
    assert mask_cameras(dataset) == []
    from nactuator.data.info import describe

    assert "observation.masks" not in describe(dataset)
    assert read_dataset(dataset).episodes[0].length > 0
    with pytest.raises(DataFormatError, match="has no masks"):
        read_episode_masks(dataset, 0)


def _write_pngs(folder: Path, masks: np.ndarray, names: list[str], level: int = 255) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for m, name in zip(masks, names, strict=True):
        Image.fromarray((m * level).astype(np.uint8)).save(folder / name)


def test_import_aligns_by_nearest_timestamp(dataset, camera_file, tmp_path):
    ds_path = _copy(dataset, tmp_path / "ds")
    ep = read_dataset(ds_path).episodes[0]
    ts = ep.frames["timestamp"].astype(np.float64)
    rng = np.random.default_rng(0)
    frames = np.array([2, 7, 11, 30, 45])
    masks = rng.random((len(frames), H, W)) < 0.3
    names = [f"sam_{i:03d}.png" for i in range(len(frames))]
    _write_pngs(tmp_path / "pngs", masks, names)
    # the video clock starts 2.5 s before the episode; each image 3 ms off its frame
    offset = 2.5
    with open(tmp_path / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["file", "time"])
        for name, j in zip(names[::-1], frames[::-1], strict=True):  # order must not matter
            w.writerow([name, ts[j] + offset + 0.003])
    r = import_masks(str(ds_path), 0, str(tmp_path / "pngs"), str(camera_file),
                     timestamps=str(tmp_path / "t.csv"), offset=offset)
    got = read_episode_masks(ds_path, 0)
    assert got.frame_index.tolist() == frames.tolist()
    assert np.array_equal(got.masks[frames].numpy(), masks)
    assert r["max_alignment_error_ms"] == pytest.approx(3.0, abs=1e-6)
    assert got.time == pytest.approx(ts[frames] + 0.003)
    # times from the file names: frame numbers of a 62.3 fps... here a 20 fps video
    names = [f"{n:05d}.png" for n in (0, 4, 9)]
    _write_pngs(tmp_path / "byname", masks[:3], names, level=1)
    import_masks(str(ds_path), 1, str(tmp_path / "byname"), str(camera_file), video_fps=20.0,
                 tolerance=0.01)
    ts1 = read_dataset(ds_path).episodes[1].frames["timestamp"]
    expect = [int(np.argmin(np.abs(ts1 - n / 20.0))) for n in (0, 4, 9)]
    assert read_episode_masks(ds_path, 1).frame_index.tolist() == expect


def test_import_errors_name_the_file(dataset, camera_file, tmp_path):
    ds_path = _copy(dataset, tmp_path / "ds")
    ts = read_dataset(ds_path).episodes[0].frames["timestamp"].astype(np.float64)
    good = np.zeros((H, W), dtype=bool)
    good[10:20, 10:30] = True

    def run(folder, rows, **kw):
        with open(tmp_path / "t.csv", "w", newline="") as f:
            csv.writer(f).writerows([["file", "time"], *rows])
        return import_masks(str(ds_path), 0, str(folder), str(camera_file),
                            timestamps=str(tmp_path / "t.csv"), **kw)

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    Image.fromarray(np.zeros((H + 1, W), np.uint8)).save(wrong / "a.png")
    with pytest.raises(MaskImportError, match=rf"a\.png: {W}x{H + 1} pixels, the camera is "
                                              rf"{W}x{H}"):
        run(wrong, [["a.png", ts[0]]])
    grey = tmp_path / "grey"
    grey.mkdir()
    Image.fromarray(np.arange(H * W, dtype=np.uint8).reshape(H, W)).save(grey / "g.png")
    with pytest.raises(MaskImportError, match=r"g\.png: not a binary mask"):
        run(grey, [["g.png", ts[0]]])
    ok = tmp_path / "ok"
    _write_pngs(ok, np.stack([good, good]), ["m0.png", "m1.png"])
    with pytest.raises(MaskImportError, match=r"no timestamp for 1 mask file\(s\), e.g. m1\.png"):
        run(ok, [["m0.png", ts[0]]])
    with pytest.raises(MaskImportError, match=r"m1\.png: time 9\.0000 s .* the episode spans"):
        run(ok, [["m0.png", ts[0]], ["m1.png", 9.0]])
    with pytest.raises(MaskImportError, match=r"m1\.png and .*m0\.png both align to frame 3"):
        run(ok, [["m0.png", ts[3]], ["m1.png", ts[3] + 0.001]])
    with pytest.raises(MaskImportError, match="either --timestamps"):
        import_masks(str(ds_path), 0, str(ok), str(camera_file))
    # nothing was stored by the failed imports
    assert mask_cameras(ds_path) == []


def test_overlay_writes_pngs_of_the_scaled_size(dataset, camera_file, tmp_path):
    ds_path = _copy(dataset, tmp_path / "ds")
    render_masks(str(ds_path), str(camera_file), episodes=[0], state="stored")
    r = overlay(str(ds_path), 0, [0, 20], str(tmp_path / "ov"), state="stored", scale=3)
    for f in r["files"]:
        with Image.open(f) as im:
            assert im.size == (3 * W, 3 * H) and im.mode == "RGB"
    with Image.open(r["sheet"]) as im:
        assert im.size == (2 * 3 * W, 3 * H)
    # our soft renderer vs the ray caster at the state the masks were rendered from
    assert min(r["iou"]) > 0.7
    with pytest.raises(Exception, match=r"--frames \[999\]"):
        overlay(str(ds_path), 0, [999], str(tmp_path / "ov"))


def test_overlay_of_the_model_state_is_the_models_rollout(dataset, camera_file, tmp_path):
    from nactuator.vision.masks import model_states

    ds_path = _copy(dataset, tmp_path / "ds")
    render_masks(str(ds_path), str(camera_file), episodes=[0], state="stored")
    ds = read_dataset(ds_path)
    q_model = model_states("pretrained/so101", ds, 0)
    q = ds.episodes[0].frames["q"]
    # the rollout starts at the recorded state and then follows the model, not the record
    assert q_model.shape == q.shape
    assert q_model[0] == pytest.approx(q[0], abs=1e-6)
    assert np.abs(q_model[1:] - q[1:]).max() > 1e-4
    r = overlay(str(ds_path), 0, [40], str(tmp_path / "ov"), ckpt="pretrained/so101")
    # the IoU is the one of the soft silhouette at the model's state, not at the stored one
    from nactuator.vision.scene import ArmScene
    from nactuator.vision.silhouette import SilhouetteRenderer, hard_iou

    with torch.no_grad():
        soft = SilhouetteRenderer(ArmScene("so101"))(
            torch.tensor(q_model[[40]], dtype=torch.float32), load_camera(camera_file))["mask"]
    expect = hard_iou(soft, read_episode_masks(ds_path, 0).masks[[40]].float()).item()
    assert r["iou"][0] == pytest.approx(expect)
    assert r["state"] == "model pretrained/so101"


def test_cli_errors_are_one_line(dataset, camera_file, tmp_path, capsys):
    from nactuator.cli import main

    cases = [
        (["vision", "render-masks", "--data", str(dataset), "--camera", str(camera_file),
          "--episodes", "0,x"], "--episodes '0,x': expected episode indices"),
        (["vision", "render-masks", "--data", str(dataset), "--camera", str(camera_file),
          "--episodes", "9"], "no episode 9 (it has 0..1)"),
        (["vision", "render-masks", "--data", str(dataset), "--camera", "omx_nowhere"],
         "omx_nowhere.yaml does not exist"),
        (["vision", "overlay", "--data", str(dataset), "--episode", "0", "--frames", "1",
          "--out", str(tmp_path / "o")], "has no masks"),
        (["vision", "import-masks", "--data", str(dataset), "--episode", "0", "--masks",
          str(tmp_path / "none"), "--camera", str(camera_file), "--video-fps", "30"],
         "none does not exist"),
    ]
    for argv, says in cases:
        assert main(argv) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and says in err[0], (argv, err)


def test_side_camera_sees_the_wrist_roll_the_front_camera_does_not(dataset):
    # conf/vision/cameras/so101_side.yaml exists for what so101_front barely sees (docs/
    # results.md §11.3/§11.4). Judged by MuJoCo ray casting, not by our soft renderer: the
    # pixels that flip when the wrist rolls 10° (and the shoulder pans 5°) at stored states.
    q = read_dataset(dataset).episodes[0].frames["q"][::20].astype(np.float64)
    names = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll"]
    changed = {}
    for camera in ("so101_front", "so101_side"):
        ray = RayCastRenderer("so101", load_camera(camera))
        base = ray.render(q) > 0
        assert base.any(axis=(1, 2)).all()  # the arm is in view of both
        for joint, degrees in (("wrist_roll", 10.0), ("shoulder_pan", 5.0)):
            moved = q.copy()
            moved[:, names.index(joint)] += np.deg2rad(degrees)
            changed[camera, joint] = int(((ray.render(moved) > 0) != base).sum())
    # 178 vs 66 and 1308 vs 488 pixels when written (3 frames of circular_cw at 160x120)
    assert changed["so101_side", "wrist_roll"] > 2 * changed["so101_front", "wrist_roll"]
    assert changed["so101_side", "shoulder_pan"] > 2 * changed["so101_front", "shoulder_pan"]
