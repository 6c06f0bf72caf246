"""The actuator bundle: everything needed to rebuild a trained ``NeuralActuator``.

A bundle is a plain dict (torch-saveable) that a Lightning checkpoint carries under
``checkpoint["nactuator"]`` or that is saved on its own. Loading never needs the
training data or any config file: features, norm stats and every model size are inside.
``load_model`` is the one loader of a model to *run* (``infer``, ``live``, ``eval``): a
bundle, or an exported TorchScript/ONNX file; ``load_actuator`` rebuilds the trainable
``NeuralActuator`` and refuses an exported file with a one-line error.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nactuator.atomic import atomic_path
from nactuator.errors import UserError
from nactuator.input_filters import InputFilterError, check_spec, legacy_spec
from nactuator.model_files import CHECKPOINT, model_kind, resolve_model_path
from nactuator.models.actuator import NeuralActuator

BUNDLE_FORMAT = "nactuator-actuator/1"
CHECKPOINT_KEY = "nactuator"
_RESERVED = ("ema_state_dict", "training_config", "input_filters")
UNCERTAINTY_KEY = "uncertainty"  # the force interval's calibration (absent: none)


class BundleError(UserError, ValueError):
    """A file or dict is not a usable actuator bundle; the message says which and why."""


def _cpu_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def _ema_state(ema: Any, actuator: NeuralActuator) -> dict[str, torch.Tensor]:
    """An EMA copy as a full state dict of ``actuator``.

    Accepts a state dict or a module (an EMA copy of the actuator, or a
    ``torch.optim.swa_utils.AveragedModel`` wrapping one). Buffers the EMA does not track
    (the norm stats) are taken from the live actuator.
    """
    state = ema.state_dict() if isinstance(ema, nn.Module) else dict(ema)
    state = {k.removeprefix("module."): v for k, v in state.items() if k != "n_averaged"}
    reference = actuator.state_dict()
    unknown = sorted(set(state) - set(reference))
    if unknown:
        raise BundleError(f"ema_state_dict has keys the actuator does not: {unknown[:5]}")
    for key, value in state.items():
        if tuple(value.shape) != tuple(reference[key].shape):
            raise BundleError(f"ema_state_dict[{key!r}] has shape {tuple(value.shape)}, "
                              f"the actuator's is {tuple(reference[key].shape)}")
    return _cpu_state({**reference, **state})


def bundle_to_dict(actuator: NeuralActuator, platform: str,
                   extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The bundle of ``actuator`` for ``platform``.

    ``extra`` may hold ``ema_state_dict`` (state dict or module), ``training_config``
    (the resolved training config, plain data) and ``input_filters`` (the DataModule's
    input filter spec, :mod:`nactuator.input_filters`: how the model's inputs were
    filtered); any other keys are kept under ``extra``.
    """
    if not isinstance(actuator, NeuralActuator):
        raise TypeError(f"bundle_to_dict needs a NeuralActuator, got {type(actuator).__name__}")
    if not isinstance(platform, str) or not platform:
        raise ValueError(f"platform must be a platform name such as 'omx', got {platform!r}")
    extra = dict(extra or {})
    ema = extra.get("ema_state_dict")
    filters = extra.get("input_filters")
    return {
        "format": BUNDLE_FORMAT,
        "platform": platform,
        "features": actuator.features,
        # counterfactual | telemetry: whether the model replays recorded telemetry
        # (derived from the inputs; stored so a reader can tell without building it).
        "mode": actuator.mode,
        "n_motors": actuator.n_motors,
        "norm_stats": actuator.feature_builder.norm_stats(),
        "model_config": dict(actuator.model_config),
        "state_dict": _cpu_state(actuator.state_dict()),
        "ema_state_dict": None if ema is None else _ema_state(ema, actuator),
        "training_config": extra.get("training_config"),
        # None (a bundle built without a DataModule): readers use legacy_spec.
        "input_filters": None if filters is None else check_spec(filters),
        "extra": {k: v for k, v in extra.items() if k not in _RESERVED},
        # The force interval's conformal calibration (nactuator.uncertainty), plain data.
        UNCERTAINTY_KEY: (None if actuator.interval_calibration is None
                          else dict(actuator.interval_calibration)),
    }


