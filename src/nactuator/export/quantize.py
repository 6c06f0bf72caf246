"""int8 dynamic quantization of an ONNX export, and the accuracy check it must pass.

Dynamic quantization stores every MatMul/Gemm weight as 8-bit (one scale per tensor) and
quantizes each activation to uint8 on the fly from its own min/max, so it needs no
calibration data. Its outputs cannot match eager PyTorch to 1e-5, so an int8 file is
instead checked for what a consumer of the actuator notices, on a realistic batch of
windows drawn from the bundle's own normalisation statistics
(``ExportableActuator.example_inputs``, seeded):

- ``tau`` and ``force``: max |int8 - eager| over the batch, relative to the RMS of the
  eager output over the batch (its typical size), at most ``INT8_RELATIVE_TOLERANCE``;
- ``gate`` and ``condition`` (probabilities): max |int8 - eager| at most
  ``INT8_PROBABILITY_TOLERANCE``.

Why these numbers: a healthy int8 export of the models here measured 1.4-6.6 % of RMS
(worst case over 256 x n values; the RMS of the error is ~3.5x smaller) and ≤ 3e-3 on the
probabilities; 7-bit activations (torch.ao's ``reduce_range``) already reach ~13 %, and
saturated or wrongly scaled kernels are off by far more, which is what the check is for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from nactuator.errors import UserError
from nactuator.export.graph import EXPORT_OUTPUTS, ExportableActuator

QUANTIZE = ("none", "int8")
INT8_RELATIVE_TOLERANCE = 0.10  # tau, force: max |Δ| / RMS(eager output)
INT8_PROBABILITY_TOLERANCE = 0.02  # gate, condition: max |Δ| of a probability
INT8_CHECK_BATCH = 256
# In physical units: judged relative to their size (the force interval's too).
SCALED_OUTPUTS = ("tau", "force", "force_lo", "force_hi", "force_sigma")


class QuantizeOptionError(UserError, ValueError):
    """An unknown ``quantize`` value, or int8 asked for a format that has none."""


def check_quantize_option(quantize: str | None, fmt: str) -> str:
    """The normalised option (``None`` means ``"none"``); a clear error for bad values."""
    quantize = "none" if quantize is None else quantize
    if quantize not in QUANTIZE:
        raise QuantizeOptionError(f"unknown quantize option {quantize!r}; expected one "
                                  f"of {list(QUANTIZE)}")
    if quantize == "int8" and fmt != "onnx":
        # torch.ao's dynamic quantization is deprecated in torch 2.13 and its TorchScript
        # file ran slower than ONNX Runtime's int8 here (docs/benchmarks.md, Inference).
        raise QuantizeOptionError(f"quantize='int8' is available for fmt='onnx' only, got "
                                  f"fmt={fmt!r}")
    return quantize


def int8_errors(outputs: Sequence[Any], expected: Sequence[torch.Tensor],
                names: Sequence[str] = EXPORT_OUTPUTS) -> dict[str, float]:
    """Per export output (``names``, the graph's order): relative error for tau, force and
    the force interval, absolute error for gate/condition."""
    errors = {}
    for name, got, want in zip(names, outputs, expected, strict=True):
        worst = float((torch.as_tensor(got) - want).abs().max())
        if name in SCALED_OUTPUTS:
            # The floor only keeps an all-zero output from dividing by zero.
            worst /= max(float(want.square().mean().sqrt()), 1e-12)
        errors[name] = worst
    return errors


def int8_tolerances(names: Sequence[str] = EXPORT_OUTPUTS) -> dict[str, float]:
    return {name: INT8_RELATIVE_TOLERANCE if name in SCALED_OUTPUTS
            else INT8_PROBABILITY_TOLERANCE for name in names}


def measure_int8_errors(run: Callable[..., Any], graph: ExportableActuator,
                        batch: int = INT8_CHECK_BATCH) -> dict[str, float]:
    """``int8_errors`` of ``run`` against eager on ``batch`` windows from the norm stats."""
    inputs = graph.example_inputs(batch=batch)
    with torch.no_grad():
        expected = graph(*inputs)
    return int8_errors(run(*inputs), expected, graph.output_names)


def int8_failures(errors: dict[str, float]) -> list[str]:
    """One line per output whose error is beyond its tolerance (empty: the check passed)."""
    tolerances = int8_tolerances(list(errors))
    return [f"{name} {errors[name]:.3g} > {tolerances[name]:.3g}"
            + (" (relative to its RMS)" if name in SCALED_OUTPUTS else " (absolute)")
            for name in errors if not errors[name] <= tolerances[name]]


def quantize_onnx_int8(source: Path, target: Path) -> None:
    """ONNX Runtime dynamic quantization: uint8 weights (per tensor, with a zero point),
    uint8 activations.

    Why uint8 weights (U8U8) and not int8 (U8S8): an export must run right on whatever CPU
    the arm's laptop has. On x86 CPUs without VNNI (AVX2 only, e.g. the AMD EPYC this was
    found on) ONNX Runtime's U8S8 kernel sums pairs of u8 x s8 products in saturating
    16-bit lanes, and the full int8 range overflows them: the MLP's torque came out 82 % of
    its RMS off there, while the same file passed on an AVX-512 VNNI Xeon. U8U8 takes
    another kernel that cannot saturate; measured on the AVX2 machine: tau 5.0 / 2.4 % of
    RMS (MLP / transformer), and still 5.2x / 7.8x faster than eager at batch 1.
    ``reduce_range`` (7-bit weights) would avoid the overflow too, at a larger error.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # It logs "consider to run pre-processing" on every call; that optional shape-inference
    # pass did not change the batch-1 time here, so the hint is dropped, not followed.
    hint = _DropMessage("consider to run pre-processing")
    logging.getLogger().addFilter(hint)
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8,
                         per_channel=False, reduce_range=False)
    finally:
        logging.getLogger().removeFilter(hint)


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()
