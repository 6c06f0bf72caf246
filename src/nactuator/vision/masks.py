"""Masks beside a dataset (issue 20 items 3 and 6): ``vision render-masks`` (ground truth of
the synthetic world by ray casting), ``vision import-masks`` (a folder of PNG masks, e.g. SAM
masks of your own video, aligned to an episode by time) and ``vision overlay`` (rendered vs
observed contour). The storage itself is :mod:`nactuator.data.masks`.
"""

from __future__ import annotations

import csv
import re
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from scipy import ndimage

from nactuator.atomic import atomic_path
from nactuator.data import DataFormatError, Dataset, read_dataset
from nactuator.data.masks import MaskWriter, mask_cameras, read_episode_masks
from nactuator.errors import UserError
from nactuator.progress import progress_bar
from nactuator.vision.camera import Camera, CameraError, camera_path, load_camera
from nactuator.vision.noise import MaskNoise, add_mask_noise
from nactuator.vision.raycast import RayCastRenderer
from nactuator.vision.scene import ArmScene
from nactuator.vision.silhouette import SilhouetteRenderer, hard_iou

__all__ = ["MaskImportError", "episode_states", "import_masks", "overlay", "read_mask_png",
           "render_masks"]

STATES = ("true", "stored")


class MaskImportError(UserError, ValueError):
    """A mask file, its timestamps or their alignment is wrong; the message names the file."""


def _camera(camera: str | Path, ds: Dataset) -> tuple[Camera, str]:
    cam = load_camera(camera)
    if cam.platform != ds.platform:
        raise CameraError(f"{camera_path(camera)}: platform {cam.platform!r}, but the dataset "
                          f"{ds.root} is {ds.platform!r}")
    return cam, camera_path(camera).read_text()


def _episode(ds: Dataset, index: int):
    for ep in ds.episodes:
        if ep.index == index:
            return ep
    raise DataFormatError(f"{ds.root}: no episode {index} (it has 0..{len(ds.episodes) - 1})")


def episode_states(ds: Dataset, episodes: list[int], state: str) -> dict[int, np.ndarray]:
    """Joint positions (T, n) to render, per episode index: ``true`` = the synthetic world's
    exact positions (regenerated, :func:`nactuator.data.synth.true_joint_states`), ``stored``
    = the dataset's ``q`` (what the encoders read)."""
    if state not in STATES:
        raise UserError(f"state must be one of {STATES}, got {state!r}")
    if state == "stored":
        return {i: _episode(ds, i).frames["q"].astype(np.float64) for i in episodes}
    from nactuator.data.synth import true_joint_states

    positions = {ds.episodes[j].index: j for j in range(len(ds.episodes))}
    got = true_joint_states(ds, [positions[i] for i in episodes])
    return {ds.episodes[j].index: q for j, q in got.items()}


def model_states(ckpt: str, ds: Dataset, episode: int, device: str = "cpu") -> np.ndarray:
    """Joint positions (T, n) of our model's closed-loop rollout of ``episode`` from frame 0:
    the actuator model (checkpoint, bundle, ``pretrained/NAME`` or export) drives the
    simulator with the recorded commands, exactly as ``nactuator eval`` rolls it out."""
    from nactuator.data.episodes import filter_episode, load_split
    from nactuator.eval.protocol import episode_rollouts
    from nactuator.model_files import resolve_model_path
    from nactuator.models import load_model
    from nactuator.platforms import load_platform
    from nactuator.sim import Simulator

    actuator, meta = load_model(resolve_model_path(ckpt), map_location=device,
                                expect_platform=ds.platform)
    platform = load_platform(meta["platform"])
    pairs = load_split([ds], platform, None)
    ep = next((e for _, e in pairs if e.index == episode), None)
    if ep is None:
        raise DataFormatError(f"{ds.root}: no episode {episode}")
    ep = filter_episode(ep, meta["input_filters"])
    return episode_rollouts(actuator, Simulator(platform, device=device), [ep], device)[0].q


