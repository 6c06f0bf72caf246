"""Platform files are the contract every room shares: they must load and say what they mean."""

from __future__ import annotations

import math

import pytest

from nactuator.platforms import PlatformError, list_platforms, load_platform, platform_from_dict


def test_all_shipped_platforms_load_with_consistent_channels():
    names = list_platforms()
    assert {"omx", "so101", "franka", "pendulum"} <= set(names)
    for name in names:
        p = load_platform(name)
        assert p.n == len(p.channel_names) > 0
        assert p.robot_model_path().name == p.robot_model
        assert math.isclose(p.substep_dt * p.substeps, p.control_dt)
        for c in p.channels:
            assert c.torque_min < 0 < c.torque_max, (name, c.name)
            assert c.limit_lower < c.limit_upper
            assert c.armature > 0, f"{name}.{c.name}: armature is required for stability"


def test_omx_gripper_is_one_prismatic_finger_in_metres():
    p = load_platform("omx")
    assert p.channel_names == ["joint1", "joint2", "joint3", "joint4", "gripper"]
    assert p.gripper_indices == [4] and p.arm_indices == [0, 1, 2, 3]
    g = p.channels[4]
    assert g.kind == "prismatic" and g.unit == "m" and g.torque_unit == "N"
    assert (g.limit_lower, g.limit_upper) == (-0.011, 0.020)
    assert p.effort_signal == "current"


def test_so101_matches_nad_settings():
    p = load_platform("so101")
    assert p.n == 6 and p.substeps == 5 and p.control_dt == pytest.approx(0.01605)
    assert p.effort_signal == "load"
    assert p.hardware["ids"] == [1, 2, 3, 4, 5, 6] and p.hardware["model_number"] == 777


def test_unknown_platform_names_the_choices():
    with pytest.raises(PlatformError, match=r"unknown platform 'ur5'.*so101"):
        load_platform("ur5")


def _minimal(**over):
    raw = {
        "name": "t", "robot_model": "t.xml", "fps": 60, "control_dt": 0.016, "substeps": 4,
        "effort_signal": "current", "velocity_limit": 10, "end_effector": {"body": "b"},
        "channels": [{"name": "j", "kind": "revolute", "torque": [-1, 1], "limit": [-1, 1],
                      "armature": 0.01, "damping": 0.1}],
    }
    raw.update(over)
    return raw


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"substeps": 0}, "substeps must be a positive integer"),
        ({"effort_signal": "voltage"}, "effort_signal must be one of"),
        ({"fps": -1}, "'fps' must be > 0"),
        ({"channels": [{"name": "j", "kind": "ball", "torque": [-1, 1], "limit": [-1, 1],
                        "armature": 0, "damping": 0}]}, "kind must be one of"),
        ({"channels": [{"name": "j", "kind": "revolute", "torque": [1, -1], "limit": [-1, 1],
                        "armature": 0, "damping": 0}]}, "torque must be"),
        ({"channels": [{"name": "j", "kind": "revolute", "effort": [-1, 1], "limit": [-1, 1],
                        "armature": 0, "damping": 0}]}, "'effort' was renamed 'torque'"),
    ],
)
def test_bad_platform_fields_are_named(override, message):
    with pytest.raises(PlatformError, match=message):
        platform_from_dict(_minimal(**override), source="bad.yaml")


def test_missing_field_names_file_and_field():
    raw = _minimal()
    del raw["control_dt"]
    with pytest.raises(PlatformError, match=r"bad.yaml: missing required field 'control_dt'"):
        platform_from_dict(raw, source="bad.yaml")
