"""End-effector force labels in the simulator step and the force read back from the motor
torque through physics (``model.external_torque`` with payload labels, issue 26): the label's
joint torque against MuJoCo's own EE Jacobian, off by default, and the least-squares readout
``J_ee^T f = ID - tau`` recovering a known force from an exact residual."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from nactuator.contact import residual_ee_force
from nactuator.contact.estimate import smoothed_velocity
from nactuator.platforms import load_platform
from nactuator.sim.dynamics import ArmDynamics, ee_force_from_joint_torques
from nactuator.training.losses import LossWeights

WINDOW = 9


@pytest.fixture(scope="module")
def so101():
    p = load_platform("so101")
    return p, ArmDynamics.for_platform(p)


@pytest.fixture(scope="module")
def sim(so101):
    from nactuator.sim import Simulator

    return Simulator(so101[0])


def module_on(sim, **kwargs):
    """The test training module with the shared simulator (built once per file)."""
    from test_training import make_module

    module = make_module(**kwargs)
    module._simulator, module._simulator_device = sim, "cpu"
    return module


def mujoco_ee_torque(p, q: np.ndarray, f: np.ndarray) -> np.ndarray:
    """``J_ee(q)^T f`` from MuJoCo's ``mj_jac`` at the platform's end-effector point (the
    point where the world hangs a payload, ``World._apply_ee_force``)."""
    model = mujoco.MjModel.from_xml_path(str(p.robot_model_path()))
    d = mujoco.MjData(model)
    b = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, p.end_effector.body)
    d.qpos[:] = q
    mujoco.mj_kinematics(model, d)
    mujoco.mj_comPos(model, d)
    point = d.xpos[b] + d.xmat[b].reshape(3, 3) @ np.asarray(p.end_effector.offset)
    jacp = np.zeros((3, model.nv))
    mujoco.mj_jac(model, d, jacp, None, point, b)
    return jacp[:, : p.n].T @ f


def payload_batch(p, rng: np.random.Generator, B: int = 3, T: int = 6) -> dict:
    """A batch as NADDataModule serves it: ``force`` 0 N where unlabelled, a payload's
    weight (x, y 0) on some frames, no contact (``contact_link`` -1)."""
    rows = WINDOW - 1 + T
    q = torch.tensor(rng.uniform(-1.0, 1.0, (B, rows, p.n)), dtype=torch.float32)
    force = torch.zeros(B, rows, 3)
    force[0, WINDOW:, 2] = -0.3 * 9.81  # held from the second step on
    force[2, :, :] = torch.tensor(rng.normal(0.0, 3.0, (rows, 3)), dtype=torch.float32)
    return {"q": q, "force": force, "contact_link": -torch.ones(B, rows),
            "contact_point": torch.zeros(B, rows, 3), "contact_force": torch.zeros(B, rows, 3)}


def test_ee_label_is_mujocos_jacobian_transpose_at_the_recorded_pose(so101, sim):
    p, _ = so101
    batch = payload_batch(p, np.random.default_rng(0))
    module = module_on(sim, external_torque=True)
    tau = module.contact_torque(batch)
    start = WINDOW - 1
    assert tau.shape == (3, batch["q"].shape[1] - start, p.n)
    for b, t in [(0, 1), (0, 5), (2, 0), (2, 3)]:
        q = batch["q"][b, start + t].double().numpy()
        f = batch["force"][b, start + t].double().numpy()
        np.testing.assert_allclose(tau[b, t].numpy(), mujoco_ee_torque(p, q, f), atol=1e-5)
    # unlabelled frames (0 N in the batch) and a run without a payload: no torque
    assert torch.equal(tau[0, 0], torch.zeros(p.n))
    assert torch.equal(tau[1], torch.zeros_like(tau[1]))
    # the gripper's jaw joint does not carry a force at the end-effector point
    assert torch.equal(tau[..., p.gripper_indices], torch.zeros_like(tau[..., p.gripper_indices]))


def test_contact_label_takes_its_frame_and_off_is_unchanged(so101, sim):
    from test_training import make_module

    p, _ = so101
    batch = payload_batch(p, np.random.default_rng(1))
    start = WINDOW - 1
    # frame 2 of run 2 also has a link contact: its contact alone is applied there
    batch["contact_link"][2, start + 2] = 3.0
    batch["contact_force"][2, start + 2] = torch.tensor([1.0, -2.0, 0.5])
    module = module_on(sim, external_torque=True)
    tau = module.contact_torque(batch)
    only_contact = {k: v.clone() for k, v in batch.items()}
    only_contact["force"] = torch.zeros_like(batch["force"])
    contact = module.contact_torque(only_contact)
    torch.testing.assert_close(tau[2, 2], contact[2, 2])
    assert torch.equal(contact[2, 3], torch.zeros(p.n))
    # without external_torque nothing is applied, and with it a batch with no label at all
    # gets None (the rollout's step is called exactly as before)
    assert make_module().contact_torque(batch) is None
    quiet = {k: v.clone() for k, v in only_contact.items()}
    quiet["contact_link"][:] = -1.0
    assert module.contact_torque(quiet) is None


def test_readout_recovers_an_end_effector_force_from_an_exact_residual(so101):
    p, dyn = so101
    rng = np.random.default_rng(2)
    T = 40
    q = rng.uniform(-1.0, 1.0, (T, p.n))
    f = rng.normal(0.0, 3.0, (T, 3))
    with torch.no_grad():
        jac = dyn.kin.ee_jacobian(torch.as_tensor(q)).numpy()
    tau_ext = np.einsum("tkn,tk->tn", jac, f)
    tau_ext[:, p.gripper_indices] += 5.0  # the grip: not a force at the end-effector point
    force = ee_force_from_joint_torques(dyn, q, tau_ext, dyn.kin.ee_ancestors)
    np.testing.assert_allclose(force, f, atol=1e-8)


def test_residual_readout_of_a_motor_torque_is_the_payload(so101):
    """A motor torque that holds the arm's own dynamics minus a payload's weight at the end
    effector (what ``model.external_torque`` trains ``tau`` to be) reads that weight back,
    through the same causal velocity filter and nominal inverse dynamics (and the
    simulator's joint damping when given)."""
    p, dyn = so101
    rng = np.random.default_rng(3)
    T, dt = 60, p.control_dt
    q = np.cumsum(rng.normal(0.0, 0.01, (T, p.n)), 0) + rng.uniform(-0.5, 0.5, p.n)
    qd = np.gradient(q, dt, axis=0)
    qd_s, qdd = smoothed_velocity(qd, dt)
    weight = np.array([0.0, 0.0, -0.3 * 9.81])
    with torch.no_grad():
        tau_id = dyn.inverse_dynamics(torch.as_tensor(q), torch.as_tensor(qd_s),
                                      torch.as_tensor(qdd)).numpy()
        jac = dyn.kin.ee_jacobian(torch.as_tensor(q)).numpy()
    tau_motor = tau_id - np.einsum("tkn,k->tn", jac, weight)
    got = residual_ee_force(dyn, q, qd, tau_motor, dt)
    np.testing.assert_allclose(got, np.broadcast_to(weight, got.shape), atol=1e-6)
    # through a simulator with viscous joint damping the torque also pays damping * qd
    damping = np.array([c.damping for c in p.channels])
    damped = residual_ee_force(dyn, q, qd, tau_motor + damping * qd_s, dt, damping)
    np.testing.assert_allclose(damped, got, atol=1e-9)
    # a net-torque model (tau = ID: the load explained by the motion model) reads nothing
    np.testing.assert_allclose(residual_ee_force(dyn, q, qd, tau_id, dt), 0.0, atol=1e-8)


def test_score_episode_adds_the_residual_rows():
    from nactuator.data import Episode
    from nactuator.eval.protocol import score_episode
    from nactuator.rollout import Rollout

    T, n = 20, 6
    label = np.full((T, 3), np.nan)
    label[5:, 2] = -2.943
    frames = {"q": np.zeros((T, n), np.float32), "q_cmd": np.zeros((T, n), np.float32),
              "force": label, "payload_mass": np.where(np.arange(T) >= 5, 0.3, 0.0)}
    ep = Episode(index=0, task="go_up_and_stay_still_300g", split="test", length=T,
                 payload_mass=0.3, meta={}, frames=frames)
    ro = Rollout(q=np.zeros((T, n)), qd=np.zeros((T, n)), tau=np.zeros((T - 1, n)),
                 force=np.zeros((T - 1, 3)), gate=np.zeros(T - 1), gate_logit=np.zeros(T - 1),
                 condition=np.ones((T - 1, n)), condition_logit=np.zeros((T - 1, n)))
    residual = np.zeros((T, 3))
    residual[:, 2] = -2.943
    causal = {"force": np.zeros((T, 3)), "gate": np.zeros(T), "force_residual": residual}
    out = score_episode(ep, ro, np.ones(n), causal=causal, horizons=(10,))
    assert out["force"]["model_residual"]["full"]["mae_z"] == pytest.approx(
        5 * 2.943 / (T - 1))
    assert out["payload"]["model_residual"]["mass_g"] == pytest.approx(300.0, abs=0.1)
    no_residual = score_episode(ep, ro, np.ones(n), causal={k: v for k, v in causal.items()
                                                             if k != "force_residual"},
                                horizons=(10,))
    assert "model_residual" not in no_residual["force"]


def test_known_load_is_the_labelled_force_at_the_recorded_pose(so101, sim):
    """``eval --known-load``: row i of each episode is J_ee^T f of its frame i (MuJoCo's
    Jacobian), 0 N where unlabelled and past the episode's end."""
    from nactuator.data import Episode
    from nactuator.eval.protocol import known_load_torque

    p, _ = so101
    rng = np.random.default_rng(4)
    episodes = []
    for T in (7, 5):
        label = np.full((T, 3), np.nan)
        label[2:, 2] = -1.962
        frames = {"q": rng.uniform(-1.0, 1.0, (T, p.n)).astype(np.float32), "force": label}
        episodes.append(Episode(index=len(episodes), task="pick_and_place_200g", split="test",
                                length=T, payload_mass=0.2, meta={}, frames=frames))
    tau = known_load_torque(sim, episodes).numpy()
    assert tau.shape == (2, 7, p.n)
    for b, ep in enumerate(episodes):
        for t in range(ep.length):
            want = mujoco_ee_torque(p, ep.frames["q"][t].astype(np.float64),
                                    np.nan_to_num(ep.frames["force"][t], nan=0.0))
            np.testing.assert_allclose(tau[b, t], want, atol=1e-5)
    assert not tau[1, 5:].any() and not tau[:, :2].any()


def test_motor_torque_target_is_the_nominal_inverse_dynamics_minus_the_load(so101, sim):
    """``loss.w_motor``: the target is ID(q, qd_s, qdd) + damping qd_s - J_ee^T f at the
    recorded states (the contact residual's causal filter), and a rollout whose arm torque
    equals it scores 0."""
    from nactuator.rollout import Rollout

    p, dyn = so101
    rng = np.random.default_rng(5)
    batch = payload_batch(p, rng, T=12)
    batch["qd"] = torch.tensor(rng.normal(0.0, 0.5, batch["q"].shape), dtype=torch.float32)
    module = module_on(sim, external_torque=True, loss=LossWeights(w_motor=1.0))
    target = module.motor_torque_target(batch)
    start = WINDOW - 1
    damping = np.array([c.damping for c in p.channels])
    for b in range(3):
        q, qd = batch["q"][b].double().numpy(), batch["qd"][b].double().numpy()
        qd_s, qdd = smoothed_velocity(qd, p.control_dt)
        with torch.no_grad():
            tau_id = dyn.inverse_dynamics(torch.as_tensor(q), torch.as_tensor(qd_s),
                                          torch.as_tensor(qdd)).numpy()
        load = np.stack([mujoco_ee_torque(p, q[t], batch["force"][b, t].double().numpy())
                         for t in range(start, q.shape[0])])
        want = tau_id[start:] + damping * qd_s[start:] - load
        np.testing.assert_allclose(target[b].double().numpy(), want, atol=1e-4)
    steps = target.shape[1] - 1
    zeros = torch.zeros(3, steps)
    r = Rollout(q=batch["q"][:, start:], qd=batch["qd"][:, start:], tau=target[:, :steps],
                force=torch.zeros(3, steps, 3), gate=zeros, gate_logit=zeros,
                condition=torch.ones(3, steps, p.n), condition_logit=torch.zeros(3, steps, p.n))
    assert module.motor_torque_loss(r, batch).item() == 0.0
    off = {**r.__dict__, "tau": target[:, :steps] + 0.1}
    assert module.motor_torque_loss(Rollout(**off), batch).item() > 0.0
