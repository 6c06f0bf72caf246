"""Eval plots: time in seconds, and the classical force baselines drawn beside the model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from nactuator.data import Episode
from nactuator.eval import plots


def _episode(timestamps: np.ndarray | None, length: int = 6) -> Episode:
    frames = {"q_cmd": np.zeros((length, 2)), "q": np.zeros((length, 2)),
              "force": np.tile([0.0, 0.0, -4.9], (length, 1))}
    if timestamps is not None:
        frames["timestamp"] = timestamps
    return Episode(index=3, task="carry", split="test", length=length, payload_mass=0.5,
                   meta={}, frames=frames)


def test_time_axis_is_the_recorded_timestamps_or_frame_times_dt():
    jittery = np.array([0.0, 0.016, 0.033, 0.050, 0.066, 0.083])
    np.testing.assert_allclose(plots.episode_seconds(_episode(jittery), 1 / 60), jittery)
    np.testing.assert_allclose(plots.episode_seconds(_episode(jittery + 2.0), 1 / 60), jittery)
    np.testing.assert_allclose(plots.episode_seconds(_episode(None), 0.02),
                               [0.0, 0.02, 0.04, 0.06, 0.08, 0.10])
    broken = jittery.copy()
    broken[3] = broken[2]  # not increasing: the frame times are more honest
    np.testing.assert_allclose(plots.episode_seconds(_episode(broken), 0.02),
                               np.arange(6) * 0.02)


@pytest.fixture
def figures(monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "write_png", lambda path, fig, **kw: drawn.append(fig) or path)
    return drawn


def test_force_plot_draws_the_classical_baselines_over_seconds(figures, tmp_path):
    t = np.array([0.0, 0.016, 0.033, 0.050, 0.066, 0.083])
    ep = _episode(t)
    ro = SimpleNamespace(force=np.zeros((5, 3)), gate=np.full(5, 0.2), q=np.zeros((6, 2)))
    gmo = np.arange(18, dtype=float).reshape(6, 3)
    plots.plot_force(ep, ro, tmp_path / "f.png", 1 / 60, linear=np.ones((6, 3)),
                     classical={"gmo": gmo, "id-linear": -gmo})
    (fig,) = figures
    fz = fig.axes[2]
    lines = {line.get_label(): line for line in fz.lines}
    assert set(lines) == {"label", "model", "linear regression", "momentum observer",
                          "ID-Linear"}
    np.testing.assert_allclose(lines["momentum observer"].get_xdata(), t[:5])
    np.testing.assert_allclose(lines["momentum observer"].get_ydata(), gmo[:5, 2])
    np.testing.assert_allclose(lines["ID-Linear"].get_ydata(), -gmo[:5, 2])
    assert fig.axes[3].get_xlabel() == "time [s]"

    plots.plot_force(ep, ro, tmp_path / "g.png", 1 / 60)  # without --baselines: no such lines
    assert {line.get_label() for line in figures[1].axes[2].lines} == {"label", "model"}


def test_joint_plot_is_over_seconds(figures, tmp_path):
    ep = _episode(None)
    ro = SimpleNamespace(q=np.zeros((6, 2)))
    plots.plot_joints(ep, ro, ["j1", "j2"], np.array([57.3, 57.3]), ["deg", "deg"],
                      tmp_path / "j.png", 0.05)
    (fig,) = figures
    assert fig.axes[-1].get_xlabel() == "time [s]"
    np.testing.assert_allclose(fig.axes[0].lines[0].get_xdata(), np.arange(6) * 0.05)
