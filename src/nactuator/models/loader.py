"""``load_model``: the one loader of "a model ``infer``, ``live`` and ``eval`` can run" --
a checkpoint or bundle (:mod:`nactuator.models.bundle`) or a file written by
``nactuator export`` (:mod:`nactuator.models.exported`). It sits above both, so neither
imports the other's loader."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from torch import nn

from nactuator.model_files import CHECKPOINT, model_kind, resolve_model_path
from nactuator.models.bundle import load_actuator
from nactuator.models.exported import load_exported

__all__ = ["load_model"]


def load_model(source: str | os.PathLike | Mapping, use_ema: bool = True,
               map_location: Any = "cpu", expect_platform: str | None = None,
               ) -> tuple[nn.Module, dict[str, Any]]:
    """The one loader of "a model ``infer``, ``live`` and ``eval`` can run": a checkpoint
    or bundle (:func:`load_actuator`), or a file written by ``nactuator export``
    (TorchScript, or ONNX float32/int8 run with ONNX Runtime;
    :class:`~nactuator.models.exported.ExportedActuator`). Either way the result takes a
    window dict and returns ``tau``, ``force``, ``gate``, ``condition`` (and their logits),
    with the same ``meta`` keys; an export's ``meta["export"]`` says which file it was.
    ``use_ema`` and ``map_location`` apply to checkpoints (an export was written with
    one set of weights, ``meta["weights"]``, and runs on the CPU)."""
    if isinstance(source, Mapping):
        return load_actuator(source, use_ema, map_location, expect_platform)
    source = resolve_model_path(source)
    kind = model_kind(source)
    if kind == CHECKPOINT:
        return load_actuator(source, use_ema, map_location, expect_platform)
    return load_exported(source, kind, expect_platform)
