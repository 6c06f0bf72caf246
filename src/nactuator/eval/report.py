"""Markdown tables of an evaluation's metrics (the ``metrics.md`` the CLI prints)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["baseline_report", "markdown_report"]

_METHOD_NAMES = {
    "model": "model",
    "compare": "compared checkpoint (--compare)",
    "command_following": "command following (q = goal)",
    "linear_regression": "linear regression (train split)",
    # classical baselines (eval/baselines) and the model beside them on the recorded state
    "model_causal": "model (causal, recorded state)",
    "model_residual": "model torque residual ID - tau (causal, end-effector least squares)",
    "model_rollout": "model (rollout)",
    "id-linear": "ID-Linear (classical)",
    "id-friction": "ID-Friction (classical)",
    "gmo": "momentum observer (classical)",
    "gmo-friction": "momentum observer + friction (classical)",
    "threshold": "threshold on mean \\|effort\\| (classical)",
    "svm": "SVM-RBF (classical)",
    "random-forest": "random forest (classical)",
}


def _num(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def _pct(x) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:.1f} %"


def _mean(values) -> float | None:
    """Mean of reported numbers; None (shown as —) if any is missing, e.g. a diverged run."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def _max(values) -> float | None:
    return None if not values or any(v is None for v in values) else max(values)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _horizons(block: Mapping) -> list[str]:
    """Horizon keys present in a {method: {horizon: ...}} block, in protocol order."""
    keys: list[str] = []
    for per_method in block.values():
        keys.extend(k for k in per_method if k not in keys)
    return sorted(keys, key=lambda k: (k == "full", int(k[1:]) if k != "full" else 0))


def joint_table(joints: Mapping, names: Sequence[str], units: Sequence[str],
                arm: Sequence[int]) -> list[str]:
    header = ["horizon", "method"] + [f"{n} ({u})" for n, u in zip(names, units, strict=True)]
    header += ["arm mean (deg)", "worst arm joint (deg)"]
    rows = []
    for h in _horizons(joints):
        for method, per_h in joints.items():
            if h not in per_h:
                continue
            v = per_h[h]
            arm_vals = [v[i] for i in arm]
            rows.append([h, _METHOD_NAMES.get(method, method)] + [_num(x) for x in v]
                        + [_num(_mean(arm_vals)), _num(_max(arm_vals))])
    return _table(header, rows)


def force_table(force: Mapping) -> list[str]:
    rows = []
    for h in _horizons(force):
        for method, per_h in force.items():
            if h in per_h:
                r = per_h[h]
                rows.append([h, _METHOD_NAMES.get(method, method), _num(r["mae"], 3),
                             _num(r["mae_z"], 3)] + [_num(x, 3) for x in r["mae_axes"]])
    return _table(["horizon", "method", "3-axis MAE (N)", "force-z MAE (N)", "x", "y", "z"],
                  rows)


def _binary_rows(name: str, m: Mapping) -> list[str]:
    # With one class only, accuracy is that class's hit rate: not shown as a score.
    accuracy = "n/a" if m["n"] and m["positives"] in (0, m["n"]) else _pct(m["accuracy"])
    return [name, str(m["n"]), str(m["positives"]), accuracy, _pct(m["precision"]),
            _pct(m["recall"]), _pct(m["f1"]), _num(m["auc"], 3)]


def one_class_note(name: str, m: Mapping, positive: str, unit: str = "frames",
                   negative: str = "nominal") -> str | None:
    """The line that explains an "n/a" accuracy: no ``positive`` among the ``m["n"]``
    labelled ``unit``, so only the specificity (negatives called negative) is measured; or
    no ``negative``, so only the recall is."""
    if not m["n"] or 0 < m["positives"] < m["n"]:
        return None
    if m["positives"] == m["n"]:
        return (f"- {name}: every one of the {m['n']} labelled {unit} is a {positive}, none "
                f"{negative}: accuracy would only be the recall ({_pct(m['recall'])}), so it "
                f"reads n/a; false alarms cannot be measured here.")
    specificity = m.get("specificity")
    if specificity is None:  # a result written before specificity was reported
        specificity = m["accuracy"]
    return (f"- {name}: no {positive} in these episodes ({m['n']} labelled {unit}, none "
            f"{positive}): accuracy would only be the nominal-class rate, so it reads n/a; "
            f"specificity (called nominal) {_pct(specificity)}. Precision, recall, F1 and "
            f"AUC need at least one {positive}.")


