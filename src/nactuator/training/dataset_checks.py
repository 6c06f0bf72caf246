"""What a run refuses about its data before training starts: a DataModule for another
platform or window, and a dataset that lacks a channel the model reads.

A channel a platform does not log (``data.unrecorded``, e.g. Franka's voltage) is stored as
NaN and would reach the model as a constant 0; that silently wrong input is refused here,
naming the dataset, the channel and the feature group (or the physics actuator).
"""

from __future__ import annotations

from typing import Any

from nactuator.input_filters import POOLED_KEYS, pooled_keys
from nactuator.models.config import physics_inputs
from nactuator.models.features import window_channels
from nactuator.platforms import Platform


def check_datamodule_matches(platform: Platform, window_length: int, datamodule: Any) -> None:
    """The DataModule serves the run's platform with the run's window length."""
    served = getattr(datamodule, "platform", None)
    name = getattr(served, "name", served)
    if isinstance(name, str) and name != platform.name:
        raise ValueError(
            f"the model is configured for platform {platform.name!r} but the data "
            f"module serves {name!r}; set the same --platform for both"
        )
    data_window = getattr(datamodule, "window_length", window_length)
    if data_window != window_length:
        raise ValueError(
            f"model window_length {window_length} != data window_length "
            f"{data_window} (link data.window_length and model.window_length)"
        )


def check_dataset_channels(features: list[str], model_config: dict[str, Any],
                           datamodule: Any) -> None:
    """Every channel the model's feature groups (and its physics actuator) read must be
    recorded in every dataset of the DataModule (``unrecorded_channels()``), and the pooled
    statistics the group ``pooled`` reads must be computed by its input filters."""
    pooled = [k for k in window_channels(features) if k in POOLED_KEYS]
    filters = getattr(datamodule, "input_filters", None)
    if pooled and isinstance(filters, dict) and not pooled_keys(filters):
        raise ValueError("model.features has 'pooled' but the DataModule computes no pooled "
                         "statistics; set data.pool_frames (e.g. conf/train/"
                         "pooled_condition.yaml) or drop 'pooled'")
    unrecorded = getattr(datamodule, "unrecorded_channels", None)
    if unrecorded is None:
        return
    needed = window_channels(features) + physics_inputs(model_config)
    for path, missing_by_key in unrecorded().items():
        for key in needed:
            missing = missing_by_key.get(key)
            if not missing:
                continue
            groups = [g for g in features if key in window_channels([g])]
            if not groups:  # read by the physics actuator
                raise ValueError(
                    f"{path}: the dataset has no {key!r} for channel(s) {missing} (for "
                    f"every episode), which the model's physics actuator needs "
                    f"(docs/counterfactual.md)")
            keep = [g for g in features if g not in groups]
            raise ValueError(
                f"{path}: the dataset has no recorded {key!r} for channel(s) {missing}, "
                f"which the model's feature group(s) {groups} need; drop them from "
                f"model.features (e.g. {keep}) or train on data that records {key!r}"
            )
