"""Contact anywhere on the arm from the learned actuator torque (issue 23, docs/contact.md):
``nactuator contact calibrate`` and the contact columns of ``infer --contact``.

The residual is ``tau_ext = ID(q, qd, qdd) - tau``, ``tau`` the model's torque on every
causal window (:func:`nactuator.eval.episodes.predict_episodes`, what ``infer`` runs) and ID the
nominal arm's inverse dynamics at the recorded state (:func:`nactuator.contact.external_torque`).
``calibrate`` sets the per-joint detection thresholds on the user's no-contact runs with one
model and writes them to a JSON file; ``infer --contact FILE`` then detects, isolates and
localises per frame with the same model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from nactuator.contact import (
    ContactCalibration,
    LinkSurfaces,
    calibrate_threshold,
    check_calibration,
    detect,
    episode_residual,
    estimate_recording,
    estimator_settings,
    load_contact_config,
    model_sha256,
)
from nactuator.data import Episode
from nactuator.data.episodes import dataset_paths
from nactuator.eval.episodes import (
    EvalDataError,
    is_no_contact,
    load_filtered,
    predict_episodes,
)
from nactuator.platforms import Platform
from nactuator.sim.dynamics import ArmDynamics

__all__ = ["calibrate_contact", "contact_columns", "model_sha256", "residuals"]


def residuals(platform: Platform, episodes: Sequence[Episode],
              preds: Sequence[dict[str, np.ndarray]], tare_seconds: float) -> list[np.ndarray]:
    """Per episode: tau_ext (T, n) from the model's ``tau``
    (:func:`nactuator.contact.episode_residual`: causal, NaN on the warm-up and tare frames;
    what ``live --contact`` computes frame by frame)."""
    dyn = ArmDynamics.for_platform(platform)
    return [episode_residual(dyn, np.asarray(ep.frames["q"], np.float64),
                             np.asarray(ep.frames["qd"], np.float64), p["tau"],
                             platform.control_dt, tare_seconds)
            for ep, p in zip(episodes, preds, strict=True)]


def _predict(ckpt, data, split):
    actuator, _, platform, episodes = load_filtered(ckpt, data, split)
    return platform, episodes, predict_episodes(actuator, episodes)


def calibrate_contact(ckpt: str | os.PathLike, data, out: str | os.PathLike,
                      split: str | None = None, tare_seconds: float = 0.0) -> str:
    """Thresholds of the contact detector from the no-contact runs of ``data`` with the
    model ``ckpt``; writes ``out`` (:class:`ContactCalibration`) and returns a summary."""
    if tare_seconds < 0:
        raise EvalDataError(f"--tare-seconds must be >= 0, got {tare_seconds}")
    platform, episodes, preds = _predict(ckpt, data, split)
    cfg = load_contact_config(platform)
    surf = LinkSurfaces.build(platform, cfg)
    quiet = [i for i, ep in enumerate(episodes) if is_no_contact(ep)]
    if not quiet:
        raise EvalDataError(f"{', '.join(str(p) for p in dataset_paths(data))}: no no-contact "
                            "episode (every one has a force or contact label above "
                            "the contact threshold); calibrate on contact-free runs")
    res = residuals(platform, [episodes[i] for i in quiet], [preds[i] for i in quiet],
                    tare_seconds)
    joints = int(surf.last_joint.max()) + 1  # the joints that move a contact link
    idle = np.concatenate([r[:, :joints] for r in res])
    idle = idle[np.isfinite(idle).all(axis=1)]
    q, m = float(cfg["threshold_quantile"]), float(cfg["threshold_margin"])
    thr = calibrate_threshold(idle, q, m)
    calib = ContactCalibration(
        platform=platform.name, threshold=[float(x) for x in thr],
        tare_seconds=float(tare_seconds), model=str(ckpt), model_sha256=model_sha256(ckpt),
        quantile=q, margin=m, frames=int(idle.shape[0]),
        data=[str(p) for p in dataset_paths(data)])
    calib.save(out)
    names = platform.channel_names[:joints]
    return "\n".join([
        f"contact calibrate: {len(quiet)} no-contact episode(s) of {len(episodes)}, "
        f"{idle.shape[0]} frames, model {ckpt}, tare {tare_seconds:g} s",
        "thresholds [N m]: " + ", ".join(f"{n} {t:.4f}" for n, t in zip(names, thr,
                                                                          strict=True)),
        f"flagged on these frames (in-sample): {100 * detect(idle, thr).mean():.2f} %",
        f"written: {out}"])


def contact_columns(platform: Platform, episodes: Sequence[Episode],
                    preds: Sequence[dict[str, np.ndarray]], calib_path: str | os.PathLike,
                    ckpt: str | os.PathLike) -> tuple[dict[str, np.ndarray], list[str]]:
    """Per frame of all ``episodes``: ``contact_link`` (the MJCF body name; empty: none),
    ``contact_px/py/pz`` (m, in that body's frame), ``contact_fx/fy/fz`` (N, base frame,
    environment on robot); and summary lines (against contact labels where there are any)."""
    cfg = load_contact_config(platform)
    surf = LinkSurfaces.build(platform, cfg)
    calib = check_calibration(calib_path, ContactCalibration.load(calib_path), platform, ckpt,
                              surf)
    thr = np.asarray(calib.threshold)
    res = residuals(platform, episodes, preds, calib.tare_seconds)
    settings = estimator_settings(cfg)
    est = [estimate_recording(surf, np.asarray(ep.frames["q"], np.float64), r, thr,
                              float(cfg["friction"]), settings)
           for ep, r in zip(episodes, res, strict=True)]
    link = np.concatenate([e["link"] for e in est])
    names = np.array([*surf.names, ""], dtype=object)  # -1 (no contact) -> ""
    point = np.concatenate([e["point_local"] for e in est])
    force = np.concatenate([e["force"] for e in est])
    cols = {"contact_link": names[link]}
    cols.update({f"contact_p{a}": point[:, i] for i, a in enumerate("xyz")})
    cols.update({f"contact_f{a}": force[:, i] for i, a in enumerate("xyz")})
    lines = [f"contact ({calib_path}): {100 * (link >= 0).mean():.1f} % of frames flagged; "
             + ", ".join(f"{n} {int((link == k).sum())}" for k, n in enumerate(surf.names))]
    labels = [ep.frames.get("contact_link") for ep in episodes]
    if any(lb is not None and np.isfinite(lb).any() for lb in labels):
        truth = np.concatenate([np.full(ep.length, np.nan) if lb is None
                                else np.asarray(lb, float).reshape(-1)
                                for ep, lb in zip(episodes, labels, strict=True)])
        body_to_link = {int(b): k for k, b in enumerate(surf.bodies)}
        on = np.isfinite(truth)
        true_link = np.array([body_to_link.get(int(b), -2) for b in truth[on]])
        lines.append(f"  labelled contact frames {int(on.sum())}: flagged "
                     f"{100 * (link[on] >= 0).mean():.1f} %, right link "
                     f"{100 * (link[on] == true_link).mean():.1f} %; unlabelled frames "
                     f"flagged {100 * (link[~on] >= 0).mean():.2f} %")
    return cols, lines
