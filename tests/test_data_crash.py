"""What survives a crash: appends are atomic as a whole, recordings lose seconds, not episodes.

A crash is simulated two ways. In-process: every file operation of the writer goes through
``writer._atomic_write_bytes`` or ``writer._publish``; a hook counts them, copies the
dataset folder as it is on disk after the k-th one (what a kill at that moment leaves) and
raises. This is done for every k of an append, of a new dataset and of an import. Out of
process: a child process SIGKILLs itself at a chosen write, or mid-recording, so nothing
of Python's unwinding can help.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from nactuator.data import DataFormatError, DatasetWriter, read_dataset
from nactuator.data import writer as fmt
from nactuator.data.committed import read_parquet
from nactuator.data.importers import import_nad
from nactuator.data.info import describe
from nactuator.platforms import load_platform

OMX = load_platform("omx")
ROOT = Path(__file__).resolve().parents[1]


def make_frames(T: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "q_cmd": rng.normal(size=(T, 5)),
        "q": rng.normal(size=(T, 5)),
        "qd": rng.normal(size=(T, 5)),
        "effort": rng.normal(size=(T, 5)),
        "voltage": 12 + rng.normal(size=(T, 5)),
        "temperature": 35 + rng.normal(size=(T, 5)),
    }


BASE = [(make_frames(20, 0), "a"), (make_frames(13, 1), "b")]
NEW = [(make_frames(9, 2), "c"), (make_frames(11, 3), "a")]  # a new task and an old one


def write(root: Path, episodes) -> None:
    with DatasetWriter(root, OMX, OMX.fps) as w:
        for frames, task in episodes:
            w.add_episode(frames, task, "train", {"task": task})


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class Crash(Exception):
    pass


class CrashAfter:
    """Counts the writer's file operations; after the k-th, copies the folder and raises."""

    def __init__(self, monkeypatch, root: Path, k: int, copy_to: Path) -> None:
        self.root, self.k, self.copy_to, self.done = root, k, copy_to, 0
        for name in ("_atomic_write_bytes", "_publish"):
            real = getattr(fmt, name, None)
            if real is not None:
                monkeypatch.setattr(fmt, name, self._wrap(real))

    def _wrap(self, real):
        def op(*args):
            if self.done == self.k:  # once; the surviving process then undoes normally
                self.done += 1
                if self.root.exists():
                    shutil.copytree(self.root, self.copy_to, symlinks=True)
                else:
                    self.copy_to.mkdir()
                raise Crash(f"crash after write {self.k}")
            real(*args)
            self.done += 1
        return op


def assert_holds(root: Path, episodes) -> None:
    """``root`` opens with exactly ``episodes`` (frames, task), indices 0..n-1, statistics
    of exactly those frames, and no parquet file LeRobot would read beyond the committed."""
    ds = read_dataset(root)
    assert [e.index for e in ds.episodes] == list(range(len(episodes)))
    assert [e.task for e in ds.episodes] == [t for _, t in episodes]
    for e, (frames, _) in zip(ds.episodes, episodes, strict=True):
        np.testing.assert_array_equal(e.frames["q"], frames["q"].astype(np.float32))
    if episodes:
        allq = np.concatenate([f["q"] for f, _ in episodes]).astype(np.float32)
        np.testing.assert_allclose(ds.stats["observation.state"]["mean"], allq.mean(0),
                                   rtol=1e-5, atol=1e-6)
        assert ds.stats["observation.state"]["count"] == [len(allq)] * 5
    assert f"episodes: {len(episodes)} " in describe(root)


