"""A Jacobian field that sees the load (issue 21): the observation spec (joints, the
servos' effort, command − joints) and its normalisation round-trip through the field
file, a format-1 (joints-only) file still loads and tracks identically, a field fitted on
a small multi-payload collection predicts held-out world perturbations, and a
loaded-observation field tracks on the emulated bus and leaves torque off."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nactuator.control.field import (
    JacobianField,
    collect_perturbations,
    fit_field,
    fk_priors,
    load_field,
    save_field,
)
from nactuator.errors import UserError
from nactuator.platforms import load_platform

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Q0 = np.array([0.0, -0.5, 0.5, 0.9, 0.0, 0.3])
JOINTS = [0, 1, 2, 3, 4]


def numpy_jacobian(state: dict, q, extra: list, prior=None, kind: str = "none",
                   signed: bool = False) -> np.ndarray:
    """The field's MLP written out in numpy from the saved weights: features sin q, cos q
    and each extra input normalised (clipped to ±3 std), two tanh layers; then (3, k) J
    (``none``), the prior plus it (``fk``), or the prior's columns scaled by
    1 + ½ tanh of its k outputs (``fk_scale``); a signed field's two halves averaged."""
    w = {k: v.double().numpy() for k, v in state.items()}
    h = np.concatenate([np.sin(q), np.cos(q), *(np.clip(z, -3.0, 3.0) for z in extra)])
    h = np.tanh(w["net.0.weight"] @ h + w["net.0.bias"])
    h = np.tanh(w["net.2.weight"] @ h + w["net.2.bias"])
    out = w["net.4.weight"] @ h + w["net.4.bias"]
    Js = []
    for half in np.split(out, 2 if signed else 1):
        if kind == "fk_scale":
            Js.append(prior * (1 + 0.5 * np.tanh(half))[None, :])
        else:
            Js.append(half.reshape(3, -1) + (0 if kind == "none" else prior))
    return np.mean(Js, axis=0)


def random_field(observation, prior="none", seed=0, signed=False) -> JacobianField:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    norm = {o: {"mean": rng.normal(size=6).tolist(), "std": rng.uniform(0.5, 2, 6).tolist()}
            for o in observation[1:]}
    field = JacobianField(6, JOINTS, hidden=16, observation=observation, norm=norm,
                          prior=prior, signed=signed)
    with torch.no_grad():  # a residual field starts at zero: give it a correction to carry
        for prm in field.parameters():
            prm.add_(0.1 * torch.randn_like(prm))
    return field.eval()


@pytest.mark.parametrize(("prior", "signed"), [("none", False), ("fk", False),
                                               ("fk_scale", False), ("fk_scale", True)])
def test_the_observation_and_its_normalisation_round_trip_through_the_file(tmp_path, sims,
                                                                          prior, signed) -> None:
    kin = sims["so101"].kinematics
    field = random_field(("q", "effort", "error"), prior=prior, signed=signed)
    out = save_field(tmp_path / "f.pt", field, "so101", {"payload_g": [0.0, 300.0]})
    back = load_field(out, expect_platform="so101")
    assert back.observation == ("q", "effort", "error") and back.prior == prior
    assert back.signed == signed
    assert back.norm == field.norm and back.info["payload_g"] == [0.0, 300.0]
    rng = np.random.default_rng(1)
    for _ in range(3):
        q = Q0 + rng.uniform(-0.3, 0.3, 6)
        effort, u = rng.uniform(-0.5, 0.5, 6), q + rng.uniform(-0.05, 0.05, 6)
        fk = fk_priors(kin, q[None])[0]
        J = back.jacobian(q, 6, effort=effort, q_cmd=u, prior=fk)
        m = {o: np.array(back.norm[o]["mean"]) for o in back.norm}
        s = {o: np.array(back.norm[o]["std"]) for o in back.norm}
        expect = numpy_jacobian(back.state_dict(), q, [(effort - m["effort"]) / s["effort"],
                                                       (u - q - m["error"]) / s["error"]],
                                fk[:, JOINTS], prior, signed)
        np.testing.assert_allclose(J[:, JOINTS], expect, atol=2e-5)
        assert np.all(J[:, 5] == 0)  # the gripper column is not controlled
        # The load inputs matter: another effort gives another J.
        assert np.abs(back.jacobian(q, 6, effort=effort + 0.3, q_cmd=u, prior=fk)
                      - J).max() > 1e-4
        if prior == "fk_scale":  # FK's directions kept: each column a positive multiple
            cos = (J * fk).sum(0)[JOINTS] / (np.linalg.norm(J, axis=0)
                                             * np.linalg.norm(fk, axis=0))[JOINTS]
            np.testing.assert_allclose(cos, 1.0, atol=1e-5)
    with pytest.raises(UserError, match="reads 'effort'"):
        back.jacobian(Q0, 6, q_cmd=Q0, prior=fk)


