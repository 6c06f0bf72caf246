"""The nactuator dataset format: round trip, appending, atomicity, LeRobot v3.0 layout,
bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets  # installed by `make setup` (LeRobot's loader): imported, never skipped
import numpy as np
import pyarrow.parquet as pq
import pytest

from nactuator.data import DataFormatError, DatasetWriter, read_dataset
from nactuator.data import writer as fmt
from nactuator.platforms import load_platform

OMX = load_platform("omx")
SO101 = load_platform("so101")


def make_frames(T: int, n: int, seed: int, **overrides) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    frames = {
        "q_cmd": rng.normal(size=(T, n)),
        "q": rng.normal(size=(T, n)),
        "qd": rng.normal(size=(T, n)),
        "effort": rng.normal(size=(T, n)),
        "voltage": 12 + rng.normal(size=(T, n)),
        "temperature": 35 + rng.normal(size=(T, n)),
    }
    frames.update(overrides)
    return frames


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_round_trip_keeps_every_channel_and_label(tmp_path):
    root = tmp_path / "ds"
    force = np.full((20, 3), np.nan)
    force[5:9] = [0.0, 0.0, -4.9]
    a = make_frames(20, OMX.n, 0, force=force, payload_mass=np.full(20, 0.5),
                    pwm=np.linspace(-1, 1, 100).reshape(20, 5),
                    condition=np.ones((20, 5)), timestamp=np.arange(20) * 0.017 + 0.003)
    b = make_frames(7, OMX.n, 1)
    with DatasetWriter(root, OMX, OMX.fps, metadata={"source": "unit test"}) as w:
        assert w.add_episode(a, "push", "train", {"trial": 1}) == 0
        assert w.add_episode(b, "free", "test") == 1
    ds = read_dataset(root)
    assert ds.platform == "omx" and ds.fps == pytest.approx(58.8)
    assert [(e.index, e.task, e.split, e.length) for e in ds.episodes] == [
        (0, "push", "train", 20), (1, "free", "test", 7)]
    assert ds.episodes[0].meta == {"trial": 1}
    assert ds.episodes[0].payload_mass == pytest.approx(0.5)
    ea, eb = ds.episodes[0].frames, ds.episodes[1].frames
    for key in ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "pwm", "condition"):
        np.testing.assert_array_equal(ea[key], a[key].astype(np.float32))
    np.testing.assert_array_equal(ea["force"], force.astype(np.float32))  # NaN kept as NaN
    assert ea["payload_mass"].shape == (20,) and (ea["payload_mass"] == 0.5).all()
    np.testing.assert_allclose(ea["timestamp"], a["timestamp"], rtol=1e-6)
    # Optional keys that were not given: NaN (unrecorded) / 1 (telemetry read) / frame/fps.
    assert np.isnan(eb["pwm"]).all() and np.isnan(eb["force"]).all()
    assert (eb["telemetry_valid"] == 1).all()
    np.testing.assert_allclose(eb["timestamp"], np.arange(7) / OMX.fps, rtol=1e-6)
    assert ds.info["nactuator"]["metadata"] == {"source": "unit test"}


def test_layout_is_lerobot_v3(tmp_path):
    root = tmp_path / "ds"
    with DatasetWriter(root, SO101, SO101.fps) as w:
        w.add_episode(make_frames(10, 6, 0), "pick", "train")
        w.add_episode(make_frames(12, 6, 1), "pick", "validation")
        w.add_episode(make_frames(5, 6, 2), "lift", "train")
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["robot_type"] == "so101_follower"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (3, 27, 2)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["splits"] == {"train": "0:1,2:3", "validation": "1:2"}
    state = info["features"]["observation.state"]
    assert state["dtype"] == "float32" and state["shape"] == [6]
    assert state["names"] == SO101.channel_names and state["unit"] == ["rad"] * 6
    assert info["features"]["observation.effort"]["unit"][0] == "fraction of max torque"
    assert set(fmt.FEATURES[k].name for k in fmt.FEATURES
               if k not in fmt.DECLARED_KEYS) <= set(info["features"])

    data = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    assert data.column("index").to_pylist() == list(range(27))
    assert data.column("episode_index").to_pylist() == [0] * 10 + [1] * 12 + [2] * 5
    assert data.column("frame_index").to_pylist()[10:13] == [0, 1, 2]
    assert data.column("task_index").to_pylist()[-1] == 1
    eps = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [(e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == [
        (0, 10), (10, 22), (22, 27)]
    assert [e["split"] for e in eps] == ["train", "validation", "train"]
    assert eps[2]["tasks"] == ["lift"]
    import pandas as pd  # LeRobot reads tasks.parquet with pandas, task string as index

    tasks = pd.read_parquet(root / "meta" / "tasks.parquet")
    assert tasks.loc["lift"].task_index == 1 and tasks.loc["pick"].task_index == 0


def test_huggingface_datasets_reads_the_data_files(tmp_path):
    root = tmp_path / "ds"
    frames = make_frames(8, 5, 0)
    with DatasetWriter(root, OMX, OMX.fps) as w:
        w.add_episode(frames, "t", "train")
    info = json.loads((root / "meta" / "info.json").read_text())
    feats = {}
    for k, v in info["features"].items():  # what LeRobot's get_hf_features_from_features does
        value = datasets.Value(v["dtype"])
        feats[k] = value if v["shape"] == [1] else datasets.Sequence(value, length=v["shape"][0])
    hf = datasets.Dataset.from_parquet(
        str(root / "data" / "chunk-000" / "file-000.parquet"),
        features=datasets.Features(feats), cache_dir=str(tmp_path / "hf"))
    np.testing.assert_allclose(hf[3]["observation.state"], frames["q"][3], rtol=1e-6)


def test_append_writes_new_files_and_aggregates_stats(tmp_path):
    root = tmp_path / "ds"
    first = [make_frames(30, 5, s) for s in range(2)]
    with DatasetWriter(root, OMX, OMX.fps) as w:
        for f in first:
            w.add_episode(f, "a", "train")
    before = snapshot(root / "data")
    second = make_frames(11, 5, 9)
    with DatasetWriter(root, OMX, OMX.fps) as w:
        assert w.add_episode(second, "b", "validation") == 2
    after = snapshot(root / "data")
    assert {k: after[k] for k in before} == before  # earlier data files untouched
    assert len(after) == len(before) + 1
    ds = read_dataset(root)
    assert [e.length for e in ds.episodes] == [30, 30, 11]
    np.testing.assert_array_equal(ds.episodes[2].frames["q"], second["q"].astype(np.float32))
    allq = np.concatenate([f["q"] for f in first] + [second["q"]]).astype(np.float32)
    s = ds.stats["observation.state"]
    np.testing.assert_allclose(s["mean"], allq.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s["std"], allq.std(0), rtol=1e-4)
    np.testing.assert_allclose(s["min"], allq.min(0))
    assert s["count"] == [71] * 5


def test_refuses_other_platform_and_fps_when_appending(tmp_path):
    root = tmp_path / "ds"
    with DatasetWriter(root, OMX, OMX.fps) as w:
        w.add_episode(make_frames(5, 5, 0), "a", "train")
    with pytest.raises(DataFormatError, match="platform is 'omx'.*'so101'"):
        DatasetWriter(root, SO101, SO101.fps)
    with pytest.raises(DataFormatError, match="fps mismatch.*58.8.*30"):
        DatasetWriter(root, OMX, 30.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.pop("voltage"), r"missing required frame keys \['voltage'\]"),
        (lambda f: f.update(qd=f["qd"][:, :4]), r"'qd' has shape \(10, 4\), expected \(T, 5\)"),
        (lambda f: f.update(q=f["q"][:9]), "'q' has 9 frames, other keys have 10"),
        (lambda f: f["effort"].__setitem__((3, 2), np.nan),
         "NaN in required channel 'effort' \\(channel 'joint3', frame 3\\)"),
        (lambda f: f.update(torque=f["q"]), r"unknown frame keys \['torque'\]"),
        (lambda f: f["q"].__setitem__((0, 0), np.inf), "'q' contains inf"),
        (lambda f: f.update(force=np.zeros((10, 2))), r"'force' has shape \(10, 2\)"),
        (lambda f: f.update(timestamp=np.arange(10)[::-1] * 1.0), "non-decreasing"),
        (lambda f: [f.__setitem__(k, f[k][:0]) for k in list(f)], "empty episode"),
    ],
)
def test_bad_episodes_are_rejected_with_a_clear_message(tmp_path, change, message):
    frames = make_frames(10, 5, 0)
    change(frames)
    with DatasetWriter(tmp_path / "ds", OMX, OMX.fps) as w, pytest.raises(
        DataFormatError, match=message
    ):
        w.add_episode(frames, "a", "train")


def test_bad_split_and_task(tmp_path):
    with DatasetWriter(tmp_path / "ds", OMX, OMX.fps) as w:
        with pytest.raises(DataFormatError, match="split must be one of"):
            w.add_episode(make_frames(4, 5, 0), "a", "val")
        with pytest.raises(DataFormatError, match="task must be a non-empty string"):
            w.add_episode(make_frames(4, 5, 0), "", "train")


def test_unrecorded_channels_may_be_nan_on_franka(tmp_path):
    franka = load_platform("franka")
    f = make_frames(6, 7, 0, voltage=np.full((6, 7), np.nan), temperature=np.full((6, 7), np.nan))
    with DatasetWriter(tmp_path / "ds", franka, franka.fps) as w:
        w.add_episode(f, "lift_hold", "train")
    assert np.isnan(read_dataset(tmp_path / "ds").episodes[0].frames["voltage"]).all()


def test_nan_allowed_only_where_telemetry_was_not_read(tmp_path):
    valid = np.ones((6, 5))
    valid[2, 1] = 0
    f = make_frames(6, 5, 0, telemetry_valid=valid)
    f["effort"][2, 1] = np.nan  # motor 2 missed its read on frame 2: fine
    with DatasetWriter(tmp_path / "ds", OMX, OMX.fps) as w:
        w.add_episode(f, "t", "train")
        f["effort"][3, 1] = np.nan  # ... but not on a frame it was read
        with pytest.raises(DataFormatError, match="channel 'joint2', frame 3"):
            w.add_episode(f, "t", "train")
    assert np.isnan(read_dataset(tmp_path / "ds").episodes[0].frames["effort"][2, 1])


def test_failed_append_leaves_dataset_untouched(tmp_path):
    root = tmp_path / "ds"
    with DatasetWriter(root, OMX, OMX.fps) as w:
        w.add_episode(make_frames(10, 5, 0), "a", "train")
    before = snapshot(root)
    bad = make_frames(10, 5, 1)
    bad["q"][4, 1] = np.nan
    with pytest.raises(DataFormatError), DatasetWriter(root, OMX, OMX.fps) as w:
        w.add_episode(make_frames(10, 5, 2), "b", "train")  # good, but buffered
        w.add_episode(bad, "b", "train")
    assert snapshot(root) == before
    assert len(read_dataset(root).episodes) == 1


def test_crash_while_flushing_rolls_back(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    with DatasetWriter(root, OMX, OMX.fps) as w:
        w.add_episode(make_frames(10, 5, 0), "a", "train")
    before = snapshot(root)
    real_write = fmt._atomic_write_bytes

    def failing_write(path, data):
        if path.name == "info.json":  # the very last step of a flush
            raise OSError("disk full")
        real_write(path, data)

    monkeypatch.setattr(fmt, "_atomic_write_bytes", failing_write)
    w = DatasetWriter(root, OMX, OMX.fps)
    w.add_episode(make_frames(10, 5, 1), "new task", "test")
    with pytest.raises(OSError, match="disk full"):
        w.close()
    monkeypatch.setattr(fmt, "_atomic_write_bytes", real_write)
    assert snapshot(root) == before
    assert [e.task for e in read_dataset(root).episodes] == ["a"]


def test_corrupt_parquet_is_reported_by_file(tmp_path):
    root = tmp_path / "ds"
    with DatasetWriter(root, OMX, OMX.fps) as w:
        w.add_episode(make_frames(50, 5, 0), "a", "train")
    data = root / "data" / "chunk-000" / "file-000.parquet"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    with pytest.raises(DataFormatError, match=r"file-000\.parquet: corrupt or truncated"):
        read_dataset(root)


def test_refuses_a_non_dataset_folder(tmp_path):
    (tmp_path / "junk.txt").write_text("x")
    with pytest.raises(DataFormatError, match="not empty but has no meta/info.json"):
        DatasetWriter(tmp_path, OMX, OMX.fps)
    with pytest.raises(DataFormatError, match="info.json: missing"):
        read_dataset(tmp_path)


def test_info_says_unknown_for_a_payload_nobody_gave(tmp_path):
    from nactuator.data.info import describe

    with DatasetWriter(tmp_path / "ds", OMX, OMX.fps) as w:
        w.add_episode(make_frames(20, 5, 0), "carry", "train")  # no payload_mass channel
        w.add_episode(make_frames(20, 5, 1), "carry", "train")
        w.add_episode(make_frames(20, 5, 2, payload_mass=np.full(20, 0.2)), "lift", "train")
        w.add_episode(make_frames(20, 5, 3), "lift", "train")
    text = describe(tmp_path / "ds")
    assert "carry: 2 episodes (train 2), payload unknown" in text
    assert "lift: 2 episodes (train 2), payload 0.2 kg, unknown for 1 episode(s)" in text
    assert "nan" not in text.split("features")[0]


def test_declared_columns_live_only_in_datasets_that_declare_them(tmp_path):
    """observation.environment_state is a LeRobot policy input: a dataset that does not
    declare it has no such column, no feature, no stats (a NaN column would poison ACT);
    one that declares it round-trips it; the mixes are refused naming the key."""
    plain, declared = tmp_path / "plain", tmp_path / "declared"
    with DatasetWriter(plain, OMX, OMX.fps) as w:
        w.add_episode(make_frames(12, 5, 0), "a", "train")
    env = np.random.default_rng(1).normal(size=(12, 4))
    with DatasetWriter(declared, OMX, OMX.fps, declared=("environment_state",)) as w:
        w.add_episode(make_frames(12, 5, 0, environment_state=env), "a", "train")
        w.add_episode(make_frames(12, 5, 2), "a", "train")  # not given: NaN, as any optional

    info = json.loads((plain / "meta" / "info.json").read_text())
    stats = json.loads((plain / "meta" / "stats.json").read_text())
    columns = pq.read_schema(next((plain / "data").rglob("*.parquet"))).names
    assert "observation.environment_state" not in info["features"]
    assert "observation.environment_state" not in stats
    assert "observation.environment_state" not in columns
    assert np.isnan(read_dataset(plain).episodes[0].frames["environment_state"]).all()

    ds = read_dataset(declared)
    np.testing.assert_allclose(ds.episodes[0].frames["environment_state"], env, atol=1e-6)
    assert np.isnan(ds.episodes[1].frames["environment_state"]).all()
    s = ds.stats["observation.environment_state"]
    np.testing.assert_allclose(s["mean"], env.mean(0), atol=1e-5)
    assert s["count"] == [12] * 4

    with pytest.raises(DataFormatError, match="'environment_state'.*not declared"):
        with DatasetWriter(plain, OMX, OMX.fps) as w:
            w.add_episode(make_frames(12, 5, 3, environment_state=env), "a", "train")
    with pytest.raises(DataFormatError, match="does not declare.*environment_state"):
        DatasetWriter(plain, OMX, OMX.fps, declared=("environment_state",))
    with pytest.raises(DataFormatError, match="cannot declare.*'pwm'"):
        DatasetWriter(tmp_path / "x", OMX, OMX.fps, declared=("pwm",))
    # an append by a writer that knows nothing of it keeps the column (NaN) and the stats
    with DatasetWriter(declared, OMX, OMX.fps) as w:
        w.add_episode(make_frames(7, 5, 4), "b", "train")
    again = read_dataset(declared)
    assert [e.length for e in again.episodes] == [12, 12, 7]
    assert again.stats["observation.environment_state"]["count"] == [12] * 4
