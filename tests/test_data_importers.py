"""Importers against the real NAD (SO-101, OMX) and BAM files, plus every bad-input case.

Raw files are read independently here with the csv/json modules and compared with what
the importer stored, so a unit slip in the importer cannot hide behind itself.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from nactuator.data import DataFormatError, read_dataset
from nactuator.data.importers import expand_header, import_bam, import_nad, read_nad_csv
from nactuator.data.info import describe
from nactuator.platforms import load_platform


def raw_csv(path: Path) -> dict[str, np.ndarray]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return {name: np.array([float(r[i]) for r in rows[1:]]) for i, name in enumerate(rows[0])}


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def so101(nad_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("so101") / "ds"
    summary = import_nad(nad_dir / "so101", out)
    return out, summary, read_dataset(out)


@pytest.fixture(scope="module")
def omx(nad_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("omx") / "ds"
    import_nad(nad_dir / "omx", out)
    return out, read_dataset(out)


@pytest.fixture(scope="module")
def bam(bam_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bam") / "ds"
    summary = import_bam(bam_dir / "xl330" / "raw", out)
    return out, summary, read_dataset(out)


# --------------------------------------------------------------------------- SO-101


def test_so101_frames_splits_and_labels(so101, nad_dir):
    out, summary, ds = so101
    files = sorted((nad_dir / "so101").rglob("*.csv"))
    assert ds.platform == "so101" and ds.fps == pytest.approx(62.3)
    assert len(ds.episodes) == len(files)
    assert [e.split for e in ds.episodes].count("validation") == 1
    assert {e.task for e in ds.episodes} == {"pick_and_place/500g"}
    assert all(e.payload_mass == pytest.approx(0.5) for e in ds.episodes)
    by_source = {e.meta["source"]: e for e in ds.episodes}
    for f in files:
        raw = raw_csv(f)
        ep = by_source["/".join(f.parts[-4:])]
        assert ep.length == len(raw["timestamp"])
        carry = raw["force_z"] == -4.9
        assert carry.sum() > 200  # the carry interval (nad-format.md §9)
        assert np.isin(raw["force_z"], (-4.9, -999)).all()  # nothing else in these files
        fz = ep.frames["force"][:, 2]
        np.testing.assert_array_equal(np.isnan(fz), raw["force_z"] == -999)
        np.testing.assert_allclose(fz[carry], -4.9, rtol=1e-6)
        assert np.isnan(ep.frames["force"][:, :2]).all()  # x, y are -999 throughout
        np.testing.assert_allclose(ep.frames["payload_mass"], np.where(carry, 0.5, 0.0))
    assert "imported 9 episodes" in summary and "train 8, validation 1" in summary


def test_so101_units_are_si(so101, nad_dir):
    _, _, ds = so101
    f = nad_dir / "so101" / "pick_and_place" / "500g" / "train" / "001.csv"
    raw = raw_csv(f)
    ep = next(e for e in ds.episodes if e.meta["source"].endswith("train/001.csv"))
    fr = ep.frames
    for j in range(6):
        np.testing.assert_allclose(fr["qd"][:, j], raw[f"vel{j + 1}"] * 2 * math.pi / 4096,
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(fr["effort"][:, j], raw[f"load{j + 1}"] / 1000, atol=1e-7)
        np.testing.assert_allclose(fr["voltage"][:, j], raw[f"volts{j + 1}"] / 10, rtol=1e-6)
        np.testing.assert_allclose(fr["current"][:, j], raw[f"current{j + 1}"] * 0.0065,
                                   rtol=1e-6)
        np.testing.assert_allclose(fr["q"][:, j], raw[f"pos{j + 1}"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(fr["q_cmd"][:, j], raw[f"goal_pos{j + 1}"], atol=1e-6)
    assert 10.0 < np.median(fr["voltage"]) < 13.0  # a 12 V bus, not 122 "dV"
    assert np.abs(fr["effort"]).max() <= 1.0  # fraction of max torque
    assert np.isnan(fr["pwm"]).all()  # not recorded on SO-101
    assert np.isnan(fr["condition"]).all()  # unlabelled
    # One-frame temperature spikes are kept raw on disk (the DataModule filters them).
    assert np.array_equal(fr["temperature"], raw_temps(raw))


def raw_temps(raw):
    return np.stack([raw[f"temp{j + 1}"] for j in range(6)], axis=1).astype(np.float32)


def test_describe_reports_dataset(so101):
    out, _, ds = so101
    text = describe(out)
    assert "platform: so101" in text and "fps: 62.3" in text
    assert f"episodes: 9   frames: {sum(e.length for e in ds.episodes)}" in text
    assert "pick_and_place/500g: 9 episodes (train 8, validation 1), payload 0.5 kg" in text
    assert "observation.ee_force (force):" in text
    x_line = next(ln for ln in text.splitlines() if ln.strip().startswith("x "))
    assert "NaN 100.0%" in x_line


# --------------------------------------------------------------------------- OMX


def test_omx_units_gripper_and_force(omx, nad_dir):
    _, ds = omx
    assert ds.platform == "omx" and len(ds.episodes) == 18
    assert {e.task for e in ds.episodes} == {"force_sensor/force_z_minus",
                                             "force_sensor/force_z_minus_ref"}
    f = nad_dir / "omx" / "force_sensor" / "force_z_minus" / "train" / "001.csv"
    raw = raw_csv(f)
    source = "force_sensor/force_z_minus/train/001.csv"
    ep = next(e for e in ds.episodes if e.meta["source"] == source)
    fr = ep.frames
    assert ep.length == len(raw["timestamp"])
    np.testing.assert_allclose(fr["q"][:, 4], raw["aperture"] / 1000, rtol=1e-6)
    np.testing.assert_allclose(fr["q_cmd"][:, 4], raw["goal_aperture"] / 1000, rtol=1e-6)
    np.testing.assert_allclose(fr["q"][:, 2], raw["pos3"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fr["effort"][:, 1], raw["current2"] / 1000, rtol=1e-6)
    np.testing.assert_allclose(fr["pwm"][:, 0], raw["pwm1"] / 885, rtol=1e-6)
    np.testing.assert_allclose(fr["qd"][:, 3], raw["vel4"], rtol=1e-6, atol=1e-7)
    # Gripper velocity = d(finger)/dt over the recorded timestamps.
    np.testing.assert_allclose(fr["qd"][:, 4], np.gradient(raw["aperture"] / 1000,
                                                           raw["timestamp"]), atol=1e-7)
    np.testing.assert_allclose(fr["force"], np.stack([raw["force_x"], raw["force_y"],
                                                      raw["force_z"]], 1), rtol=1e-6)
    assert 12.0 < fr["voltage"].mean() < 13.5
    ref = [e for e in ds.episodes if e.task.endswith("_ref")]
    assert all(np.isnan(e.frames["force"]).all() for e in ref)  # -999 throughout -> NaN


def test_motor_condition_labels_from_task_name(nad_dir, tmp_path):
    src = nad_dir / "omx" / "force_sensor" / "force_z_minus_ref" / "train" / "001.csv"
    root = tmp_path / "nad"
    for task in ("pick_place_object_200g_degrade", "pick_place_object_200g"):
        dst = root / "motor_condition" / task / "train" / "001.csv"
        dst.parent.mkdir(parents=True)
        shutil.copy(src, dst)
    # One recording under two labels is a content duplicate: allowed explicitly here.
    ds = read_dataset(_import(root, tmp_path / "ds", allow_duplicates=True))
    degrade = next(e for e in ds.episodes if e.task.endswith("_degrade"))
    nominal = next(e for e in ds.episodes if not e.task.endswith("_degrade"))
    np.testing.assert_array_equal(degrade.frames["condition"][0], [1, 1, 0, 1, 1])
    np.testing.assert_array_equal(nominal.frames["condition"][0], [1, 1, 1, 1, 1])
    assert degrade.payload_mass == pytest.approx(0.2)


def _import(src, out, **kw):
    import_nad(src, out, **kw)
    return out


FRANKA_HEADER = expand_header(load_platform("franka").data["nad"]["header"])


def write_franka_csv(path: Path, rows: int = 40) -> None:
    t = np.arange(rows) * 0.016
    cols = {name: np.zeros(rows) for name in FRANKA_HEADER}
    cols["timestamp"] = t
    for j in range(1, 8):
        cols[f"pos{j}"] = 0.1 * j + 0.01 * np.sin(t)
        cols[f"cmd_pos{j}"] = np.full(rows, 0.1 * j)
        cols[f"vel{j}"] = 0.01 * np.cos(t)
        cols[f"tau_d{j}"] = np.full(rows, 0.5 * j)
    cols["force_x"][:] = cols["force_y"][:] = -999
    cols["force_z"][:] = -3.924
    cols["lifting"][:] = 1
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(FRANKA_HEADER)]
    lines += [",".join(repr(float(cols[c][i])) for c in FRANKA_HEADER) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def test_franka_layout_detected(tmp_path):
    write_franka_csv(tmp_path / "franka" / "lift_hold" / "test" / "400_001.csv")
    ds = read_dataset(_import(tmp_path / "franka", tmp_path / "ds"))
    ep = ds.episodes[0]
    assert ds.platform == "franka" and ep.task == "lift_hold" and ep.split == "test"
    assert ep.payload_mass == pytest.approx(0.4)
    np.testing.assert_allclose(ep.frames["effort"][0], 0.5 * np.arange(1, 8))  # tau_d, N*m
    np.testing.assert_allclose(ep.frames["q_cmd"][0], 0.1 * np.arange(1, 8), rtol=1e-6)
    assert np.isnan(ep.frames["voltage"]).all()  # libfranka logs no bus voltage
    np.testing.assert_allclose(ep.frames["force"][:, 2], -3.924, rtol=1e-6)


# --------------------------------------------------------------------------- BAM


def test_bam_grid_splits_and_pwm_decoding(bam, bam_dir):
    out, summary, ds = bam
    assert ds.platform == "pendulum" and ds.fps == 200
    assert len(ds.episodes) == 16
    splits = {e.meta["kp"]: e.split for e in ds.episodes}
    assert splits == {100: "train", 200: "validation", 400: "train", 800: "test"}
    for e in ds.episodes:
        assert e.length == 1200  # 6 s on the 5 ms grid
        np.testing.assert_allclose(np.diff(e.frames["timestamp"]), 0.005, atol=1e-5)
        assert np.abs(e.frames["pwm"]).max() <= 1.0
    # Decoded PWM follows kp * (goal - position): strongly correlated (real-data.md §2.3).
    ep = next(e for e in ds.episodes if e.task == "sin_sin" and e.meta["kp"] == 400)
    err = ep.frames["q_cmd"][:, 0] - ep.frames["q"][:, 0]
    assert np.corrcoef(err, ep.frames["effort"][:, 0])[0, 1] > 0.9
    raw = json.loads((bam_dir / "xl330" / "raw" / ep.meta["source"]).read_text())["entries"]
    assert any(x["load"] > 32767 for x in raw)  # the wrapped values were really there
    assert ep.frames["effort"].min() < -0.05  # ... and decode to negative duty
    drop = next(e for e in ds.episodes if e.task == "lift_and_drop" and e.meta["kp"] == 100)
    off = drop.frames["torque_enable"][:, 0] == 0
    assert 0.6 < off.mean() < 0.7  # torque off for the last 4 s of 6
    assert np.abs(drop.frames["pwm"][off]).max() == 0.0


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def so101_file(nad_dir, tmp_path) -> Path:
    """A writable copy (in tmp_path) of one real SO-101 file inside its NAD folder layout."""
    src = nad_dir / "so101" / "pick_and_place" / "500g" / "validation" / "001.csv"
    dst = tmp_path / "nad" / "so101" / "pick_and_place" / "500g" / "validation" / "001.csv"
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    return dst


def edit_column(path: Path, column: str, fn) -> None:
    lines = path.read_bytes().decode().split("\r\n")
    header = lines[0].split(",")
    j = header.index(column)
    out = [lines[0]]
    for ln in lines[1:]:
        if ln:
            cells = ln.split(",")
            cells[j] = fn(cells[j])
            ln = ",".join(cells)
        out.append(ln)
    path.write_bytes("\r\n".join(out).encode())


def test_missing_column(so101_file):
    text = so101_file.read_bytes().decode()
    lines = [",".join(c for i, c in enumerate(ln.split(",")) if i != 27) for ln in
             text.split("\r\n")]
    so101_file.write_bytes("\r\n".join(lines).encode())
    with pytest.raises(DataFormatError, match=r"001\.csv: header does not match the NAD so101 "
                       r"layout.*missing columns \['load3'\]"):
        read_nad_csv(so101_file)


def test_misnamed_column(so101_file):
    raw = so101_file.read_bytes().replace(b"volts3", b"voltage3", 1)
    so101_file.write_bytes(raw)
    with pytest.raises(DataFormatError, match=r"missing columns \['volts3'\], unexpected "
                       r"columns \['voltage3'\]"):
        read_nad_csv(so101_file)


def test_volts_in_wrong_unit(so101_file):
    edit_column(so101_file, "volts2", lambda v: str(float(v) / 10))  # V instead of dV
    with pytest.raises(DataFormatError, match=r"'volts2' gives 1\.\d+\.\.1\.\d+ V .*expected "
                       r"4\.0\.\.16\.0 V"):
        read_nad_csv(so101_file)


def test_positions_in_degrees(so101_file):
    edit_column(so101_file, "pos4", lambda v: str(math.degrees(float(v))))
    with pytest.raises(DataFormatError, match="q of channel 'wrist_flex' reaches .*'pos4'"):
        read_nad_csv(so101_file)


def test_timestamps_in_ms_fail_the_fps_check(so101_file):
    edit_column(so101_file, "timestamp", lambda v: str(float(v) * 1000))
    with pytest.raises(DataFormatError, match=r"timestamps imply 0\.06\d+ Hz but platform "
                       r"'so101' records at 62\.3 Hz"):
        read_nad_csv(so101_file)


def test_nan_in_required_channel(so101_file):
    lines = so101_file.read_bytes().split(b"\r\n")
    cells = lines[5].split(b",")
    cells[25] = b""  # load1 on data row 5 (file line 6)
    lines[5] = b",".join(cells)
    so101_file.write_bytes(b"\r\n".join(lines))
    with pytest.raises(DataFormatError, match=r"column 'load1' is empty/NaN at data row 5 "
                       r"\(line 6\) \(required channel 'effort'\)"):
        read_nad_csv(so101_file)


def test_empty_episode(so101_file):
    so101_file.write_bytes(so101_file.read_bytes().split(b"\r\n")[0] + b"\r\n")
    with pytest.raises(DataFormatError, match="empty episode: header but no data rows"):
        read_nad_csv(so101_file)


def test_truncated_last_row(so101_file):
    raw = so101_file.read_bytes()
    so101_file.write_bytes(raw[: len(raw) - 40])  # cut the last row mid-way
    with pytest.raises(DataFormatError, match=r"truncated file: the last row \(line \d+\)"):
        read_nad_csv(so101_file)


def test_labels_come_from_the_folders_not_the_spelling_of_the_path(nad_dir, tmp_path):
    src = nad_dir / "so101" / "pick_and_place" / "500g" / "validation" / ".." / "validation"
    import_nad(src, tmp_path / "ds")
    [ep] = read_dataset(tmp_path / "ds").episodes
    assert ep.task == "pick_and_place/500g" and ep.split == "validation"
    assert ep.meta["source"] == "pick_and_place/500g/validation/001.csv"


def test_file_outside_a_split_folder(so101_file):
    dst = so101_file.parent.parent / "001.csv"
    so101_file.rename(dst)
    with pytest.raises(DataFormatError, match="expected the file inside a split folder"):
        read_nad_csv(dst)


def test_failed_import_leaves_existing_dataset_untouched(so101_file, nad_dir, tmp_path):
    out = tmp_path / "ds"
    import_nad(nad_dir / "so101" / "pick_and_place" / "500g" / "train", out)
    before = snapshot(out)
    edit_column(so101_file, "volts1", lambda v: str(float(v) / 10))
    good = so101_file.parent.parent / "test" / "001.csv"  # a good file next to the bad one
    good.parent.mkdir()
    shutil.copy(nad_dir / "so101" / "pick_and_place" / "500g" / "train" / "001.csv", good)
    with pytest.raises(DataFormatError, match="volts1"):
        import_nad(tmp_path / "nad", out)
    assert snapshot(out) == before
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(DataFormatError):
        import_nad(tmp_path / "nad", tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()  # nothing half-written


def test_platform_mismatch(nad_dir, so101_file, tmp_path):
    out = tmp_path / "ds"
    import_nad(so101_file, out)
    with pytest.raises(DataFormatError, match="dataset platform is 'so101', cannot append 'omx'"):
        import_nad(nad_dir / "omx" / "force_sensor" / "force_z_minus" / "validation", out)
    with pytest.raises(DataFormatError, match="header does not match the NAD omx layout"):
        import_nad(so101_file, tmp_path / "other", platform="omx")


def test_bam_bad_inputs(bam_dir, tmp_path):
    src = bam_dir / "xl330" / "raw" / "2026-01-15_10h28m10.json"
    log = json.loads(src.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(src.read_text()[:5000])
    with pytest.raises(DataFormatError, match=r"bad\.json: not valid JSON \(truncated file\?\)"):
        import_bam(bad, tmp_path / "o1")
    log["kp"] = 300
    bad.write_text(json.dumps(log))
    with pytest.raises(DataFormatError, match=r"kp 300 has no split .*known: \[100, 200, 400"):
        import_bam(bad, tmp_path / "o2")
    log["kp"] = 100
    log["entries"][7]["load"] = 40000  # decodes to -25536: not a PWM register value
    bad.write_text(json.dumps(log))
    with pytest.raises(DataFormatError, match="entry 7 'load' = 40000 decodes to PWM -25536"):
        import_bam(bad, tmp_path / "o3")
    log["entries"] = []
    bad.write_text(json.dumps(log))
    with pytest.raises(DataFormatError, match="empty episode"):
        import_bam(bad, tmp_path / "o4")


def test_row_with_missing_cells(so101_file):
    lines = so101_file.read_bytes().split(b"\r\n")
    lines[100] = b",".join(lines[100].split(b",")[:-3])  # a damaged row mid-file
    so101_file.write_bytes(b"\r\n".join(lines))
    with pytest.raises(DataFormatError, match=r"001\.csv: malformed CSV .*Expected 46 columns"):
        read_nad_csv(so101_file)


def test_cli_commands(nad_dir, tmp_path, capsys):
    from nactuator.cli import main

    out = tmp_path / "ds"
    assert main(["data", "import-nad", str(nad_dir / "so101"), "--out", str(out)]) == 0
    assert "imported 9 episodes" in capsys.readouterr().out
    assert main(["data", "info", str(out)]) == 0
    assert "platform: so101" in capsys.readouterr().out


def test_platform_option_imports_one_platform_of_a_mixed_tree(so101_file, tmp_path):
    write_franka_csv(tmp_path / "nad" / "franka" / "lift_hold" / "train" / "300_002.csv")
    with pytest.raises(DataFormatError, match="mixed platforms in one import"):
        import_nad(tmp_path / "nad", tmp_path / "mixed")
    summary = import_nad(tmp_path / "nad", tmp_path / "franka", platform="franka")
    assert "imported 1 episodes" in summary and "skipped (other platforms): 1 so101" in summary
    assert read_dataset(tmp_path / "franka").episodes[0].payload_mass == pytest.approx(0.3)
    with pytest.raises(DataFormatError, match="no NAD CSV of platform 'omx'"):
        import_nad(tmp_path / "nad", tmp_path / "omx", platform="omx")


def test_own_csvs_take_task_and_split_from_the_command_line(nad_dir, tmp_path, capsys):
    """CSVs outside the NAD layout: a flat folder (or one file) labelled by --task/--split;
    the payload is read from the task name as it would be from the NAD path."""
    from nactuator.cli import main

    originals = [nad_dir / "so101" / "pick_and_place" / "500g" / "train" / f"00{k}.csv"
                 for k in (1, 2)]
    flat = tmp_path / "my_runs"
    flat.mkdir()
    for k, f in enumerate(originals):
        shutil.copy(f, flat / f"run_{k}.csv")
    out = tmp_path / "ds"
    assert main(["data", "import-nad", str(flat), "--out", str(out),
                 "--task", "carry_300g", "--split", "validation"]) == 0
    assert "imported 2 episodes" in capsys.readouterr().out
    eps = read_dataset(out).episodes
    assert [(e.task, e.split) for e in eps] == [("carry_300g", "validation")] * 2
    assert [e.meta["source"] for e in eps] == ["run_0.csv", "run_1.csv"]
    assert [e.length for e in eps] == [raw_csv(f)["timestamp"].size for f in originals]
    assert all(e.payload_mass == pytest.approx(0.3) for e in eps)
    one = tmp_path / "one"
    import_nad(flat / "run_0.csv", one, task="push", split="test")
    [ep] = read_dataset(one).episodes
    assert (ep.task, ep.split, ep.payload_mass) == ("push", "test", 0.0)


def test_task_and_split_errors_are_one_line(nad_dir, tmp_path, capsys):
    from nactuator.cli import main

    src = nad_dir / "so101" / "pick_and_place" / "500g" / "train" / "001.csv"
    assert main(["data", "import-nad", str(src), "--out", str(tmp_path / "a"),
                 "--task", "push"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--task needs --split too" in err
    with pytest.raises(DataFormatError, match="--split needs --task"):
        import_nad(src, tmp_path / "b", split="train")
    with pytest.raises(DataFormatError, match="--split must be one of"):
        import_nad(src, tmp_path / "b", task="push", split="val")
    with pytest.raises(DataFormatError, match="task name is empty"):
        import_nad(src, tmp_path / "b", task=" ", split="train")
    nested = tmp_path / "tree"
    (nested / "deeper").mkdir(parents=True)
    shutil.copy(src, nested / "deeper" / "001.csv")
    with pytest.raises(DataFormatError, match=r"tree: .*1 CSV\(s\) sit in sub-folders"):
        import_nad(nested, tmp_path / "b", task="push", split="train")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# --------------------------------------------------------------------------- duplicates


def test_importing_the_same_files_again_is_skipped_and_said(nad_dir, tmp_path, capsys):
    from nactuator.cli import main

    src = nad_dir / "so101"
    out = tmp_path / "ds"
    assert main(["data", "import-nad", str(src), "--out", str(out)]) == 0
    assert "imported 9 episodes" in capsys.readouterr().out
    ds = read_dataset(out)
    for e in ds.episodes:  # each episode knows the content of the file it came from
        source = src / e.meta["source"]
        assert e.meta["source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert main(["data", "import-nad", str(src), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "nothing imported: every file is already in" in said
    assert "skipped 9 file(s) whose content is already in the dataset (same sha256)" in said
    assert "--allow-duplicates" in said
    assert len(read_dataset(out).episodes) == 9  # not 18
    validation = [e for e in read_dataset(out).episodes if e.split == "validation"]
    assert len(validation) == 1

    # A folder with one new file and the old ones: only the new one is imported.
    extra = tmp_path / "nad" / "so101" / "pick_and_place" / "500g" / "test" / "001.csv"
    extra.parent.mkdir(parents=True)
    raw = (src / "pick_and_place" / "500g" / "train" / "001.csv").read_bytes()
    extra.write_bytes(raw.replace(b"\r\n", b"\n"))  # same numbers, other bytes: new content
    for f in sorted(src.rglob("*.csv"))[:2]:
        dst = tmp_path / "nad" / "so101" / f.relative_to(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst)
    summary = import_nad(tmp_path / "nad", out)
    assert "imported 1 episodes" in summary and "skipped 2 file(s)" in summary
    assert len(read_dataset(out).episodes) == 10

    assert main(["data", "import-nad", str(src), "--out", str(out), "--allow-duplicates"]) == 0
    assert "imported 9 episodes" in capsys.readouterr().out
    assert len(read_dataset(out).episodes) == 19


def test_bam_reimport_is_skipped_unless_allowed(bam_dir, tmp_path, capsys):
    from nactuator.cli import main

    log = bam_dir / "xl330" / "raw" / "2026-01-15_10h28m10.json"
    out = tmp_path / "bam"
    assert main(["data", "import-bam", str(log), "--out", str(out)]) == 0
    assert main(["data", "import-bam", str(log), "--out", str(out)]) == 0
    assert "skipped 1 file(s)" in capsys.readouterr().out
    assert len(read_dataset(out).episodes) == 1
    assert main(["data", "import-bam", str(log), "--out", str(out), "--allow-duplicates"]) == 0
    eps = read_dataset(out).episodes
    assert len(eps) == 2
    assert eps[0].meta["source_sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- CSV forms


def test_complete_csv_without_final_newline_imports(so101_file, tmp_path):
    whole = read_nad_csv(so101_file)
    so101_file.write_bytes(so101_file.read_bytes().rstrip(b"\r\n"))
    cut = read_nad_csv(so101_file)
    assert cut.meta["rows"] == whole.meta["rows"]
    np.testing.assert_array_equal(cut.frames["q"], whole.frames["q"])
    import_nad(so101_file, tmp_path / "ds")
    assert read_dataset(tmp_path / "ds").episodes[0].length == whole.meta["rows"]


def test_csv_with_a_utf8_bom_imports(so101_file, tmp_path):
    whole = read_nad_csv(so101_file)
    so101_file.write_bytes(b"\xef\xbb\xbf" + so101_file.read_bytes())
    bom = read_nad_csv(so101_file)
    np.testing.assert_array_equal(bom.frames["effort"], whole.frames["effort"])
    np.testing.assert_array_equal(bom.frames["timestamp"], whole.frames["timestamp"])
    import_nad(so101_file.parents[3], tmp_path / "ds", platform="so101")  # folder + --platform
    assert len(read_dataset(tmp_path / "ds").episodes) == 1


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (b"PAR1\x15\x04\x15\x00\x00binary parquet bytes", r"binary data \(NUL byte at offset 7\)"),
        (b"\x89PNG\r\n\x1a\n\xff\xfe garbage", r"the first line is not UTF-8 text \(byte 0x89"),
        ("semicolons", r"the header is separated by semicolons \('timestamp;pos1;pos2"),
        (b"name,age\nbob,3\n", r"its first line 'name,age' is not a NAD header"),
    ],
    ids=["binary", "not-utf8", "semicolons", "other-csv"],
)
def test_a_file_that_is_not_a_nad_csv_is_called_so(so101_file, content, found):
    if content == "semicolons":  # a spreadsheet export with ';' as the separator
        content = so101_file.read_bytes().replace(b",", b";")
    so101_file.write_bytes(content)
    with pytest.raises(DataFormatError) as e:
        read_nad_csv(so101_file)
    message = str(e.value)
    assert message.startswith(f"{so101_file}: not a NAD CSV: ")
    assert re.search(found, message)
    assert "expected comma-separated UTF-8 text whose first line is a NAD header" in message
    assert "franka 72" in message and "layout" not in message  # not compared to a layout
