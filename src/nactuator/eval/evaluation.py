"""``evaluate``: checkpoint + dataset split -> metrics.json, metrics.md and PNG plots.

Top to bottom: load the actuator and its platform, read the split (and the train split for
the linear force reference), roll every episode out open loop through the simulator,
score each episode, aggregate per task then over tasks, write the files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nactuator.atomic import json_safe, write_json, write_text
from nactuator.data.episodes import dataset_paths, filter_episode
from nactuator.data.references import LinearForceReference, is_worse, verdict
from nactuator.eval import metrics as M
from nactuator.eval.episodes import (
    EvalDataError,
    is_no_contact,
    load_episodes,
    load_with_sources,
)
from nactuator.eval.infer import predict_episodes
from nactuator.eval.intervals import (
    SCORES_FILE,
    interval_markdown,
    interval_report,
    interval_scores,
    write_scores,
)
from nactuator.eval.plots import plot_force, plot_joints
from nactuator.eval.protocol import episode_rollouts, score_episode
from nactuator.eval.report import markdown_report
from nactuator.models import load_model
from nactuator.platforms import load_platform

__all__ = ["LINEAR_RIDGE", "MAX_PLOTTED_EPISODES", "evaluate"]

LINEAR_RIDGE = 1e-6  # "tiny λ": only there to keep collinear telemetry solvable
MAX_PLOTTED_EPISODES = 12  # plots are for looking at, not for every episode of a big split




def actuator_scale(actuator) -> float:
    """The interval half-width in σ a loaded model uses: a checkpoint's
    ``interval_scale``, an export's metadata calibration, else the Gaussian 1.645."""
    from nactuator.uncertainty import GAUSSIAN_Z90

    scale = getattr(actuator, "interval_scale", None)
    if scale is not None:
        return float(scale)
    calibration = (getattr(actuator, "metadata", None) or {}).get("uncertainty")
    return float(calibration["scale"]) if calibration else GAUSSIAN_Z90


RESIDUAL_DEFINITION = ("the end-effector force that explains ID(q, qd, qdd) + damping qd - "
                       "tau by least squares over the end effector's chain: the model's "
                       "causal torque on recorded state, the nominal arm and the simulator's "
                       "joint damping, causal velocity filter, not tared")


def add_residual_force(platform, episodes: Sequence, causal: list[dict]) -> None:
    """Adds ``force_residual`` (T, 3) to each episode's causal outputs (in place): the
    end-effector force :func:`nactuator.contact.residual_ee_force` reads from the model's
    ``tau`` at the recorded state."""
    from nactuator.contact import residual_ee_force
    from nactuator.sim.dynamics import ArmDynamics

    dyn = ArmDynamics.for_platform(platform)
    damping = np.array([c.damping for c in platform.channels])
    for ep, out in zip(episodes, causal, strict=True):
        out["force_residual"] = residual_ee_force(
            dyn, np.asarray(ep.frames["q"], np.float64), np.asarray(ep.frames["qd"], np.float64),
            np.asarray(out["tau"], np.float64), platform.control_dt, damping)


def verdict_figures(mean: dict, arm: list[int]) -> dict[str, float]:
    """The verdict's figures from an aggregate's ``mean`` block: arm-mean joint error of the
    model and of command following (full trajectory, deg), force 3-axis MAE of the model
    and of the linear regression (N), where they exist."""
    figures: dict[str, float] = {}
    joints = mean.get("joints", {})
    model, command = (joints.get(k, {}).get("full") for k in ("model", "command_following"))
    if arm and model is not None and command is not None:
        picked = [(model[i], command[i]) for i in arm]
        if all(m is not None and c is not None for m, c in picked):
            figures["joints_deg"] = float(np.mean([m for m, _ in picked]))
            figures["joints_command_deg"] = float(np.mean([c for _, c in picked]))
    force = mean.get("force", {})
    model, linear = (force.get(k, {}).get("full") for k in ("model", "linear_regression"))
    if model and linear and model.get("mae") is not None and linear.get("mae") is not None:
        figures["force_n"], figures["force_reference_n"] = model["mae"], linear["mae"]
    return figures