def _is_synthetic(ds: Dataset) -> bool:
    return bool((ds.info.get("nactuator", {}).get("metadata") or {}).get("synthetic"))


def render_masks(data: str, camera: str, noise: MaskNoise | None = None, every: int = 1,
                 state: str | None = None, episodes: list[int] | None = None,
                 seed: int = 0) -> dict:
    """Ray-cast masks of every ``every``-th frame of ``episodes`` (default all) and store
    them beside the dataset; ``state`` default: ``true`` for a synthetic dataset, else
    ``stored``. ``noise`` damages them (missed frames are not stored), seeded by ``seed`` +
    the episode index. Returns a report with the timings and the bytes written."""
    if not isinstance(every, int) or every < 1:
        raise UserError(f"--every must be a positive integer, got {every!r}")
    ds = read_dataset(data)
    cam, text = _camera(camera, ds)
    state = state or ("true" if _is_synthetic(ds) else "stored")
    chosen = [e.index for e in ds.episodes] if episodes is None else list(episodes)
    for i in chosen:
        _episode(ds, i)
    t0 = time.perf_counter()
    q_all = episode_states(ds, chosen, state)
    t_state = time.perf_counter() - t0
    ray = RayCastRenderer(ds.platform, cam)
    k = cam.intrinsics
    writer = MaskWriter(ds.root, cam.name, text, k.width, k.height)
    total = sum(len(range(0, _episode(ds, i).length, every)) for i in chosen)
    t_render = 0.0
    stored = missed = nbytes = 0
    seconds_of_data = 0.0
    with progress_bar(total=total, desc=f"render-masks {cam.name}", unit="frame",
                      disable=None) as bar:
        for i in chosen:
            ep = _episode(ds, i)
            frames = np.arange(0, ep.length, every)
            q = q_all[i][frames]
            masks = np.empty((len(frames), k.height, k.width), dtype=bool)
            for j in range(len(frames)):
                t = time.perf_counter()
                masks[j] = ray.render(q[j]) > 0
                t_render += time.perf_counter() - t
                bar.update(1)
            keep = np.ones(len(frames), dtype=bool)
            if noise is not None:
                damaged = add_mask_noise(masks, noise, seed=seed + i)
                keep = ~np.isnan(damaged).reshape(len(frames), -1).all(-1)
                masks = np.nan_to_num(damaged) > 0.5
            ts = ep.frames["timestamp"].astype(np.float64)
            meta = {"source": "render-masks", "renderer": "mujoco.mj_multiRay", "state": state,
                    "every": every, "noise": None if noise is None else asdict(noise),
                    "seed": seed + i, "missed": int((~keep).sum())}
            path = writer.write(i, ep.length, frames[keep], masks[keep], ts[frames[keep]], meta)
            stored += int(keep.sum())
            missed += int((~keep).sum())
            nbytes += path.stat().st_size
            seconds_of_data += ep.length / ds.fps
    minutes = seconds_of_data / 60
    return {"dataset": str(ds.root), "camera": cam.name, "folder": str(writer.folder),
            "resolution": [k.width, k.height], "state": state, "every": every,
            "noise": noise is not None, "episodes": len(chosen), "frames_rendered": total,
            "masks_stored": stored, "missed": missed, "state_seconds": t_state,
            "render_ms_per_frame": 1000 * t_render / max(1, total),
            "seconds": time.perf_counter() - t0, "bytes": nbytes,
            "minutes_of_data": minutes, "mb_per_minute": nbytes / 1e6 / max(minutes, 1e-9)}


def format_render_report(r: dict) -> str:
    return (f"stored {r['masks_stored']} masks of {r['episodes']} episode(s) "
            f"({r['frames_rendered']} frames rendered at {r['resolution'][0]}x"
            f"{r['resolution'][1]}, every {r['every']}, {r['state']} state, noise "
            f"{'on' if r['noise'] else 'off'}: {r['missed']} missed) in {r['folder']}; "
            f"ray casting {r['render_ms_per_frame']:.1f} ms/frame, {r['seconds']:.1f} s in all "
            f"({r['state_seconds']:.1f} s for the states); {r['bytes'] / 1e3:.0f} kB = "
            f"{r['mb_per_minute']:.3f} MB per minute of data")


