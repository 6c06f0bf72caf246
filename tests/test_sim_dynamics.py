"""Forward dynamics of both engines: MuJoCo parity, determinism, batch independence,
long-run stability, external-force routing and input validation."""

from __future__ import annotations

import pytest
import torch
from conftest import SIM_PLATFORMS as PLATFORMS

from nactuator.sim import Simulator
from nactuator.sim.check import (
    PARITY_DEV_GATE,
    PARITY_GATE,
    mujoco_parity,
    parity_passes,
    start_states,
    tracking_torques,
)

ENGINES = ["chain", "newton"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", PLATFORMS)
def test_mujoco_parity_within_mujocos_own_integration_gap(engine_sims, engine, name):
    # 2 s (Franka 1 s, before its open-loop replay turns chaotic); both engines match
    # MuJoCo's explicit-damping Euler to <= 8e-5 rad, <= 2.2e-3 of MuJoCo's Euler-RK4 gap.
    res = mujoco_parity(engine_sims[engine][name], batch=2, seed=0)
    assert res["ratio"] <= PARITY_GATE == 1e-2, res
    assert res["max_dev"] <= PARITY_DEV_GATE == 1e-3, res
    assert parity_passes(res)
    # The arm really moved, so the comparison means something.
    assert res["euler_rk4_gap"] > 1e-3, res


def test_the_parity_gate_fails_a_model_that_differs_from_mujocos(monkeypatch):
    # The simulated SO-101 has 0.5 % more joint damping than the one MuJoCo runs: a model
    # mismatch well inside the old gate (2x MuJoCo's own Euler-RK4 gap).
    import dataclasses

    from nactuator.platforms import load_platform
    from nactuator.sim import parity

    base = load_platform("so101")
    channels = tuple(dataclasses.replace(c, damping=1.005 * c.damping) for c in base.channels)
    damped = dataclasses.replace(base, channels=channels)
    reference = parity.mujoco_replay
    monkeypatch.setattr(parity, "mujoco_replay",
                        lambda platform, *a, **k: reference(base, *a, **k))
    res = mujoco_parity(Simulator(damped), batch=2, seed=0)
    assert res["ratio"] <= 2.0, res  # what the old gate accepted
    assert not parity_passes(res), res


def test_featherstone_angular_damping_has_no_effect_on_joint_space_arms(newton_sims):
    # newton 1.8.0 stores SolverFeatherstone's angular_damping but never reads it; if an
    # upgrade starts to, this fails and the MuJoCo parity (which has no counterpart) must be
    # re-checked with sim.angular_damping = 0 -- and the chain engine, which refuses a
    # nonzero value because there is nothing to match, must learn it.
    import dataclasses

    base = newton_sims["omx"].platform
    damped = Simulator(dataclasses.replace(base, sim=dict(base.sim, angular_damping=0.05)),
                       engine="newton")
    q0, qd0 = start_states(base, 2, seed=6)
    taus = tracking_torques(newton_sims["omx"], q0, qd0, 10, seed=6)
    with torch.no_grad():
        assert torch.equal(newton_sims["omx"].replay(q0, qd0, taus)[0],
                           damped.replay(q0, qd0, taus)[0])


@pytest.mark.parametrize("engine", ENGINES)
def test_repeated_runs_are_bitwise_identical(engine_sims, engine):
    sim = engine_sims[engine]["so101"]
    q0, qd0 = start_states(sim.platform, 4, seed=3)
    taus = tracking_torques(sim, q0, qd0, 20, seed=3)
    with torch.no_grad():
        first = sim.replay(q0, qd0, taus)
        second = sim.replay(q0, qd0, taus)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_arm_does_not_depend_on_the_batch_it_is_in(engine_sims, engine):
    sim = engine_sims[engine]["omx"]
    q0, qd0 = start_states(sim.platform, 8, seed=4)
    taus = tracking_torques(sim, q0, qd0, 30, seed=4)
    with torch.no_grad():
        q_all, qd_all = sim.replay(q0, qd0, taus)
        q_one, qd_one = sim.replay(q0[5:6], qd0[5:6], taus[5:6])
    assert torch.equal(q_all[5:6], q_one)
    assert torch.equal(qd_all[5:6], qd_one)


# Ten seconds on Newton cost 9-19 s per platform on one core (the chain engine: 0.4 s):
# the fast suite runs every platform on the chain engine and the light OMX on Newton; the
# chain engine equals Newton to 1e-5 rad into the limits (test_sim_chain), and
# `make test-all` runs the other platforms on Newton too.
_TEN_SECONDS = [("chain", name) for name in PLATFORMS] + [("newton", "omx")] + [
    pytest.param("newton", name, marks=pytest.mark.slow) for name in PLATFORMS if name != "omx"
]


@pytest.mark.parametrize(("engine", "name"), _TEN_SECONDS)
def test_ten_seconds_under_gravity_from_random_poses_stays_finite(engine_sims, engine, name):
    # The newton#4269 scenario: light serial arms falling under gravity onto their limits.
    sim = engine_sims[engine][name]
    platform = sim.platform
    gen = torch.Generator().manual_seed(5)
    lo = torch.tensor([c.limit_lower for c in platform.channels])
    hi = torch.tensor([c.limit_upper for c in platform.channels])
    q = lo + (hi - lo) * torch.rand(4, platform.n, generator=gen)
    qd = torch.zeros_like(q)
    zero = torch.zeros_like(q)
    with torch.no_grad():
        for _ in range(int(round(10.0 / platform.control_dt))):
            q, qd = sim.step(q, qd, zero)
    assert torch.isfinite(q).all() and torch.isfinite(qd).all()
    span = hi - lo
    assert (q > lo - 0.1 * span).all() and (q < hi + 0.1 * span).all(), q  # limits hold


def test_external_force_enters_as_jacobian_transpose(sims):
    sim = sims["omx"]
    q = torch.tensor([[0.3, -0.4, 0.5, 0.2, 0.005]])
    qd = torch.zeros(1, 5)
    tau = torch.tensor([[0.1, -0.2, 0.1, 0.05, 0.1]])
    force = torch.tensor([[1.0, -2.0, 3.0]])
    with_force = sim.step(q, qd, tau, f_ext=force)
    by_hand = sim.step(q, qd, tau + (sim.ee_jacobian(q)[0].T @ force[0])[None])
    torch.testing.assert_close(with_force[0], by_hand[0])
    # And it is differentiable w.r.t. the force, through J^T and the simulator.
    f = force.clone().requires_grad_(True)
    sim.step(q, qd, tau, f_ext=f)[0].sum().backward()
    assert torch.isfinite(f.grad).all() and f.grad.abs().sum() > 0


def test_jacobian_transpose_routing_passes_gradcheck_in_float64(sims):
    sim = sims["so101"]
    q = torch.tensor([[0.2, -0.1, 0.3, 0.4, -0.2, 0.5]], dtype=torch.float64, requires_grad=True)
    f = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64, requires_grad=True)

    def routed(q, f):
        return torch.einsum("bkn,bk->bn", sim.ee_jacobian(q), f)

    assert torch.autograd.gradcheck(routed, (q, f))


