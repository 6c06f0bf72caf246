"""Offline screen of pooled condition heads (issue 18 item 2; docs/results.md §6.3.3).

    PYTHONPATH=src .venv/bin/python bench/condition_probe.py --platform omx \
        --data runs/cond/omx_cond --onset runs/cond/omx_onset --heads per shared \
        --hidden 32 64 --schedule constant cosine

Per fold of ``nactuator cv``'s 4-fold split: the input filters' pooled statistics (N = 32,
``nactuator.input_filters``) of every episode, normalised per motor with the train split's
mean and std as the feature builder does, and a :class:`~nactuator.models.heads.
PooledConditionHead` (per motor or ``shared``) fitted on the train split's labelled frames
alone (BCE on every motor's label, Adam at 0.03, ``--steps``; under ``cosine``: the
recipes' 100-step warm-up and cosine, as the head gets inside training), on batches of
1024 frames drawn from the whole train split (``--batches frames``) or, as in training,
16 contiguous segments at the recipe's horizon (``--batches segments --steps 288``).
Scored like ``nactuator eval``'s condition rows: the held-out 64-frame windows (stride 32)
of the degraded motor, a window's score its frames' mean P(degraded) (> 0.5: degraded);
and on the onset world (``--onset``, never trained on) per faulted run: flagged (P > 0.5
on 30 consecutive frames), before its onset, on which motor the mean score rose most.
Not the model: the head here never shares a step with the network (which does not change
what it reads) and is not picked by validation, so the numbers screen heads, and the CV of
the recipe is what is reported.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from nactuator.data.episodes import load_split
from nactuator.eval.baselines.features import window_starts
from nactuator.input_filters import POOLED_KEYS, filter_inputs, input_filter_spec
from nactuator.models.heads import PooledConditionHead
from nactuator.platforms import load_platform

Episode = tuple[np.ndarray, np.ndarray]  # statistics (T, P, n), condition labels (T, n)


def load(data: str, platform: str, split: str | None, cv: tuple[int, int] | None,
         frames: int) -> list[Episode]:
    spec = input_filter_spec(pool_frames=frames)
    out = []
    for _, ep in load_split(data, load_platform(platform), split, cv):
        filtered, _ = filter_inputs(ep.frames, spec)
        x = np.stack([filtered[k] for k in POOLED_KEYS], axis=1).astype(np.float64)
        c = ep.frames.get("condition")
        y = np.full((ep.length, x.shape[2]), np.nan) if c is None else np.asarray(c, float)
        out.append((x, y))
    return out


def normalise(episodes: list[Episode], train: list[Episode]) -> list[Episode]:
    stacked = np.concatenate([x for x, _ in train])
    mean, std = np.nanmean(stacked, axis=0), np.nanstd(stacked, axis=0)
    std = np.where(std > 1e-6, std, 1.0)
    return [(np.nan_to_num((x - mean) / std).astype(np.float32), y) for x, y in episodes]


# conf/train/nad_*.yaml's horizon curriculum (epoch: frames) at 8 steps of 16 segments an epoch
HORIZON = {0: 16, 3: 32, 6: 64, 11: 96, 18: 128, 26: 192}


def _segments(train: list[Episode], step: int, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray]:
    """What the recipe's step feeds the head: 16 contiguous segments at that epoch's horizon."""
    horizon = max(v for k, v in HORIZON.items() if k <= step // 8)
    xs, ys = [], []
    for _ in range(16):
        x, y = train[rng.integers(len(train))]
        s = int(rng.integers(0, max(len(x) - horizon, 1)))
        xs.append(x[s:s + horizon])
        ys.append(y[s:s + horizon])
    return np.concatenate(xs), np.concatenate(ys)


def fit(train: list[Episode], shared: bool, hidden: int, steps: int, schedule: str,
        batches: str = "frames", seed: int = 0) -> PooledConditionHead:
    torch.manual_seed(seed)
    x = torch.tensor(np.concatenate([x for x, _ in train]))
    labels = np.concatenate([y for _, y in train])
    known = torch.tensor(np.isfinite(labels))
    degraded = torch.tensor(np.nan_to_num(labels, nan=1.0) < 0.5).float()
    head = PooledConditionHead(x.shape[2], x.shape[1], hidden, shared=shared)
    optimiser = torch.optim.Adam(head.parameters(), lr=0.03)
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        if schedule == "cosine":  # the recipes' warm-up (100 steps) and cosine
            factor = ((step + 1) / 101 if step < 100 else
                      0.5 * (1 + math.cos(math.pi * (step - 100) / max(steps - 100, 1))))
            for group in optimiser.param_groups:
                group["lr"] = 0.03 * factor
        if batches == "segments":
            xb, yb = _segments(train, step, rng)
            bx, bk = torch.tensor(xb), torch.tensor(np.isfinite(yb))
            bd = torch.tensor(np.nan_to_num(yb, nan=1.0) < 0.5).float()
        else:
            rows = torch.randint(0, len(x), (1024,), generator=generator)
            bx, bk, bd = x[rows], known[rows], degraded[rows]
        loss = F.binary_cross_entropy_with_logits(head(bx), bd, reduction="none")
        loss = (loss * bk).sum() / bk.sum().clamp(min=1)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return head


def scores(head: PooledConditionHead, episodes: list[Episode]) -> list[np.ndarray]:
    with torch.no_grad():
        return [torch.sigmoid(head(torch.tensor(x))).numpy() for x, _ in episodes]


def windows(episodes: list[Episode], p: list[np.ndarray], motor: int) -> tuple[float, float]:
    score, target = [], []
    for (x, y), frame_p in zip(episodes, p, strict=True):
        for s in window_starts(len(x), 64, 32):
            label = y[s:s + 64, motor]
            if np.isfinite(label).all():
                target.append((label < 0.5).mean() > 0.5)
                score.append(frame_p[s:s + 64, motor].mean())
    s, t = np.array(score), np.array(target)
    return float(((s > 0.5) == t).mean()), float(roc_auc_score(t, s))


def detection(episodes: list[Episode], p: list[np.ndarray], trained: int,
              hold: int = 30) -> dict[str, list[int]]:
    """Per fault motor ("trained" or "other"): [runs, flagged, before onset, localised]."""
    out: dict[str, list[int]] = {}
    for (_, y), frame_p in zip(episodes, p, strict=True):
        bad = np.isfinite(y) & (y < 0.5)
        if not bad.any():
            continue
        motor = int(np.flatnonzero(bad.any(axis=0))[0])
        onset = int(np.flatnonzero(bad[:, motor])[0])
        above = frame_p[:, motor] > 0.5
        run = np.convolve(above, np.ones(hold), mode="full")[:len(above)] >= hold
        shift = frame_p[onset:].mean(axis=0) - frame_p[:onset].mean(axis=0)
        row = out.setdefault("trained" if motor == trained else "other", [0, 0, 0, 0])
        row[0] += 1
        row[1] += int(run.any())
        row[2] += int(run[:onset].any())
        row[3] += int(int(np.argmax(shift)) == motor)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--platform", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--onset", required=True)
    ap.add_argument("--heads", nargs="+", default=["per", "shared"], choices=["per", "shared"])
    ap.add_argument("--hidden", nargs="+", type=int, default=[32])
    ap.add_argument("--schedule", nargs="+", default=["constant"],
                    choices=["constant", "cosine"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batches", default="frames", choices=["frames", "segments"],
                    help="frames: 1024 frames drawn from the whole train split a step; "
                         "segments: the recipe's 16 contiguous segments (use --steps 288)")
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--folds", type=int, nargs="+", default=[0, 1, 2, 3])
    args = ap.parse_args()
    torch.set_num_threads(1)
    onset_raw = load(args.onset, args.platform, None, None, args.frames)
    results: dict[str, list[tuple[float, float]]] = {}
    for fold in args.folds:
        train = load(args.data, args.platform, "train", (4, fold), args.frames)
        test = load(args.data, args.platform, "test", (4, fold), args.frames)
        trained = int(np.flatnonzero(np.concatenate(
            [np.isfinite(y) & (y < 0.5) for _, y in train]).any(axis=0))[0])
        train_n, test_n, onset_n = (normalise(e, train) for e in (train, test, onset_raw))
        for kind in args.heads:
            for hidden in args.hidden:
                for schedule in args.schedule:
                    name = f"{kind} h{hidden} {schedule}"
                    head = fit(train_n, kind == "shared", hidden, args.steps, schedule,
                               args.batches)
                    acc, auc = windows(test_n, scores(head, test_n), trained)
                    det = detection(onset_n, scores(head, onset_n), trained)
                    results.setdefault(name, []).append((acc, auc))
                    print(f"fold {fold} {name}: windows {100 * acc:.1f} % / AUC {auc:.3f}; "
                          f"onset [runs, flagged, before onset, localised] {det}", flush=True)
    for name, rows in results.items():
        a = np.array(rows)
        sd = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros(2)
        print(f"{name}: {100 * a[:, 0].mean():.1f} ± {100 * sd[0]:.1f} % / "
              f"AUC {a[:, 1].mean():.3f} ± {sd[1]:.3f}")


if __name__ == "__main__":
    main()