# ---------------------------------------------------------------- import


def read_mask_png(path: Path, width: int, height: int) -> np.ndarray:
    """A binary PNG mask -> (H, W) bool. Any image mode; foreground = the non-zero value.
    Refuses a wrong size, a colour image whose channels differ, more than two grey levels."""
    try:
        with Image.open(path) as im:
            im.load()
            size, a = im.size, np.asarray(im.convert("RGBA") if im.mode == "P" else im)
    except OSError as e:
        raise MaskImportError(f"{path}: not a readable image: {e}") from None
    if size != (width, height):
        raise MaskImportError(f"{path}: {size[0]}x{size[1]} pixels, the camera is "
                              f"{width}x{height} (resize the masks or use a camera file of "
                              "their size)")
    if a.ndim == 3:
        colour = a[..., :3] if a.shape[-1] >= 3 else a[..., :1]
        if (colour != colour[..., :1]).any():
            raise MaskImportError(f"{path}: a colour image; expected a binary mask (one "
                                  "grey level on black)")
        a = colour[..., 0]
    levels = np.unique(a)
    if len(levels) > 2 or (len(levels) == 2 and levels[0] != 0):
        shown = ", ".join(str(v) for v in levels[:5].tolist())
        raise MaskImportError(f"{path}: not a binary mask: {len(levels)} grey levels "
                              f"({shown}{', ...' if len(levels) > 5 else ''}); expected 0 and "
                              "one other value (threshold it first)")
    return a > 0


_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def _times_from_csv(path: Path, files: list[Path]) -> dict[str, float]:
    if not path.is_file():
        raise MaskImportError(f"timestamps file {path} does not exist")
    out: dict[str, float] = {}
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        if rows.fieldnames is None or not {"file", "time"} <= set(rows.fieldnames):
            raise MaskImportError(f"{path}: expected a header with columns 'file' and 'time' "
                                  f"(seconds), got {rows.fieldnames}")
        for line, row in enumerate(rows, start=2):
            try:
                t = float(row["time"])
            except (TypeError, ValueError):
                t = float("nan")
            if not np.isfinite(t):
                raise MaskImportError(f"{path}: line {line}: time {row['time']!r} is not a "
                                      "finite number of seconds")
            out[Path(row["file"]).name] = t
    names = {p.name for p in files}
    missing = [p.name for p in files if p.name not in out]
    if missing:
        raise MaskImportError(f"{path}: no timestamp for {len(missing)} mask file(s), e.g. "
                              f"{missing[0]}")
    extra = sorted(set(out) - names)
    if extra:
        raise MaskImportError(f"{path}: timestamp for a file that is not in the mask folder: "
                              f"{extra[0]}")
    return out


def _times_from_names(files: list[Path], fps: float) -> dict[str, float]:
    out = {}
    for p in files:
        m = _NUMBER.search(p.stem)
        if m is None:
            raise MaskImportError(f"{p}: no frame number in the file name (expected e.g. "
                                  "00042.png); give --timestamps CSV instead")
        out[p.name] = int(m.group(1)) / fps
    return out


