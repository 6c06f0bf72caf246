"""Checkpoint policing: what a checkpoint must share with the run that loads it or starts
from it, and the resolved configuration a checkpoint carries.

One compatibility check (:func:`check_checkpoint`) serves both ways a checkpoint enters a
run: ``model.init_from`` (fine-tuning, :mod:`nactuator.training.finetune`) and Lightning's
checkpoint load (``--ckpt_path``, resuming). :func:`plain` turns the run's configuration
into YAML/JSON-friendly data for the bundle (``training_config``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from nactuator.errors import UserError
from nactuator.training.losses import LossWeights


class CheckpointMismatchError(UserError, ValueError):
    """A checkpoint this run cannot load (platform, features, window or model config)."""


class InitFromError(CheckpointMismatchError):
    """``model.init_from`` names a checkpoint this run cannot start from; the message says why."""


def check_checkpoint(where: str, platform: str | None, features: Any, config: dict[str, Any],
                     error: type[Exception], *, run_platform: str, run_platform_source: str,
                     run_features: list[str], run_window_length: int,
                     expected: dict[str, Any] | None = None) -> None:
    """The one compatibility check of a checkpoint with a run (``model.init_from`` and
    checkpoint load): same platform, feature groups and window; with ``expected`` (a loaded
    checkpoint must rebuild the run's model exactly) the same model config. Raises
    ``error`` with a message that starts with ``where``."""
    if platform != run_platform:
        raise error(
            f"{where}: the checkpoint was trained for platform {platform!r}, but this "
            f"run is for {run_platform!r} ({run_platform_source}); use a "
            "checkpoint of the same platform")
    if list(features or []) != run_features:
        raise error(
            f"{where}: the checkpoint reads feature groups {features}, this run is "
            f"configured for {run_features}; set model.features to the checkpoint's")
    if config.get("window_length") != run_window_length:
        raise error(
            f"{where}: the checkpoint's window is {config.get('window_length')} frames, "
            f"this run's is {run_window_length}; set data.window_length to the "
            "checkpoint's")
    if expected is not None and config != expected:
        diff = sorted(k for k in set(expected) | set(config)
                      if expected.get(k) != config.get(k))
        raise error(f"{where}: the model config differs from this run's in {diff}: "
                    f"checkpoint {config}, run {expected}")


def require_bundle(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``nactuator`` bundle, or a ValueError naming what it holds instead."""
    bundle = checkpoint.get("nactuator")
    if not isinstance(bundle, dict):
        raise ValueError(
            "checkpoint has no 'nactuator' bundle: it was not written by "
            "NeuralActuatorModule (keys: " + ", ".join(sorted(checkpoint)[:8]) + ")"
        )
    return bundle


def plain(value: Any) -> Any:
    """Config values as YAML/JSON-friendly plain data."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, int) else k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, LossWeights):
        return asdict(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
