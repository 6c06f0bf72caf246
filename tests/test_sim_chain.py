"""The chain engine against the Newton reference and against float64 MuJoCo; its adjoint
against Newton's and against a literal ``wp.Tape`` replay; engine selection and refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import warp as wp
from conftest import SIM_PLATFORMS as PLATFORMS

from nactuator.platforms import Channel, EndEffector, load_platform
from nactuator.sim import Simulator
from nactuator.sim.builder import SimSetupError
from nactuator.sim.check import (
    AGREEMENT_GATE,
    STEP_ACCURACY_GATE,
    engine_agreement,
    start_states,
    step_accuracy,
)

LIGHT = ["omx", "so101", "pendulum"]


def test_the_chain_engine_is_the_default_for_every_shipped_platform(sims, newton_sims):
    for name in PLATFORMS:
        assert sims[name].engine == "chain"
        assert newton_sims[name].engine == "newton"


@pytest.mark.parametrize("name", PLATFORMS)
def test_one_control_step_matches_float64_mujoco(sims, newton_sims, name):
    # Random poses inside the limits, random velocities and efforts; MuJoCo Euler with
    # explicit damping is the same integration scheme in float64.
    err = step_accuracy(sims[name], poses=8, seed=0)
    assert err <= STEP_ACCURACY_GATE, err
    if name == "franka":
        # Newton's float32 pipeline is ~10-100x less accurate on Franka (long links, world-
        # frame 6n x 6n products): this is why the Franka agreement gate below is looser.
        # If a newton upgrade fixes it, tighten that gate to AGREEMENT_GATE.
        assert step_accuracy(newton_sims[name], poses=8, seed=0) > 5 * err


@pytest.mark.parametrize("name", PLATFORMS)
def test_chain_matches_newton_for_two_seconds_of_random_efforts(sims, newton_sims, name):
    # Uniform random efforts (+-50 % of the bounds, new each control step) on top of a
    # gravity + PD hold that each engine computes on its own state (stable, so float32
    # round-off cannot grow chaotically; see engine_agreement).
    res = engine_agreement(sims[name], newton_sims[name], seconds=2.0, batch=4, seed=0)
    assert res["motion"] > 0.05, res  # the arms really moved
    # Franka: the residual is Newton's own float32 error (test above), measured 1.4e-5.
    gate = 5 * AGREEMENT_GATE if name == "franka" else AGREEMENT_GATE
    assert res["max_dev"] <= gate, res
    assert res["max_dev_prismatic"] <= AGREEMENT_GATE, res


@pytest.mark.parametrize("name", LIGHT)
def test_chain_matches_newton_open_loop_into_the_limits(sims, newton_sims, name):
    # Open loop, efforts uniform over the full bounds: the light arms slam into their
    # penalty limits, so the limit law is compared too.
    res = engine_agreement(sims[name], newton_sims[name], seconds=2.0, batch=4, seed=1,
                           noise=1.0, hold_hz=None)
    assert res["max_dev"] <= AGREEMENT_GATE, res
    assert res["max_dev_prismatic"] <= AGREEMENT_GATE, res
    if name != "pendulum":  # +-1 duty cannot lift the pendulum past +-3.2 rad
        assert res["limit_fraction"] > 0.002, res  # some (step, joint) samples past a limit


@pytest.mark.parametrize("name", PLATFORMS)
def test_chain_step_gradients_equal_newtons(sims, newton_sims, name):
    # One control step from states that include joints beyond their limits.
    sim = sims[name]
    platform = sim.platform
    gen = torch.Generator().manual_seed(7)
    lo = torch.tensor([c.limit_lower for c in platform.channels])
    hi = torch.tensor([c.limit_upper for c in platform.channels])
    span = hi - lo
    q = lo - 0.05 * span + 1.1 * span * torch.rand(6, platform.n, generator=gen)
    qd = 0.2 * span * torch.randn(6, platform.n, generator=gen)
    tau = 0.5 * sim.torque_max * torch.randn(6, platform.n, generator=gen)
    seeds = [torch.randn(6, platform.n, generator=gen) for _ in range(2)]

    def grads(s: Simulator) -> list[torch.Tensor]:
        inputs = [x.clone().requires_grad_(True) for x in (q, qd, tau)]
        q1, qd1 = s.step(*inputs)
        ((q1 * seeds[0]).sum() + (qd1 * seeds[1]).sum()).backward()
        return [x.grad for x in inputs]

    tolerance = 1e-3 if name == "franka" else 1e-4  # relative; Newton's float32 (see above)
    for ours, reference in zip(grads(sim), grads(newton_sims[name]), strict=True):
        scale = float(reference.abs().max())
        assert scale > 0
        torch.testing.assert_close(ours, reference, rtol=0, atol=tolerance * scale)


def test_the_recorded_adjoint_equals_a_tape_replay_of_the_step(sims):
    # ChainEngine.backward launches the kernel's adjoint directly; wp.Tape.backward over
    # a recorded forward launch must give the very same numbers.
    sim = sims["so101"]
    engine = sim._engine(4)
    gen = torch.Generator().manual_seed(3)
    q, qd, tau, gq, gqd = (torch.randn(4, 6, generator=gen) for _ in range(5))
    ours = engine.backward(tau, q, qd, gq, gqd)

    def array(t: torch.Tensor) -> wp.array:
        return wp.from_torch(t.clone(), dtype=engine.vec_n, requires_grad=True)

    inputs, outputs = [array(q), array(qd), array(tau)], [array(q), array(qd)]
    tape = wp.Tape()
    with tape:
        wp.launch(engine.kernel, dim=4, inputs=[*inputs, *engine.params], outputs=outputs,
                  device="cpu")
    tape.backward(grads={outputs[0]: wp.from_torch(gq.clone(), dtype=engine.vec_n),
                         outputs[1]: wp.from_torch(gqd.clone(), dtype=engine.vec_n)})
    taped = [wp.to_torch(a.grad) for a in (inputs[2], inputs[0], inputs[1])]
    for a, b in zip(ours, taped, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# -- engine selection ---------------------------------------------------------------------

def _tree_platform(tmp_path) -> object:
    """Three hinges where two bodies hang off the same parent: a tree, not a chain."""
    xml = tmp_path / "tree.xml"
    xml.write_text("""<mujoco model="tree">
  <worldbody>
    <body name="base">
      <joint name="a" type="hinge" axis="0 0 1"/>
      <inertial pos="0 0 0.05" mass="0.3" diaginertia="1e-3 1e-3 1e-3"/>
      <body name="left" pos="0 0.05 0.1">
        <joint name="b" type="hinge" axis="0 1 0"/>
        <inertial pos="0.05 0 0" mass="0.1" diaginertia="1e-4 1e-4 1e-4"/>
      </body>
      <body name="right" pos="0 -0.05 0.1">
        <joint name="c" type="hinge" axis="0 1 0"/>
        <inertial pos="0.05 0 0" mass="0.1" diaginertia="1e-4 1e-4 1e-4"/>
      </body>
    </body>
  </worldbody>