def import_masks(data: str, episode: int, masks: str, camera: str,
                 timestamps: str | None = None, video_fps: float | None = None,
                 offset: float = 0.0, tolerance: float | None = None) -> dict:
    """Align a folder of PNG masks to episode ``episode`` and store them beside the dataset.

    A mask's time is its ``time`` column in the ``timestamps`` CSV (``file,time``, seconds),
    or its file name's last number divided by ``video_fps`` (``00042.png`` at 30 fps: 1.4 s),
    minus ``offset`` (the video time of the episode's first frame). Each goes to the frame
    of nearest ``timestamp``; farther than ``tolerance`` (default: half the episode's median
    frame period) is an error naming the file, as are two masks on one frame."""
    ds = read_dataset(data)
    ep = _episode(ds, episode)
    cam, text = _camera(camera, ds)
    k = cam.intrinsics
    folder = Path(masks)
    if not folder.is_dir():
        raise MaskImportError(f"mask folder {folder} does not exist")
    files = sorted(folder.glob("*.png"))
    if not files:
        raise MaskImportError(f"{folder}: no *.png masks")
    if (timestamps is None) == (video_fps is None):
        raise MaskImportError("give either --timestamps CSV (columns file, time) or "
                              "--video-fps (times from the frame numbers in the file names)")
    if video_fps is not None and not (video_fps > 0 and np.isfinite(video_fps)):
        raise MaskImportError(f"--video-fps must be a positive number, got {video_fps!r}")
    times = (_times_from_csv(Path(timestamps), files) if timestamps is not None
             else _times_from_names(files, float(video_fps)))
    ts = ep.frames["timestamp"].astype(np.float64)
    period = float(np.median(np.diff(ts))) if len(ts) > 1 else 1.0 / ds.fps
    tol = 0.5 * period if tolerance is None else float(tolerance)
    order = sorted(files, key=lambda p: times[p.name])
    frame_of: dict[int, Path] = {}
    rows = []
    for p in order:
        t = times[p.name] - offset
        j = int(np.argmin(np.abs(ts - t)))
        gap = abs(ts[j] - t)
        if gap > tol:
            raise MaskImportError(
                f"{p}: time {t:.4f} s (after the offset) is {1000 * gap:.1f} ms from the "
                f"nearest frame of episode {episode} (tolerance {1000 * tol:.1f} ms); the "
                f"episode spans {ts[0]:.3f}..{ts[-1]:.3f} s: check --offset and the times")
        if j in frame_of:
            raise MaskImportError(f"{p} and {frame_of[j]} both align to frame {j} of episode "
                                  f"{episode}; the masks are denser than the frames")
        frame_of[j] = p
        rows.append((j, t, p))
    rows.sort()
    frames = np.array([r[0] for r in rows], dtype=np.int64)
    arr = np.stack([read_mask_png(r[2], k.width, k.height) for r in rows])
    gaps = np.abs(ts[frames] - np.array([r[1] for r in rows]))
    writer = MaskWriter(ds.root, cam.name, text, k.width, k.height)
    meta = {"source": "import-masks", "folder": str(folder.resolve()),
            "timestamps": None if timestamps is None else str(Path(timestamps).resolve()),
            "video_fps": video_fps, "offset": offset, "tolerance": tol,
            "max_alignment_error": float(gaps.max())}
    writer.write(ep.index, ep.length, frames, arr, np.array([r[1] for r in rows]), meta)
    return {"dataset": str(ds.root), "episode": episode, "camera": cam.name,
            "folder": str(writer.folder), "masks": len(rows), "frames": ep.length,
            "first_frame": int(frames[0]), "last_frame": int(frames[-1]),
            "max_alignment_error_ms": 1000 * float(gaps.max()), "tolerance_ms": 1000 * tol}


# ---------------------------------------------------------------- overlay

SHEET_MAX = 8  # frames side by side in the sheet
_OBSERVED = (40, 200, 80)   # green: the observed mask's contour
_RENDERED = (230, 40, 200)  # magenta: our soft renderer's contour


def _contour(mask: np.ndarray) -> np.ndarray:
    return mask & ~ndimage.binary_erosion(mask)


