"""nactuator.models: pure ``nn.Module``s for the neural actuator (Contract 4).

``FeatureBuilder`` turns a window of raw channels into normalised tokens, ``build_model``
makes one encoder (transformer | mlp | gru | lstm | jointwise) with the torque / force-gate /
condition heads, ``NeuralActuator`` joins the two, and the bundle functions save and
rebuild a trained actuator without its training data or config files. ``load_model`` loads
what ``infer``, ``live`` and ``eval`` run: a checkpoint/bundle, or a file written by
``nactuator export`` (run by ``models.exported.ExportedActuator``).
"""

from nactuator.models.actuator import NeuralActuator
from nactuator.models.bundle import (
    BUNDLE_FORMAT,
    CHECKPOINT_KEY,
    BundleError,
    bundle_to_dict,
    load_actuator,
    save_bundle,
)
from nactuator.models.features import (
    DEFAULT_FEATURES,
    FEATURE_GROUPS,
    FeatureBuilder,
    feature_channels,
    window_channels,
)
from nactuator.models.heads import OUTPUT_KEYS, ActuatorHeads
from nactuator.models.loader import load_model
from nactuator.models.networks import ENCODERS, ActuatorNet, build_model, count_parameters

__all__ = [
    "BUNDLE_FORMAT",
    "CHECKPOINT_KEY",
    "DEFAULT_FEATURES",
    "ENCODERS",
    "FEATURE_GROUPS",
    "OUTPUT_KEYS",
    "ActuatorHeads",
    "ActuatorNet",
    "BundleError",
    "FeatureBuilder",
    "NeuralActuator",
    "build_model",
    "bundle_to_dict",
    "count_parameters",
    "feature_channels",
    "load_actuator",
    "load_model",
    "save_bundle",
    "window_channels",
]
