"""The contact experiment's yardstick (issue 23): how far each residual source is from the
contact's own joint torque, and what a perfect motor-torque model would see when the held
servos' dry friction takes an unknown share of that torque (``exact_friction``)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from nactuator.contact.experiment import _friction_share, evaluate, run_world
from nactuator.platforms import conf_dir


@pytest.fixture(scope="module")
def runs():
    # 2 presses of 6 N (links drawn) + their 2 no-contact twins, 2 folds (one press each).
    data = run_world("so101", pairs=2, seed=0, seconds=3.0, magnitude=6.0)
    return data, evaluate(data, folds=2)


def test_the_worlds_dry_friction_level_is_logged_per_frame(runs):
    data, _ = runs
    level = data["logs"]["friction_true"]
    assert level.shape == data["logs"]["q"].shape
    # Independently from the world file: Coulomb (randomised +-30 %) is the floor of the level;
    # at rest Coulomb + Stribeck + load friction x |delivered torque| (each +-30 %) its ceiling.
    world = yaml.safe_load((conf_dir() / "world" / "so101.yaml").read_text())
    m, spread = world["servo"], world["randomize"]
    assert (level >= (1 - spread["coulomb"]) * m["coulomb"] - 1e-9).all()
    coulomb = max(m["coulomb"], world["motors"]["gripper"]["coulomb"])
    ceiling = ((1 + spread["coulomb"]) * coulomb + (1 + spread["stribeck"]) * m["stribeck"]
               + (1 + spread["load_friction"]) * m["load_friction"]
               * np.abs(data["logs"]["torque_true"]))
    assert (level <= ceiling + 1e-6).all()


def test_the_friction_share_sits_on_the_press_frames_within_the_level(runs):
    data, _ = runs
    share = _friction_share(data)
    pairs = data["force"].shape[1]
    on = np.linalg.norm(data["force"], axis=2) > 0
    assert np.all(share[:, pairs:] == 0)  # the twins
    assert np.all(share[:, :pairs][~on] == 0)  # before and after each press
    for e in range(pairs):
        rows = share[on[:, e], e]
        assert np.all(rows == rows[0])  # one share per press and joint
        f = np.linalg.norm(data["force"][:, e], axis=1)
        level = data["logs"]["friction_true"][f >= 0.999 * f.max(), e].mean(0)  # the hold's
        assert np.all(np.abs(rows[0]) <= level) and np.any(rows[0] != 0)
    assert np.array_equal(share, _friction_share(data))  # seeded


def test_torque_error_against_the_contacts_own_torque(runs):
    data, summary = runs
    mean = {name: {k: v["mean"] for k, v in s.items()} for name, s in summary.items()
            if name != "meta"}
    assert mean["exact"]["torque_err_nm"] == 0.0 and mean["exact"]["within_friction"] == 1.0
    # The friction share is inside the level by construction, and not nothing.
    top = data["logs"]["friction_true"][..., :4].max()
    assert 0.0 < mean["exact_friction"]["torque_err_nm"] <= top
    assert mean["exact_friction"]["within_friction"] == 1.0
    # The world's true motor torque is off by about a friction level, through inverse dynamics
    # or the momentum observer; the classical current map, fitted on contact-free twins, by
    # several.
    for way in ("tared", "observer_tared"):
        assert mean[f"oracle_{way}"]["torque_err_nm"] <= 2 * top
        assert (mean[f"current_id_{way}"]["torque_err_nm"]
                > 2 * mean[f"oracle_{way}"]["torque_err_nm"])
        for name in (f"oracle_{way}", f"current_id_{way}"):
            assert 0.0 <= mean[name]["within_friction"] <= 1.0