def overlay(data: str, episode: int, frames: list[int], out: str, camera: str | None = None,
            mask_camera: str | None = None, state: str = "stored", scale: int = 4,
            sigma: float = 0.7, ckpt: str | None = None, device: str = "cpu") -> dict:
    """PNGs of the observed masks (filled grey, green contour) and the soft renderer's
    silhouette at the joint state of each frame (magenta contour), ``scale`` times the
    camera's size, one per frame in ``out`` plus a side-by-side sheet (up to 8 frames).
    ``camera``: the camera to render with (default the one stored beside the masks; e.g. a
    refined one); ``state``: ``stored`` (the dataset's q) or ``true`` (the synthetic world's), or
    with ``ckpt`` the state our model's rollout reaches (:func:`model_states`)."""
    if not isinstance(scale, int) or scale < 1:
        raise UserError(f"--scale must be a positive integer, got {scale!r}")
    if not frames:
        raise UserError("--frames: give at least one frame index")
    ds = read_dataset(data)
    ep = _episode(ds, episode)
    if mask_camera is None and len(mask_cameras(ds.root)) > 1:
        raise UserError(f"{ds.root}: masks of several cameras ({mask_cameras(ds.root)}); "
                        "choose one with --mask-camera")
    stored = read_episode_masks(ds.root, ep.index, mask_camera)
    cam, _ = _camera(camera if camera is not None else stored.camera_file, ds)
    k = cam.intrinsics
    if stored.masks.shape[1:] != (k.height, k.width):
        raise CameraError(f"{camera}: {k.width}x{k.height}, the masks in "
                          f"{stored.camera_file.parent} are {stored.masks.shape[2]}x"
                          f"{stored.masks.shape[1]}")
    bad = [f for f in frames if not 0 <= f < ep.length]
    if bad:
        raise UserError(f"--frames {bad}: episode {episode} has frames 0..{ep.length - 1}")
    absent = [f for f in frames if not bool(stored.valid[f])]
    if absent:
        near = stored.frame_index[np.argmin(np.abs(stored.frame_index[:, None]
                                                   - np.array(absent)[None]), axis=0)]
        raise UserError(f"--frames {absent}: no mask stored there (nearest with one: "
                        f"{near.tolist()})")
    if ckpt is not None:
        state = f"model {ckpt}"
        q_all = model_states(ckpt, ds, ep.index, device)
    else:
        q_all = episode_states(ds, [ep.index], state)[ep.index]
    q = torch.tensor(q_all[frames], dtype=torch.float32)
    renderer = SilhouetteRenderer(ArmScene(ds.platform))
    with torch.no_grad():
        soft = renderer(q, cam, sigma=sigma)["mask"]
    observed = stored.masks[frames].to(torch.float32)
    iou = hard_iou(soft, observed).numpy()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    images, paths = [], []
    for j, f in enumerate(frames):
        obs = np.kron(observed[j].numpy() > 0.5, np.ones((scale, scale), dtype=bool))
        ren = np.kron(soft[j].numpy() > 0.5, np.ones((scale, scale), dtype=bool))
        img = np.full(obs.shape + (3,), 255, dtype=np.uint8)
        img[obs] = (200, 200, 200)
        img[ndimage.binary_dilation(_contour(obs))] = _OBSERVED
        img[ndimage.binary_dilation(_contour(ren))] = _RENDERED
        pil = Image.fromarray(img)
        ImageDraw.Draw(pil).text((4, 4), f"ep {episode} frame {f}  IoU {iou[j]:.3f}",
                                 fill=(0, 0, 0))
        path = out_dir / f"overlay-ep{episode:06d}-frame{f:06d}.png"
        _save_png(pil, path)
        images.append(pil)
        paths.append(str(path))
    sheet_path = None
    if len(images) <= SHEET_MAX:  # a strip wider than that is no longer one picture
        sheet = Image.new("RGB", (sum(i.width for i in images), images[0].height), "white")
        x = 0
        for im in images:
            sheet.paste(im, (x, 0))
            x += im.width
        sheet_path = out_dir / f"overlay-ep{episode:06d}.png"
        _save_png(sheet, sheet_path)
    return {"episode": episode, "frames": list(frames), "iou": iou.tolist(),
            "mean_iou": float(iou.mean()), "files": paths,
            "sheet": None if sheet_path is None else str(sheet_path),
            "size": [k.width * scale, k.height * scale], "state": state}


def _save_png(image: Image.Image, path: Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        image.save(tmp, format="PNG")
