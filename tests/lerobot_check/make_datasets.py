"""First half of ``make lerobot-check``, run in OUR environment (.venv): writes the two kinds
of dataset a user brings to LeRobot and, beside each, what our own reader sees in it.

- ``OUT/recorded``: a teleoperation recording from two emulated SO-101 arms (scripted
  leader, hidden-world follower) on the real Feetech wire protocol, through
  ``nactuator.hardware.recorder.record`` -- what ``nactuator record`` writes.
- ``OUT/so101-nad``: the NAD SO-101 CSVs imported with ``nactuator data import-nad``.
- ``OUT/policy-demos``: ``nactuator policy demos``' dataset (a short run of the scripted
  expert in the hidden world with the shipped SO-101 actuator), whose
  ``observation.environment_state`` is the frozen model's [f̂, gate] ACT reads as its
  environment state.
- ``OUT/<name>.reference.npz``: ``read_dataset``'s frames (action, state, velocity, effort),
  episode lengths and recorded fps, so the LeRobot half (``open_with_lerobot.py``, run in
  .venv-lerobot) checks LeRobot's values against ours rather than against themselves.

Usage: python tests/lerobot_check/make_datasets.py OUT [NAD_SO101_FOLDER]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from nactuator.data import read_dataset
from nactuator.hardware.emulator import Emulator
from nactuator.hardware.recorder import record, with_hardware
from nactuator.platforms import load_platform

NAD_SO101 = Path(__file__).resolve().parents[3] / "shared" / "data" / "nad" / "so101"
FRAMES_PER_EPISODE = 150  # > ACT's chunk in the LeRobot half; 2.4 s at 62.3 Hz
PATIENT_MS = 5000.0  # in-process emulators on a loaded 2-core machine answer late


def write_recording(out: Path) -> None:
    """Two train episodes and one validation episode of emulated teleoperation."""
    platform = with_hardware(load_platform("so101"), record_ramp_s=0.2,
                             rx_timeout_ms=PATIENT_MS, reply_timeout_ms=PATIENT_MS,
                             read_retries=1)
    step = 1.0 / platform.fps  # the arms advance one period per telemetry read
    for seed, split in ((1, "train"), (2, "train"), (3, "validation")):
        leader = Emulator("feetech", platform, seed=seed, leader=True, step_per_read=step)
        follower = Emulator("feetech", platform, seed=seed + 10, step_per_read=step)
        with leader, follower:
            stop = threading.Event()  # exactly FRAMES_PER_EPISODE frames, however loaded
            leader.after_reads(FRAMES_PER_EPISODE + 1, stop.set)
            record(platform, leader.port, follower.port, "teleop_free", episodes=1,
                   seconds=600.0, out=out, payload_g=0, split=split, progress=False,
                   stop=stop)


def import_nad(src: Path, out: Path) -> None:
    """The user's command, in a child process: ``nactuator data import-nad SRC --out OUT``."""
    subprocess.run([sys.executable, "-m", "nactuator.cli", "data", "import-nad", str(src),
                    "--out", str(out)], check=True)


def write_policy_demos(out: Path) -> None:
    """Two payloads x two episodes x 3 s of each task: longer than ACT's chunk."""
    from nactuator.policy.config import load_config
    from nactuator.policy.demos import make_demos

    cfg = load_config(actuator="pretrained/so101")
    cfg["demos"].update(payloads_g=[200, 500], episodes=2)
    for task in cfg["tasks"].values():
        task["seconds"] = 3.0
    make_demos(cfg, out.parent / "policy-demos-run")
    shutil.move(out.parent / "policy-demos-run" / "dataset", out)


def write_reference(dataset: Path) -> None:
    ds = read_dataset(dataset)
    declared = {"observation.environment_state": ds.frames["environment_state"]} \
        if "observation.environment_state" in ds.info["features"] else {}
    np.savez(dataset.with_suffix(".reference.npz"), fps=ds.fps, lengths=ds.lengths,
             **{"action": ds.frames["q_cmd"], "observation.state": ds.frames["q"],
                "observation.velocity": ds.frames["qd"],
                "observation.effort": ds.frames["effort"]}, **declared)
    print(f"{dataset}: {len(ds.episodes)} episodes, {len(ds.frames['q'])} frames, "
          f"{ds.fps:g} Hz (our reader)")


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    nad = Path(argv[1]) if len(argv) > 1 else NAD_SO101
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    write_recording(out / "recorded")
    import_nad(nad, out / "so101-nad")
    write_policy_demos(out / "policy-demos")
    for name in ("recorded", "so101-nad", "policy-demos"):
        write_reference(out / name)


if __name__ == "__main__":
    main(sys.argv[1:])
