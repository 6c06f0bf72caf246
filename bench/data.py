"""Data-room throughput: windows and rollout segments served by NADDataModule.

Measures, in one run, on the real NAD subset (OMX + SO-101, imported to a temp folder) and
on a larger synthetic OMX dataset:

* 9-frame windows/s from ``nactuator.rollout.causal_windows`` over a whole split (the one
  window builder of training, eval, infer and live), every window materialised as a
  contiguous (T, L, n) tensor per key, vs a naive map-style ``torch.utils.data.Dataset`` +
  default collate (per-sample Python) that builds the same windows, in the same order (the
  bench checks that the first batch of each is equal). ``causal_windows`` itself returns
  ``unfold`` views, which cost nothing until read: counting those would compare building
  nothing with building everything;
* rollout segments/s (T = window_length + H frames) from ``train_dataloader`` vs the same
  naive per-sample baseline;
* NAD import throughput (frames/s).

Run:  .venv/bin/python bench/data.py [--seconds 1]
      (``--synthetic 40x200 --seconds 0.05``: the test suite's smoke run)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from nactuator.data import DatasetWriter, read_dataset
from nactuator.data.datamodule import NADDataModule
from nactuator.data.importers import import_nad
from nactuator.platforms import load_platform
from nactuator.rollout import causal_windows

KEYS = ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "force", "payload_mass")
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "nad"


class NaiveSegments(TorchDataset):
    """The obvious per-sample implementation: slice each episode, float32, zero-pad,
    collate."""

    def __init__(self, root: Path, window_length: int, horizon: int) -> None:
        ds = read_dataset(root)
        self.episodes = [e.frames for e in ds.episodes if e.split == "train"]
        self.before, self.horizon = window_length - 1, horizon
        self.index = [(i, s) for i, f in enumerate(self.episodes)
                      for s in range(len(f["q"]) - horizon)]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        i, s = self.index[k]
        frames = self.episodes[i]
        lo, hi = s - self.before, s + self.horizon + 1
        out = {}
        for key in KEYS:
            x = np.nan_to_num(frames[key][max(lo, 0):hi].astype(np.float32))
            x = x.reshape(len(x), -1)  # (T,) channels such as payload_mass become (T, 1)
            if lo < 0:
                x = np.concatenate([np.zeros((-lo, *x.shape[1:]), x.dtype), x])
            out[key] = torch.from_numpy(x)
        out["pad"] = torch.arange(lo, hi) < 0
        return out


def cycling(loader: DataLoader):
    """Batch sizes from ``loader`` forever, one persistent iterator per pass (fair to both)."""

    def next_size() -> int:
        nonlocal it
        try:
            return len(next(it)["q"])
        except StopIteration:
            it = iter(loader)
            return len(next(it)["q"])

    it = iter(loader)
    return next_size


def rate(fn, seconds: float) -> float:
    """Items per second of ``fn()`` (which returns how many items it produced)."""
    fn()  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += fn()
    return done / (time.perf_counter() - t0)


def _check_same_windows(fast: dict[str, torch.Tensor], naive: dict[str, torch.Tensor]) -> None:
    """Both sides must build the same thing for the ratio to mean anything."""
    k = min(len(fast["q"]), len(naive["q"]))
    for key in (*KEYS, "pad"):
        if not torch.equal(fast[key][:k], naive[key][:k]):
            raise AssertionError(f"bench/data.py: the two window builders disagree on {key!r}")


def synthetic_omx(root: Path, episodes: int, frames: int) -> None:
    p = load_platform("omx")
    rng = np.random.default_rng(0)
    with DatasetWriter(root, p, p.fps) as w:
        for e in range(episodes):
            f = {k: rng.normal(size=(frames, p.n)) for k in
                 ("q_cmd", "q", "qd", "effort", "voltage", "temperature")}
            w.add_episode(f, "synthetic", "train" if e % 10 < 8 else "validation")


def bench(label: str, root: Path, platform: str, seconds: float) -> list[str]:
    rows = []
    train = [e.frames for e in read_dataset(root).episodes if e.split == "train"]

    def windows(frames) -> dict[str, torch.Tensor]:
        return {k: v.contiguous() for k, v in causal_windows(frames, KEYS, 9).items()}

    def fast_windows() -> int:  # every causal window of the train split, built
        return sum(len(windows(f)["q"]) for f in train)

    # The same windows in the same order, 256 per batch, one Python call per window.
    naive_w = NaiveSegments(root, window_length=9, horizon=0)
    naive_loader = DataLoader(naive_w, batch_size=256, shuffle=False)
    _check_same_windows(windows(train[0]), next(iter(naive_loader)))
    naive_windows = cycling(naive_loader)
    fw, nw = rate(fast_windows, seconds), rate(naive_windows, seconds)
    rows.append(f"| {label} | 9-frame causal windows, whole split, materialised | {fw:,.0f} /s | "
                f"{nw:,.0f} /s | {fw / nw:.0f}x |")

    dm16 = NADDataModule(root, platform, window_length=9, horizon=128, batch_size=16)
    fast_segments = cycling(dm16.train_dataloader())
    naive_s = NaiveSegments(root, window_length=9, horizon=128)
    naive_segments = cycling(DataLoader(naive_s, batch_size=16, shuffle=True,
                                        generator=torch.Generator().manual_seed(0)))
    fs, ns = rate(fast_segments, seconds), rate(naive_segments, seconds)
    rows.append(f"| {label} | rollout segments H=128 (137 frames), batch 16 | {fs:,.0f} /s | "
                f"{ns:,.0f} /s | {fs / ns:.0f}x |")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    ap.add_argument("--synthetic", default="400x600", metavar="EPISODESxFRAMES",
                    help="size of the synthetic OMX dataset")
    ap.add_argument("--nad", type=Path, default=SHARED,
                    help="the NAD folder (omx/ and so101/ CSVs) to import and serve")
    args = ap.parse_args(argv)
    episodes, frames_per_episode = (int(x) for x in args.synthetic.split("x"))
    torch.manual_seed(0)
    rows = ["| data | what | causal_windows / NADDataModule | naive per-sample Dataset + collate "
            "| ratio |",
            "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        import_nad(args.nad / "omx", tmp / "omx")
        import_nad(args.nad / "so101", tmp / "so101")
        dt = time.perf_counter() - t0
        frames = sum(len(read_dataset(tmp / d).frames["q"]) for d in ("omx", "so101"))
        print(f"import_nad: {frames} frames in {dt:.2f} s = {frames / dt:,.0f} frames/s")
        synthetic_omx(tmp / "synth", episodes=episodes, frames=frames_per_episode)
        rows += bench("NAD OMX subset (18 ep)", tmp / "omx", "omx", args.seconds)
        rows += bench("NAD SO-101 subset (9 ep)", tmp / "so101", "so101", args.seconds)
        rows += bench(f"synthetic OMX ({episodes} ep x {frames_per_episode})", tmp / "synth",
                      "omx", args.seconds)
    print(f"torch threads: {torch.get_num_threads()}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
