"""What LeRobot needs from our datasets, and that older datasets still read: the integer
``info.json`` ``fps`` beside our recorded rate, and statistics without ``null`` for channels
never recorded. (LeRobot itself opens the datasets in ``make lerobot-check``, in its own
environment: tests/lerobot_check/.)"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from nactuator.data import DataFormatError, DatasetWriter, read_dataset
from nactuator.data.datamodule import NADDataModule
from nactuator.data.info import describe
from nactuator.data.schema import nominal_fps
from nactuator.platforms import load_platform

SO101 = load_platform("so101")  # records at 62.3 Hz


def frames(T: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = SO101.n
    return {"q_cmd": rng.normal(size=(T, n)), "q": rng.normal(size=(T, n)),
            "qd": rng.normal(size=(T, n)), "effort": rng.normal(size=(T, n)),
            "voltage": 12 + rng.normal(size=(T, n)), "temperature": 35 + rng.normal(size=(T, n))}


def write(root: Path, splits=("train", "validation", "test"), T: int = 40) -> None:
    with DatasetWriter(root, SO101, SO101.fps) as w:
        for seed, split in enumerate(splits):
            w.add_episode(frames(T, seed), "pick", split)


def info_of(root: Path) -> dict:
    return json.loads((root / "meta" / "info.json").read_text())


def make_old(root: Path) -> None:
    """Turn a dataset into what nactuator wrote before: the recorded rate as LeRobot's fps,
    no ``nactuator.fps``, and ``null`` statistics for channels never recorded."""
    info = info_of(root)
    info["fps"] = info["nactuator"].pop("fps")
    stats = json.loads((root / "meta" / "stats.json").read_text())
    for s in stats.values():
        for name in ("min", "max", "mean", "std"):
            s[name] = [None if c == 0 else v for v, c in zip(s[name], s["count"], strict=True)]
    data = json.dumps(stats).encode()
    (root / "meta" / "stats.json").write_bytes(data)
    info["nactuator"]["commit"]["stats_sha256"] = hashlib.sha256(data).hexdigest()
    (root / "meta" / "info.json").write_text(json.dumps(info))


@pytest.mark.parametrize(("fps", "nominal"),
                         [(62.3, 62), (58.8, 59), (62.5, 63), (200.0, 200), (30, 30), (0.3, 1)])
def test_nominal_fps_rounds_half_up_to_a_positive_int(fps, nominal):
    assert nominal_fps(fps) == nominal and isinstance(nominal_fps(fps), int)


def test_info_json_fps_is_an_int_and_the_recorded_rate_is_kept(tmp_path):
    root = tmp_path / "ds"
    write(root)
    info = info_of(root)
    assert info["fps"] == 62 and isinstance(info["fps"], int)  # what LeRobot reads
    assert info["nactuator"]["fps"] == 62.3
    ds = read_dataset(root)
    assert ds.fps == pytest.approx(62.3)  # our reader: the measured rate
    # default timestamps are frame / recorded rate, not / 62
    np.testing.assert_allclose(ds.episodes[0].frames["timestamp"], np.arange(40) / 62.3,
                               rtol=1e-6)
    assert "fps: 62.3 (LeRobot fps 62)" in describe(root)


def test_a_dataset_with_the_old_float_fps_still_reads_trains_and_appends(tmp_path):
    root = tmp_path / "old"
    write(root)
    make_old(root)
    assert info_of(root)["fps"] == 62.3 and "fps" not in info_of(root)["nactuator"]
    ds = read_dataset(root)
    assert ds.fps == pytest.approx(62.3) and [e.length for e in ds.episodes] == [40, 40, 40]
    assert "fps: 62.3\n" in describe(root) + "\n"
    dm = NADDataModule(root, "so101", window_length=9, horizon=10, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batch = next(iter(dm.train_dataloader()))
    assert batch["q"].shape == (4, 8 + 10 + 1, SO101.n)
    with pytest.raises(DataFormatError, match="fps mismatch.*62.3.*58.8"):
        DatasetWriter(root, SO101, 58.8)
    extra = frames(25, 7)
    with DatasetWriter(root, SO101, SO101.fps) as w:  # the append upgrades info.json
        assert w.add_episode(extra, "pick", "train") == 3
    info = info_of(root)
    assert (info["fps"], info["nactuator"]["fps"]) == (62, 62.3)
    ds = read_dataset(root)
    assert [e.length for e in ds.episodes] == [40, 40, 40, 25]
    np.testing.assert_array_equal(ds.episodes[3].frames["q"], extra["q"].astype(np.float32))
    pwm = json.loads((root / "meta" / "stats.json").read_text())["observation.pwm"]
    assert pwm["count"] == [0] * SO101.n and pwm["std"] == [1.0] * SO101.n  # nulls replaced


def test_a_bad_fps_in_info_json_is_named(tmp_path):
    root = tmp_path / "ds"
    write(root, splits=("train",))
    info = info_of(root)
    info["nactuator"]["fps"] = "fast"
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(DataFormatError, match=r"info\.json: fps must be a positive number, "
                                              r"got 'fast'"):
        read_dataset(root)


def test_channels_never_recorded_get_numbers_lerobot_can_normalise(tmp_path):
    root = tmp_path / "ds"
    write(root)  # no pwm, current, force, condition given: all NaN
    stats = json.loads((root / "meta" / "stats.json").read_text())
    for name, s in stats.items():  # every statistic is a number (LeRobot makes tensors)
        for key in ("min", "max", "mean", "std"):
            assert all(isinstance(v, float) and math.isfinite(v) for v in s[key]), (name, key)
    assert stats["observation.pwm"] == {"min": [0.0] * 6, "max": [1.0] * 6, "mean": [0.0] * 6,
                                        "std": [1.0] * 6, "count": [0] * 6}
    q = np.concatenate([frames(40, s)["q"] for s in range(3)]).astype(np.float32)
    np.testing.assert_allclose(stats["observation.state"]["mean"], q.mean(0), rtol=1e-5,
                               atol=1e-6)
    pwm_line = next(line for line in describe(root).splitlines()
                    if line.strip().startswith("gripper") and "duty" in line)
    assert "nan .. nan" in " ".join(pwm_line.split()) and "NaN 100.0%" in pwm_line