</mujoco>
""")
    channel = Channel(name="a", kind="revolute", torque_min=-1.0, torque_max=1.0,
                      limit_lower=-2.0, limit_upper=2.0, armature=0.05, damping=0.1)
    pendulum = load_platform("pendulum")
    return dataclasses.replace(
        pendulum, name="tree", robot_model=str(xml), source=str(xml),
        channels=tuple(dataclasses.replace(channel, name=k) for k in "abc"),
        end_effector=EndEffector(body="left", offset=(0.1, 0.0, 0.0)), sim={})


def test_a_tree_runs_on_newton_and_refuses_the_chain_engine(tmp_path):
    tree = _tree_platform(tmp_path)
    sim = Simulator(tree)
    assert sim.engine == "newton"
    q1, _ = sim.step(torch.zeros(2, 3), torch.zeros(2, 3), torch.full((2, 3), 0.1))
    assert torch.isfinite(q1).all()
    with pytest.raises(SimSetupError, match=r"engine 'chain' requested, but .*tree.xml: joint 2 "
                                            r"connects body 0 -> 2.*not a serial chain.*"
                                            r"engine='newton'"):
        Simulator(tree, engine="chain")
    pinned = dataclasses.replace(tree, sim={"engine": "chain"})
    with pytest.raises(SimSetupError, match="engine 'chain' pinned by sim.engine"):
        Simulator(pinned)


def test_the_platform_yaml_can_pin_an_engine_and_the_argument_overrides_it():
    omx = load_platform("omx")
    pinned = dataclasses.replace(omx, sim=dict(omx.sim, engine="newton"))
    assert Simulator(pinned).engine == "newton"
    assert Simulator(pinned, engine="chain").engine == "chain"
    with pytest.raises(SimSetupError, match=r"sim.engine must be one of \['chain', 'newton'\], "
                                            "got 'mujoco'"):
        Simulator(dataclasses.replace(omx, sim=dict(omx.sim, engine="mujoco")))
    with pytest.raises(ValueError, match=r"engine must be one of \['chain', 'newton'\] or None"):
        Simulator(omx, engine="fast")


def test_options_the_chain_engine_cannot_honour_are_refused():
    omx = load_platform("omx")
    with pytest.raises(ValueError, match="gradient_fix=False selects Newton's stock solver"):
        Simulator(omx, gradient_fix=False)
    assert Simulator(omx, engine="newton", gradient_fix=False).engine == "newton"
    damped = dataclasses.replace(omx, sim=dict(omx.sim, angular_damping=0.05))
    with pytest.raises(SimSetupError, match=r"sim.angular_damping = 0.05 has no effect"):
        Simulator(damped)


def test_changing_joint_dynamics_needs_no_new_kernel(sims):
    # Armature, damping, limits and limit gains are launch arguments, not compiled in.
    so101 = sims["so101"].platform
    heavier = dataclasses.replace(so101, channels=tuple(
        dataclasses.replace(c, armature=2 * c.armature) for c in so101.channels))
    other = Simulator(heavier)
    assert other._engine(1).kernel is sims["so101"]._engine(1).kernel
    q0, qd0 = start_states(so101, 2, seed=0)
    tau = torch.full((2, 6), 0.5)
    with torch.no_grad():
        fast = sims["so101"].step(q0, qd0, tau)[1] - qd0
        slow = other.step(q0, qd0, tau)[1] - qd0
    assert (slow.abs() < fast.abs()).all()  # twice the rotor inertia accelerates less


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (CPU-only machine)")
def test_the_chain_engine_runs_on_cuda_like_on_cpu(sims):
    cpu = sims["so101"]
    gpu = Simulator("so101", device="cuda")
    assert gpu.engine == "chain"
    q0, qd0 = start_states(cpu.platform, 8, seed=2)
    gen = torch.Generator().manual_seed(2)
    taus = 0.5 * cpu.torque_max * (2 * torch.rand(8, 32, 6, generator=gen) - 1)
    results = []
    for sim in (cpu, gpu):
        t = taus.to(sim.device).requires_grad_(True)
        q, _ = sim.replay(q0.to(sim.device), qd0.to(sim.device), t)
        q.sum().backward()
        results.append((q.detach().cpu(), t.grad.cpu()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)
