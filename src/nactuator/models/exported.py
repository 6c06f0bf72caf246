"""Run an exported actuator file behind the interface of ``NeuralActuator``.

``nactuator export`` writes the forward "window channels + padding mask in, (tau, force,
gate, condition) out" as a TorchScript file or an ONNX file (float32 or int8) with its
metadata inside (this module defines that file contract; ``nactuator.export`` writes it).
:class:`ExportedActuator` runs such a file the way ``infer``, ``live`` and ``eval`` run a
checkpoint's actuator: a window dict of (B, L, n) tensors (plus the optional ``pad``
(B, L) mask) in, a dict of outputs out, and the same ``inputs``, ``window_length``,
``n_motors``, ``features`` and ``mode``. It runs on the CPU (ONNX Runtime's CPU provider,
or TorchScript's CPU constants); tensors on another device are moved there and back.

An exported file holds no weights to train and no autograd graph: what needs gradients
through the model (``plan``, fine-tuning, ``adapt``) needs the checkpoint it came from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nactuator.model_files import ONNX, TORCHSCRIPT
from nactuator.models.bundle import BundleError, input_filters_of
from nactuator.models.features import actuator_mode

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_OUTPUTS",
    "INTERVAL_OUTPUTS",
    "META_FILE",
    "ONNX_META_KEY",
    "PAD_INPUT",
    "ExportedActuator",
    "load_exported",
    "export_outputs",
    "ort_session",
]

EXPORT_FORMAT = "nactuator-export/2"  # /1 had no padding input (first L - 1 frames differed)
EXPORT_OUTPUTS = ("tau", "force", "gate", "condition")
# Added after those by a model with the uncertainty head: the calibrated force interval and
# σ ((B, 3) each, N); the calibration scale is a constant of the exported graph.
INTERVAL_OUTPUTS = ("force_lo", "force_hi", "force_sigma")


def export_outputs(has_uncertainty: bool) -> tuple[str, ...]:
    """The exported graph's outputs, in order."""
    return (*EXPORT_OUTPUTS, *INTERVAL_OUTPUTS) if has_uncertainty else EXPORT_OUTPUTS
PAD_INPUT = "pad"  # (B, L) bool, True on zero-padded frames before the stream's first frame
META_FILE = "nactuator.json"  # TorchScript: the metadata as this extra file
ONNX_META_KEY = "nactuator"  # ONNX: the metadata as this metadata_props entry
# The exported graph returns probabilities only; the logits a rollout records are
# recomputed from them, clamped where a float32 probability has saturated at 0 or 1.
LOGIT_EPS = 1e-7

Runner = Callable[[list[torch.Tensor]], Sequence[Any]]


