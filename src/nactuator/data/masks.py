"""Silhouette masks stored beside a dataset's shards, one camera per folder (issue 20).

Layout (docs/data-format.md, "Masks")::

    DATASET/masks/observation.masks.<camera>/
        info.json                          format, size, and per episode: file, length, source
        camera.yaml                        the camera file the masks belong to (a copy)
        chunk-000/episode-000000.npz       one episode: every mask it has, compressed

An episode file holds ``masks`` (K, H, ceil(W / 8)) uint8, the K binary masks packed 8 pixels
a byte along the width (``numpy.packbits``, big-endian bit order), ``frame_index`` (K,)
int64, strictly increasing, the frame each mask belongs to (frames without a mask are simply
absent: not rendered, missed by the segmenter), and ``time`` (K,) float64, the mask's own
time in the episode's clock (= the frame's ``timestamp`` for rendered masks, the image's
time for imported ones).

One compressed file per episode rather than LeRobot's PNG per frame
(``images/<key>/episode-NNNNNN/frame-NNNNNN.png``): at 160x120 a PNG is ~300 bytes but takes
a 4 KiB file-system block, ~15 MB and 3,700 files per minute at 62 Hz, the episode file
~0.15 MB (measured, docs/vision.md). The key follows LeRobot's ``observation.images.<cam>``.
Nothing under ``meta/`` or ``data/`` changes, so a dataset with masks reads exactly as one
without (LeRobot ignores the folder); ``info.json`` here is replaced last and atomically,
so a crash leaves the previous masks readable.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where masks are read (``data info`` reads the index alone)
    import torch

import numpy as np

from nactuator.atomic import write_bytes, write_json, write_text
from nactuator.data.schema import DataFormatError

__all__ = ["MASKS_DIR", "MASK_FORMAT", "EpisodeMasks", "MaskWriter", "mask_cameras",
           "mask_folder", "mask_key", "mask_summary", "read_episode_masks"]

MASKS_DIR = "masks"
MASK_FORMAT = "nactuator-masks/1"
_CHUNK = 1000  # episodes per chunk folder, as LeRobot's chunks_size
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def mask_key(camera: str) -> str:
    """``observation.masks.<camera>``: the feature name of one camera's masks."""
    if not _NAME.match(camera):
        raise DataFormatError(f"camera name {camera!r}: use letters, digits, '_', '-' and '.'")
    return f"observation.masks.{camera}"


def mask_folder(root: str | Path, camera: str) -> Path:
    return Path(root) / MASKS_DIR / mask_key(camera)


def _episode_file(episode: int) -> str:
    return f"chunk-{episode // _CHUNK:03d}/episode-{episode:06d}.npz"


def mask_cameras(root: str | Path) -> list[str]:
    """Cameras with masks in the dataset at ``root`` (none: an empty list)."""
    base = Path(root) / MASKS_DIR
    prefix = "observation.masks."
    if not base.is_dir():
        return []
    return sorted(p.name[len(prefix):] for p in base.iterdir()
                  if p.name.startswith(prefix) and (p / "info.json").is_file())


def mask_summary(root: str | Path) -> list[str]:
    """One line per camera with masks (from the index files alone), for ``data info``."""
    lines = []
    for cam in mask_cameras(root):
        index = _load_index(mask_folder(root, cam))
        eps = index["episodes"].values()
        sources = sorted({str(e.get("source", "?")) for e in eps})
        lines.append(f"  {index['key']} ({index['width']}x{index['height']}): {len(eps)} "
                     f"episode(s), {sum(int(e['frames']) for e in eps)} masks "
                     f"({', '.join(sources)})")
    return lines


def _load_index(folder: Path) -> dict:
    path = folder / "info.json"
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataFormatError(f"{folder}: no masks here (no info.json)") from None
    except ValueError as e:
        raise DataFormatError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(index, dict) or index.get("format") != MASK_FORMAT:
        found = index.get("format") if isinstance(index, dict) else None
        raise DataFormatError(f"{path}: format {found!r}, expected {MASK_FORMAT!r}")
    return index