def _linear_reference(data, platform, filters: dict, cv: tuple[int, int] | None,
                      tasks: set[str] | None = None
                      ) -> tuple[LinearForceReference | None, dict]:
    """The linear force reference fitted on the train split; ``tasks`` (if given) gets
    the train split's task names (seen / unseen task of the interval report)."""
    train = [filter_episode(ep, filters)
             for ep in load_episodes(data, platform, "train", cv)]
    if tasks is not None:
        tasks.update(ep.task for ep in train)
    if not train:
        return None, {"unavailable": "the dataset has no train split to fit it on"}
    try:
        ref = LinearForceReference.fit(train, ridge=LINEAR_RIDGE)
    except EvalDataError as err:
        return None, {"unavailable": str(err)}
    return ref, {"ridge": LINEAR_RIDGE, "train_episodes": len(train),
                 "train_frames": ref.train_frames}


def _baselines(names, settings, data, platform, episodes, per_episode, rollouts, causal,
               horizons, cv) -> dict:
    """Fit the classical baselines on the train split and add their rows (in place) to
    ``per_episode``, beside the model's rollout and causal (recorded-state) rows; returns
    what they were and the fitted baselines (the force plots draw them)."""
    from nactuator.eval.baselines import fit_baselines, score_baselines

    t0 = time.perf_counter()
    fitted = fit_baselines(load_episodes(data, platform, "train", cv), platform, names,
                           settings)
    condition = score_baselines(fitted, episodes, per_episode, horizons, rollouts, causal)
    return {"methods": list(names), "fit": fitted.info, "condition": condition,
            "wall_time_s": time.perf_counter() - t0}, fitted


def _compare(ckpt, platform, recorded, per_episode, scales, horizons, device) -> dict:
    """Roll a second checkpoint out on the same episodes; adds its joint rows (``compare``)
    to ``per_episode`` in place and returns what it was."""
    from nactuator.sim import Simulator

    other, meta = load_model(ckpt, map_location=device)
    if meta["platform"] != platform.name:
        raise EvalDataError(f"--compare {ckpt} is for platform {meta['platform']!r}, the "
                            f"evaluated checkpoint for {platform.name!r}")
    episodes = [filter_episode(ep, meta["input_filters"]) for _, ep in recorded]
    rollouts = episode_rollouts(other, Simulator(platform, device=device), episodes, device=device)
    for row, ep, ro in zip(per_episode, episodes, rollouts, strict=True):
        q_true = ep.frames["q"][1:].astype("float64")
        errors = M.prefix_mae(abs(ro.q[1:] - q_true) * scales, horizons)
        row["joints"]["compare"] = {k: v.tolist() for k, v in errors.items()}
    return {"checkpoint": str(ckpt), "mode": other.mode, "weights": meta.get("weights")}


def _group(per_episode: list[dict], tasks: set[str]) -> dict | None:
    chosen = [e for e in per_episode if e["task"] in tasks]
    return M.aggregate(chosen) if chosen else None


