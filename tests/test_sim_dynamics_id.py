"""Inverse dynamics, mass matrix and Coriolis terms (sim/dynamics.py) against MuJoCo's own
``mj_inverse`` / ``mj_fullM`` / ``qfrc_bias`` on the platform MJCFs, plus the structural
identities the momentum observer relies on."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch
from conftest import SIM_PLATFORMS as PLATFORMS

from nactuator.platforms import load_platform
from nactuator.sim.dynamics import ArmDynamics
from nactuator.sim.parity import mujoco_model

# Newton stores the MJCF inertials in float32, so agreement is ~1e-7 relative, not 1e-15.
RTOL = 2e-5


@pytest.fixture(scope="module")
def arms():
    return {name: (load_platform(name), ArmDynamics.for_platform(name)) for name in PLATFORMS}


def random_states(platform, count: int, seed: int):
    rng = np.random.default_rng(seed)
    lo = np.array([c.limit_lower for c in platform.channels])
    hi = np.array([c.limit_upper for c in platform.channels])
    # Inside the limits (MuJoCo adds limit forces at them), fast enough for real Coriolis.
    q = lo + (hi - lo) * rng.uniform(0.1, 0.9, (count, platform.n))
    scale = np.array([0.02 if c.kind == "prismatic" else 2.0 for c in platform.channels])
    qd = rng.normal(0.0, 1.0, (count, platform.n)) * scale
    qdd = rng.normal(0.0, 3.0, (count, platform.n)) * scale
    return q, qd, qdd


def mujoco_reference(platform, q, qd, qdd, gravity=True):
    model = mujoco_model(platform)
    model.dof_damping[:] = 0.0  # passive forces are not rigid-body dynamics
    if not gravity:
        model.opt.gravity[:] = 0.0
    data = mujoco.MjData(model)
    tau, bias, mass = [], [], []
    for qi, qdi, qddi in zip(q, qd, qdd, strict=True):
        data.qpos[:], data.qvel[:], data.qacc[:] = qi, qdi, qddi
        mujoco.mj_inverse(model, data)
        tau.append(data.qfrc_inverse.copy())
        bias.append(data.qfrc_bias.copy())
        full = np.zeros((platform.n, platform.n))
        mujoco.mj_fullM(model, data, full)
        mass.append(full)
    return np.array(tau), np.array(bias), np.array(mass)


def as_torch(*arrays):
    return [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in arrays]


def assert_close(ours, ref, what):
    scale = np.abs(ref).max()
    err = np.abs(ours - ref).max()
    assert err <= RTOL * scale + 1e-9, f"{what}: max error {err:.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("name", PLATFORMS)
def test_inverse_dynamics_matches_mujoco_mj_inverse(arms, name):
    platform, dyn = arms[name]
    q, qd, qdd = random_states(platform, 8, seed=1)
    ref_tau, ref_bias, ref_mass = mujoco_reference(platform, q, qd, qdd)
    tq, tqd, tqdd = as_torch(q, qd, qdd)
    assert_close(dyn.inverse_dynamics(tq, tqd, tqdd).numpy(), ref_tau, "qfrc_inverse")
    assert_close(dyn.bias(tq, tqd).numpy(), ref_bias, "qfrc_bias")
    assert_close(dyn.mass_matrix(tq).numpy(), ref_mass, "mj_fullM")
    # The armature really is in there (MuJoCo's M carries the platform's).
    assert (np.diagonal(dyn.mass_matrix(tq).numpy(), axis1=1, axis2=2)
            >= np.array([c.armature for c in platform.channels]) - 1e-12).all()


@pytest.mark.parametrize("name", ["so101", "franka"])
def test_coriolis_and_centrifugal_terms_match_mujoco_without_gravity(arms, name):
    platform, dyn = arms[name]
    q, qd, qdd = random_states(platform, 6, seed=2)
    _, ref_bias, _ = mujoco_reference(platform, q, qd, qdd, gravity=False)
    tq, tqd = as_torch(q, qd)
    assert np.abs(ref_bias).max() > 1e-3  # velocity terms are really exercised
    assert_close(dyn.bias(tq, tqd, gravity=False).numpy(), ref_bias, "C(q, qd) qd")
    c = dyn.coriolis_matrix(tq, tqd)
    assert_close((c @ tqd[..., None])[..., 0].numpy(), ref_bias, "Christoffel C qd")


@pytest.mark.parametrize("name", ["omx", "so101", "franka"])
def test_mass_matrix_rate_minus_two_c_is_skew_symmetric(arms, name):
    # The property the generalised momentum observer is built on: Mdot = C + C^T.
    platform, dyn = arms[name]
    q, qd, _ = random_states(platform, 5, seed=3)
    tq, tqd = as_torch(q, qd)
    c = dyn.coriolis_matrix(tq, tqd)
    s = dyn.mass_matrix_rate(tq, tqd) - 2 * c
    assert torch.allclose(s, -s.transpose(1, 2), atol=1e-10)
    # C^T qd from one forward-mode pass (Mdot qd - RNEA's C qd) equals the Christoffel one;
    # the two routes share the float32 joint frames, hence the relative tolerance.
    ct_qd = (c.transpose(1, 2) @ tqd[..., None])[..., 0]
    assert_close(dyn.coriolis_transpose_qd(tq, tqd).numpy(), ct_qd.numpy(), "C^T qd")
    # Mdot itself against a central difference of M along the motion.
    h = 1e-6
    fd = (dyn.mass_matrix(tq + h * tqd) - dyn.mass_matrix(tq - h * tqd)) / (2 * h)
    assert torch.allclose(dyn.mass_matrix_rate(tq, tqd), fd, atol=1e-7)


@pytest.mark.parametrize("name", PLATFORMS)
def test_gravity_torque_agrees_with_the_simulators_kinematics(arms, name):
    platform, dyn = arms[name]
    q, _, _ = random_states(platform, 4, seed=4)
    (tq,) = as_torch(q)
    assert torch.allclose(dyn.gravity_torque(tq), dyn.kin.gravity_torque(tq), atol=1e-10)


def test_inverse_dynamics_of_a_pendulum_by_hand(arms):
    # The BAM bench: point-like mass m at l, hinge at q = 0 hanging down; the MJCF inertials
    # give I_total and m*l; tau = I_total qdd + m g l sin(q).
    platform, dyn = arms["pendulum"]
    q = torch.tensor([[0.0], [np.pi / 2], [0.3]], dtype=torch.float64)
    zero = torch.zeros_like(q)
    m_l = dyn.gravity_torque(q[1:2])[0, 0].item() / 9.81  # effort at horizontal = m g l
    inertia = dyn.mass_matrix(q)[:, 0, 0]
    assert torch.allclose(inertia, inertia[0].expand(3))  # one joint: M does not depend on q
    tau = dyn.inverse_dynamics(q, zero, torch.full_like(q, 2.0))[:, 0]
    expected = inertia * 2.0 + 9.81 * m_l * torch.sin(q[:, 0])
    assert torch.allclose(tau, expected, atol=1e-9)
    assert 0.04 < m_l < 0.06  # 0.49 kg at 0.10 m (robots.md §6)


def test_armature_override_and_bad_inputs(arms):
    platform, dyn = arms["omx"]
    light = ArmDynamics(dyn.kin, armature=[0.01] * platform.n)
    q = torch.zeros(1, platform.n, dtype=torch.float64)
    diff = dyn.mass_matrix(q) - light.mass_matrix(q)
    assert torch.allclose(diff, torch.eye(platform.n, dtype=torch.float64) * (
        torch.tensor([c.armature for c in platform.channels], dtype=torch.float64) - 0.01))
    with pytest.raises(ValueError, match="armature needs 5 values"):
        ArmDynamics(dyn.kin, armature=[0.01] * 3)
    with pytest.raises(ValueError, match=r"qd must have shape \(1, 5\)"):
        dyn.inverse_dynamics(q, torch.zeros(1, 4, dtype=torch.float64), q)
    with pytest.raises(TypeError, match="floating-point"):
        dyn.mass_matrix(torch.zeros(1, 5, dtype=torch.int64))