class ExportedActuator(nn.Module):
    """An exported file's forward with ``NeuralActuator``'s interface (see the module
    docstring); ``metadata`` is the dict the exporter stored in the file."""

    def __init__(self, run: Runner, metadata: Mapping[str, Any], source: str,
                 kind: str) -> None:
        super().__init__()
        self._run, self.metadata, self.source, self.kind = run, dict(metadata), source, kind

    @property
    def inputs(self) -> list[str]:
        """The window keys the model reads (the graph's inputs before ``pad``)."""
        return list(self.metadata["inputs"])

    @property
    def window_length(self) -> int:
        return int(self.metadata["window_length"])

    @property
    def n_motors(self) -> int:
        return int(self.metadata["n_motors"])

    @property
    def features(self) -> list[str]:
        return list(self.metadata["features"])

    @property
    def model_config(self) -> dict[str, Any]:
        return dict(self.metadata["model_config"])

    @property
    def mode(self) -> str:
        return actuator_mode(self.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The graph's outputs, in order (the metadata's; files before the interval
        outputs list the four of :data:`EXPORT_OUTPUTS`)."""
        return tuple(self.metadata.get("outputs") or EXPORT_OUTPUTS)

    @property
    def has_uncertainty(self) -> bool:
        """True when the file gives the force interval (``force_lo``/``force_hi``)."""
        return "force_lo" in self.outputs

    def forward(self, window: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        first = window[self.inputs[0]]
        device, (batch, length) = first.device, first.shape[:2]
        pad = window.get(PAD_INPUT)
        if pad is None:  # as NeuralActuator: no mask means every frame is real
            pad = torch.zeros(batch, length, dtype=torch.bool)
        args = [window[k].detach().to("cpu", torch.float32) for k in self.inputs]
        args.append(pad.detach().to("cpu", torch.bool))
        out = {k: torch.as_tensor(v).to(device)
               for k, v in zip(self.outputs, self._run(args), strict=True)}
        out["gate_logit"] = torch.logit(out["gate"], eps=LOGIT_EPS)
        out["condition_logit"] = torch.logit(out["condition"], eps=LOGIT_EPS)
        return out

    def extra_repr(self) -> str:
        return f"{self.kind} {self.source}"


def ort_session(path: str | os.PathLike, threads: int = 1) -> Any:
    """An ONNX Runtime CPU session for an exported file (``threads`` intra-op threads)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _torchscript(path: Path) -> tuple[Runner, dict[str, Any] | None]:
    extra = {META_FILE: ""}
    try:
        module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    except RuntimeError as err:
        raise BundleError(f"{path} is not a readable TorchScript file "
                          f"({str(err).strip().splitlines()[0]})") from err
    module.eval()
    metadata = json.loads(extra[META_FILE]) if extra[META_FILE] else None

    def run(args: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        with torch.no_grad():
            return module(*args)
    return run, metadata


def _onnx(path: Path, threads: int) -> tuple[Runner, dict[str, Any] | None, list[str]]:
    try:
        session = ort_session(path, threads)
    except Exception as err:  # onnxruntime raises its own untyped errors for a bad file
        raise BundleError(f"{path} is not a readable ONNX model "
                          f"({type(err).__name__}: {str(err).strip().splitlines()[0]})") from err
    names = [i.name for i in session.get_inputs()]
    text = session.get_modelmeta().custom_metadata_map.get(ONNX_META_KEY)

    def run(args: list[torch.Tensor]) -> Sequence[np.ndarray]:
        return session.run(None, {n: np.ascontiguousarray(a.numpy())
                                  for n, a in zip(names, args, strict=True)})
    return run, (json.loads(text) if text else None), names


def load_exported(path: str | os.PathLike, kind: str, expect_platform: str | None = None,
                  threads: int | None = None) -> tuple[ExportedActuator, dict[str, Any]]:
    """An :class:`ExportedActuator` and the metadata ``load_actuator`` returns for a
    checkpoint (platform, features, model and training config, weights, source, mode).
    ``threads``: ONNX Runtime intra-op threads (default: torch's current setting)."""
    path = Path(path)
    if kind == TORCHSCRIPT:
        run, metadata = _torchscript(path)
        names = None
    elif kind == ONNX:
        run, metadata, names = _onnx(path, threads or torch.get_num_threads())
    else:
        raise ValueError(f"unknown exported model kind {kind!r}")
    if metadata is None:
        raise BundleError(f"{path} is a {kind} file without nactuator metadata (not "
                          "written by `nactuator export`)")
    if metadata.get("format") != EXPORT_FORMAT:
        raise BundleError(f"{path} was exported in format {metadata.get('format')!r}; this "
                          f"version runs {EXPORT_FORMAT!r}: export it again from its "
                          f"checkpoint (nactuator export --ckpt CKPT --out {path})")
    graph_inputs = [*metadata["inputs"], PAD_INPUT]
    if names is not None and names != graph_inputs:
        raise BundleError(f"{path}: the ONNX graph's inputs {names} are not the metadata's "
                          f"{graph_inputs}")
    if expect_platform is not None and metadata.get("platform") != expect_platform:
        raise BundleError(f"{path} was trained for platform {metadata.get('platform')!r}, "
                          f"expected {expect_platform!r}")
    actuator = ExportedActuator(run, metadata, str(path), kind)
    meta = {"format": metadata["format"], "platform": metadata.get("platform"),
            "features": actuator.features, "n_motors": actuator.n_motors,
            "norm_stats": None, "model_config": actuator.model_config,
            "training_config": metadata.get("training_config"), "extra": None,
            "input_filters": input_filters_of(metadata, str(path)),
            "weights": metadata.get("weights"), "source": str(path), "mode": actuator.mode,
            "uncertainty": metadata.get("uncertainty"),
            "export": {"kind": kind, "quantize": metadata.get("quantize", "none")}}
    return actuator, meta
