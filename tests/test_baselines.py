"""Classical baselines (eval/baselines) on cases with a known answer.

The "noiseless world" here is MuJoCo itself: joint trajectories are prescribed, MuJoCo's
``mj_inverse`` gives the torque the motors must supply (minus ``J^T f`` for a payload at the
end effector, plus a friction law when asked), and the effort register reads
``(tau_motor - b) / Kt`` exactly. So the true Kt, b, friction and external force are known,
and every baseline must recover them.
"""

from __future__ import annotations

from types import SimpleNamespace

import mujoco
import numpy as np
import pytest
import torch

from nactuator.data import Episode
from nactuator.eval import metrics as M
from nactuator.eval.baselines import (
    ALL_METHODS,
    fit_baselines,
    load_settings,
    parse_baselines,
)
from nactuator.eval.baselines.calibration import EFFORT_ON_TORQUE, TorqueCalibration
from nactuator.eval.baselines.condition import ConditionBaselines
from nactuator.eval.baselines.features import (
    FEATURE_NAMES,
    window_features,
    window_labels,
    window_starts,
)
from nactuator.eval.baselines.force_map import contact_decision
from nactuator.eval.baselines.momentum_observer import MomentumObserver
from nactuator.eval.episodes import EvalDataError
from nactuator.platforms import load_platform
from nactuator.sim.dynamics import ArmDynamics, ee_force_from_joint_torques, momentum_residual
from nactuator.sim.parity import mujoco_model

PLATFORM = "so101"
KT = np.array([2.6, 3.0, 2.8, 2.2, 2.4, 1.5])  # true N*m per unit effort
BIAS = np.array([0.01, -0.03, 0.02, 0.0, 0.005, 0.0])  # true N*m
PAYLOAD_KG = 0.3
G = 9.81


@pytest.fixture(scope="module")
def platform():
    return load_platform(PLATFORM)


@pytest.fixture(scope="module")
def settings():
    return load_settings()


class NoiselessWorld:
    """MuJoCo inverse dynamics of the platform MJCF with the baselines' armature."""

    def __init__(self, platform, armature):
        self.platform = platform
        self.model = mujoco_model(platform)
        self.model.dof_damping[:] = 0.0
        self.model.dof_armature[:] = armature
        self.data = mujoco.MjData(self.model)
        ee = platform.end_effector
        self.body = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, ee.body)
        self.offset = np.asarray(ee.offset)

    def motor_torque(self, q, qd, qdd, force):
        """(T, n) torque the motors must supply; ``force`` (T, 3) acts on the end effector."""
        out = np.zeros_like(q)
        jacp = np.zeros((3, self.model.nv))
        for k in range(len(q)):
            d = self.data
            d.qpos[:], d.qvel[:], d.qacc[:] = q[k], qd[k], qdd[k]
            mujoco.mj_inverse(self.model, d)
            point = d.xpos[self.body] + d.xmat[self.body].reshape(3, 3) @ self.offset
            mujoco.mj_jac(self.model, d, jacp, None, point, self.body)
            out[k] = d.qfrc_inverse - jacp.T @ force[k]
        return out


def make_episode(world, q, qd, qdd, force, index, task, split="train", friction=None,
                 labelled=True, condition=None):
    p = world.platform
    tau = world.motor_torque(q, qd, qdd, force)
    if friction is not None:
        tau = tau + friction(qd)
    effort = (tau - BIAS) / KT
    t = len(q)
    label = force.copy() if labelled else np.full((t, 3), np.nan)
    if labelled and not np.abs(force).any():
        label[:] = np.nan  # free motion: unlabelled, like NAD
    mass = np.where(np.abs(force[:, 2]) > 0, PAYLOAD_KG, 0.0)
    frames = {"q_cmd": q, "q": q, "qd": qd, "effort": effort, "force": label,
              "payload_mass": mass, "timestamp": np.arange(t) * p.control_dt,
              "voltage": np.full((t, p.n), 12.0), "temperature": np.full((t, p.n), 30.0)}
    if condition is not None:
        frames["condition"] = condition
    return Episode(index=index, task=task, split=split, length=t, payload_mass=float(mass.max()),
                   meta={}, frames=frames)


