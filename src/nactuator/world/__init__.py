"""The hidden ground-truth world: servo firmware, DC motor, gearbox, thermal state, MuJoCo arm.

``data.synth`` drives it to generate datasets; the hardware emulators drive it in real time.
It may import only ``platforms``, ``servo_units`` (the register encodings and unit scales
it shares with the buses), numpy and mujoco (and yaml for world files). See
``docs/synthetic-world.md``.
"""

from .params import WorldError, WorldParams, default_world_path, load_world_config, resolve_world
from .tasks import EpisodePlan, Kinematics, plan_episode
from .world import World, load_world

__all__ = [
    "EpisodePlan",
    "Kinematics",
    "World",
    "WorldError",
    "WorldParams",
    "default_world_path",
    "load_world",
    "load_world_config",
    "plan_episode",
    "resolve_world",
]