def lerobot_visible(root: Path) -> dict[str, str]:
    """The parquet files LeRobot's loader reads (it globs data/*/*.parquet and
    meta/episodes/*/*.parquet), with their content hashes."""
    files = [*(root / "data").glob("*/*.parquet"), *(root / "meta" / "episodes").glob("*/*")]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def assert_no_orphans(root: Path) -> None:
    """Every parquet file LeRobot globs (data/*/*, meta/episodes/*/*) is committed."""
    info = json.loads((root / "meta" / "info.json").read_text())
    eps = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
    data = sorted((root / "data").glob("*/*.parquet"))
    rows = [r for p in eps for r in read_parquet(p).to_pylist()]
    assert sorted(r["episode_index"] for r in rows) == list(range(info["total_episodes"]))
    referenced = {(r["data/chunk_index"], r["data/file_index"]) for r in rows}
    assert len(data) == len(referenced)


@pytest.mark.parametrize("fresh", [False, True], ids=["append", "new-dataset"])
def test_a_crash_at_every_write_keeps_exactly_the_committed_episodes(tmp_path, monkeypatch,
                                                                      fresh):
    base = [] if fresh else BASE
    template = tmp_path / "template"
    if not fresh:
        write(template, BASE)
    k = 0
    while True:
        root, crashed = tmp_path / f"live{k}", tmp_path / f"crashed{k}"
        if not fresh:
            shutil.copytree(template, root)
        before = snapshot(root) if not fresh else None
        with monkeypatch.context() as m:
            CrashAfter(m, root, k, crashed)
            try:
                write(root, NEW)
            except Crash:
                pass
            else:
                break  # k is past the last write: the append completed
        # The process survived the failure: the dataset is exactly as before, at once.
        if fresh:
            if (root / "meta" / "info.json").exists():
                assert_holds(root, [])
        else:
            assert snapshot(root) == before
            assert_holds(root, BASE)
        # The process died at that moment: what it left opens with the committed episodes
        # (the new ones only if info.json had been replaced) ...
        info = crashed / "meta" / "info.json"
        committed = info.exists() and json.loads(info.read_text())["total_episodes"] > len(base)
        if not fresh and k <= 2:  # new files only staged: LeRobot (globbing) sees no change
            assert lerobot_visible(crashed) == lerobot_visible(template)
        if info.exists():
            assert_holds(crashed, base + NEW if committed else base)
        # ... and a retry (any later run) succeeds, with no duplicate episode index.
        if not committed:
            write(crashed, NEW)
        assert_holds(crashed, base + NEW)
        assert_no_orphans(crashed)
        assert not list((crashed / ".nactuator" / "staging").glob("*"))
        k += 1
    assert k >= 7  # stage 2 files, move 2, tasks, stats, info (+ 3 to create a dataset)
    assert_holds(root, base + NEW)


def test_a_crash_during_recovery_is_repaired_by_the_next_open(tmp_path, monkeypatch):
    """The issue's state (every file of an append written but info.json) needs the most
    repair: tasks.parquet cut back, stats.json recomputed, info.json rewritten, files
    deleted. A crash at any point of that repair is repaired by the next open."""
    template, crashed = tmp_path / "template", tmp_path / "crashed"
    write(template, BASE)
    with monkeypatch.context() as m:
        CrashAfter(m, template, 6, crashed)  # 2 staged, 2 moved, tasks, stats; not info
        with pytest.raises(Crash):
            write(template, NEW)
    k = 0
    while True:
        root, again = tmp_path / f"repair{k}", tmp_path / f"again{k}"
        shutil.copytree(crashed, root)
        with monkeypatch.context() as m:
            CrashAfter(m, root, k, again)
            try:
                DatasetWriter(root, OMX, OMX.fps).close()  # opening repairs
            except Crash:
                pass
            else:
                break
        assert_holds(again, BASE)
        write(again, NEW)
        assert_holds(again, BASE + NEW)
        assert_no_orphans(again)
        k += 1
    assert k >= 3  # tasks, stats, info rewritten
    assert_holds(root, BASE)