def evaluate(ckpt: str | os.PathLike, data: str | os.PathLike | Sequence[str],
             split: str = "test", out: str | os.PathLike = "eval", device: str = "cpu",
             horizons: Sequence[int] = M.HORIZONS, cv: tuple[int, int] | None = None,
             baselines: str | Sequence[str] | None = None,
             baselines_config: str | os.PathLike | None = None,
             compare: str | os.PathLike | None = None,
             residual_force: bool | None = None, known_load: bool = False) -> str:
    """Run the published protocol on every episode of ``split``; returns ``metrics.md``.

    Writes ``metrics.json`` (every per-episode, per-task and mean figure), ``metrics.md``
    and PNG plots into ``out``. ``cv = (folds, fold)`` evaluates with the splits of that
    cross-validation fold (its held-out runs are ``split="test"``). ``baselines`` (``"all"``
    or e.g. ``"id-linear,gmo,svm"``) adds the classical baselines, fitted on the train split
    of ``data``, as rows of the same tables (``nactuator.eval.baselines``;
    ``baselines_config`` is a partial YAML merged onto ``conf/eval/baselines.yaml``).
    ``compare`` is a second checkpoint of the same platform rolled out on the same episodes
    (joint rows ``compare``), e.g. a counterfactual model beside a telemetry-conditioned one:
    the report names each checkpoint's mode (docs/counterfactual.md). ``residual_force``
    adds the ``model_residual`` force rows: the end-effector force read from the model's
    torque through the nominal inverse dynamics on the recorded state
    (:func:`nactuator.contact.residual_ee_force` with the platform's joint damping,
    causal); None (default): on for a model
    trained with ``model.external_torque`` (its ``tau`` is the motor's share, so the
    residual holds the load), off otherwise. ``known_load`` applies each episode's
    labelled end-effector force in the rollout's simulator steps (the simulation is told
    the payload, as such a model was trained); off: the protocol. Raises
    :class:`EvalDataError` for data that cannot be evaluated with this checkpoint (other
    platform, a missing input channel, empty split).
    """
    from nactuator.eval.baselines import load_settings, parse_baselines
    from nactuator.sim import Simulator

    baseline_names = parse_baselines(baselines)
    baseline_settings = load_settings(baselines_config) if baseline_names else None

    t0 = time.perf_counter()
    out = Path(out)
    actuator, meta = load_model(ckpt, map_location=device)  # checkpoint or export
    platform = load_platform(meta["platform"])
    if actuator.n_motors != platform.n:
        raise EvalDataError(f"{ckpt}: the model drives {actuator.n_motors} motors but platform "
                            f"{platform.name!r} has {platform.n}")
    # The model sees its inputs exactly as in training and live (the bundle's causal input
    # filters), in the rollout and on the recorded-state (infer) path alike.
    filters = meta["input_filters"]
    recorded = load_with_sources(data, platform, split, cv)
    sources = [(path, filter_episode(ep, filters)) for path, ep in recorded]
    episodes = [ep for _, ep in sources]
    if not episodes:
        where = ", ".join(str(p) for p in dataset_paths(data))
        raise EvalDataError(f"{where}: no episodes in split {split!r}")
    train_tasks: set[str] = set()
    linear, linear_info = _linear_reference(data, platform, filters, cv, train_tasks)

    scales, units = M.channel_scales([c.kind for c in platform.channels])
    sim = Simulator(platform, device=device)
    # Every episode of the split in one batch (eval mode, no autograd: deterministic).
    rollouts = episode_rollouts(actuator, sim, episodes, device=device, known_load=known_load)
    # The deployment path on the same episodes and inputs: recorded state, no simulator.
    causal = predict_episodes(actuator, episodes)
    if residual_force is None:
        residual_force = bool((meta.get("training_config") or {}).get("external_torque"))
    if residual_force:
        add_residual_force(platform, episodes, causal)

    intervals = None
    if "force_lo" in causal[0]:  # the uncertainty head: coverage of the 90 % interval
        known_tasks = train_tasks or None
        intervals = interval_report(episodes, causal, actuator_scale(actuator),
                                    meta.get("uncertainty"), known_tasks)
        write_scores(out / SCORES_FILE, interval_scores(episodes, causal, known_tasks))

    paths = dataset_paths(data)
    per_episode = []
    for (path, ep), ro, live in zip(sources, rollouts, causal, strict=True):
        scores = score_episode(ep, ro, scales, linear, horizons, causal=live)
        per_episode.append({"dataset": str(path), **scores})
    compared = None
    if compare is not None:
        compared = _compare(compare, platform, recorded, per_episode, scales, horizons, device)
    baseline_result = fitted = None
    if baseline_names:
        baseline_result, fitted = _baselines(baseline_names, baseline_settings, data, platform,
                                             episodes, per_episode, rollouts, causal, horizons,
                                             cv)
    quiet_tasks = {e.task for e in episodes} - {e.task for e in episodes if not is_no_contact(e)}
    aggregate = {
        "all": M.aggregate(per_episode),
        "contact": _group(per_episode, {e.task for e in episodes} - quiet_tasks),
        "no_contact": _group(per_episode, quiet_tasks),
    }
    figures = verdict_figures(aggregate["all"]["mean"], platform.arm_indices)
    notes = []
    if known_load:
        notes.append("known load: the rollout's simulated state moves under the labelled "
                     "force, so its force rows ('model') see the label: not a force estimate "
                     "(the causal and residual rows read the recorded state only)")
    for h in horizons:
        short = [e for e in episodes if e.length - 1 < h]
        if short:
            notes.append(f"horizon @{h} skipped for {len(short)} of {len(episodes)} episode(s) "
                         f"shorter than {h} steps (shortest: {min(e.length for e in short) - 1})")

    plots = []
    for (path, ep), ro in list(zip(sources, rollouts, strict=True))[:MAX_PLOTTED_EPISODES]:
        # Episode indices repeat across datasets; prefix the dataset's position if several.
        stem = f"episode_{ep.index:03d}"
        if len(paths) > 1:
            stem = f"data{paths.index(path)}_{stem}"
        plots.append(plot_joints(ep, ro, platform.channel_names, scales, units,
                                 out / f"{stem}_joints.png", platform.control_dt))
        lin = linear.predict(ep) if linear is not None else None
        classical = fitted.force_estimates(ep) if fitted is not None else None
        plots.append(plot_force(ep, ro, out / f"{stem}_force.png", platform.control_dt, lin,
                                classical))

    result = {
        "checkpoint": str(ckpt),
        "mode": actuator.mode,
        **({"compare": compared} if compared is not None else {}),
        "weights": meta.get("weights"),
        "data": [str(p) for p in paths],
        "split": split,
        **({"known_load": True} if known_load else {}),
        "cv": None if cv is None else {"folds": cv[0], "fold": cv[1]},
        "platform": platform.name,
        "device": device,
        "episodes": len(episodes),
        "steps": int(sum(e.length - 1 for e in episodes)),
        "horizons": list(horizons),
        "channels": [{"name": c.name, "kind": c.kind, "unit": u}
                     for c, u in zip(platform.channels, units, strict=True)],
        "arm_indices": platform.arm_indices,
        "references": {"command_following": {"definition": "q[i+1] predicted as q_cmd[i]"},
                       "model_causal": {"definition": "the model on recorded state (no "
                                        "simulator): the `infer`/`live` path"},
                       **({"model_residual": {"definition": RESIDUAL_DEFINITION}}
                          if residual_force else {}),
                       "linear_regression": linear_info},
        "input_filters": filters,
        **({"baselines": baseline_result} if baseline_result is not None else {}),
        "notes": notes,
        "verdict": {"line": verdict(figures, "linear regression"),
                    "worse_than_a_reference": is_worse(figures), **figures},
        "aggregate": aggregate,
        **({"uncertainty": intervals} if intervals is not None else {}),
        "per_episode": per_episode,
        "plots": [p.name for p in plots],
        "wall_time_s": time.perf_counter() - t0,
    }
    result = json_safe(result)  # NaN -> None: "n/a" in the table, null in the JSON
    text = markdown_report(result)
    if intervals is not None:
        text += interval_markdown(result["uncertainty"])
    write_json(out / "metrics.json", result)
    write_text(out / "metrics.md", text)
    return text
