"""Labelled contacts in the simulator step (``model.external_torque``, issue 23): the joint
torque of a force anywhere on the arm against MuJoCo's own point Jacobian, the dataset's
MJCF body ids mapped onto the simulator's chain, and the rollout stepping under it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_rollout_fused import STEPS, L, _actuator, _block

from nactuator.contact.surface import LinkSurfaces, load_contact_config
from nactuator.platforms import load_platform
from nactuator.rollout import closed_loop_rollout, closed_loop_rollout_stepwise
from nactuator.sim import Simulator


@pytest.fixture(scope="module")
def so101():
    p = load_platform("so101")
    return p, Simulator(p), LinkSurfaces.build(p, load_contact_config(p))


def test_point_torque_is_mujocos_jacobian_transpose_force(so101):
    p, sim, surf = so101
    rng = np.random.default_rng(0)
    for link in range(len(surf.names)):
        q = rng.uniform(-1.0, 1.0, (3, p.n))
        point = surf.points[link][[5, 90, 200]]
        force = rng.normal(0.0, 4.0, (3, 3))
        body = sim.chain_bodies(torch.full((3,), float(surf.bodies[link])))
        got = sim.kinematics.point_torque(torch.tensor(q), body, torch.tensor(point),
                                          torch.tensor(force)).numpy()
        for i in range(3):
            pts, _, d = surf.world_points(q[i], link, local=point[i])
            want = surf.point_jacobian(d, link, pts[0]).T @ force[i]
            np.testing.assert_allclose(got[i], want, atol=1e-6)


def test_unlabelled_frames_map_to_no_body_and_no_torque(so101):
    p, sim, surf = so101
    body = sim.chain_bodies(torch.tensor([float("nan"), -1.0, 0.0, 1e6]))
    assert body.tolist() == [-1, -1, -1, -1]  # NaN, none, the world body, not a body
    tau = sim.kinematics.point_torque(torch.zeros(4, p.n, dtype=torch.float64), body,
                                      torch.ones(4, 3), torch.ones(4, 3))
    assert torch.equal(tau, torch.zeros(4, p.n, dtype=torch.float64))


def test_rollout_steps_under_the_external_torque(so101):
    """Both rollout paths pass step i its row of ``tau_ext``; the first step equals the
    simulator's own step with ``tau_ext`` (added after the motor clip), and a push moves
    the arm away from the unpushed rollout."""
    p, sim, _ = so101
    actuator = _actuator(["command", "state", "telemetry", "error"])
    block = _block()
    gen = torch.Generator().manual_seed(5)
    ext = 0.8 * torch.randn(block["q"].shape[0], STEPS, p.n, generator=gen)
    free = closed_loop_rollout(actuator, sim.step, block, L)
    pushed = closed_loop_rollout(actuator, sim.step, block, L, tau_ext=ext)
    stepwise = closed_loop_rollout_stepwise(actuator, sim.step, block, L, tau_ext=ext)
    torch.testing.assert_close(pushed.q, stepwise.q)
    q1, _ = sim.step(pushed.q[:, 0], pushed.qd[:, 0], pushed.tau[:, 0], tau_ext=ext[:, 0])
    torch.testing.assert_close(pushed.q[:, 1], q1)
    assert (pushed.q[:, -1] - free.q[:, -1]).abs().max() > 1e-3


def test_labelled_presses_reach_the_simulator_as_their_joint_torque(tmp_path, so101):
    """A press dataset (contact.experiment, labels per frame) -> NADDataModule batch ->
    the training module's ``contact_torque``: on every labelled frame MuJoCo's J_p^T f at
    the recorded pose, zero elsewhere; without ``external_torque`` nothing is applied."""
    from test_training import make_dm, make_module

    from nactuator.contact.experiment import run_world, write_dataset

    p, _, surf = so101
    data = run_world("so101", pairs=2, seed=0, seconds=3.0, press_link="wrist", magnitude=6.0)
    write_dataset(data, tmp_path / "nad", folds=2, fold=0, presses=True)
    dm = make_dm(tmp_path / "nad")
    dm.setup()
    batch = dm.split_episodes("train")  # pair 1: its press and its twin, whole episodes
    module = make_module(external_torque=True)
    tau = module.contact_torque(batch)
    assert make_module().contact_torque(batch) is None  # off by default (SPEC: net torque)
    start = module.window_length - 1
    link = batch["contact_link"][:, start:]
    assert (link == float(surf.bodies[surf.names.index("wrist")])).any()
    assert set(torch.unique(link).tolist()) <= {-1.0, float(surf.bodies[2])}
    k = surf.names.index("wrist")
    checked = 0
    for row, t in zip(*np.nonzero(link.numpy() >= 0), strict=True):
        if t % 20:
            continue
        q = batch["q"][row, start + t].double().numpy()
        pts, _, d = surf.world_points(q, k, local=batch["contact_point"][row, start + t].double()
                                      .numpy())
        want = surf.point_jacobian(d, k, pts[0]).T @ batch["contact_force"][row, start + t].numpy()
        np.testing.assert_allclose(tau[row, t].numpy(), want, atol=1e-4)
        checked += 1
    assert checked >= 3
    assert torch.equal(tau[link < 0], torch.zeros_like(tau[link < 0]))