def sine_motion(platform, seconds, freqs, amps, seed):
    """Smooth joint motion around a comfortable pose, with exact qd and qdd."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds / platform.control_dt))[:, None] * platform.control_dt
    q0 = np.array([0.0, -0.8, 0.8, 0.6, 0.0, 0.4])[None, :]
    phase = rng.uniform(0, 2 * np.pi, platform.n)
    w = 2 * np.pi * np.asarray(freqs)
    q = q0 + amps * np.sin(w * t + phase)
    qd = amps * w * np.cos(w * t + phase)
    qdd = -amps * w ** 2 * np.sin(w * t + phase)
    return q, qd, qdd


@pytest.fixture(scope="module")
def world(platform, settings):
    armature = settings.armature_for(platform) or [c.armature for c in platform.channels]
    return NoiselessWorld(platform, armature)


def free_episodes(world, friction=None, count=4):
    eps = []
    for i in range(count):
        q, qd, qdd = sine_motion(world.platform, 8.0, [0.3 + 0.1 * i + 0.05 * j for j in range(6)],
                                 np.array([0.5, 0.4, 0.4, 0.5, 0.6, 0.3]), seed=i)
        eps.append(make_episode(world, q, qd, qdd, np.zeros((len(q), 3)), i, "free",
                                friction=friction))
    return eps


def payload_episode(world, moving: bool, friction=None, index=100):
    p = world.platform
    seconds = 5.0
    if moving:
        q, qd, qdd = sine_motion(p, seconds, [0.25] * 6, np.array([0.3, 0.2, 0.2, 0.3, 0.3, 0.0]),
                                 seed=9)
    else:
        n = int(seconds / p.control_dt)
        q = np.tile([0.2, -0.6, 0.7, 0.5, 0.1, 0.3], (n, 1))
        qd = qdd = np.zeros_like(q)
    force = np.zeros((len(q), 3))
    force[:, 2] = -PAYLOAD_KG * G
    return make_episode(world, q, qd, qdd, force, index, "payload", split="test",
                        friction=friction)


def viscous_coulomb(qd):
    return 0.05 * np.tanh(qd / 0.01) + 0.12 * qd


SETTLED = 1.0  # s: the low-pass (4 Hz) and the observer (0.1 s) have forgotten frame 0


def settled_error(platform, estimate, truth):
    k = int(SETTLED / platform.control_dt)
    return np.linalg.norm(estimate[k:] - truth[k:], axis=1).mean() / np.linalg.norm(truth[0])


# -- family 1: calibration ----------------------------------------------------------------
def test_calibration_recovers_kt_and_offset_from_free_motion(platform, settings, world):
    fitted = fit_baselines(free_episodes(world), platform, ["id-linear"], settings)
    cal = fitted.force_methods["id-linear"].calibration
    arm = platform.arm_indices
    assert cal.modes[1] == EFFORT_ON_TORQUE
    assert np.allclose(cal.kt[arm], KT[arm], rtol=0.02), cal.kt
    assert np.allclose(cal.bias[arm], BIAS[arm], atol=0.01), cal.bias
    info = fitted.info["calibration"]["joints"]["shoulder_lift"]
    # M(q) LP(qdd) vs LP(M(q) qdd): the only mismatch left in a noiseless world
    assert info["correlation"] > 0.99 and info["rms"] < 0.02


def test_calibration_needs_free_motion(platform, settings, world):
    only_payload = [payload_episode(world, moving=False)]
    fitted = fit_baselines(only_payload, platform, ["id-linear", "gmo"], settings)
    assert not fitted.force_methods
    assert "free-motion frame" in fitted.info["id-linear"]["unavailable"]


def test_an_unidentifiable_joint_falls_back_instead_of_blowing_up(platform, world):
    # Effort that does not follow tau_ID at all (pure noise): inverting its ~0 slope would
    # multiply the noise by ~1/slope; the fallback's motor torque can never vary more than
    # tau_ID itself (least squares of tau_ID on u explains at most all of tau_ID's variance).
    eps = free_episodes(world, count=2)
    rng = np.random.default_rng(0)
    for ep in eps:
        ep.frames["effort"][:, 0] = rng.normal(0, 0.05, ep.length)
    sigs = [fit_baselines([], platform, [], load_settings()).signals(ep) for ep in eps]
    cal = TorqueCalibration.fit(sigs, min_correlation=0.3)
    assert cal.modes[0] != EFFORT_ON_TORQUE and cal.modes[1] == EFFORT_ON_TORQUE
    u = np.concatenate([s.u_f[s.free, 0] for s in sigs])
    tau = np.concatenate([s.tau_id[s.free, 0] for s in sigs])
    assert np.std(cal.torque(np.stack([u] * platform.n, 1))[:, 0]) <= np.std(tau)
    inverse_slope = np.polyfit(tau, u, 1)[0]
    assert abs(1 / inverse_slope) * np.std(u) > 3 * np.std(tau)  # what the fallback avoids


# -- families 2-5: force from joint torques -------------------------------------------------
FORCE = ["id-linear", "id-friction", "gmo", "gmo-friction"]


@pytest.fixture(scope="module")
def fitted_clean(platform, settings, world):
    return fit_baselines(free_episodes(world), platform, FORCE, settings)


@pytest.mark.parametrize("moving", [False, True], ids=["static", "moving"])
def test_every_force_baseline_recovers_a_payload_within_5_percent(platform, world,
                                                                  fitted_clean, moving):
    ep = payload_episode(world, moving=moving)
    truth = ep.frames["force"]
    for name, est in fitted_clean.force_estimates(ep).items():
        err = settled_error(platform, est, truth)
        assert err < 0.05, f"{name}: {100 * err:.1f} % of the payload force"


def test_no_force_is_found_in_free_motion(platform, world, fitted_clean):
    # A held-out free motion: every method must say ~0 N (this is what catches a wrong sign
    # of C^T qd in the observer or a lagging acceleration in the inverse dynamics).
    q, qd, qdd = sine_motion(platform, 6.0, [0.45] * 6, np.array([0.4] * 6), seed=42)
    ep = make_episode(world, q, qd, qdd, np.zeros((len(q), 3)), 50, "free", split="test")
    k = int(SETTLED / platform.control_dt)
    for name, est in fitted_clean.force_estimates(ep).items():
        mean_norm = np.linalg.norm(est[k:], axis=1).mean()
        assert mean_norm < 0.05 * PAYLOAD_KG * G, f"{name}: {mean_norm:.3f} N in free motion"
        assert contact_decision(est[k:], 1.0).mean() == 0.0


def test_momentum_observer_cancels_the_coriolis_term_in_fast_free_motion(platform, world,
                                                                         fitted_clean):
    # 1 Hz, 0.8 rad on every joint: C^T qd is tens of mN*m; a wrong sign or a missing term
    # would leave a residual of that size, the right observer leaves a small fraction of it.
    q, qd, qdd = sine_motion(platform, 6.0, [1.0] * 6, np.array([0.8] * 6), seed=42)
    ep = make_episode(world, q, qd, qdd, np.zeros((len(q), 3)), 51, "free", split="test")
    sig = fitted_clean.signals(ep)
    k = int(SETTLED / platform.control_dt)
    arm = platform.arm_indices
    residual = fitted_clean.force_methods["gmo"].joint_torques(sig)[k:, arm]
    with torch.no_grad():
        term = fitted_clean.dynamics.coriolis_transpose_qd(
            torch.from_numpy(sig.q), torch.from_numpy(sig.qd)).numpy()[k:, arm]
    rms = lambda x: float(np.sqrt(np.mean(x ** 2)))  # noqa: E731
    assert rms(term) > 0.01
    assert rms(residual) < 0.25 * rms(term), (rms(residual), rms(term))


def test_id_friction_recovers_the_friction_that_id_linear_misses(platform, settings, world):
    fitted = fit_baselines(free_episodes(world, friction=viscous_coulomb), platform, FORCE,
                           settings)
    model = fitted.force_methods["id-friction"].model
    arm = platform.arm_indices
    assert np.allclose(model.viscous[arm], 0.12, rtol=0.25), model.viscous
    assert np.allclose(model.kt[arm], KT[arm], rtol=0.05), model.kt
    ep = payload_episode(world, moving=True, friction=viscous_coulomb)
    est = fitted.force_estimates(ep)
    truth = ep.frames["force"]
    errors = {name: settled_error(platform, f, truth) for name, f in est.items()}
    assert errors["id-friction"] < 0.05 and errors["gmo-friction"] < 0.05, errors
    assert errors["id-linear"] > 2 * errors["id-friction"], errors


def test_momentum_residual_is_a_first_order_filter_of_the_external_torque():
    # Arm at rest (p = 0), motor holding gravity minus a constant external torque from t = 0:
    # r_k = tau_ext * (1 - (1 - K dt)^k) exactly, the discrete first-order response.
    steps, dt, gain = 200, 0.01, 10.0
    g = np.tile([0.5, -0.2], (steps, 1))
    tau_ext = np.array([0.3, -0.1])
    r = momentum_residual(np.zeros((steps, 2)), g, g - tau_ext, np.full(steps, dt), gain)
    k = np.arange(steps)[:, None]
    assert np.allclose(r, tau_ext * (1 - (1 - gain * dt) ** k), atol=1e-12)
    with pytest.raises(ValueError, match="unstable"):
        momentum_residual(np.zeros((3, 2)), g[:3], g[:3], np.full(3, 0.05), 50.0)
    # Through the GMO baseline the same gain is an evaluation error naming its config key.
    dyn = ArmDynamics.for_platform(PLATFORM)
    n = dyn.n
    sig = SimpleNamespace(q=np.zeros((3, n)), qd=np.zeros((3, n)), step_dt=np.full(3, 0.05))
    observer = MomentumObserver(lambda s: np.zeros((3, n)), 50.0, dyn)
    with pytest.raises(EvalDataError, match="momentum_observer.gain.*unstable"):
        observer.joint_torques(sig)


def test_force_map_inverts_jacobian_transpose(platform, fitted_clean):
    dyn = fitted_clean.dynamics
    rng = np.random.default_rng(1)
    q = np.array([0.2, -0.6, 0.7, 0.5, 0.1, 0.3]) + rng.normal(0, 0.2, (5, 6))
    jac = dyn.ee_jacobian(torch.from_numpy(q)).numpy()
    f = rng.normal(0, 3.0, (5, 3))
    tau = np.einsum("tkn,tk->tn", jac, f)
    tau[:, 5] = 7.0  # the gripper's torque never enters the end-effector force
    exact = ee_force_from_joint_torques(dyn, q, tau, platform.arm_indices, damping=0.0)
    assert np.allclose(exact, f, atol=1e-9)
    damped = ee_force_from_joint_torques(dyn, q, tau, platform.arm_indices, damping=0.01)
    assert np.allclose(damped, f, rtol=0.05, atol=0.05)
    assert contact_decision(np.array([[0.0, 0.0, 0.9], [0.0, 0.0, -1.1]]), 1.0).tolist() == \
        [0.0, 1.0]


def test_force_estimates_are_causal(platform, world, fitted_clean):
    ep = payload_episode(world, moving=True)
    before = fitted_clean.force_estimates(ep)
    frames = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in ep.frames.items()}
    cut = 150
    for key in ("q", "qd", "effort"):
        frames[key][cut:] += 0.3  # change the future
    changed = Episode(ep.index, ep.task, ep.split, ep.length, ep.payload_mass, ep.meta, frames)
    after = fitted_clean.force_estimates(changed)
    for name in before:
        assert np.array_equal(before[name][:cut], after[name][:cut]), name
        assert not np.allclose(before[name][cut:], after[name][cut:]), name


# -- family 6: condition ----------------------------------------------------------------------
def condition_episode(platform, index, degraded: bool, seed: int, split="train", world=None):
    """Elbow sweeps; a degraded (banded) elbow needs extra effort k (q - rest). With a
    ``world`` the effort is the noiseless world's (motor torque of the motion plus the band);
    without, a constant effort plus noise and the band."""
    rng = np.random.default_rng(seed)
    t = np.arange(640) * platform.control_dt
    w = 2 * np.pi * 0.3
    phase = rng.uniform(0, 6)
    q = np.zeros((len(t), platform.n)) + np.array([0, -0.8, 0.8, 0.6, 0, 0.4])
    qd, qdd = np.zeros_like(q), np.zeros_like(q)
    q[:, 2] += 0.4 * np.sin(w * t + phase)
    qd[:, 2] = 0.4 * w * np.cos(w * t + phase)
    qdd[:, 2] = -0.4 * w ** 2 * np.sin(w * t + phase)
    band = np.zeros_like(q)
    if degraded:
        band[:, 2] = 0.3 * (q[:, 2] - 0.3)  # an elastic band with its rest below the motion
    if world is None:
        effort = 0.1 + 0.02 * rng.normal(size=q.shape) + band
    else:
        tau = world.motor_torque(q, qd, qdd, np.zeros((len(t), 3))) + band
        effort = (tau - BIAS) / KT
    cond = np.ones_like(q)
    cond[:, 2] = 0.0 if degraded else 1.0
    frames = {"q_cmd": q + 0.01, "q": q, "qd": qd, "effort": effort, "condition": cond,
              "timestamp": t}
    return Episode(index, "banded" if degraded else "nominal", split, len(t), 0.0, {}, frames)


def test_window_features_on_a_hand_made_window(platform):
    ep = condition_episode(platform, 0, degraded=False, seed=0)
    frames = dict(ep.frames)
    q = frames["q"][:, 2]
    frames["effort"] = frames["effort"].copy()
    frames["effort"][:, 2] = 2.0 * q - 1.0  # effort exactly linear in position
    ep = Episode(0, "x", "train", ep.length, 0.0, {}, frames)
    starts = window_starts(ep.length, 64, 32)
    assert starts.tolist() == list(range(0, 640 - 64 + 1, 32))
    x = window_features(ep, 2, starts, 64)
    assert x.shape == (len(starts), len(FEATURE_NAMES)) == (19, 20)
    named = dict(zip(FEATURE_NAMES, x[3], strict=True))
    u = frames["effort"][96:160, 2]
    assert np.isclose(named["effort_mean_abs"], np.abs(u).mean())
    assert np.isclose(named["corr_effort_position"], 1.0)
    assert np.isclose(named["slope_effort_position"], 2.0)
    assert np.isclose(named["error_mean"], 0.01)
    assert np.isclose(named["error_std"], 0.0, atol=1e-12)
    assert named["corr_effort_error"] == 0.0  # constant error: defined as 0, not NaN


def test_window_labels_majority_and_unlabelled(platform):
    ep = condition_episode(platform, 0, degraded=True, seed=0)
    c = ep.frames["condition"].copy()
    c[:40, 2] = 1.0  # first window: 40 nominal frames of 64 -> nominal
    c[100, 2] = np.nan  # windows covering frame 100 are unlabelled
    ep.frames["condition"] = c
    lab = window_labels(ep, 2, np.array([0, 32, 64, 96, 128]), 64)
    assert lab[0] == 0.0 and lab[1] == 1.0
    assert np.isnan(lab[2]) and np.isnan(lab[3]) and lab[4] == 1.0


def test_condition_classifiers_separate_a_banded_joint(platform, settings):
    train = [condition_episode(platform, i, degraded=i % 2 == 1, seed=i) for i in range(10)]
    test = [condition_episode(platform, 20 + i, degraded=i % 2 == 1, seed=100 + i, split="test")
            for i in range(4)]
    cond = ConditionBaselines.fit(train, platform.n, ["threshold", "svm", "random-forest"],
                                  64, 32, settings.svm, settings.random_forest)
    assert cond.channels == [2]  # only the elbow is ever labelled degraded
    assert cond.methods["threshold"].direction == 1.0  # degraded = more effort
    from nactuator.eval.baselines.condition import labelled_windows

    blocks = labelled_windows(test, cond.channels, 64, 32)
    x = np.concatenate([b["features"] for b in blocks])
    y = np.concatenate([b["labels"] for b in blocks]) > 0.5
    for name, method in cond.methods.items():
        m = M.binary_metrics(method.score(x), y, 0.0)
        assert m["accuracy"] >= 0.9 and m["auc"] >= 0.95, (name, m)


def test_condition_baselines_need_degraded_labels(platform, settings):
    train = [condition_episode(platform, i, degraded=False, seed=i) for i in range(3)]
    with pytest.raises(EvalDataError, match="no motor labelled degraded"):
        ConditionBaselines.fit(train, platform.n, ["svm"], 64, 32, settings.svm,
                               settings.random_forest)


# -- names and settings -------------------------------------------------------------------
def test_baseline_names():
    assert parse_baselines("all") == ALL_METHODS
    assert parse_baselines(None) == () and parse_baselines("none") == ()
    assert parse_baselines("svm, id-linear") == ("id-linear", "svm")
    with pytest.raises(EvalDataError, match=r"unknown baseline\(s\) \['idlinear'\]"):
        parse_baselines("idlinear")


def test_settings_errors_name_the_key(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_text("momentum_observer: {gain: -3}\n")
    with pytest.raises(EvalDataError, match=r"momentum_observer.gain: expected a number > 0"):
        load_settings(bad)
    bad.write_text("force: {dampnig: 0.1}\n")
    with pytest.raises(EvalDataError, match=r"force: unknown key\(s\) \['dampnig'\]"):
        load_settings(bad)
    good = tmp_path / "g.yaml"
    good.write_text("force: {contact_threshold_n: 2.5}\n")
    s = load_settings(good)
    assert s.contact_threshold_n == 2.5 and s.observer_gain == load_settings().observer_gain