def test_a_crash_at_every_write_of_an_import_then_the_retry_imports_once(nad_dir, tmp_path,
                                                                       monkeypatch):
    src = nad_dir / "so101" / "pick_and_place" / "500g" / "validation"
    k = 0
    while True:
        out, crashed = tmp_path / f"live{k}", tmp_path / f"crashed{k}"
        with monkeypatch.context() as m:
            CrashAfter(m, out, k, crashed)
            try:
                import_nad(src, out)
            except Crash:
                pass
            else:
                break
        if not crashed.exists():  # killed before the folder existed
            crashed.mkdir()
        summary = import_nad(src, crashed)  # the user runs the same command again
        ds = read_dataset(crashed)
        assert [e.index for e in ds.episodes] == [0]
        assert ds.episodes[0].meta["source"] == "pick_and_place/500g/validation/001.csv"
        assert "imported 1 episodes" in summary or "nothing imported" in summary
        k += 1
    assert k >= 10


def test_a_dataset_damaged_by_an_earlier_version_opens_and_appends(tmp_path):
    """The state of the issue: meta/episodes holds more episodes than info.json commits
    (an old-format info.json without a commit block), stats.json of the lost append."""
    root = tmp_path / "ds"
    write(root, BASE)
    old_info = json.loads((root / "meta" / "info.json").read_text())
    old_info["nactuator"].pop("commit", None)
    write(root, NEW)
    (root / "meta" / "info.json").write_text(json.dumps(old_info))
    assert len(list((root / "meta" / "episodes").glob("*/*.parquet"))) == 2

    assert_holds(root, BASE)  # reads only what info.json counts; statistics recomputed
    write(root, NEW)  # the retry of the lost append
    assert_holds(root, BASE + NEW)
    assert_no_orphans(root)


def test_episodes_appended_by_an_older_version_are_not_rolled_back(tmp_path):
    """An older nactuator rewrites info.json keeping the commit block it read: its
    episodes are counted by info.json, and must not be taken for leftovers and deleted."""
    root = tmp_path / "ds"
    write(root, BASE)
    stale = json.loads((root / "meta" / "info.json").read_text())["nactuator"]["commit"]
    write(root, NEW)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["nactuator"]["commit"] = stale
    (root / "meta" / "info.json").write_text(json.dumps(info))
    assert_holds(root, BASE + NEW)
    write(root, NEW[:1])
    assert_holds(root, BASE + NEW + NEW[:1])
    assert_no_orphans(root)


CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from nactuator.data import DatasetWriter
    from nactuator.data import writer as fmt
    from nactuator.platforms import load_platform

    root, target = sys.argv[1], sys.argv[2]
    for name in ("_atomic_write_bytes", "_publish"):
        real = getattr(fmt, name, None)
        if real is None:
            continue
        def op(*args, real=real):
            dst = args[-1] if real.__name__ == "_publish" else args[0]
            if str(dst).endswith(target):  # about to write or move this file into place
                os.kill(os.getpid(), signal.SIGKILL)
            real(*args)
        setattr(fmt, name, op)
    p = load_platform("omx")
    rng = np.random.default_rng(2)
    with DatasetWriter(root, p, p.fps) as w:
        for T, task in ((9, "c"), (11, "a")):
            f = {k: rng.normal(size=(T, 5)) for k in ("q_cmd", "q", "qd", "effort")}
            f["voltage"] = 12 + rng.normal(size=(T, 5))
            f["temperature"] = 35 + rng.normal(size=(T, 5))
            w.add_episode(f, task, "train", {"task": task})
