"""Write an actuator bundle as a TorchScript or ONNX file, checked against eager PyTorch.

float32 files must match eager to 1e-5; an int8 ONNX file (``quantize="int8"``) must stay
within the quantization tolerances of ``nactuator.export.quantize``.

The format follows the file's extension (``.pt``/``.ts``: TorchScript, ``.onnx``: ONNX); an
explicit ``fmt`` must agree with it. Both files carry the same JSON metadata (platform,
input and output names, shapes and units, window length, feature groups, model and
training config) so a deployment needs nothing else: TorchScript as the ``nactuator.json``
extra file, ONNX as the model's ``metadata_props``. ``nactuator.models.load_model`` runs
either file in ``infer``, ``live`` and ``eval``. Files are written atomically with the
permissions of any new file (the umask applies).
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

from nactuator.atomic import atomic_path, json_safe
from nactuator.errors import UserError
from nactuator.export.graph import EXPORT_FORMAT, ExportableActuator
from nactuator.export.quantize import (
    INT8_CHECK_BATCH,
    check_quantize_option,
    int8_failures,
    measure_int8_errors,
    quantize_onnx_int8,
)
from nactuator.export.units import export_units
from nactuator.model_files import EXPORT_EXTENSIONS, ONNX, TORCHSCRIPT, export_format
from nactuator.models import NeuralActuator, load_actuator
from nactuator.models.exported import (
    INTERVAL_OUTPUTS,
    META_FILE,
    ONNX_META_KEY,
    PAD_INPUT,
    export_outputs,
    ort_session,
)
from nactuator.platforms import load_platform

FORMATS = (TORCHSCRIPT, ONNX)
EXTENSIONS = EXPORT_EXTENSIONS
TOLERANCE = 1e-5  # max |exported - eager| accepted on every output (see parity_tolerance)


class ExportError(UserError, RuntimeError):
    """The export could not be written or does not reproduce the eager model."""


def export_metadata(actuator: NeuralActuator, meta: dict[str, Any]) -> dict[str, Any]:
    n, length = actuator.n_motors, actuator.window_length
    platform = meta.get("platform")
    metadata = {
        "format": EXPORT_FORMAT,
        "platform": platform,
        "inputs": actuator.inputs,
        "graph_inputs": [*actuator.inputs, PAD_INPUT],
        "outputs": list(export_outputs(actuator.has_uncertainty)),
        "input_shapes": {**{k: ["batch", length, n] for k in actuator.inputs},
                         PAD_INPUT: ["batch", length]},
        "output_shapes": {"tau": ["batch", n], "force": ["batch", 3], "gate": ["batch", 1],
                          "condition": ["batch", n],
                          **({k: ["batch", 3] for k in INTERVAL_OUTPUTS}
                             if actuator.has_uncertainty else {})},
        # The force interval's calibration (baked into the graph as a constant).
        "uncertainty": meta.get("uncertainty"),
        "window_length": length,
        "n_motors": n,
        "features": actuator.features,
        "model_config": actuator.model_config,
        "weights": meta.get("weights"),
        # What the model was trained on (e.g. data.temperature_median): the runner feeds
        # the telemetry through the same filters as for the checkpoint.
        "training_config": json_safe(meta.get("training_config")),
        # How the model's inputs are filtered (nactuator.input_filters): infer and live
        # apply the same spec to an export as to its checkpoint.
        "input_filters": meta.get("input_filters"),
    }
    if platform is not None:
        metadata["units"] = export_units(load_platform(platform), actuator.inputs)
    return metadata


def _atomic_write(path: Path, write: Callable[[str], None]) -> None:
    with atomic_path(path, suffix=path.suffix) as tmp:
        write(str(tmp))


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


def _onnx_module() -> Any:
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError as err:
        raise ExportError(f"fmt='onnx' needs the onnx and onnxscript packages ({err}); "
                          f"install them with `pip install onnx onnxscript onnxruntime`, "
                          f"or export fmt='torchscript'") from err
    return onnx


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
    """torch.export-based ONNX export with a dynamic batch axis, checked with ONNX Runtime.
    ``quantize="int8"`` checks the float32 graph to 1e-5 first, then quantizes it and checks
    the int8 file with ``quantize.int8_errors``; the measured errors go into the file's
    metadata as ``int8_errors``."""
    quantize = check_quantize_option(quantize, "onnx")
    onnx = _onnx_module()
    graph = ExportableActuator(actuator).eval()
    batch = torch.export.Dim("batch")
    # The forward takes *channels, so the dynamic shapes are one tuple for that argument.
    dynamic = (tuple({0: batch} for _ in graph.input_names),)
    program = torch.onnx.export(graph, graph.example_inputs(batch=2), dynamo=True,
                                input_names=graph.input_names,
                                output_names=graph.output_names,
                                dynamic_shapes=dynamic, verbose=False)
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    model = program.model_proto
    onnx.helper.set_model_props(model, {ONNX_META_KEY: json.dumps(metadata)})

    def check_float32(path: str) -> None:
        session = ort_session(path)
        names = [i.name for i in session.get_inputs()]
        _check_parity(lambda *xs: session.run(None, {n: x.numpy() for n, x in
                                                     zip(names, xs, strict=True)}),
                      graph, "ONNX")

    def write(tmp: str) -> None:
        if quantize == "none":
            onnx.save(model, tmp)
            check_float32(tmp)
            return
        with tempfile.TemporaryDirectory(prefix="nactuator-int8-") as scratch:
            float32 = str(Path(scratch) / "float32.onnx")
            onnx.save(model, float32)
            check_float32(float32)  # an int8 error must not hide an export bug
            quantize_onnx_int8(Path(float32), Path(tmp))
        errors = _check_int8(ort_session(tmp), graph)
        quantized = onnx.load(tmp)
        onnx.helper.set_model_props(quantized, {ONNX_META_KEY: json.dumps(
            {**metadata, "quantize": "int8", "int8_errors": errors})})
        onnx.save(quantized, tmp)

    _atomic_write(out, write)


def export(ckpt: str | os.PathLike, out: str | os.PathLike, fmt: str | None = None,
           use_ema: bool = True, quantize: str = "none") -> str:
    """Export a checkpoint's (or bundle's) actuator; returns the path written.

    The format follows ``out``'s extension (``.pt``/``.ts`` TorchScript, ``.onnx`` ONNX);
    ``fmt``, if given, must agree with it. ``quantize="int8"`` (ONNX only) writes ONNX
    Runtime's dynamic int8 quantization, checked against the tolerances of
    ``nactuator.export.quantize``."""
    fmt = export_format(out, fmt)
    quantize = check_quantize_option(quantize, fmt)
    actuator, meta = load_actuator(ckpt, use_ema=use_ema)
    if actuator.dynamics != "torque":
        raise ExportError(f"{ckpt} is a next-state model (model.dynamics: next_state): the "
                          "export file contract carries a simulator torque (tau, force, gate, "
                          "condition), which it does not predict; export a torque-mode model")
    metadata = {**export_metadata(actuator, meta), "quantize": quantize}
    out = Path(out)
    if fmt == TORCHSCRIPT:
        to_torchscript(actuator, out, metadata)
    else:
        to_onnx(actuator, out, metadata, quantize=quantize)
    return str(out)