def save_bundle(bundle: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write a bundle atomically (temp file in the same folder, then ``os.replace``)."""
    path = Path(path)
    if bundle.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"refusing to save: format tag {bundle.get('format')!r} is not "
                          f"{BUNDLE_FORMAT!r}")
    with atomic_path(path) as tmp:
        torch.save(dict(bundle), tmp)
    return path


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _read(source: str | os.PathLike | Mapping, map_location: Any) -> tuple[dict, str]:
    if isinstance(source, Mapping):
        return dict(source), "<dict>"
    path = resolve_model_path(source)
    kind = model_kind(path)
    if kind != CHECKPOINT:
        raise BundleError(f"{path} is an exported {kind} model: infer, live and eval run it, "
                          "but this needs the checkpoint (.ckpt) or bundle it was exported "
                          "from (an export has no trainable weights or gradients)")
    try:
        # weights_only: the restricted unpickler builds tensors and plain containers only, so
        # a crafted file cannot run code. Our checkpoints and bundles hold nothing else.
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        wanted = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if wanted is None:
            raise BundleError(f"{path} is not a torch checkpoint or actuator bundle (it does "
                              "not unpickle as one)") from err
        raise BundleError(
            f"{path} was refused: it asks to call or build {wanted.group(1)}, which a nactuator "
            "checkpoint never contains, and loading it could run code. Only load checkpoints "
            "written by nactuator (a .ckpt from `nactuator train`/`fit`, or a saved bundle)"
        ) from err
    except Exception as err:
        raise BundleError(f"{path} is not a torch checkpoint or actuator bundle "
                          f"({type(err).__name__}: {_first_line(err)})") from err
    if not isinstance(obj, Mapping):
        raise BundleError(f"{path} holds a {type(obj).__name__}, not a checkpoint dict")
    return dict(obj), str(path)


def load_actuator(source: str | os.PathLike | Mapping, use_ema: bool = True,
                  map_location: Any = "cpu",
                  expect_platform: str | None = None) -> tuple[NeuralActuator, dict[str, Any]]:
    """Rebuild an eval-mode ``NeuralActuator`` from a Lightning ``.ckpt``, a bundle file or
    a dict of either. EMA weights are used when present and ``use_ema``; ``meta["weights"]``
    says which were loaded."""
    obj, where = _read(source, map_location)
    if CHECKPOINT_KEY in obj:
        bundle = obj[CHECKPOINT_KEY]
    elif "format" in obj:
        bundle = obj
    else:
        raise BundleError(f"{where} is not a nactuator checkpoint: no {CHECKPOINT_KEY!r} "
                          f"bundle and no 'format' tag (top-level keys: {sorted(obj)[:8]})")
    if not isinstance(bundle, Mapping) or bundle.get("format") != BUNDLE_FORMAT:
        tag = bundle.get("format") if isinstance(bundle, Mapping) else type(bundle).__name__
        raise BundleError(f"{where}: bundle format {tag!r} is not {BUNDLE_FORMAT!r}")
    missing = [k for k in ("platform", "features", "n_motors", "norm_stats", "model_config",
                           "state_dict") if k not in bundle]
    if missing:
        raise BundleError(f"{where}: bundle is missing {missing}")
    if expect_platform is not None and bundle["platform"] != expect_platform:
        raise BundleError(f"{where} was trained for platform {bundle['platform']!r}, "
                          f"expected {expect_platform!r}")

    actuator = NeuralActuator(bundle["features"], bundle["n_motors"], bundle["norm_stats"],
                              bundle["model_config"])
    ema = bundle.get("ema_state_dict")
    weights = "ema" if use_ema and ema is not None else "raw"
    try:
        actuator.load_state_dict(ema if weights == "ema" else bundle["state_dict"])
    except RuntimeError as err:
        raise BundleError(f"{where}: {weights} weights do not fit the bundle's model "
                          f"config {bundle['model_config']}: {err}") from err
    calibration = bundle.get(UNCERTAINTY_KEY)
    if calibration is not None:
        if not actuator.has_uncertainty:
            raise BundleError(f"{where}: the bundle has an interval calibration but its model "
                              "has no uncertainty head")
        actuator.interval_calibration = dict(calibration)
    if isinstance(map_location, (str, torch.device)):
        actuator.to(map_location)
    actuator.eval()
    meta = {k: bundle.get(k) for k in ("format", "platform", "features", "n_motors",
                                       "norm_stats", "model_config", "training_config",
                                       "extra", UNCERTAINTY_KEY)}
    meta.update(weights=weights, source=where, mode=actuator.mode,
                input_filters=input_filters_of(bundle, where))
    return actuator, meta


def input_filters_of(bundle: Mapping, where: str) -> dict[str, Any]:
    """The input filter spec of a bundle (or of an export's metadata: the same keys); for
    one saved before they carried a spec, the spec that reproduces its training inputs
    (:func:`nactuator.input_filters.legacy_spec`)."""
    try:
        if bundle.get("input_filters") is not None:
            return check_spec(bundle["input_filters"], f"{where}: input_filters")
        return legacy_spec(bundle.get("training_config"))
    except InputFilterError as err:
        raise BundleError(f"{where}: {err}") from err


def set_calibration(source: str | os.PathLike, calibration: Mapping[str, Any] | None,
                    out: str | os.PathLike | None = None) -> Path:
    """Store the force interval's calibration (plain data,
    ``nactuator.uncertainty.calibration_record``) in a checkpoint or bundle file, written
    atomically to ``out`` (default: ``source`` itself, a symlink's target). Weights and
    everything else are kept as they are."""
    obj, where = _read(source, "cpu")
    bundle = obj.get(CHECKPOINT_KEY, obj)
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{where} is not a nactuator checkpoint or bundle")
    if not (bundle.get("model_config") or {}).get("uncertainty"):
        raise BundleError(f"{where}: its model has no uncertainty head to calibrate")
    bundle[UNCERTAINTY_KEY] = None if calibration is None else dict(calibration)
    target = Path(out) if out is not None else Path(where).resolve()
    with atomic_path(target) as tmp:
        torch.save(obj, tmp)
    return target