""")


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


# Killed just before this file is written or moved into place. info.json: every other file of
# the append is on disk (the case).
@pytest.mark.parametrize("target", ["data/chunk-000/file-001.parquet",
                                    "meta/episodes/chunk-000/file-001.parquet",
                                    "meta/stats.json", "meta/info.json"])
def test_sigkill_during_an_append(tmp_path, target):
    root = tmp_path / "ds"
    write(root, BASE)
    child = subprocess.run([sys.executable, "-c", CHILD, str(root), target],
                           env=child_env(), capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert_holds(root, BASE)
    if target == "meta/info.json":
        assert "file(s) of an interrupted write are not part of the dataset" in describe(root)
    write(root, NEW)  # the retry: the new episodes once, after the old ones
    ds = read_dataset(root)
    assert [e.index for e in ds.episodes] == [0, 1, 2, 3]
    assert [e.task for e in ds.episodes] == ["a", "b", "c", "a"]
    assert_no_orphans(root)


def test_a_second_writer_is_refused_while_one_is_open(tmp_path):
    root = tmp_path / "ds"
    write(root, BASE)
    first = DatasetWriter(root, OMX, OMX.fps)
    first.add_episode(NEW[0][0], "c", "train")
    # Refused when opened, before it does any work (a recorder: before the arm moves).
    with pytest.raises(DataFormatError, match=rf"another writer \(process {os.getpid()}\) has"):
        DatasetWriter(root, OMX, OMX.fps)
    assert len(read_dataset(root).episodes) == 2  # readers are never blocked
    first.close()
    with DatasetWriter(root, OMX, OMX.fps) as third:
        assert third.add_episode(NEW[1][0], "a", "train") == 3


# --------------------------------------------------------------------------- recordings


def recording_frames(T: int, t0: int = 0) -> dict[str, np.ndarray]:
    f = make_frames(T, 100 + t0)
    f["timestamp"] = (t0 + np.arange(T)) / OMX.fps
    return f


def test_a_recording_in_progress_survives_a_crash_but_for_its_last_chunk(tmp_path):
    root = tmp_path / "ds"
    write(root, BASE)
    w = DatasetWriter(root, OMX, OMX.fps)
    journal = w.begin_episode("teleop", "train", {"leader_port": "/dev/x"}, chunk_seconds=1.0)
    chunk = journal.chunk_frames
    assert chunk == round(OMX.fps)
    full = {k: np.concatenate([recording_frames(chunk, 0)[k], recording_frames(chunk, chunk)[k],
                               recording_frames(chunk // 2, 2 * chunk)[k]])
            for k in recording_frames(1)}
    for start, stop in ((0, chunk), (chunk, 2 * chunk), (2 * chunk, 2 * chunk + chunk // 2)):
        journal.extend({k: v[start:stop] for k, v in full.items()})
    assert journal.sync() == 2 * chunk + chunk // 2
    journal.extend({k: v[:3] for k, v in full.items()})  # not a chunk yet: in memory only
    crashed = tmp_path / "crashed"
    shutil.copytree(root, crashed)  # the power goes out here
    w.abort()
    assert "1 interrupted recording(s)" in describe(crashed)
    assert len(read_dataset(crashed).episodes) == 2  # readers never write, nor recover

    with DatasetWriter(crashed, OMX, OMX.fps) as recovering:
        recovering.flush()
        assert recovering.recovered == [(2, 2 * chunk + chunk // 2)]
    ds = read_dataset(crashed)
    assert [e.length for e in ds.episodes] == [20, 13, 2 * chunk + chunk // 2]
    ep = ds.episodes[2]
    assert ep.task == "teleop" and ep.split == "train"
    assert ep.meta["interrupted"] and ep.meta["recovered"] and ep.meta["leader_port"] == "/dev/x"
    np.testing.assert_array_equal(ep.frames["q"], full["q"].astype(np.float32))
    np.testing.assert_allclose(ep.frames["timestamp"], full["timestamp"], rtol=1e-6)
    assert not list((crashed / ".nactuator" / "journal").iterdir())
    with DatasetWriter(crashed, OMX, OMX.fps) as again:  # recovered once, not twice
        again.flush()
        assert again.recovered == []
    assert len(read_dataset(crashed).episodes) == 3


def test_a_committed_recording_deletes_its_journal_and_is_not_recovered_again(tmp_path):
    root = tmp_path / "ds"
    w = DatasetWriter(root, OMX, OMX.fps)
    journal = w.begin_episode("teleop", "train", chunk_seconds=0.1)
    frames = recording_frames(40)
    journal.extend(frames)
    journal.sync()
    crashed = tmp_path / "crashed"
    real_discard = type(journal).discard

    def die_after_commit(self):  # the commit succeeded, the journal was not deleted
        shutil.copytree(root, crashed)
        real_discard(self)

    type(journal).discard = die_after_commit
    try:
        w.add_episode(frames, "teleop", "train", {"interrupted": False}, journal=journal)
        w.close()
    finally:
        type(journal).discard = real_discard
    assert any((crashed / ".nactuator" / "journal").iterdir())
    with DatasetWriter(crashed, OMX, OMX.fps) as again:
        again.flush()
        assert again.recovered == []
    [ep] = read_dataset(crashed).episodes
    assert ep.meta["interrupted"] is False and ep.meta["journal"] == journal.id
    assert not any((crashed / ".nactuator" / "journal").iterdir())


RECORD_CHILD = textwrap.dedent("""
    import sys
    from nactuator.hardware.emulator import Emulator
    from nactuator.hardware.recorder import record, with_hardware
    from nactuator.platforms import load_platform

    # A generous reply timeout: this is about what reaches the disk, not bus timing, and
    # must not fail on a loaded machine (the emulators share this process).
    p = with_hardware(load_platform("omx"), record_ramp_s=0.2, rx_timeout_ms=100)
    leader = Emulator("dynamixel", p, seed=1, leader=True)
    follower = Emulator("dynamixel", p, seed=2)
    with leader, follower:
        record(p, leader.port, follower.port, "first", seconds=0.5, out=sys.argv[1],
               progress=False)
        record(p, leader.port, follower.port, "second", seconds=300, out=sys.argv[1],
               payload_g=100, progress=False)  # killed long before its end
