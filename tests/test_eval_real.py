"""The references on the real NAD files (../shared/data/nad): what they reach on validation."""

from __future__ import annotations

import numpy as np
import pytest

from nactuator.data.importers import import_nad
from nactuator.data.references import LinearForceReference, command_following
from nactuator.eval import metrics as M
from nactuator.eval.episodes import force_labels, is_no_contact, load_episodes
from nactuator.platforms import load_platform


@pytest.fixture(scope="module")
def real(nad_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("nad")
    out = {}
    for name in ("so101", "omx"):
        import_nad(nad_dir / name, root / name)
        platform = load_platform(name)
        out[name] = (platform, load_episodes(root / name, platform, "train"),
                     load_episodes(root / name, platform, "validation"))
    return out


def test_linear_force_reference_beats_predicting_zero_on_so101_validation(real):
    _, train, val = real["so101"]
    ref = LinearForceReference.fit(train)
    (ep,) = val
    err = M.force_errors(ref.predict(ep), force_labels(ep)).mean()
    zero = M.force_errors(np.zeros((ep.length, 3)), force_labels(ep)).mean()
    # 280 carry frames at -4.9 N of 694: always predicting 0 N scores 0.66 N.
    assert zero == pytest.approx(0.66, abs=0.01)
    assert err < 0.5 * zero


def test_omx_reference_runs_are_no_contact_and_command_following_is_degrees(real):
    platform, _, val = real["omx"]
    kinds = {ep.task: is_no_contact(ep) for ep in val}
    assert kinds == {"force_sensor/force_z_minus": False, "force_sensor/force_z_minus_ref": True}
    scales, units = M.channel_scales([c.kind for c in platform.channels])
    assert units == ["deg"] * 4 + ["mm"]
    for ep in val:
        err = np.abs(command_following(ep) - ep.frames["q"][1:]) * scales
        full = M.prefix_mae(err)["full"]
        # A slow push motion: the goal leads the arm by a few degrees at most, and the
        # finger (metres in the data) is reported in mm, not in thousandths of a metre.
        assert np.all(full[:4] < 10.0) and np.all(full > 0.0)