def markdown_report(result: Mapping) -> str:
    """The whole ``metrics.md`` from an evaluation result dict (see ``evaluation.evaluate``)."""
    names = [c["name"] for c in result["channels"]]
    units = [c["unit"] for c in result["channels"]]
    arm = result["arm_indices"]
    agg = result["aggregate"]
    lines = [f"# Evaluation of `{result['checkpoint']}`", ""]
    if result.get("verdict"):
        v = result["verdict"]
        warn = (" — **the model is no better than a trivial reference here**"
                if v.get("worse_than_a_reference") else "")
        lines += [f"**Verdict (arm mean, full trajectory):** {v['line']}{warn}", ""]
    if result.get("mode"):
        lines.append(f"- model mode: **{result['mode']}** (counterfactual: commands, "
                     "simulated state and pre-execution conditions only; telemetry: replays "
                     "the recorded effort telemetry)")
    if result.get("compare"):
        c = result["compare"]
        lines.append(f"- compared checkpoint (rows 'compared checkpoint'): `{c['checkpoint']}`"
                     f", mode **{c['mode']}**, rolled out on the same episodes")
    if result.get("known_load"):
        lines.append("- **known load** (`--known-load`, not the protocol): every rollout step "
                     "applies the episode's labelled end-effector force as J_ee(q)^T f")
    lines += [
        f"- data: {', '.join(f'`{d}`' for d in result['data'])}; split **{result['split']}**; "
        f"platform **{result['platform']}**",
        f"- {result['episodes']} episode(s) in {len(agg['all']['tasks'])} task(s); "
        f"{result['steps']} rollout steps; {result['wall_time_s']:.1f} s on {result['device']}",
        "- protocol: one open-loop rollout per episode from frame 0 (q = recorded q[0], "
        "qd = 0, zero-padded window; recorded commands/telemetry, simulated state slots); "
        "joints of step i are scored against frame i+1, its force/gate/condition against "
        "frame i (the window's current frame, as in training); MAE @W = mean over the first "
        "W steps; mean over each task's episodes, then over tasks.",
        "- force: mean over the 3 axes and time, unlabelled → 0 N (the reference convention).",
        f"- inputs through the checkpoint's causal input filters, for model and reference: "
        f"{_describe_filters(result.get('input_filters'))}.",
    ]
    lin = result["references"]["linear_regression"]
    if "unavailable" in lin:
        lines.append(f"- linear force regression: unavailable ({lin['unavailable']})")
    else:
        lines.append(f"- linear force regression: ridge λ={lin['ridge']:g} on "
                     f"{lin['train_episodes']} train episode(s), {lin['train_frames']} frames")
    for note in result.get("notes", []):
        lines.append(f"- {note}")

    mean = agg["all"]["mean"]
    lines += ["", "## Joint rollout MAE (mean over tasks)", ""]
    lines += joint_table(mean["joints"], names, units, arm)

    groups = [("all tasks", agg["all"])]
    if agg.get("contact") and agg.get("no_contact"):
        groups = [("contact tasks", agg["contact"]), ("no-contact tasks", agg["no_contact"]),
                  ("all tasks", agg["all"])]
    for title, g in groups:
        lines += ["", f"## Force MAE — {title} (mean over tasks)", ""]
        lines += force_table(g["mean"]["force"])

    payload = mean.get("payload")
    if payload:
        lines += ["", "## Payload read from the force during the carry (mean over tasks)", ""]
        rows = [[_METHOD_NAMES.get(k, k), _num(v["mass_g"], 0), _num(v["abs_error_g"], 0)]
                for k, v in payload.items() if isinstance(v, Mapping)]
        lines += _table([f"method (true {_num(payload['true_g'], 0)} g, "
                         f"{_num(payload['carry_frames'], 0)} frames)", "mass (g)",
                         "\\|error\\| (g)"], rows)

    binary_rows, notes = [], []
    if "gate" in mean:
        binary_rows.append(_binary_rows("contact gate (\\|f\\| > 0.01 N)", mean["gate"]))
        notes.append(one_class_note("contact gate", mean["gate"], "contact",
                                    negative="free of contact"))
    if "condition" in mean:
        binary_rows.append(_binary_rows("condition (c < 0.5 = degraded)", mean["condition"]))
        notes.append(one_class_note("condition", mean["condition"], "degraded motor"))
    if binary_rows:
        lines += ["", "## Classification (labelled frames, mean over tasks)", ""]
        lines += _table(["head", "frames", "positives", "accuracy", "precision", "recall", "F1",
                         "AUC"], binary_rows)
        if any(notes):
            lines += [""] + [note for note in notes if note]

    lines += ["", "## No contact", ""]
    fc = mean["false_contact"]
    rows = []
    if fc["frames"]:
        rows.append(["frames with no contact (labelled ≤ 0.01 N, or a no-contact run)",
                     str(fc["frames"]), _pct(fc["false_contact_rate"]),
                     _num(fc["mean_force_norm"], 3), "—"])
    un = mean.get("unlabelled_frames")
    if un and un["frames"]:
        rows.append(["unlabelled frames of labelled runs (0 N by convention)",
                     str(un["frames"]), _pct(un["false_contact_rate"]),
                     _num(un["mean_force_norm"], 3), "—"])
    if agg.get("no_contact"):
        nc = agg["no_contact"]["mean"]["no_contact_run"]
        lin_norm = nc.get("linear_regression", {}).get("mean_force_norm")
        rows.append(["no-contact runs (whole episode)", str(nc["model"]["frames"]),
                     _pct(nc["model"]["false_contact_rate"]),
                     _num(nc["model"]["mean_force_norm"], 3), _num(lin_norm, 3)])
        if "model_causal" in nc:
            rows.append(["no-contact runs, causal (infer/live)",
                         str(nc["model_causal"]["frames"]),
                         _pct(nc["model_causal"]["false_contact_rate"]),
                         _num(nc["model_causal"]["mean_force_norm"], 3), "—"])
    if rows:
        lines += _table(["frames", "n", "false-contact rate (gate > 0.5)",
                         "model mean \\|f̂\\| (N)", "linear mean \\|f̂\\| (N)"], rows)
    else:
        lines.append("No frame of this split is known to be free of contact.")

    lines += ["", "## Per task (full trajectory)", ""]
    rows = []
    for task, m in agg["all"]["tasks"].items():
        jm, jc = m["joints"]["model"]["full"], m["joints"]["command_following"]["full"]
        f = m["force"]
        rows.append([f"`{task}`", str(m["episodes"]), str(m["steps"]),
                     _num(_mean([jm[i] for i in arm])),
                     _num(_mean([jc[i] for i in arm])),
                     _num(f["model"]["full"]["mae"], 3),
                     _num(f.get("linear_regression", {}).get("full", {}).get("mae"), 3)])
    lines += _table(["task", "episodes", "steps", "model arm MAE (deg)",
                     "command following (deg)", "model force MAE (N)", "linear force MAE (N)"],
                    rows)
    if result.get("baselines"):
        lines += [""] + baseline_report(result)
    return "\n".join(lines) + "\n"


