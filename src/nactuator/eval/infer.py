"""``infer``: the deployment path — force, contact gate and condition from telemetry alone.

No simulator: every frame's window is the *recorded* commands, state and telemetry of the
last L frames, after the checkpoint's input filters (:mod:`nactuator.input_filters`)
(:func:`nactuator.rollout.causal_windows`: zero-padded before the episode
start, as in training), so each estimate
uses only what a live robot would have seen up to that frame. All windows of all episodes
go through the network in large batches.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from nactuator.atomic import atomic_path
from nactuator.data.episodes import dataset_paths
from nactuator.eval import metrics as M
from nactuator.eval.episodes import (
    BATCH_SIZE,
    force_labels,
    is_no_contact,
    load_filtered,
    predict_episodes,
)

__all__ = ["BATCH_SIZE", "infer", "predict_episodes"]



AXES = ("x", "y", "z")




def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path, suffix=".csv") as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")


def infer(ckpt: str | os.PathLike, data, split: str | None = None,
          out: str | os.PathLike | None = None, force_only: bool = False,
          contact: str | os.PathLike | None = None) -> str:
    """Causal estimates for every frame of ``split`` (None = all episodes) of ``data``.

    Writes a CSV to ``out`` (if given) with columns ``episode, frame, timestamp, fx, fy,
    fz, gate``, for a model with the uncertainty head ``force_lo_<axis>, force_hi_<axis>``
    (the calibrated 90 % interval, docs/uncertainty.md), and, unless ``force_only``,
    ``condition_<channel>`` per motor; with ``contact`` (a calibration file of ``nactuator
    contact calibrate``) the contact estimate per frame: ``contact_link`` (body name, empty:
    none), ``contact_px/py/pz`` (m, that body's frame), ``contact_fx/fy/fz`` (N, base frame;
    :func:`nactuator.eval.contact.contact_columns`). Returns a summary: frames, throughput,
    and force MAE (and contact rates) against the labels where there are any.
    """
    t0 = time.perf_counter()
    if contact is not None:  # a bad calibration file fails before the model runs
        from nactuator.contact import ContactCalibration

        ContactCalibration.load(contact)
    actuator, meta, platform, episodes = load_filtered(ckpt, data, split)
    t1 = time.perf_counter()
    preds = predict_episodes(actuator, episodes)
    model_s = time.perf_counter() - t1
    frames = sum(ep.length for ep in episodes)
    contact_cols, contact_lines = {}, []
    if contact is not None:
        from nactuator.eval.contact import contact_columns  # mujoco + scipy: only when asked

        t2 = time.perf_counter()
        contact_cols, contact_lines = contact_columns(platform, episodes, preds, contact, ckpt)
        contact_lines.append(f"  contact estimate: {time.perf_counter() - t2:.2f} s")

    if out is not None:
        columns: dict[str, np.ndarray] = {
            "episode": np.concatenate([np.full(ep.length, ep.index) for ep in episodes]),
            "frame": np.concatenate([np.arange(ep.length) for ep in episodes]),
            "timestamp": np.concatenate([ep.frames["timestamp"] for ep in episodes]),
        }
        force = np.concatenate([p["force"] for p in preds])
        columns.update(fx=force[:, 0], fy=force[:, 1], fz=force[:, 2],
                       gate=np.concatenate([p["gate"] for p in preds]))
        if "force_lo" in preds[0]:
            for key in ("force_lo", "force_hi"):
                bound = np.concatenate([p[key] for p in preds])
                columns.update({f"{key}_{a}": bound[:, i] for i, a in enumerate(AXES)})
        if not force_only:
            cond = np.concatenate([p["condition"] for p in preds])
            for j, name in enumerate(platform.channel_names):
                columns[f"condition_{name}"] = cond[:, j]
        columns.update(contact_cols)
        _write_csv(pd.DataFrame(columns), Path(out))

    lines = [f"infer: {len(episodes)} episode(s), {frames} frames of "
             f"{', '.join(str(p) for p in dataset_paths(data))} (split {split or 'all'}), "
             f"platform {platform.name}",
             f"model: {model_s:.2f} s for all frames = {frames / max(model_s, 1e-9):,.0f} "
             f"frames/s (batch {BATCH_SIZE}, {torch.get_num_threads()} thread(s)); "
             f"total {time.perf_counter() - t0:.2f} s"]
    labelled = [(ep, p) for ep, p in zip(episodes, preds, strict=True)
                if np.isfinite(force_labels(ep)).any()]
    if labelled:
        err = np.concatenate([M.force_errors(p["force"], force_labels(ep))
                              for ep, p in labelled])
        lines.append(f"force MAE vs labels ({len(labelled)} labelled episode(s), unlabelled "
                     f"frames as 0 N): 3-axis {err.mean():.3f} N, z {err[:, 2].mean():.3f} N")
    quiet = [p for ep, p in zip(episodes, preds, strict=True) if is_no_contact(ep)]
    if quiet:
        nc = M.no_contact_metrics(np.concatenate([p["gate"] for p in quiet]),
                                  np.concatenate([p["force"] for p in quiet]))
        lines.append(f"no-contact runs ({len(quiet)}): false-contact rate "
                     f"{100 * nc['false_contact_rate']:.1f} %, mean |f| "
                     f"{nc['mean_force_norm']:.3f} N")
    lines.extend(contact_lines)
    lines.append(f"CSV: {out}" if out is not None else "CSV: not written (pass --out FILE)")
    return "\n".join(lines)