""")


def test_sigkill_mid_recording_loses_at_most_the_last_seconds(tmp_path):
    """A real recording (emulated arms, real SDK) killed mid-episode once a journal chunk is
    on disk: the earlier episode is intact, the killed one is recovered up to its last chunk."""
    from nactuator.data.journal import read_journal

    out = tmp_path / "rec"
    child = subprocess.Popen([sys.executable, "-c", RECORD_CHILD, str(out)],
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journals = out / ".nactuator" / "journal"
    info = out / "meta" / "info.json"
    committed, live = None, []
    try:
        deadline = time.monotonic() + 240  # a generous bound; the wait ends on a condition
        while time.monotonic() < deadline and child.poll() is None:
            if committed is None and info.exists() and \
                    json.loads(info.read_text())["total_episodes"] >= 1:
                committed = {e.meta["journal"] for e in read_dataset(out).episodes}
            if committed is not None:  # the second episode's journal has a chunk on disk
                live = [d for d in journals.glob("*") if d.name not in committed]
                if live and any(live[0].glob("chunk-*.parquet")):
                    break
            time.sleep(0.05)
        else:
            pytest.fail(f"recording ended or stalled: {child.communicate()[1][-2000:]!r}")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    _, journaled = read_journal(live[0])
    with DatasetWriter(out, OMX, OMX.fps) as w:
        w.flush()
        [(index, frames)] = w.recovered
    first, second = read_dataset(out).episodes
    assert first.task == "first" and second.task == "second"
    assert not first.meta["interrupted"] and not first.meta.get("recovered")
    assert index == 1 and second.length == frames == len(journaled["timestamp"])
    assert frames >= round(fmt.JOURNAL_CHUNK_S * OMX.fps)  # at least one whole chunk
    np.testing.assert_array_equal(second.frames["q"], journaled["q"].astype(np.float32))
    assert second.meta["recovered"] and second.meta["interrupted"]
    assert second.meta["payload_g"] == 100 and second.meta["follower_port"]
    assert (second.frames["payload_mass"] == np.float32(0.1)).all()
