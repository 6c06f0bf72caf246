"""Model-config resolution: what the training options (``model.arch``, ``model.width``,
``model.depth``, ``model.model_sizes``, ``model.physics``) mean for a
:class:`~nactuator.models.NeuralActuator`, so the sweep axes mean the same thing for every
architecture and the training room only passes the options through.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEPTH_KEY", "WIDTH_KEY", "dynamics_config", "firmware_config", "physics_inputs",
           "resolve_model_config"]

# Which size name is the "width" and the "depth" of each architecture, so that one sweep
# axis (model.width / model.depth) means the same thing for every arch.
WIDTH_KEY = {"transformer": "d_model", "mlp": "hidden", "gru": "hidden", "lstm": "hidden",
             "jointwise": "hidden"}
DEPTH_KEY = {"transformer": "n_layers", "mlp": "n_layers", "gru": "n_layers", "lstm": "n_layers",
             "jointwise": "n_layers"}


def resolve_model_config(
    arch: str, window_length: int, width: int | None, depth: int | None,
    sizes: dict[str, Any] | None
) -> dict[str, Any]:
    """``{"arch", "window_length", **sizes}`` for ``NeuralActuator``.

    ``width``/``depth`` set the architecture's main width and layer count; for the
    transformer the feed-forward size follows as 2 × width (SPEC §4: 192 → 384) unless
    ``sizes`` names ``d_ff`` explicitly.
    """
    if arch not in WIDTH_KEY:
        raise ValueError(f"model.arch must be one of {sorted(WIDTH_KEY)}, got {arch!r}")
    config: dict[str, Any] = {"arch": arch, "window_length": window_length}
    if width is not None:
        config[WIDTH_KEY[arch]] = int(width)
        if arch == "transformer":
            config["d_ff"] = 2 * int(width)
    if depth is not None:
        config[DEPTH_KEY[arch]] = int(depth)
    config.update(sizes or {})
    return config


def physics_inputs(model_config: dict[str, Any]) -> list[str]:
    """Window keys the model config's physics actuator reads (none without one)."""
    from nactuator.models.physics import PHYSICS

    physics = model_config.get("physics")
    kind = physics.get("kind") if isinstance(physics, dict) else None
    if kind not in PHYSICS:
        return []
    skip = {"initial_temperature"} if physics.get("temperature") is False else set()
    return [k for k in PHYSICS[kind].inputs if k not in skip]


def dynamics_config(dynamics: str, arch: str, model_config: dict[str, Any]) -> dict[str, Any]:
    """``{"dynamics": "next_state"}`` for the joint-wise model's second mode (each joint
    predicts its own next state), ``{}`` for the default ``torque``; other combinations are
    refused."""
    if dynamics not in ("torque", "next_state"):
        raise ValueError(f"dynamics must be 'torque' or 'next_state', got {dynamics!r}")
    if dynamics == "torque":
        return {}
    if arch != "jointwise":
        raise ValueError("dynamics: next_state is the joint-wise model's second mode "
                         f"(each joint predicts its own next state); set arch: "
                         f"jointwise, not {arch!r}")
    if "physics" in model_config:
        raise ValueError("dynamics: next_state predicts the state, not a torque: "
                         "drop model_sizes.physics")
    return {"dynamics": "next_state"}


def firmware_config(platform: Any, features: list[str],
                    model_config: dict[str, Any]) -> dict[str, Any]:
    """``{"firmware": ...}`` from the platform's ``hardware.firmware`` when the model needs
    the servo's position law (the ``duty`` feature group or a ``physics`` actuator), else {}
    (counterfactual models, docs/counterfactual.md)."""
    needs = "duty" in features or "physics" in model_config
    if not needs or "firmware" in model_config:
        return {}
    firmware = platform.hardware.get("firmware")
    if firmware is None:
        raise ValueError(f"the model's commanded-duty feature / physics actuator needs the "
                         f"servo firmware law, but {platform.source} has no hardware.firmware")
    return {"firmware": dict(firmware)}
