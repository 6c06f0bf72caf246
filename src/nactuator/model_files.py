"""Which kind of model file a path is, decided without importing torch.

``infer``, ``live`` and ``eval`` run three kinds of file: a checkpoint or saved bundle
(``torch.save``: ``.ckpt``, often ``.pt``), an exported TorchScript file (``.pt``/``.ts``)
and an exported ONNX file (``.onnx``). ``.pt`` names both of the first two, so the kind
is read from the content: both are zip archives and only TorchScript stores code
(``<archive>/code/...``); an ONNX file is a protobuf, not a zip. A wrong ``--ckpt`` (a
missing file, a dataset or run folder) is refused here in milliseconds, before the
command imports torch.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from nactuator.errors import UserError

__all__ = ["CHECKPOINT", "EXPORT_EXTENSIONS", "MODEL_KINDS", "ONNX", "PRETRAINED_PREFIX",
           "TORCHSCRIPT", "ModelFileError", "export_format", "model_kind", "pretrained_dir",
           "pretrained_names", "resolve_model_path"]

CHECKPOINT, TORCHSCRIPT, ONNX = "checkpoint", "torchscript", "onnx"
MODEL_KINDS = (CHECKPOINT, TORCHSCRIPT, ONNX)
# The file names `nactuator export` writes, and the format each one means.
EXPORT_EXTENSIONS = {".pt": TORCHSCRIPT, ".ts": TORCHSCRIPT, ".onnx": ONNX}
# What `nactuator train` leaves in a run folder (best by val/loss, then the latest).
RUN_CHECKPOINTS = ("best.ckpt", "last.ckpt")


# `--ckpt pretrained/so101` names a bundle shipped with the package (`make pretrain`).
PRETRAINED_PREFIX = "pretrained/"


class ModelFileError(UserError, ValueError):
    """A path that is not a model file (e.g. a folder); the message says what to pass."""


def pretrained_dir() -> Path:
    """Where the shipped bundles lie: ``$NACTUATOR_PRETRAINED`` if set, else the package's
    ``pretrained/`` folder (installed with it)."""
    env = os.environ.get("NACTUATOR_PRETRAINED")
    return Path(env) if env else Path(__file__).resolve().parent / "pretrained"


def pretrained_names() -> list[str]:
    folder = pretrained_dir()
    return sorted(p.stem for p in folder.glob("*.pt")) if folder.is_dir() else []


def resolve_model_path(path: str | os.PathLike) -> Path:
    """``path`` itself when it exists; ``pretrained/NAME`` (no such file here) is the shipped
    bundle ``NAME``, and an unknown name is refused with the names there are."""
    given = Path(path)
    text = str(path)
    if given.exists() or not text.startswith(PRETRAINED_PREFIX):
        return given
    name = text[len(PRETRAINED_PREFIX):].removesuffix(".pt")
    shipped = pretrained_dir() / f"{name}.pt"
    if shipped.is_file():
        return shipped
    have = ", ".join(PRETRAINED_PREFIX + n for n in pretrained_names()) or "none"
    raise ModelFileError(f"--ckpt {text}: no pretrained actuator {name!r} (shipped: {have}; "
                         "`make pretrain PLATFORM=...` builds one)")


def _folder_hint(folder: Path) -> str:
    found = [folder / name for name in RUN_CHECKPOINTS if (folder / name).is_file()]
    if found:
        return "pass " + " or ".join(str(p) for p in found)
    if (folder / "meta" / "info.json").is_file():
        return "it is a dataset (give it as --data); pass a .ckpt, a bundle or an exported file"
    return ("pass a checkpoint (.ckpt), a saved bundle or an exported .pt/.onnx file; "
            f"it has no {' or '.join(RUN_CHECKPOINTS)}")


def model_kind(path: str | os.PathLike) -> str:
    """``"checkpoint"``, ``"torchscript"`` or ``"onnx"`` for an existing file; a one-line
    error naming the path for a missing file or a folder."""
    path = resolve_model_path(path)
    if path.is_dir():
        raise ModelFileError(f"{path} is a folder, not a model file; {_folder_hint(path)}")
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} does not exist")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError):
            return CHECKPOINT  # torch.load gives the precise error
        return TORCHSCRIPT if any("/code/" in name for name in names) else CHECKPOINT
    return ONNX if path.suffix.lower() == ".onnx" else CHECKPOINT


def export_format(out: str | os.PathLike, fmt: str | None = None) -> str:
    """The export format the file name ``out`` asks for (its extension); ``fmt``, if
    given, must agree with it, so an ``.onnx`` file always holds ONNX."""
    formats = sorted(set(EXPORT_EXTENSIONS.values()))
    if fmt is not None and fmt not in formats:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {formats}")
    suffix = Path(out).suffix.lower()
    named = EXPORT_EXTENSIONS.get(suffix)
    if named is None:
        known = ", ".join(f"{ext} ({kind})" for ext, kind in EXPORT_EXTENSIONS.items())
        raise ModelFileError(f"{out}: export writes {known} files; the extension "
                             f"{suffix or '(none)'!r} names no format")
    if fmt is not None and fmt != named:
        wanted = " or ".join(ext for ext, kind in EXPORT_EXTENSIONS.items() if kind == fmt)
        raise ModelFileError(f"{out}: the extension {suffix} means {named}, but --format "
                             f"{fmt} was asked; name the file {wanted} or drop --format")
    return named