def test_a_format_1_joints_only_file_loads_and_tracks_identically(tmp_path, sims) -> None:
    from nactuator.control.jacobian import Points
    from nactuator.control.plants import WorldPlant
    from nactuator.control.track import Tracker, TrackSettings, run_tracking

    p, sim = load_platform("so101"), sims["so101"]
    field = random_field(("q",))
    old = tmp_path / "v1.pt"
    # The file `nactuator field fit` wrote before the observation spec (format 1).
    torch.save({"format": "nactuator-jacobian-field/1", "platform": "so101", "n": 6,
                "joints": JOINTS, "hidden": 16, "state_dict": field.state_dict(),
                "info": {"samples": 768}}, old)
    back = load_field(old, expect_platform="so101")
    assert back.observation == ("q",) and back.prior == "none" and back.info["samples"] == 768
    np.testing.assert_allclose(back.jacobian(Q0, 6)[:, JOINTS],
                               numpy_jacobian(field.state_dict(), Q0, []), atol=2e-5)
    # Effort and command are offered by every plant now; a joints-only field ignores them.
    np.testing.assert_array_equal(back.jacobian(Q0, 6, effort=np.ones(6), q_cmd=Q0 + 1),
                                  back.jacobian(Q0, 6))
    pts = Points.end_effector(sim.kinematics)
    times = np.array([0.0, 0.5])
    path = np.stack([pts.positions(sim.kinematics, torch.tensor(Q0[None]))[0, 0].numpy()] * 2)
    path[1, 2] += 0.01
    settings = TrackSettings(extra_s=0.3)
    logs = []
    for f in (field, back):
        plant = WorldPlant(p, pts, sim.kinematics, Q0, payload_kg=0.2)
        logs.append(run_tracking(plant, Tracker("field", p, sim.kinematics, pts, settings,
                                                field=f), times, path).u)
    np.testing.assert_array_equal(logs[0], logs[1])


def test_a_field_fitted_across_payloads_predicts_held_out_perturbations(sims) -> None:
    """Collected at 0 and 300 g (effort and lag read before each step), fitted, then scored
    on a fresh collection at 200 g (a payload it never saw): R² of the predicted Δx against
    the world's, computed here in numpy, is above zero (better than predicting no motion)."""
    p = load_platform("so101")
    obs = ("q", "effort", "error")
    data = collect_perturbations(p, Q0, JOINTS, poses=32, per_pose=4, horizon=16,
                                 payload_kg=[0.0, 0.3], seed=0)
    assert data["q"].shape == (256, 6) and sorted(set(data["payload_g"])) == [0.0, 300.0]
    # The observation carries the load: the shoulder's effort under 300 g differs from 0 g
    # by far more than its spread over poses within one payload.
    load, empty = data["effort"][data["payload_g"] > 0, 1], data["effort"][
        data["payload_g"] == 0, 1]
    assert abs(load.mean() - empty.mean()) > 2 * max(load.std(), empty.std())
    field, fit = fit_field(data, p.n, JOINTS, steps=200, lr=1e-2, observation=obs)
    assert field.observation == obs and set(field.norm) == {"effort", "error"}
    # Normalised by the training split's statistics (the fit's seeded 80 % of the rows).
    torch.manual_seed(0)
    train = torch.randperm(256)[: int(0.8 * 256)].numpy()
    np.testing.assert_allclose(field.norm["error"]["mean"], data["error"][train].mean(0),
                               atol=1e-9)
    std = data["effort"][train].std(0)
    # A joint whose effort reads 0 at rest (the base, the wrist roll) keeps std 1.
    np.testing.assert_allclose(field.norm["effort"]["std"], np.where(std > 1e-6, std, 1.0),
                               rtol=1e-6)
    held = collect_perturbations(p, Q0, JOINTS, poses=4, per_pose=4, horizon=16,
                                 payload_kg=0.2, seed=7)
    pred = np.stack([field.jacobian(q, 6, effort=e, q_cmd=q + err)[:, JOINTS] @ du
                     for q, e, err, du in zip(held["q"], held["effort"], held["error"],
                                              held["du"], strict=True)])
    r2 = 1 - ((pred - held["dx"]) ** 2).sum() / (held["dx"] ** 2).sum()
    assert r2 > 0.0, r2