def negative_kt_note(calibration: Mapping, friction: Mapping) -> str | None:
    """Why a calibrated Kt can be negative, naming the joints where one is."""
    joints = [c for c, j in calibration.items()
              if j["kt"] < 0 or (friction.get(c) or {}).get("kt", 0.0) < 0]
    if not joints:
        return None
    guessed = [c for c in joints if calibration[c]["mode"] != "effort-on-torque"]
    text = (f"Kt < 0 on {', '.join(joints)}: on the free-motion frames the effort register "
            "and tau_ID have opposite signs. ")
    if guessed:
        text += (f"On {', '.join(guessed)} (fit `torque-on-effort`: \\|r(u, tau_ID)\\| below "
                 "`calibration.min_correlation`) the slope is not identified and its sign "
                 "means nothing. ")
    return text + ("Where it is identified, the register counts the other way round from the "
                   "joint's torque: the STS3215 (SO-101) Present_Load reads positive while the "
                   "servo drives towards lower positions, on every joint; the synthetic SO-101 "
                   "world, which encodes the register as the real servos do, calibrates to "
                   "Kt < 0 too. The classical force rows apply the signed Kt as fitted "
                   "(docs/evaluation.md).")


def _nc_cells(m: Mapping | None) -> list[str]:
    if not m or not m.get("frames"):
        return ["—", "—", "—"]
    return [str(m["frames"]), _pct(m["false_contact_rate"]), _num(m["mean_force_norm"], 3)]


