"""Second half of ``make lerobot-check``, run in the SEPARATE LeRobot environment
(.venv-lerobot: torch 2.14.1, torchvision 0.29.1, LeRobot 0.4.4 and its dependencies; no
nactuator). For each dataset ``make_datasets.py`` wrote, with LeRobot's own code only:

1. ``LeRobotDataset(repo_id, root=...)`` opens the folder locally (no hub), and its
   metadata says what ours does: integer fps (our recorded rate rounded), episodes,
   frames, feature shapes and dtypes;
2. every frame LeRobot serves equals what our reader read (the ``.reference.npz``);
3. a ``torch.utils.data.DataLoader`` batch with ACT's action chunks
   (``delta_timestamps`` from ``resolve_delta_timestamps``) has the shapes ACT expects and
   pads past each episode's end;
4. one state-only ACT training step (``lerobot.policies.act``): the joint state as
   ``observation.state`` and, as ``observation.environment_state``, the dataset's own
   column where it has one (``policy demos``: the frozen actuator's [f̂, gate]), else the
   telemetry (velocity, effort), normalised by LeRobot's processor with the dataset's
   ``meta/stats.json``; the loss is finite and the optimiser changes the weights.

Then the LeRobot tools our docs send users to answer ``--help`` here, and
``lerobot-dataset-viz`` saves a Rerun recording of the recorded dataset's first episode.

Usage: .venv-lerobot/bin/python tests/lerobot_check/open_with_lerobot.py OUT
Exits non-zero, naming the dataset and the check, on the first failure.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.datasets.factory import resolve_delta_timestamps
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.act.processor_act import make_act_pre_post_processors

DATASETS = ("recorded", "so101-nad", "policy-demos")
TELEMETRY = ("observation.velocity", "observation.effort")  # ACT's environment state
ENV_STATE = "observation.environment_state"
CHUNK = 20  # ACT action chunk (frames); shorter than every episode
BATCH = 8
# The LeRobot tools our docs and messages send users to in this environment
# (docs/hardware.md, docs/data-format.md; tests/test_lerobot_tools.py keeps the two in step)
TOOLS = ("lerobot-calibrate", "lerobot-setup-motors", "lerobot-dataset-viz")


class CheckFailed(AssertionError):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def own_env_state(meta) -> bool:
    """The dataset stores ``observation.environment_state`` itself (policy demos)."""
    return ENV_STATE in meta.features


def act_config(ds: LeRobotDataset) -> ACTConfig:
    n = ds.meta.shapes["observation.state"][0]
    env_dim = ds.meta.shapes[ENV_STATE][0] if own_env_state(ds.meta) else \
        sum(ds.meta.shapes[k][0] for k in TELEMETRY)
    return ACTConfig(
        input_features={
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(n,)),
            ENV_STATE: PolicyFeature(type=FeatureType.ENV, shape=(env_dim,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(n,))},
        chunk_size=CHUNK, n_action_steps=CHUNK, dim_model=64, dim_feedforward=128,
        n_heads=4, n_encoder_layers=1, n_decoder_layers=1, latent_dim=8, device="cpu",
    )


def with_env_state(batch: dict) -> dict:
    """The telemetry channels joined into ACT's one environment-state vector."""
    return {**batch, ENV_STATE: torch.cat([batch[k] for k in TELEMETRY], dim=-1)}


def env_state_stats(stats: dict) -> dict:
    return {s: np.concatenate([np.asarray(stats[k][s], dtype=np.float32) for k in TELEMETRY])
            for s in ("mean", "std", "min", "max")}