def test_velocity_is_clipped_to_the_platform_limit(sims):
    sim = sims["pendulum"]  # velocity_limit 20 rad/s
    q1, qd1 = sim.step(torch.zeros(1, 1), torch.full((1, 1), 19.99), torch.ones(1, 1))
    assert qd1.item() == pytest.approx(sim.platform.velocity_limit)


def test_rollout_returns_every_state_after_each_step(sims):
    sim = sims["pendulum"]
    q0, qd0 = torch.full((2, 1), 0.3), torch.zeros(2, 1)
    taus = torch.zeros(2, 5, 1)
    q, qd = sim.replay(q0, qd0, taus)
    assert q.shape == qd.shape == (2, 5, 1)
    q1, qd1 = sim.step(q0, qd0, taus[:, 0])
    assert torch.equal(q[:, 0], q1) and torch.equal(qd[:, 0], qd1)
    assert (q[:, -1] < 0.3).all()  # it swings down under gravity


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"q": torch.zeros(2, 4)}, ValueError,
         r"q must have shape \(B, 5\) = \(2, 5\), got \(2, 4\)"),
        ({"tau": torch.zeros(3, 5)}, ValueError,
         r"tau must have shape \(B, 5\) = \(2, 5\), got \(3, 5\)"),
        ({"qd": torch.zeros(2, 5, dtype=torch.float64)}, TypeError,
         "qd must be torch.float32, got torch.float64"),
        ({"tau": [[0.0] * 5] * 2}, TypeError, "tau must be a torch.Tensor, got list"),
        ({"tau": torch.full((2, 5), float("nan"))}, ValueError,
         r"tau contains NaN or inf \(first at index \(0, 0\)\)"),
        ({"q": torch.tensor([[0, 0, float("inf"), 0, 0]] * 2)}, ValueError,
         "q contains NaN or inf"),
        ({"f_ext": torch.zeros(2, 2)}, ValueError,
         r"f_ext must have shape \(B, 3\) = \(2, 3\), got \(2, 2\)"),
    ],
)
def test_bad_inputs_get_clear_errors(sims, kwargs, error, message):
    args = {"q": torch.zeros(2, 5), "qd": torch.zeros(2, 5), "tau": torch.zeros(2, 5)} | kwargs
    with pytest.raises(error, match=message):
        sims["omx"].step(**args)


def test_bad_rollout_inputs_get_clear_errors(sims):
    sim = sims["omx"]
    with pytest.raises(ValueError,
                       match=r"taus must have shape \(B, T, 5\) with B = 2, got \(2, 5\)"):
        sim.replay(torch.zeros(2, 5), torch.zeros(2, 5), torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"q must have shape \(B, 5\)"):
        sim.ee_position(torch.zeros(2, 4))
