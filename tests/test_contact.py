"""Contact anywhere on the arm (issue 23): the world applies the labelled force, and
isolation + NNLS localisation recover a known contact from its exact joint torque."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import scipy.optimize

from nactuator.contact import (
    LinkSurfaces,
    calibrate_threshold,
    detect,
    isolate,
    load_contact_config,
    localise,
)
from nactuator.contact.estimate import (
    ContactFilter,
    FilterSettings,
    _pyramid,
    localise_window,
    nnls_gram,
)
from nactuator.platforms import load_platform
from nactuator.world import World, load_world


@pytest.fixture(scope="module")
def so101():
    p = load_platform("so101")
    cfg = load_contact_config(p)
    return p, cfg, LinkSurfaces.build(p, cfg)


def test_world_applies_the_labelled_force_at_the_point(so101):
    p, _, surf = so101
    world = World(p, load_world(p, seed=0), n_envs=1)
    q = np.array([0.1, -0.4, 0.6, 0.3, 0.2, 0.5])
    world.reset(q)
    link = surf.names.index("lower_arm")
    local, f = np.array([-0.06, 0.0, 0.02]), np.array([1.0, -2.0, 3.0])
    world.set_link_contact(int(surf.bodies[link]), local, f)
    m, d = world.models[0], world.datas[0]
    d.xfrc_applied[:] = 0.0
    world._apply_link_contact(d, 0)
    # What the applied wrench does to the joints (MuJoCo's own map of a COM wrench) ...
    qfrc = np.zeros(m.nv)
    b = int(surf.bodies[link])
    mujoco.mj_applyFT(m, d, d.xfrc_applied[b, :3].copy(), d.xfrc_applied[b, 3:].copy(),
                      d.xipos[b].copy(), b, qfrc)
    # ... equals J_p^T f of the labelled point, J_p from mj_jac at that point.
    p_world = d.xpos[b] + d.xmat[b].reshape(3, 3) @ local
    jacp = np.zeros((3, m.nv))
    mujoco.mj_jac(m, d, jacp, None, p_world, b)
    np.testing.assert_allclose(qfrc, jacp.T @ f, atol=1e-9)
    assert np.abs(qfrc[3:]).max() == 0.0  # a force on the forearm moves no wrist joint


def test_contact_moves_the_world_and_clears(so101):
    p, _, surf = so101
    params = load_world(p, seed=0)
    world = World(p, params, n_envs=2)
    q = np.array([0.0, -0.4, 0.6, 0.3, 0.0, 0.5])
    world.reset(q)
    world.set_torque_enabled(False)
    link = surf.names.index("lower_arm")
    world.set_link_contact([int(surf.bodies[link]), -1], [-0.1, 0, 0], [0.0, 0.0, -10.0])
    world.step(0.05)
    assert not np.allclose(world.q[0], world.q[1])  # the pressed arm moved differently
    world.set_link_contact(-1, np.zeros(3), np.zeros(3))
    world.step(0.01)
    assert np.abs(world.datas[0].xfrc_applied).max() == 0.0


@pytest.mark.parametrize("name,index", [("upper_arm", 17), ("lower_arm", 101), ("wrist", 60),
                                        ("gripper", 120)])
def test_isolation_and_nnls_recover_a_known_contact(so101, name, index):
    p, cfg, surf = so101
    q = np.array([0.2, -0.5, 0.7, 0.4, 0.3, 0.5])
    k = surf.names.index(name)
    pts, nrm, d = surf.world_points(q, k)
    # A push into the surface, inside the friction cone, 6 N.
    t = np.cross(nrm[index], [0.0, 0.0, 1.0])
    f = -nrm[index] + 0.3 * t / np.linalg.norm(t)
    f *= 6.0 / np.linalg.norm(f)
    tau = surf.point_jacobian(d, k, pts[index]).T @ f
    thr = np.full(p.n, 0.01)
    j = isolate(tau, thr)
    assert j in (surf.last_joint[k], surf.last_joint[k] - 1)  # the last joint may be silent
    est = localise(surf, q, tau, j, float(cfg["friction"]))
    assert est.link == k
    fit = surf.point_jacobian(d, k, est.point_world).T @ est.force
    assert np.linalg.norm(fit - tau) <= 0.006 * np.linalg.norm(tau)
    if name in ("upper_arm", "lower_arm"):
        return  # 2-3 joints see it: fewer equations than 3 force axes + 2 surface coordinates
    assert np.linalg.norm(est.point_world - pts[index]) < 0.03
    np.testing.assert_allclose(est.force, f, atol=0.05)


def test_threshold_calibration_bounds_idle_false_alarms():
    rng = np.random.default_rng(0)
    idle = rng.normal(0, [0.01, 0.02, 0.03], size=(20000, 3))
    thr = calibrate_threshold(idle, quantile=0.999, margin=1.0)
    fresh = rng.normal(0, [0.01, 0.02, 0.03], size=(20000, 3))
    rate = detect(fresh, thr).mean()
    assert 0.0005 < rate < 0.006  # ~3 joints x 0.1 %
    np.testing.assert_allclose(thr, 3.29 * np.array([0.01, 0.02, 0.03]), rtol=0.08)
    with pytest.raises(ValueError, match="10 finite"):
        calibrate_threshold(np.full((5, 3), 0.1))


def _frames(n: int, length: int, rng) -> dict:
    f = {k: rng.normal(size=(length, n)) for k in ("q_cmd", "q", "qd", "effort")}
    f.update(voltage=np.full((length, n), 12.0), temperature=np.full((length, n), 30.0),
             timestamp=np.arange(length) * 0.016)
    return f


def test_contact_columns_round_trip_and_older_datasets_still_read(tmp_path):
    import pyarrow.parquet as pq

    from nactuator.data.reader import read_dataset
    from nactuator.data.writer import DatasetWriter

    p = load_platform("so101")
    rng = np.random.default_rng(0)
    frames = _frames(p.n, 50, rng)
    link = np.where(np.arange(50) >= 20, 3.0, np.nan)
    point = np.where(link[:, None] > 0, [-0.05, 0.01, 0.02], np.nan)
    force = np.where(link[:, None] > 0, [0.0, 0.0, -4.0], np.nan)
    frames.update(contact_link=link, contact_point=point, contact_force=force)
    root = tmp_path / "ds"
    w = DatasetWriter(root, p, fps=p.fps, metadata={})
    w.add_episode(frames, "press", "train")
    w.add_episode(_frames(p.n, 30, rng), "free", "train")  # no contact labels given
    w.close()
    ds = read_dataset(root)
    e0, e1 = ds.episodes
    np.testing.assert_array_equal(e0.frames["contact_link"], link.astype(np.float32))
    np.testing.assert_allclose(e0.frames["contact_point"], point.astype(np.float32))
    np.testing.assert_allclose(e0.frames["contact_force"], force.astype(np.float32))
    assert np.isnan(e1.frames["contact_force"]).all()
    # A dataset written before the columns existed: drop them from the data files.
    for f in (root / "data").rglob("*.parquet"):
        t = pq.read_table(f)
        keep = [c for c in t.column_names if not c.startswith("observation.contact_")]
        pq.write_table(t.select(keep), f)
    old = read_dataset(root)
    assert np.isnan(old.episodes[0].frames["contact_link"]).all()
    np.testing.assert_array_equal(old.episodes[0].frames["q"], ds.episodes[0].frames["q"])


def test_batched_pyramid_fit_matches_scipy_nnls(so101):
    """nnls_small (the surface search's batched solver) reaches scipy's NNLS optimum on
    every point of a link, including links seen by too few joints (rank-deficient fits)."""
    from scipy.optimize import nnls

    from nactuator.contact.estimate import _pyramids, nnls_small

    p, cfg, surf = so101
    rng = np.random.default_rng(3)
    for link in range(len(surf.names)):
        q = rng.uniform(-1.0, 1.0, p.n)
        pts, nrm, d = surf.world_points(q, link)
        D = _pyramids(nrm, float(cfg["friction"]))
        J = surf.point_jacobians(d, link, pts)
        for i in (0, 77, 150):  # the batched Jacobians are MuJoCo's, point by point
            np.testing.assert_allclose(J[i], surf.point_jacobian(d, link, pts[i]), atol=1e-12)
        A = np.swapaxes(J, 1, 2) @ D
        tau = rng.normal(0.0, 0.5, p.n)
        x, res = nnls_small(A, tau, D)
        ref = np.array([nnls(A[i], tau, maxiter=200)[1] for i in range(len(A))])
        assert (x >= 0).all()
        np.testing.assert_allclose(res, np.linalg.norm((A @ x[..., None])[..., 0] - tau, axis=1),
                                   atol=1e-12)  # the residual reported is the fit's
        # Optimal: never worse than scipy, and equal up to the tie tolerance (1e-6 |tau|).
        assert (res <= ref + 1e-6 * np.linalg.norm(tau) + 1e-12).all()
        assert (res >= ref - 1e-9).all()


def _moving_press(surf, link, sample, q0, amp, frames, mu, magnitude=4.0, ramp=None):
    """Postures q0 + amp * s (s in 0..1) and the exact joint torque J_p(q)^T f of a press at
    surface sample ``sample`` of ``link``, f fixed in the base frame (into the surface, the
    friction pyramid's centre, at the first posture); ``ramp`` (frames,) scales f per frame."""
    qs, taus, pts, f = [], [], [], None
    for n, s in enumerate(np.linspace(0.0, 1.0, frames)):
        q = q0 + amp * s
        pw, _, d = surf.world_points(q, link, local=surf.points[link][sample])
        if f is None:
            R = d.xmat[surf.bodies[link]].reshape(3, 3)
            f = magnitude * _pyramid(R @ surf.normals[link][sample], mu).mean(1)
        qs.append(q)
        taus.append(surf.point_jacobian(d, link, pw[0]).T @ f * (1.0 if ramp is None else ramp[n]))
        pts.append(pw[0])
    return np.array(qs), np.array(taus), np.array(pts), f


# A posture and the sweep around it (shoulder lift, elbow, wrist by 0.3 rad) for forearm presses.
FOREARM_SWEEP = (np.array([0.1, -0.5, 0.7, 0.3, 0.0, 0.5]),
                 np.array([0.0, 0.3, -0.3, 0.3, 0.0, 0.0]))


@pytest.mark.parametrize("sample", [21, 63, 98])
def test_contact_filter_localises_a_moving_forearm_press(so101, sample):
    """One frame of a forearm press gives 3 joint equations for 5 unknowns: the one-frame
    estimate misses the point by > 3 cm. Eight postures of the arm moving while pressed
    (shoulder lift, elbow, wrist by 0.3 rad) determine it: the filter is within 3 cm."""
    _, cfg, surf = so101
    mu, thr, k = float(cfg["friction"]), np.full(4, 0.005), surf.names.index("lower_arm")
    q0, amp = FOREARM_SWEEP
    qs, taus, pts, f = _moving_press(surf, k, sample, q0, amp, 8, mu)
    one = localise(surf, qs[0], taus[0], isolate(taus[0][:4], thr), mu)
    assert np.linalg.norm(one.point_world - pts[0]) > 0.03  # not determined by one frame
    filt = ContactFilter(surf, thr, mu, FilterSettings())
    for q, tau in zip(qs, taus, strict=True):
        est = filt.update(q, tau)
    assert est.link == k
    assert np.linalg.norm(est.point_world - pts[-1]) < 0.03
    np.testing.assert_allclose(est.force, f, atol=0.05 * np.linalg.norm(f))
    # The same filter on one posture (the press held still) is no better than one frame.
    still = ContactFilter(surf, thr, mu)
    for _ in range(8):
        held = still.update(qs[0], taus[0])
    assert np.linalg.norm(held.point_world - pts[0]) > 0.03


def test_contact_filter_stream_equals_window_and_resets(so101):
    """Frame by frame (ContactFilter) = the batch fit of the contact's window
    (localise_window); unflagged frames in a row end the contact."""
    _, cfg, surf = so101
    mu = float(cfg["friction"])
    thr = np.full(4, 0.005)
    k = surf.names.index("wrist")
    q0 = np.array([-0.2, -0.3, 0.5, 0.6, 0.3, 0.5])
    amp = np.array([0.3, 0.2, 0.0, -0.3, 0.0, 0.0])
    qs, taus, _, _ = _moving_press(surf, k, 40, q0, amp, 6, mu)
    settings = FilterSettings(release_frames=2, forget=0.9)
    filt = ContactFilter(surf, thr, mu, settings)
    for t, (q, tau) in enumerate(zip(qs, taus, strict=True)):  # every frame: the window so far
        est = filt.update(q, tau)
        batch = localise_window(surf, qs[:t + 1], taus[:t + 1], thr, mu, settings)
        assert est.link == batch.link
        np.testing.assert_allclose(est.point_world, batch.point_world, atol=1e-9)
        np.testing.assert_allclose(est.force, batch.force, rtol=1e-6, atol=1e-9)
    assert est.link == k
    assert filt.update(qs[-1], np.zeros(6)).link == -1 and filt.frames == len(qs)
    filt.update(qs[-1], np.zeros(6))
    assert filt.frames == 0  # reset after release_frames unflagged frames


def test_nnls_gram_matches_stacked_nnls():
    """The filter's accumulated normal equations give the stacked NNLS (scipy) optimum."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        D = rng.normal(size=(1, 3, 4))
        A = rng.normal(size=(1, 9, 3)) @ D  # stacked frames' J^T D: rank <= 3
        b = rng.normal(size=9)
        At = np.swapaxes(A, 1, 2)
        x, r2 = nnls_gram(At @ A, At @ b, float(b @ b), D)
        ref, rnorm = scipy.optimize.nnls(A[0], b)
        assert r2[0] == pytest.approx(rnorm ** 2, rel=1e-6, abs=1e-9)


def test_contact_filter_restarts_its_fit_when_the_push_changes_size(so101):
    """A push that ramps up while the arm moves: one force over all frames misfits the ramp;
    with change_ratio the fit restarts while |tau_ext| grows and ends within 3 cm."""
    _, cfg, surf = so101
    mu, thr, k = float(cfg["friction"]), np.full(4, 0.005), surf.names.index("lower_arm")
    q0, amp = FOREARM_SWEEP
    ramp = np.minimum(1.0, np.linspace(0.1, 3.0, 24))  # 10 % -> 100 % over 8 frames, held
    qs, taus, pts, _ = _moving_press(surf, k, 63, q0, amp, 24, mu, ramp=ramp)
    errors = {}
    for ratio in (0.0, 0.2):
        filt = ContactFilter(surf, thr, mu, FilterSettings(change_ratio=ratio))
        for q, tau in zip(qs, taus, strict=True):
            est = filt.update(q, tau)
        errors[ratio] = (est.link, np.linalg.norm(est.point_world - pts[-1]))
    assert errors[0.2][0] == k and errors[0.2][1] < 0.03
    assert errors[0.2][1] < errors[0.0][1]
