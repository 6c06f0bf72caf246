"""User errors reach the user as one line and exit status 2; --debug shows the traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nactuator.cli import main


def _run(capsys, argv: list[str]) -> tuple[int, list[str]]:
    code = main(argv)
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("argv, says", [
    (["eval", "--ckpt", "{tmp}/nope.ckpt", "--data", "{tmp}", "--out", "{tmp}/e"],
     "nope.ckpt does not exist"),
    (["eval", "--ckpt", "{tmp}/notes.txt", "--data", "{tmp}", "--out", "{tmp}/e"],
     "notes.txt is not a torch checkpoint"),
    (["export", "--ckpt", "{tmp}/notes.txt", "--out", "{tmp}/a.pt"],
     "notes.txt is not a torch checkpoint"),
    (["infer", "--ckpt", "{tmp}/run", "--data", "{tmp}"],
     "run is a folder, not a model file; pass {tmp}/run/best.ckpt or {tmp}/run/last.ckpt"),
    (["live", "--ckpt", "{tmp}/dataset", "--platform", "so101", "--port", "/dev/null"],
     "dataset is a folder, not a model file; it is a dataset (give it as --data)"),
    (["export", "--ckpt", "{tmp}/run/best.ckpt", "--out", "{tmp}/x.onnx", "--format",
      "torchscript"], "x.onnx: the extension .onnx means onnx, but --format torchscript"),
    (["data", "info", "{tmp}/nowhere"], "nowhere/meta/info.json: missing"),
    (["sim-check", "--platform", "nope"], "unknown platform 'nope'"),
    (["record", "--platform", "so101", "--leader", "{tmp}/no-leader", "--follower",
      "{tmp}/no-follower", "--task", "t", "--out", "{tmp}/rec"], "does not exist"),
])
def test_a_user_error_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    (tmp_path / "run").mkdir()
    for name in ("best.ckpt", "last.ckpt"):
        (tmp_path / "run" / name).write_text("a checkpoint\n")
    (tmp_path / "dataset" / "meta").mkdir(parents=True)
    (tmp_path / "dataset" / "meta" / "info.json").write_text("{}\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    says = says.format(tmp=tmp_path)
    code, lines = _run(capsys, argv)
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"nactuator {argv[0]}")
    assert says in lines[0] and "Traceback" not in lines[0]


def test_a_path_that_is_a_file_where_a_folder_is_needed(tmp_path, capsys, nad_dir):
    (tmp_path / "taken").write_text("my notes\n")
    code, lines = _run(capsys, ["data", "import-nad", str(nad_dir / "so101"),
                                "--out", str(tmp_path / "taken")])
    assert code == 2 and len(lines) == 1 and "taken" in lines[0]
    assert (tmp_path / "taken").read_text() == "my notes\n"


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        main(["--debug", "export", "--ckpt", str(tmp_path / "nope.ckpt"), "--out", "x.pt"])
    monkeypatch.setenv("NACTUATOR_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        main(["export", "--ckpt", str(tmp_path / "nope.ckpt"), "--out", "x.pt"])


def test_the_installed_command_prints_no_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nactuator.cli", "data", "info",
                          str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "meta/info.json: missing" in out.stderr


def test_a_wrong_ckpt_is_refused_before_torch_is_imported(tmp_path):
    """The path check runs before the command's room (torch, Lightning, Warp) is imported,
    so the error comes at once rather than after ~10 s of imports."""
    (tmp_path / "run").mkdir()
    script = ("import sys; from nactuator.cli import main; "
              f"code = main(['infer', '--ckpt', {str(tmp_path / 'run')!r}, '--data', 'x']); "
              "print(code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["2", "False"], out.stderr
    assert "run is a folder, not a model file" in out.stderr


def test_a_child_command_appends_its_command_line_and_output_to_the_log(tmp_path):
    """cv, adapt and bench-bam run trainings through nactuator.child: the exit code comes
    back and the log says what ran and what it printed."""
    from nactuator.child import run_nactuator

    log = tmp_path / "train.log"
    log.write_text("earlier output\n")
    code = run_nactuator(["data", "info", str(tmp_path / "missing")], log)
    text = log.read_text()
    assert code == 2
    assert text.startswith("earlier output\n$ ")  # appended, never truncated
    assert "nactuator.cli data info" in text and "missing" in text.splitlines()[-1]
