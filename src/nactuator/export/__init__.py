"""nactuator.export: deployable TorchScript / ONNX files of a trained actuator.

``export(ckpt, out)`` loads a Lightning checkpoint or bundle (EMA weights by default),
exports the forward "window tensors in, (tau, force, gate, condition) out" in the format
``out``'s extension names (``.pt``/``.ts`` TorchScript, ``.onnx`` ONNX) and refuses to
write a file whose outputs differ from eager PyTorch by more than 1e-5.
``export(ckpt, "x.onnx", quantize="int8")`` writes ONNX Runtime's dynamic int8
quantization instead, refused beyond the tolerances documented in ``export.quantize``.
"""

from nactuator.export.formats import (
    EXTENSIONS,
    FORMATS,
    TOLERANCE,
    ExportError,
    export,
    load_torchscript,
    parity_tolerance,
    to_onnx,
    to_torchscript,
)
from nactuator.export.graph import EXPORT_FORMAT, EXPORT_OUTPUTS, PAD_INPUT, ExportableActuator
from nactuator.export.quantize import (
    INT8_PROBABILITY_TOLERANCE,
    INT8_RELATIVE_TOLERANCE,
    QUANTIZE,
    int8_errors,
    int8_tolerances,
    measure_int8_errors,
)
from nactuator.export.units import export_units
from nactuator.models.exported import ort_session

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_OUTPUTS",
    "EXTENSIONS",
    "FORMATS",
    "INT8_PROBABILITY_TOLERANCE",
    "INT8_RELATIVE_TOLERANCE",
    "PAD_INPUT",
    "QUANTIZE",
    "TOLERANCE",
    "ExportError",
    "ExportableActuator",
    "export",
    "export_units",
    "int8_errors",
    "int8_tolerances",
    "load_torchscript",
    "measure_int8_errors",
    "ort_session",
    "parity_tolerance",
    "to_onnx",
    "to_torchscript",
]
