"""The quickstart notebook runs headless from top to bottom (1 epoch), and is committed
without outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbclient  # dev dependencies `make setup` installs: a broken install fails, not skips
import nbformat

from nactuator.paths import warp_cache_dir

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


def test_the_committed_notebook_has_no_outputs():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)


def test_quickstart_runs_headless(tmp_path, monkeypatch):
    # The notebook writes under <repo>/runs/quickstart; run it in a scratch copy of the
    # repository's layout so the test leaves the checkout untouched.
    work = tmp_path / "repo"
    work.mkdir()
    (work / "conf").symlink_to(ROOT / "conf")
    (work / "notebooks").mkdir()
    monkeypatch.setenv("NACTUATOR_QUICKSTART_EPOCHS", "1")
    monkeypatch.setenv("NACTUATOR_SHARED", str(Path(os.environ.get(
        "NACTUATOR_SHARED", ROOT.parent / "shared")).resolve()))
    monkeypatch.setenv("NACTUATOR_CONF", str(ROOT / "conf"))
    monkeypatch.setenv("WARP_CACHE_PATH", str(warp_cache_dir()))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel draws inline, as for a user
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(work / "notebooks")}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "best checkpoint:" in outputs and "whole-episode arm error and force:" in outputs
    assert "command following:" in outputs  # the verdict against the trivial reference
    assert (work / "runs" / "quickstart" / "eval" / "metrics.json").is_file()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the notebook shows the rollout and force plots"