def test_a_loaded_observation_field_tracks_on_the_emulated_bus_ends_with_torque_off(
        tmp_path, sims, world_follower, patient_track_config) -> None:
    """`track --method field` with a field that reads effort and lag, on the STS3215
    emulator running the hidden world: the bus's effort reaches the field, the arm moves
    along the reach, and torque is off after."""
    import json

    from nactuator.control.track import write_path
    from nactuator.control.track_run import fit_field_file, track
    p = load_platform("so101")
    out = tmp_path / "field.pt"
    fit_field_file(out, platform=p, poses=4, per_pose=4, payload_g=[0.0, 300.0], steps=200,
                   observation=["q", "effort", "error"], prior="fk_scale")
    assert load_field(out).observation == ("q", "effort", "error")
    t = np.arange(0.0, 1.5 + 1e-9, 0.05)
    d = np.array([0.02, 0.0, 0.02])
    path = write_path(tmp_path / "reach.csv", t,
                      np.clip(t / 0.9, 0, 1)[:, None] ** 2 * d)
    with world_follower(p, Q0) as (follower, arm, patient):
        start_world = arm.world.ee_position()[0].copy()
        track(path, platform=patient, methods=("field",), field=out, port=follower.port,
              relative=True, out=tmp_path / "run", config=patient_track_config)
        assert [tb.get("Torque_Enable") for tb in follower.tables.values()] == [0] * 6
        end = arm.world.ee_position()[0]
    run = json.loads((tmp_path / "run" / "track.json").read_text())["runs"][0]
    assert run["method"] == "field" and run["metrics"]["stop"] == "settled"
    assert np.linalg.norm(end - (start_world + d)) < 0.01, end - start_world


def test_a_signed_field_steps_with_the_columns_of_its_steps_signs(sims) -> None:
    """A servo answers a step up and a step down differently; a signed field's loop step
    must be the damped-least-squares step through the columns its own signs select
    (checked here by solving again in numpy), not through their mean."""
    from nactuator.control.jacobian import Points
    from nactuator.control.plants import Observation
    from nactuator.control.track import Tracker, TrackSettings

    p, sim = load_platform("so101"), sims["so101"]
    rng = np.random.default_rng(3)
    up = rng.normal(0, 0.2, (3, 6))
    down = up * rng.uniform(0.2, 0.6, 6)  # a step down moves the point less

    class Fixed:  # the two column sets of a signed field at this observation
        signed, prior, observation = True, "none", ("q",)

        def jacobians(self, q, n, effort=None, q_cmd=None, prior=None):
            return np.stack([up, down])

    s = TrackSettings(null_gain=0.0, step_clip=10.0, max_lead=10.0)
    tracker = Tracker("field", p, sim.kinematics, Points.end_effector(sim.kinematics), s,
                      field=Fixed())
    u = Q0.copy()
    obs = Observation(Q0, np.zeros(6), np.zeros((1, 3)), None, 0.0, effort=np.zeros(6))
    e = np.array([0.004, -0.002, 0.003])
    new, _ = tracker.decide(obs, u, e[None])
    du = (new - u)[JOINTS]
    J = np.where(du >= 0, up[:, JOINTS], down[:, JOINTS])
    expect = s.gain * np.linalg.solve(J.T @ J + s.damping**2 * np.eye(5), J.T @ e)
    np.testing.assert_allclose(du, expect, atol=1e-12)
    mean = 0.5 * (up + down)[:, JOINTS]
    plain = s.gain * np.linalg.solve(mean.T @ mean + s.damping**2 * np.eye(5), mean.T @ e)
    assert np.abs(plain - du).max() > 1e-3  # the signs' columns made a difference


def test_field_fit_cli_writes_the_configured_observation(tmp_path, monkeypatch) -> None:
    """`nactuator field fit` with the observation, prior and sign flags: the file says
    what was asked, and the collection had a block of poses per payload."""
    from nactuator.cli import main

    out = tmp_path / "f.pt"
    assert main(["field", "fit", "--platform", "so101", "--out", str(out), "--poses", "3",
                 "--per-pose", "2", "--payload-g", "0", "300", "--observation", "q", "effort",
                 "--prior", "fk_scale", "--signed", "--steps", "20"]) == 0
    f = load_field(out, expect_platform="so101")
    assert f.observation == ("q", "effort") and f.prior == "fk_scale" and f.signed
    assert f.info["samples"] == 12 and f.info["payload_g"] == [0.0, 300.0]
    assert f.jacobians(Q0, 6, effort=np.zeros(6), prior=np.ones((3, 6))).shape == (2, 3, 6)
