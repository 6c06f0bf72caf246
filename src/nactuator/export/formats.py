"""Write an actuator bundle as a TorchScript or ONNX file, checked against eager PyTorch.

float32 files must match eager to 1e-5; an int8 ONNX file (``quantize="int8"``) must stay
within the quantization tolerances of ``nactuator.export.quantize``.

Both files carry the same JSON metadata (platform, input and output names, window
length, feature groups, model config) so a deployment needs nothing else: TorchScript as
the ``nactuator.json`` extra file, ONNX as the model's ``metadata_props``.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nactuator.errors import UserError
from nactuator.export.graph import EXPORT_FORMAT, EXPORT_OUTPUTS, ExportableActuator
from nactuator.export.quantize import (
    INT8_CHECK_BATCH,
    check_quantize_option,
    int8_failures,
    measure_int8_errors,
    quantize_onnx_int8,
)
from nactuator.models import NeuralActuator, load_actuator

FORMATS = ("torchscript", "onnx")
META_FILE = "nactuator.json"
TOLERANCE = 1e-5  # max |exported - eager| accepted on every output (see parity_tolerance)


class ExportError(UserError, RuntimeError):
    """The export could not be written or does not reproduce the eager model."""


def export_metadata(actuator: NeuralActuator, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "platform": meta.get("platform"),
        "inputs": actuator.inputs,
        "outputs": list(EXPORT_OUTPUTS),
        "input_shape": ["batch", actuator.window_length, actuator.n_motors],
        "window_length": actuator.window_length,
        "n_motors": actuator.n_motors,
        "features": actuator.features,
        "model_config": actuator.model_config,
        "weights": meta.get("weights"),
    }


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def rounding_floor(graph: ExportableActuator, inputs: tuple[torch.Tensor, ...]) -> float:
    """How far eager float32 itself is from float64 on these inputs (max over outputs).

    Deep float32 stacks (the 7-layer MLP ablation in particular) reach ~2e-5 of rounding
    error before any export; a runtime that sums in another order may differ from eager by
    that much without being wrong, so the export check allows a few times this floor.
    """
    exact = copy.deepcopy(graph).double()
    with torch.no_grad():
        single = graph(*inputs)
        double = exact(*(x.double() for x in inputs))
    return max(float((s - d).abs().max()) for s, d in zip(single, double, strict=True))


def parity_tolerance(graph: ExportableActuator, inputs: tuple[torch.Tensor, ...]) -> float:
    return max(TOLERANCE, 4.0 * rounding_floor(graph, inputs))


def _check_parity(run: Callable[..., Any], graph: ExportableActuator, what: str) -> float:
    """Max |exported - eager| over the outputs on a batch size the export never saw."""
    inputs = graph.example_inputs(batch=5)
    with torch.no_grad():
        expected = graph(*inputs)
    got = run(*inputs)
    worst = max(float((torch.as_tensor(g) - e).abs().max()) for g, e in
                zip(got, expected, strict=True))
    tolerance = parity_tolerance(graph, inputs)
    if not worst <= tolerance:
        raise ExportError(f"{what} export differs from eager PyTorch by {worst:.3g} "
                          f"(> {tolerance:.3g}); not written")
    return worst


def to_torchscript(actuator: NeuralActuator, out: Path, metadata: dict[str, Any]) -> None:
    """Trace, freeze (weights become constants) and save."""
    graph = ExportableActuator(actuator).eval()
    with torch.no_grad():
        # torch's own trace check only reruns the example; _check_parity below is stricter
        # (eager vs. the frozen file's graph at a batch size the trace never saw).
        traced = torch.jit.trace(graph, graph.example_inputs(batch=2), check_trace=False)
    frozen = torch.jit.freeze(traced)
    _check_parity(frozen, graph, "TorchScript")
    extra = {META_FILE: json.dumps(metadata)}
    _atomic_write(out, lambda tmp: torch.jit.save(frozen, tmp, _extra_files=extra))


def load_torchscript(path: str | os.PathLike) -> tuple[torch.jit.ScriptModule, dict[str, Any]]:
    """The exported module and its metadata."""
    extra = {META_FILE: ""}
    module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    if not extra[META_FILE]:
        raise ExportError(f"{path} is a TorchScript file without nactuator metadata")
    return module, json.loads(extra[META_FILE])


def _onnx_modules() -> tuple[Any, Any]:
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError as err:
        raise ExportError(f"fmt='onnx' needs the onnx and onnxscript packages ({err}); "
                          f"install them with `pip install onnx onnxscript onnxruntime`, "
                          f"or export fmt='torchscript'") from err
    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None
    return onnx, onnxruntime


def ort_session(path: str | os.PathLike, threads: int = 1) -> Any:
    """An ONNX Runtime CPU session for an exported file."""
    _, onnxruntime = _onnx_modules()
    if onnxruntime is None:
        raise ExportError("running an ONNX export needs onnxruntime (`pip install onnxruntime`)")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _check_int8(session: Any, graph: ExportableActuator) -> dict[str, float]:
    names = [i.name for i in session.get_inputs()]
    errors = measure_int8_errors(
        lambda *xs: session.run(None, {n: x.numpy() for n, x in zip(names, xs, strict=True)}),
        graph)
    failed = int8_failures(errors)
    if failed:
        raise ExportError(f"int8 ONNX export is too far from eager PyTorch on "
                          f"{INT8_CHECK_BATCH} windows drawn from the norm stats: "
                          + "; ".join(failed) + "; not written")
    return errors


def to_onnx(actuator: NeuralActuator, out: Path, metadata: dict[str, Any],
            quantize: str = "none") -> None:
    """torch.export-based ONNX export with a dynamic batch axis; checked with ONNX Runtime
    when it is installed. ``quantize="int8"`` (needs onnxruntime) checks the float32 graph
    to 1e-5 first, then quantizes it and checks the int8 file with ``quantize.int8_errors``;
    the measured errors go into the file's metadata as ``int8_errors``."""
    quantize = check_quantize_option(quantize, "onnx")
    onnx, onnxruntime = _onnx_modules()
    if quantize == "int8" and onnxruntime is None:
        raise ExportError("quantize='int8' needs onnxruntime (`pip install onnxruntime`)")
    graph = ExportableActuator(actuator).eval()
    batch = torch.export.Dim("batch")
    # The forward takes *channels, so the dynamic shapes are one tuple for that argument.
    dynamic = (tuple({0: batch} for _ in graph.input_names),)
    program = torch.onnx.export(graph, graph.example_inputs(batch=2), dynamo=True,
                                input_names=graph.input_names,
                                output_names=list(EXPORT_OUTPUTS),
                                dynamic_shapes=dynamic, verbose=False)
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    model = program.model_proto
    onnx.helper.set_model_props(model, {"nactuator": json.dumps(metadata)})

    def check_float32(path: str) -> None:
        session = ort_session(path)
        names = [i.name for i in session.get_inputs()]
        _check_parity(lambda *xs: session.run(None, {n: x.numpy() for n, x in
                                                     zip(names, xs, strict=True)}),
                      graph, "ONNX")

    def write(tmp: str) -> None:
        if quantize == "none":
            onnx.save(model, tmp)
            if onnxruntime is not None:
                check_float32(tmp)
            return
        with tempfile.TemporaryDirectory(prefix="nactuator-int8-") as scratch:
            float32 = str(Path(scratch) / "float32.onnx")
            onnx.save(model, float32)
            check_float32(float32)  # an int8 error must not hide an export bug
            quantize_onnx_int8(Path(float32), Path(tmp))
        errors = _check_int8(ort_session(tmp), graph)
        quantized = onnx.load(tmp)
        onnx.helper.set_model_props(quantized, {"nactuator": json.dumps(
            {**metadata, "quantize": "int8", "int8_errors": errors})})
        onnx.save(quantized, tmp)

    _atomic_write(out, write)


def export(ckpt: str | os.PathLike, out: str | os.PathLike, fmt: str = "torchscript",
           use_ema: bool = True, quantize: str = "none") -> str:
    """Export a checkpoint's (or bundle's) actuator; returns the path written.

    ``quantize="int8"`` (``fmt="onnx"`` only) writes ONNX Runtime's dynamic int8
    quantization, checked against the tolerances of ``nactuator.export.quantize``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; expected one of {list(FORMATS)}")
    quantize = check_quantize_option(quantize, fmt)
    actuator, meta = load_actuator(ckpt, use_ema=use_ema)
    metadata = {**export_metadata(actuator, meta), "quantize": quantize}
    out = Path(out)
    if fmt == "torchscript":
        to_torchscript(actuator, out, metadata)
    else:
        to_onnx(actuator, out, metadata, quantize=quantize)
    return str(out)