def baseline_report(result: Mapping) -> list[str]:
    """The "Classical baselines" section: fits, contact decisions and condition windows.

    Their force rows sit in the force tables above (same protocol, same labels)."""
    b = result["baselines"]
    fit = b["fit"]
    names = [c["name"] for c in result["channels"]]
    agg = result["aggregate"]
    lines = ["## Classical baselines (fitted on the train split, recorded state, causal)", ""]
    lines.append(f"- methods: {', '.join(b['methods'])}; settings `{fit.get('settings')}`; "
                 f"{fit.get('train_episodes')} train episode(s); fit and scoring "
                 f"{b['wall_time_s']:.1f} s")
    for m in b["methods"]:
        if "unavailable" in fit.get(m, {}):
            lines.append(f"- {_METHOD_NAMES.get(m, m)}: unavailable ({fit[m]['unavailable']})")
    force = fit.get("force")
    if force:
        lines.append(f"- force rows in the tables above: f = (J_v^T)^+ tau_ext over "
                     f"{', '.join(force['arm_channels'])} (damping {force['damping']:g} m); "
                     f"contact when \\|f̂\\| > {force['contact_threshold_n']:g} N; "
                     f"armature {', '.join(f'{a:g}' for a in fit['armature'])}")
    cal = fit.get("calibration")
    if cal:
        fr = fit.get("friction", {}).get("joints", {})
        lines += ["", f"### Current-to-torque calibration ({cal['frames']} free-motion frames)",
                  ""]
        rows = []
        for c in names:
            j = cal["joints"][c]
            f = fr.get(c)
            rows.append([c, _num(j["kt"], 3), _num(j["bias"], 3), _num(j["correlation"], 2),
                         j["mode"], _num(j["rms"], 3)]
                        + ([_num(f["kt"], 3), _num(f["bias"], 3), _num(f["coulomb"], 3),
                            _num(f["viscous"], 3), _num(f["stribeck"], 3),
                            _num(f["stribeck_velocity"], 2), _num(f["deadzone"], 3),
                            _num(f["rms"], 3)] if f else ["—"] * 8))
        lines += _table(["joint", "Kt", "b", "r(u, tau_ID)", "fit", "residual RMS",
                         "friction: Kt", "b", "Fc", "Fv", "Fs", "vs", "dead zone",
                         "residual RMS"], rows)
        note = negative_kt_note(cal["joints"], fr)
        if note:
            lines += ["", note]
    mean = agg["all"]["mean"].get("baselines", {})
    methods = [m for m in (*b["methods"], "model_causal")
               if m in mean.get("no_contact_frames", {})]
    if methods:
        quiet = agg.get("no_contact", {}) or {}
        runs = quiet.get("mean", {}).get("baselines", {}).get("no_contact_run", {}) \
            if quiet else {}
        lines += ["", "### No contact: false-contact rate and mean \\|f̂\\| (mean over tasks)",
                  "", "Classical methods call contact when \\|f̂\\| exceeds the threshold "
                  "above; the model when its gate > 0.5.", ""]
        rows = []
        for m in methods:
            rows.append([_METHOD_NAMES.get(m, m)]
                        + _nc_cells(mean.get("no_contact_frames", {}).get(m))
                        + _nc_cells(runs.get(m))
                        + _nc_cells(mean.get("unlabelled_frames", {}).get(m)))
        lines += _table(["method", "no-contact frames", "false contacts", "mean \\|f̂\\| (N)",
                         "no-contact runs", "false contacts", "mean \\|f̂\\| (N)",
                         "unlabelled frames", "false contacts", "mean \\|f̂\\| (N)"], rows)
    cond = b.get("condition") or {}
    if "unavailable" in cond:
        lines += ["", f"Condition baselines: unavailable ({cond['unavailable']})."]
    elif cond.get("methods"):
        info = fit.get("condition", {})
        lines += ["", f"### Motor condition per window ({info.get('window')} frames, stride "
                      f"{info.get('stride')}; channels {', '.join(info.get('channels', []))}; "
                      f"pooled over the split's windows)", ""]
        rows = [_binary_rows(_METHOD_NAMES.get(m, m), v) for m, v in cond["methods"].items()]
        lines += _table(["method", "windows", "degraded", "accuracy", "precision", "recall",
                         "F1", "AUC"], rows)
        first = next(iter(cond["methods"].values()))
        note = one_class_note("condition windows", first, "degraded motor", "windows")
        if note:
            lines += ["", note + " The same holds for every method in this table."]
        lines.append("")
        lines.append(f"Trained on {info.get('train_windows')} train windows "
                     f"({info.get('train_positives')} degraded). The model's window score is "
                     "the mean of 1 − c over the window's frames.")
    return lines


def _describe_filters(spec: dict | None) -> str:
    """One phrase for the input filter spec (nactuator.input_filters) in metrics.json."""
    if not spec:
        return "none recorded"
    median = ", ".join(f"{k} running median of {w} frames (trailing)"
                       for k, w in spec.get("median", {}).items()) or "no running median"
    return f"missing telemetry {spec.get('missing')}; {median}"