def check_dataset(root: Path) -> str:
    name = root.name
    ref = np.load(root.with_suffix(".reference.npz"))
    ds = LeRobotDataset(f"nactuator/{name}", root=root)
    meta = ds.meta

    # 1. metadata
    check(isinstance(meta.fps, int) and meta.fps == int(np.floor(float(ref["fps"]) + 0.5)),
          f"fps {meta.fps!r}: expected the int {float(ref['fps']):g} Hz rounds to")
    check(meta.total_episodes == len(ref["lengths"]), "total_episodes differs from ours")
    check(len(ds) == int(ref["lengths"].sum()), f"{len(ds)} frames, ours {ref['lengths'].sum()}")
    lengths = [int(e["dataset_to_index"] - e["dataset_from_index"]) for e in meta.episodes]
    check(lengths == ref["lengths"].tolist(), f"episode lengths {lengths} differ from ours")
    keys = ("action", "observation.state", *TELEMETRY, *[k for k in (ENV_STATE,) if k in ref])
    check(own_env_state(meta) == (ENV_STATE in ref), f"{ENV_STATE}: LeRobot and we disagree "
          "on whether the dataset has it")
    for key in keys:
        check(meta.features[key]["dtype"] == "float32", f"{key} dtype")
        check(tuple(meta.shapes[key]) == ref[key].shape[1:], f"{key} shape {meta.shapes[key]}")

    # 2. values: LeRobot's frames are our frames
    hf = ds.hf_dataset.with_format("numpy")
    for key in keys:
        theirs = np.stack(hf[key]).astype(np.float32)
        check(np.array_equal(theirs, ref[key], equal_nan=True),
              f"{key}: LeRobot's values differ from our reader's "
              f"(max |diff| {np.nanmax(np.abs(theirs - ref[key])):.3g})")
    item = ds[0]
    check(item["task"] == meta.tasks.index[int(item["task_index"])], "task string lookup")

    # 3. a DataLoader batch with ACT's action chunks
    config = act_config(ds)
    chunked = LeRobotDataset(f"nactuator/{name}", root=root,
                             delta_timestamps=resolve_delta_timestamps(config, meta))
    loader = torch.utils.data.DataLoader(chunked, batch_size=BATCH, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    batch = next(iter(loader))
    n = meta.shapes["action"][0]
    check(tuple(batch["action"].shape) == (BATCH, CHUNK, n), f"action {batch['action'].shape}")
    check(tuple(batch["observation.state"].shape) == (BATCH, n), "observation.state batch")
    last = chunked[lengths[0] - 1]  # the first episode's last frame: the chunk runs past it
    check(bool(last["action_is_pad"][1:].all()) and not bool(last["action_is_pad"][0]),
          "action_is_pad past the episode's end")
    for key in keys:
        check(bool(torch.isfinite(batch[key]).all()), f"{key}: NaN in the batch")

    # 4. one state-only ACT training step
    torch.manual_seed(0)
    policy = ACTPolicy(config)
    own = own_env_state(meta)
    stats = meta.stats if own else {**meta.stats, ENV_STATE: env_state_stats(meta.stats)}
    preprocess, _ = make_act_pre_post_processors(config, dataset_stats=stats)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    before = [p.detach().clone() for p in policy.parameters()]
    policy.train()
    loss, parts = policy.forward(preprocess(batch if own else with_env_state(batch)))
    loss.backward()
    optimizer.step()
    check(bool(torch.isfinite(loss)), f"ACT loss {loss.item()}")
    moved = sum(not torch.equal(a, b.detach()) for a, b in zip(before, policy.parameters(),
                                                               strict=True))
    check(moved > 0, "the optimiser step changed no weight")
    return (f"{name}: LeRobotDataset ok ({meta.total_episodes} episodes, {len(ds)} frames, "
            f"fps {meta.fps}; values equal ours); DataLoader batch {tuple(batch['action'].shape)}; "
            f"ACT step loss {loss.item():.3f} (l1 {parts['l1_loss']:.3f}), {moved} tensors updated")


def run_tool(tool: str, *args: str) -> None:
    run = subprocess.run([str(Path(sys.executable).parent / tool), *args],
                         capture_output=True, text=True, timeout=300)
    check(run.returncode == 0, f"{tool} {' '.join(args)} exited {run.returncode}: "
          f"{(run.stderr or run.stdout).strip().splitlines()[-1:]}")


def check_tools(out: Path) -> list[str]:
    lines = []
    for tool in TOOLS:
        run_tool(tool, "--help")
        lines.append(f"{tool} --help: ok")
    viz = out / "viz"
    run_tool("lerobot-dataset-viz", "--repo-id", "nactuator/recorded", "--root",
             str(out / "recorded"), "--episode-index", "0", "--num-workers", "0",
             "--save", "1", "--output-dir", str(viz))
    rrd = viz / "nactuator_recorded_episode_0.rrd"
    check(rrd.is_file() and rrd.stat().st_size > 0, f"lerobot-dataset-viz wrote no {rrd}")
    lines.append(f"lerobot-dataset-viz: {rrd} ({rrd.stat().st_size // 1024} KiB)")
    return lines


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    t0 = time.perf_counter()
    try:
        for name in DATASETS:
            try:
                print(check_dataset(out / name), flush=True)
            except CheckFailed as e:
                raise CheckFailed(f"{out / name}: {e}") from None
        for line in check_tools(out):
            print(line, flush=True)
    except CheckFailed as e:
        print(f"lerobot-check FAILED: {e}", file=sys.stderr)
        return 1
    print(f"lerobot-check passed in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
