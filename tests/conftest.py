"""Shared test fixtures: where the real data lives, and the Warp kernel cache the commands use."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from nactuator.paths import warp_cache_dir

ROOT = Path(__file__).resolve().parents[1]
# Real data sits beside the project (../shared), never inside it.
SHARED = Path(os.environ.get("NACTUATOR_SHARED", ROOT.parent / "shared"))
# The same per-user kernel cache a user's commands use (nactuator.paths.warp_cache_dir): a fresh
# clone compiles nothing a previous one compiled.
os.environ.setdefault("WARP_CACHE_PATH", str(warp_cache_dir()))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.fail(f"shared data folder {SHARED} is missing (set NACTUATOR_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def nad_dir(shared_dir: Path) -> Path:
    return shared_dir / "data" / "nad"


@pytest.fixture(scope="session")
def bam_dir(shared_dir: Path) -> Path:
    return shared_dir / "data" / "bam"


SIM_PLATFORMS = ["omx", "so101", "franka", "pendulum"]


@pytest.fixture(scope="session")
def sims():
    """One Simulator per platform for the whole session: building one compiles/loads Warp
    kernels and the Newton model, so the simulator test modules share them. These run the
    default engine (the chain engine on every shipped platform)."""
    from nactuator.sim import Simulator

    return {name: Simulator(name) for name in SIM_PLATFORMS}


@pytest.fixture(scope="session")
def newton_sims():
    """The same platforms on the Newton (reference) engine."""
    from nactuator.sim import Simulator

    return {name: Simulator(name, engine="newton") for name in SIM_PLATFORMS}


@pytest.fixture(scope="session")
def engine_sims(sims, newton_sims):
    """``engine_sims[engine][platform]`` for tests parametrized over both engines."""
    return {"chain": sims, "newton": newton_sims}


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread, as conf/base.yaml's TorchThreads sets for training runs (a
    module's tests then train as `make train` does, and do not oversubscribe the cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def patient_track_config(tmp_path: Path) -> Path:
    """conf/track/so101.yaml with a long ``extra_s``, for `track --port` against an emulator
    that steps its world once per read: the loop's clock is the wall's and the world's is
    the reads', so on a loaded machine the world falls behind and a 2 s timeout can end the
    run before it settles. The runs stop at "settled" long before."""
    import yaml

    from nactuator.paths import conf_dir

    config = yaml.safe_load((conf_dir() / "track" / "so101.yaml").read_text())
    config["settings"]["extra_s"] = 30.0
    path = tmp_path / "patient_track.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def world_follower():
    """Open an STS3215 emulator running the hidden SO-101 world from joints ``q0``, holding
    its pose (goal = present), for `track --port`: ``with world_follower(p, q0) as
    (follower, arm, patient):`` — ``patient`` is the platform with 5 s reply timeouts (an
    emulator in this process can take a few hundred ms to answer on a loaded machine).
    The world advances one control step per telemetry read, so its motion does not depend
    on the load; `patient_track_config` gives the wall-clock stop rule the time to see it."""
    from contextlib import contextmanager

    from nactuator.hardware.emulator import Emulator
    from nactuator.hardware.emulator.world_arm import WorldArm
    from nactuator.hardware.recorder import with_hardware

    @contextmanager
    def open_follower(platform, q0):
        arm = WorldArm(platform, seed=2, q0=q0)
        with Emulator("feetech", platform, seed=2, arm=arm,
                      step_per_read=platform.control_dt) as follower:
            for table in follower.tables.values():
                table.set("Goal_Position", table.get("Present_Position"))
            yield follower, arm, with_hardware(platform, rx_timeout_ms=5000.0,
                                               reply_timeout_ms=5000.0)

    return open_follower


@pytest.fixture
def python_sigint():
    """Python's Ctrl-C handler for the test. `_thread.interrupt_main` does nothing while
    SIGINT is ignored, as it is in a job that a shell without job control starts in the
    background (`nohup make test-slow-sample &`: calibrate-arm's Ctrl-C test then failed with
    "DID NOT RAISE"); a user's foreground `calibrate-arm` always has the handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