class MaskWriter:
    """Writes one camera's masks of a dataset's episodes (new, or replacing an episode's).

    ``camera_text`` is the camera file's content, copied to ``camera.yaml``; a folder that
    already holds masks of a different camera file (or size) is refused, since the masks
    would then no longer match the camera stored beside them.
    """

    def __init__(self, root: str | Path, camera: str, camera_text: str, width: int,
                 height: int) -> None:
        self.root = Path(root)
        if not (self.root / "meta" / "info.json").is_file():
            raise DataFormatError(f"{self.root}: not a dataset (no meta/info.json)")
        self.folder = mask_folder(self.root, camera)
        self.camera, self.width, self.height = camera, int(width), int(height)
        cam_file = self.folder / "camera.yaml"
        if (self.folder / "info.json").is_file():
            self.index = _load_index(self.folder)
            old = cam_file.read_text() if cam_file.is_file() else None
            if old != camera_text or (self.index["width"], self.index["height"]) != (
                    self.width, self.height):
                raise DataFormatError(
                    f"{self.folder}: holds masks of another camera file ({cam_file}); write "
                    f"these under another camera name, or delete {self.folder} first")
        else:
            self.index = {"format": MASK_FORMAT, "key": mask_key(camera), "camera": "camera.yaml",
                          "width": self.width, "height": self.height, "episodes": {}}
            write_text(cam_file, camera_text)

    def write(self, episode: int, length: int, frame_index: np.ndarray, masks: np.ndarray,
              time: np.ndarray, meta: dict | None = None) -> Path:
        """Store the masks (K, H, W) of ``frame_index`` (K,) of episode ``episode`` (``length``
        frames), replacing any it had; ``meta`` (JSON) says where they came from."""
        frame_index = np.asarray(frame_index, dtype=np.int64)
        masks = np.asarray(masks)
        time = np.asarray(time, dtype=np.float64)
        k = len(frame_index)
        where = f"{self.folder}: episode {episode}"
        if masks.shape != (k, self.height, self.width):
            raise DataFormatError(f"{where}: masks have shape {masks.shape}, expected "
                                  f"({k}, {self.height}, {self.width})")
        if masks.dtype != bool:
            raise DataFormatError(f"{where}: masks must be boolean, got {masks.dtype}")
        if time.shape != (k,) or not np.isfinite(time).all():
            raise DataFormatError(f"{where}: time must be {k} finite numbers")
        if k and (frame_index[0] < 0 or frame_index[-1] >= length
                  or (np.diff(frame_index) <= 0).any()):
            raise DataFormatError(f"{where}: frame indices must increase strictly within "
                                  f"0..{length - 1}, got {frame_index[:3].tolist()}...")
        name = _episode_file(episode)
        buf = io.BytesIO()
        np.savez_compressed(buf, masks=np.packbits(masks, axis=-1), frame_index=frame_index,
                            time=time)
        path = write_bytes(self.folder / name, buf.getvalue())
        self.index["episodes"][str(episode)] = dict(meta or {}, file=name, length=int(length),
                                                    frames=k)
        write_json(self.folder / "info.json", self.index)  # the commit point, last
        return path


@dataclass
class EpisodeMasks:
    """One episode's masks for a loss: ``masks`` (T, H, W) bool over all T frames of the
    episode (False where ``valid`` is False), ``valid`` (T,) bool, which frames have a mask;
    ``frame_index`` (K,) and ``time`` (K,) of the stored masks; ``camera_file`` the camera
    they were taken with; ``meta`` where they came from."""

    masks: torch.Tensor  # noqa: F821 (imported when read)
    valid: torch.Tensor  # noqa: F821
    frame_index: np.ndarray
    time: np.ndarray
    camera_file: Path
    meta: dict


def read_episode_masks(root: str | Path, episode: int, camera: str | None = None
                       ) -> EpisodeMasks:
    """The masks of episode ``episode`` as (T, H, W) with the frames that have them.
    ``camera`` may be left out when the dataset has masks of one camera only."""
    import torch

    cams = mask_cameras(root)
    if camera is None:
        if not cams:
            raise DataFormatError(f"{root}: has no masks (no {MASKS_DIR}/observation.masks.* "
                                  "folder)")
        if len(cams) > 1:
            raise DataFormatError(f"{root}: has masks of cameras {', '.join(cams)}; name one")
        camera = cams[0]
    elif camera not in cams:
        raise DataFormatError(f"{root}: no masks of camera {camera!r} (it has: "
                              f"{', '.join(cams) or 'none'})")
    folder = mask_folder(root, camera)
    index = _load_index(folder)
    entry = index["episodes"].get(str(episode))
    if entry is None:
        have = sorted(int(e) for e in index["episodes"])
        raise DataFormatError(f"{folder}: no masks of episode {episode} (episodes with masks: "
                              f"{have})")
    path = folder / entry["file"]
    try:
        with np.load(path) as z:
            packed, frame_index, time = z["masks"], z["frame_index"], z["time"]
    except (OSError, KeyError, ValueError) as e:
        raise DataFormatError(f"{path}: unreadable mask file: {e}") from None
    h, w, length = int(index["height"]), int(index["width"]), int(entry["length"])
    masks = np.unpackbits(packed, axis=-1, count=w).astype(bool)
    if masks.shape != (len(frame_index), h, w):
        raise DataFormatError(f"{path}: masks {masks.shape} do not match "
                              f"({len(frame_index)}, {h}, {w})")
    full = torch.zeros((length, h, w), dtype=torch.bool)
    full[torch.as_tensor(frame_index)] = torch.from_numpy(masks)
    valid = torch.zeros(length, dtype=torch.bool)
    valid[torch.as_tensor(frame_index)] = True
    meta = {k: v for k, v in entry.items() if k not in ("file",)}
    return EpisodeMasks(full, valid, frame_index, time, folder / index["camera"], meta)
