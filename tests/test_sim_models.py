"""Robot models and builder: both engines see the same arm, the YAML is the source of truth,
the torch kinematics agree with MuJoCo, and unusable settings are refused clearly."""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest
import torch
from conftest import SIM_PLATFORMS as PLATFORMS

from nactuator.platforms import PlatformError, list_platforms, load_platform
from nactuator.sim import Simulator
from nactuator.sim.builder import SimSetupError, build_newton_model, sim_settings
from nactuator.sim.parity import mujoco_model


def test_every_configured_platform_has_a_model():
    assert set(PLATFORMS) <= set(list_platforms())
    for name in PLATFORMS:
        assert load_platform(name).robot_model_path().exists()


@pytest.mark.parametrize("name", PLATFORMS)
def test_newton_and_mujoco_share_joint_order_and_dynamics(name):
    platform = load_platform(name)
    model = build_newton_model(platform, batch=3, device="cpu")
    n = platform.n
    assert model.joint_dof_count == 3 * n
    names = [k.rsplit("/", 1)[-1] for k in model.joint_label]
    assert names == platform.channel_names * 3
    armature = [c.armature for c in platform.channels]
    np.testing.assert_allclose(model.joint_armature.numpy()[:n], armature, rtol=1e-6)
    np.testing.assert_allclose(model.joint_target_ke.numpy(), 0.0)
    np.testing.assert_allclose(model.joint_target_kd.numpy(), 0.0)
    settings = sim_settings(platform)
    np.testing.assert_allclose(model.joint_limit_ke.numpy(), settings.limit_ke)

    mj = mujoco_model(platform)
    assert [mj.joint(i).name for i in range(mj.njnt)] == platform.channel_names
    np.testing.assert_allclose(mj.dof_armature, [c.armature for c in platform.channels])
    np.testing.assert_allclose(mj.dof_damping, [c.damping for c in platform.channels])
    limits = [[c.limit_lower, c.limit_upper] for c in platform.channels]
    np.testing.assert_allclose(mj.jnt_range, limits)
    # Same inertials: total moving mass agrees (the welded base is not simulated).
    moving_mass = sum(mj.body_mass[i] for i in range(mj.nbody) if mj.body_weldid[i] != 0)
    assert moving_mass == pytest.approx(float(model.body_mass.numpy()[:n].sum()), rel=1e-5)


def test_reference_numbers_from_robots_md():
    # OMX end effector at q = 0 is at (0.286, 0, 0.2045) m; gravity torques at q = 0.
    sim = Simulator("omx")
    q = torch.zeros(1, 5)
    np.testing.assert_allclose(sim.ee_position(q)[0].numpy(), [0.286, 0.0, 0.2045], atol=1e-4)
    np.testing.assert_allclose(sim.gravity_torque(q)[0, 1:4].numpy(), [-0.438, -0.359, -0.064],
                               atol=2e-3)
    so = Simulator("so101")
    np.testing.assert_allclose(so.gravity_torque(torch.zeros(1, 6))[0, 1:4].numpy(),
                               [-0.539, -0.453, -0.117], atol=2e-3)


@pytest.mark.parametrize("name", PLATFORMS)
def test_torch_kinematics_match_mujoco(sims, name):
    sim = sims[name]
    platform = sim.platform
    mj = mujoco_model(platform)
    data = mujoco.MjData(mj)
    rng = np.random.default_rng(1)
    lo = np.array([c.limit_lower for c in platform.channels])
    hi = np.array([c.limit_upper for c in platform.channels])
    body = mj.body(platform.end_effector.body).id
    for q in rng.uniform(lo, hi, size=(4, platform.n)):
        data.qpos[:] = q
        mujoco.mj_forward(mj, data)
        offset = np.array(platform.end_effector.offset)
        point = data.xpos[body] + data.xmat[body].reshape(3, 3) @ offset
        jac = np.zeros((3, mj.nv))
        mujoco.mj_jac(mj, data, jac, None, point, body)
        mass = np.zeros((mj.nv, mj.nv))
        mujoco.mj_fullM(mj, data, mass)
        qt = torch.tensor(q[None], dtype=torch.float64)
        # Newton stores the joint frames in float32, hence the ~1e-6 relative tolerances.
        np.testing.assert_allclose(sim.ee_position(qt)[0].numpy(), point, atol=1e-5)
        np.testing.assert_allclose(sim.ee_jacobian(qt)[0].numpy(), jac, atol=1e-5)
        np.testing.assert_allclose(sim.gravity_torque(qt)[0].numpy(), data.qfrc_bias, atol=1e-4,
                                   rtol=1e-4)
        np.testing.assert_allclose(sim.kinematics.joint_inertia(qt)[0].numpy(), np.diag(mass),
                                   rtol=1e-4)


def test_jacobian_is_the_derivative_of_the_end_effector_point(sims):
    sim = sims["so101"]
    q = torch.tensor([[0.1, -0.3, 0.4, 0.2, -0.5, 0.3]], dtype=torch.float64)
    auto = torch.autograd.functional.jacobian(lambda x: sim.ee_position(x)[0], q)[:, 0, :]
    torch.testing.assert_close(sim.ee_jacobian(q)[0], auto)


def test_unstable_settings_are_refused_with_the_fix():
    so101 = load_platform("so101")
    # The newton#4269 jaw: damping 0.60 on a 1.6e-5 kg*m^2 link without armature (~119).
    no_armature = tuple(dataclasses.replace(c, armature=0.0 if c.is_gripper else c.armature)
                        for c in so101.channels)
    with pytest.raises(SimSetupError, match=r"joint 'gripper'.*damping \* dt / I_eff.*"
                                            r"raise armature above"):
        Simulator(dataclasses.replace(so101, channels=no_armature))
    pendulum = load_platform("pendulum")
    stiff = dataclasses.replace(pendulum, sim={"limit_kd": 10.0})
    with pytest.raises(SimSetupError, match=r"sim.limit_kd \* dt / I_eff = 10 "):
        Simulator(stiff)
    with pytest.raises(SimSetupError, match=r"limit_ke"):
        Simulator(dataclasses.replace(pendulum, sim=dict(pendulum.sim, limit_ke=1e7)))


def test_bad_configuration_is_refused():
    with pytest.raises(PlatformError, match="unknown platform 'nope'"):
        Simulator("nope")
    with pytest.raises(TypeError, match="platform must be a Platform"):
        Simulator(3)
    omx = load_platform("omx")
    with pytest.raises(SimSetupError, match=r"unknown key\(s\) \['limit_k'\] in section 'sim'"):
        Simulator(dataclasses.replace(omx, sim={"limit_k": 1.0}))
    with pytest.raises(SimSetupError, match="sim.limit_ke must be a finite number >= 0"):
        Simulator(dataclasses.replace(omx, sim={"limit_ke": -1.0}))
    renamed = tuple(dataclasses.replace(c, name=f"x{i}") for i, c in enumerate(omx.channels))
    with pytest.raises(SimSetupError, match="do not match the channels"):
        Simulator(dataclasses.replace(omx, channels=renamed))
    with pytest.raises(SimSetupError, match="end_effector.body 'hand'"):
        Simulator(dataclasses.replace(omx, end_effector=dataclasses.replace(omx.end_effector,
                                                                            body="hand")))
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda"):
        Simulator("omx", device="mps")
