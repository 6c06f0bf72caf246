"""nactuator.export: deployable TorchScript / ONNX files of a trained actuator.

``export(ckpt, out, fmt)`` loads a Lightning checkpoint or bundle (EMA weights by
default), exports the forward "window tensors in, (tau, force, gate, condition) out" and
refuses to write a file whose outputs differ from eager PyTorch by more than 1e-5.
"""

from nactuator.export.formats import (
    FORMATS,
    TOLERANCE,
    ExportError,
    export,
    load_torchscript,
    ort_session,
    parity_tolerance,
    to_onnx,
    to_torchscript,
)
from nactuator.export.graph import EXPORT_FORMAT, EXPORT_OUTPUTS, ExportableActuator

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_OUTPUTS",
    "FORMATS",
    "TOLERANCE",
    "ExportError",
    "ExportableActuator",
    "export",
    "load_torchscript",
    "ort_session",
    "parity_tolerance",
    "to_onnx",
    "to_torchscript",
]
