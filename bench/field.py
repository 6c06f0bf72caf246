"""Learned Jacobian fields against rigid FK in closed loop (docs/results.md §9, "field").

For each collection seed (``--seeds``): random ±0.04 rad command perturbations held 16
steps at poses within ±0.3 rad of the track start pose, at each ``--fit-payload-g`` (one
dataset; 0.5 mm track noise), then one field per ``--variants`` entry fitted to it:
``q`` (the joints only), ``q+effort``, ``q+effort+error`` (the servos' load telemetry);
an ``fk:`` prefix fits the residual J_FK(q) + ΔJ_θ(obs), ``fk_scale:`` rigid FK's columns
scaled by 1 ± ½, and ``,signed`` after the prior one set of columns per step sign. Every
field and rigid FK track the circle at each ``--payload-g`` (the evaluation payloads, some
not fitted at), judged by the world's own end-effector; rigid FK is deterministic and runs
once. ``--check-poses`` scores each Jacobian against the world's own dx/du
(control.jacobian_check) at the start pose and seeded poses, per payload, as
bench/jacobian.py does. ``--out`` writes field.json and field.png (target vs tracked, the
first seed's fields).

``--gains`` (default: conf/track's one gain): with more than one, each method (rigid FK
once, each field per seed) first tracks ``--tune-path`` at ``--tune-payload-g`` at every
gain and keeps the gain of lowest rms; the evaluation then runs at that gain. The picked
gains and every tuning rms go into field.json (``tuning``) and the summary's gain column.
``--all-gains`` also evaluates every method at every gain (field.json ``all_gains``), and
the summary adds the oracle view: each method at the gain best for it on the evaluation
path itself at ``--oracle-payload-g`` (tuned on the test: an upper bound).

    .venv/bin/python bench/field.py [--seeds 0 1] [--fit-payload-g 0 300] [--out DIR]

``--fit-steps``, ``--poses`` and ``--path`` exist for the smoke test
(tests/test_bench_control.py); the defaults are the figures' settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from nactuator.control.field import collect_perturbations, fit_field, fk_priors
from nactuator.control.jacobian import Points, kinematic_jacobian
from nactuator.control.jacobian_check import world_dxdu
from nactuator.control.plants import WorldPlant
from nactuator.control.track import Tracker, read_path, run_tracking
from nactuator.control.track_run import load_track_config, plot_runs
from nactuator.paths import conf_dir
from nactuator.platforms import load_platform
from nactuator.sim import Simulator

KEYS = ("rms_mm", "mean_mm", "max_mm", "final_mm", "settling_s", "decide_p50_ms",
        "decide_p99_ms", "max_rate_hz")


def parse_variant(text: str) -> tuple[str, bool, tuple[str, ...]]:
    """``[PRIOR[,signed]:]q[+effort][+error]`` -> (prior, signed, observation)."""
    head, _, obs = text.rpartition(":")
    prior, _, flag = head.partition(",")
    return prior or "none", flag == "signed", tuple(obs.split("+"))


def sign_gains(data: dict, priors: np.ndarray, joints: list[int]) -> str:
    """Why a linear J explains so little: per payload, least-squares gains on rigid FK's
    columns (Δx ≈ Σ_j c_j J_FK[:, j] δu_j), one per joint, then one per joint and step
    sign; the fraction of Δx's variance (about zero) each explains."""
    lines = ["| payload [g] | R² one gain per joint | gains | R² one per joint and sign | "
             "gains δu > 0 | gains δu < 0 |", "|---|---|---|---|---|---|"]
    for g in sorted(set(data["payload_g"])):
        m = data["payload_g"] == g
        cols = priors[m][:, :, joints] * data["du"][m][:, None, :]  # (N, 3, k)
        y = data["dx"][m].reshape(-1)
        up = data["du"][m][:, None, :] >= 0
        fits = []
        for X in (cols, np.concatenate([np.where(up, cols, 0), np.where(up, 0, cols)], -1)):
            A = X.reshape(len(y), -1)
            c = np.linalg.lstsq(A, y, rcond=None)[0]
            fits.append((1 - ((y - A @ c) ** 2).sum() / (y ** 2).sum(), c))
        k = len(joints)
        lines.append(f"| {g:.0f} | {fits[0][0]:.2f} | {np.round(fits[0][1], 2).tolist()} | "
                     f"{fits[1][0]:.2f} | {np.round(fits[1][1][:k], 2).tolist()} | "
                     f"{np.round(fits[1][1][k:], 2).tolist()} |")
    return "\n".join(lines)


def summary(rows: list[dict], labels: list[str], payloads: list[float], seeds: list[int],
            gains: bool = False) -> str:
    """Per method and payload over the seeds: rms mean (min–max), the means of mean / max /
    final error, the longest settling, decision p50/p99 (median over seeds), and in how
    many seeds the field's rms beat rigid FK's at that payload; ``gains``: a last column
    with each seed's loop gain (rows' ``gain``, in seed order)."""
    out = [f"over seeds {seeds}: rms mean (min–max); mean, max, final: means over seeds",
           "| method | payload [g] | rms [mm] | mean [mm] | max [mm] | final [mm] | "
           "settling max [s] | decide p50/p99 [ms] | rms < rigid FK |"
           + (" gain |" if gains else ""),
           "|---|---|---|---|---|---|---|---|---|" + ("---|" if gains else "")]
    for g in payloads:
        fk = [r["rms_mm"] for r in rows if r["method"] == "kinematic" and r["payload_g"] == g]
        for label in labels:
            sel = [r for r in rows if r["method"] == label and r["payload_g"] == g]
            if not sel:
                continue
            v = {k: np.array([r[k] for r in sel], float) for k in KEYS}
            settle = ("—" if np.isnan(v["settling_s"]).any()
                      else f"{v['settling_s'].max():.2f}")
            wins = ("—" if label == "kinematic" or not fk else
                    f"{int((v['rms_mm'] < fk[0]).sum())}/{len(sel)}")
            out.append(f"| {label} | {g:.0f} | {v['rms_mm'].mean():.2f} "
                       f"({v['rms_mm'].min():.2f}–{v['rms_mm'].max():.2f}) | "
                       f"{v['mean_mm'].mean():.2f} | {v['max_mm'].mean():.2f} | "
                       f"{v['final_mm'].mean():.2f} | {settle} | "
                       f"{np.median(v['decide_p50_ms']):.1f}/{np.median(v['decide_p99_ms']):.1f}"
                       f" | {wins} |"
                       + (" " + " ".join(f"{r['gain']:g}" for r in sel) + " |" if gains
                          else ""))
    return "\n".join(out)


def pick_gains(runs: list[dict], payload_g: float) -> dict[tuple, float]:
    """(method, seed) -> the gain of lowest rms among ``runs`` at ``payload_g`` (the first
    such gain on ties)."""
    best: dict[tuple, dict] = {}
    for r in runs:
        key = (r["method"], r["seed"])
        if r["payload_g"] == payload_g and (key not in best
                                            or r["rms_mm"] < best[key]["rms_mm"]):
            best[key] = r
    return {k: r["gain"] for k, r in best.items()}


def tuning_table(tuning: list[dict], labels: list[str], gains: list[float]) -> str:
    """Tuning rms per method and gain: mean (min–max) over the seeds, and how many seeds
    picked that gain."""
    picked = pick_gains(tuning, tuning[0]["payload_g"])
    out = ["| tuning | " + " | ".join(f"gain {g:g}" for g in gains) + " |",
           "|---|" + "---|" * len(gains)]
    for label in labels:
        cells = []
        for g in gains:
            v = np.array([r["rms_mm"] for r in tuning if r["method"] == label
                          and r["gain"] == g])
            n = sum(1 for (m, _), pg in picked.items() if m == label and pg == g)
            cells.append("—" if not len(v) else f"{v.mean():.2f} ({v.min():.2f}–{v.max():.2f})"
                         + (f" ×{n}" if n else ""))
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def gain_views(saved: dict, labels: list[str], payloads: list[float]) -> str:
    """The tuning table, and (with ``all_gains``) the oracle view, of a field.json."""
    out = []
    tune = saved.get("tune")
    if tune and saved.get("tuning"):
        out += ["", f"tuning: {tune['path']} at {tune['payload_g']:g} g; rms [mm] mean "
                "(min–max) over seeds, ×n: picked in n seeds",
                tuning_table(saved["tuning"], labels, tune["gains"])]
    if saved.get("all_gains"):
        gains = saved["tune"]["gains"]
        out += ["", "every gain on the evaluation path: rms [mm] mean (min–max) over seeds, "
                "(n: seeds not settled)",
                "| method | payload [g] | " + " | ".join(f"gain {g:g}" for g in gains) + " |",
                "|---|---|" + "---|" * len(gains)]
        for label in labels:
            for pg in payloads:
                cells = []
                for g in gains:
                    sel = [r for r in saved["all_gains"] if r["method"] == label
                           and r["payload_g"] == pg and r["gain"] == g]
                    v = np.array([r["rms_mm"] for r in sel])
                    n = sum(r["stop"] != "settled" for r in sel)
                    cells.append("—" if not sel else f"{v.mean():.2f} ({v.min():.2f}–"
                                 f"{v.max():.2f})" + (f" ({n})" if n else ""))
                out.append(f"| {label} | {pg:.0f} | " + " | ".join(cells) + " |")
        g = saved["oracle_payload_g"]
        picked = pick_gains(saved["all_gains"], g)
        rows = [r for r in saved["all_gains"] if picked[(r["method"], r["seed"])] == r["gain"]]
        out += ["", f"oracle: each method at its best gain on the evaluation path at {g:g} g "
                "(tuned on the test)", summary(rows, labels, payloads, saved["seeds"], True)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--poses", type=int, default=96, help="per fit payload")
    ap.add_argument("--per-pose", type=int, default=8)
    ap.add_argument("--fit-payload-g", nargs="+", type=float, default=[0.0, 300.0])
    ap.add_argument("--payload-g", nargs="+", type=float, default=[0.0, 200.0, 400.0])
    ap.add_argument("--variants", nargs="+", default=["q", "q+effort+error"],
                    help="[PRIOR[,signed]:]q[+effort][+error] per field, PRIOR one of none, "
                         "fk, fk_scale")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="collection seeds")
    ap.add_argument("--fit-steps", type=int, default=3000, help="full-batch Adam steps")
    ap.add_argument("--horizon", type=int, default=None,
                    help="control steps each perturbation is held (default: conf/track's)")
    ap.add_argument("--check-poses", type=int, default=0,
                    help="score every J against the world's own dx/du at this many poses")
    ap.add_argument("--path", default=str(conf_dir() / "track" / "paths" / "so101_circle.csv"),
                    help="target path CSV (time, x, y, z)")
    ap.add_argument("--gains", nargs="+", type=float, default=None,
                    help="loop gains to tune over (default: conf/track's gain, no tuning)")
    ap.add_argument("--tune-path",
                    default=str(conf_dir() / "track" / "paths" / "so101_reach.csv"),
                    help="path CSV the gain is tuned on (with more than one --gains)")
    ap.add_argument("--tune-payload-g", type=float, default=300.0)
    ap.add_argument("--all-gains", action="store_true",
                    help="also evaluate every gain (the oracle view at --oracle-payload-g)")
    ap.add_argument("--oracle-payload-g", type=float, default=200.0)
    ap.add_argument("--out", default=None, help="folder for field.json and field.png")
    ap.add_argument("--summarise", default=None, metavar="FIELD_JSON",
                    help="print the summary table of a saved field.json and stop")
    a = ap.parse_args(argv)
    if a.summarise:
        saved = json.loads(Path(a.summarise).read_text())
        labels = list(dict.fromkeys(r["method"] for r in saved["runs"]))
        payloads = list(dict.fromkeys(r["payload_g"] for r in saved["runs"]))
        gains = len(saved.get("tune", {}).get("gains", [])) > 1
        print(summary(saved["runs"], labels, payloads, saved["seeds"], gains))
        print(gain_views(saved, labels, payloads))
        return
    torch.set_num_threads(1)
    p = load_platform("so101")
    q0, s = load_track_config(p)
    joints = s.joints or [j for j in range(p.n) if j not in p.gripper_indices]
    horizon = a.horizon or s.horizon
    sim = Simulator(p)
    pts = Points.end_effector(sim.kinematics)
    times, path = read_path(a.path)
    gains = a.gains or [s.gain]
    tuned = len(gains) > 1
    tune_times, tune_path = read_path(a.tune_path) if tuned else (None, None)
    fits, rows, checks, plotted, tuning, all_gains = [], [], [], [], [], []

    def track_once(label: str, g: float, seed: int | None, field, gain: float,
                   t_path: tuple) -> tuple[dict, object]:
        plant = WorldPlant(p, pts, sim.kinematics, q0, payload_kg=g / 1000)
        tracker = Tracker("field" if field is not None else "kinematic", p, sim.kinematics,
                          pts, dataclasses.replace(s, gain=gain), field=field)
        r = run_tracking(plant, tracker, *t_path)
        return {"method": label, "payload_g": g, "seed": seed, "gain": gain,
                **r.metrics()}, r

    def tune(label: str, seed: int | None, field=None) -> float:
        """The gain of lowest rms on the tuning path at the tuning payload."""
        if not tuned:
            return gains[0]
        for gain in gains:
            m, _ = track_once(label, a.tune_payload_g, seed, field, gain,
                              (tune_times, tune_path))
            tuning.append(m)
            print(f"tune {label} seed {'—' if seed is None else seed} gain {gain:g}: "
                  f"{m['rms_mm']:.2f} mm rms, {m['max_mm']:.2f} max, {m['stop']}", flush=True)
        return pick_gains(tuning, a.tune_payload_g)[(label, seed)]

    def run(label: str, g: float, seed: int | None, field=None, gain: float = 0.6) -> None:
        evaluated = {}
        for other in (gains if a.all_gains else [gain]):
            evaluated[other] = track_once(label, g, seed, field, other, (times, path))
            if a.all_gains:
                all_gains.append(evaluated[other][0])
        m, r = evaluated[gain]
        rows.append(m)
        if seed in (None, a.seeds[0]):
            plotted.append((label, g, r))
        print(f"| {label} | {'—' if seed is None else seed} | {g:.0f} | {m['rms_mm']:.2f} | "
              f"{m['mean_mm']:.2f} | {m['max_mm']:.2f} | {m['final_mm']:.2f} | "
              f"{m['settling_s']:.2f} | {m['decide_p50_ms']:.1f}/{m['decide_p99_ms']:.1f} | "
              f"{m['max_rate_hz']:.0f} | {m['stop']} |", flush=True)

    rng = np.random.default_rng(0)
    check_poses = [q0] + [q0 + np.where(np.isin(np.arange(p.n), joints),
                                        rng.uniform(-0.3, 0.3, p.n), 0.0)
                          for _ in range(a.check_poses - 1)] if a.check_poses else []
    truth = {(g, i): world_dxdu(p, qc, joints, horizon, g / 1000)
             for g in a.payload_g for i, qc in enumerate(check_poses)}

    def check(label: str, seed: int | None, jac) -> None:
        for (g, i), t in truth.items():
            Jw = t["J"]
            J = jac(t)[:, joints]
            checks.append({"method": label, "seed": seed, "payload_g": g, "pose": i,
                           "rel_error": float(np.linalg.norm(J - Jw) / np.linalg.norm(Jw)),
                           "gain": float(np.linalg.norm(J) / np.linalg.norm(Jw))})

    check("kinematic", None, lambda t: kinematic_jacobian(sim.kinematics, pts, t["q"])[1])
    fields = {}
    for seed in a.seeds:
        t0 = time.perf_counter()
        data = collect_perturbations(p, q0, joints, a.poses, a.per_pose, horizon,
                                     payload_kg=[g / 1000 for g in a.fit_payload_g], seed=seed)
        t1 = time.perf_counter()
        priors = fk_priors(sim.kinematics, data["q"])
        print(f"seed {seed}: rigid FK's columns fitted to the world's Δx per payload\n"
              + sign_gains(data, priors, joints), flush=True)
        for v in a.variants:
            prior, signed, obs = parse_variant(v)
            t2 = time.perf_counter()
            field, fit = fit_field(data, p.n, joints, steps=a.fit_steps, seed=seed,
                                   observation=obs, prior=prior, priors=priors,
                                   signed=signed)
            fields[(v, seed)] = field
            fits.append({"variant": v, "seed": seed, "collect_s": t1 - t0,
                         "fit_s": time.perf_counter() - t2, **fit})
            print(f"field {v} seed {seed}: {fit['samples']} perturbations at "
                  f"{a.fit_payload_g} g ({t1 - t0:.0f} s in the world), fitted in "
                  f"{time.perf_counter() - t2:.0f} s; held-out R² {fit['heldout_r2']:.3f}",
                  flush=True)

            def jac(t, field=field):
                prior_J = kinematic_jacobian(sim.kinematics, pts, t["q"])[1]
                return field.jacobian(t["q"], p.n, effort=t["effort"], q_cmd=t["q_cmd"],
                                      prior=prior_J)

            check(f"field {v}", seed, jac)
    print("| method | seed | payload [g] | rms [mm] | mean [mm] | max [mm] | final [mm] | "
          "settling [s] | decide p50/p99 [ms] | rate [Hz] | stop |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    picked = {("kinematic", None): tune("kinematic", None)}
    for (v, seed), field in fields.items():
        picked[(f"field {v}", seed)] = tune(f"field {v}", seed, field)
    for g in a.payload_g:
        run("kinematic", g, None, gain=picked[("kinematic", None)])
        for (v, seed), field in fields.items():
            run(f"field {v}", g, seed, field, picked[(f"field {v}", seed)])
    labels = ["kinematic"] + [f"field {v}" for v in a.variants]
    saved = {"seeds": a.seeds, "tuning": tuning, "all_gains": all_gains,
             "oracle_payload_g": a.oracle_payload_g,
             "tune": {"path": a.tune_path, "payload_g": a.tune_payload_g, "gains": gains}
             if tuned else {"gains": gains}}
    print()
    print(summary(rows, labels, a.payload_g, a.seeds, tuned))
    print(gain_views(saved, labels, a.payload_g))
    if checks:
        print(f"\n||J − J_world|| / ||J_world|| at {a.check_poses} poses (mean over poses and "
              "seeds; ||J|| / ||J_world|| in brackets)")
        print("| method | " + " | ".join(f"{g:.0f} g" for g in a.payload_g) + " |")
        print("|---|" + "---|" * len(a.payload_g))
        for label in labels:
            cells = []
            for g in a.payload_g:
                sel = [c for c in checks if c["method"] == label and c["payload_g"] == g]
                cells.append(f"{np.mean([c['rel_error'] for c in sel]):.2f} "
                             f"({np.mean([c['gain'] for c in sel]):.2f})")
            print(f"| {label} | " + " | ".join(cells) + " |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        keep = ("method", "payload_g", "seed", "gain", "stop", *KEYS)
        saved.update(tuning=[{k: r[k] for k in keep} for r in tuning],
                     all_gains=[{k: r[k] for k in keep} for r in all_gains])
        (Path(a.out) / "field.json").write_text(json.dumps(
            {"fit_payload_g": a.fit_payload_g, "horizon": horizon, "fits": fits,
             "runs": [{k: r[k] for k in keep} for r in rows], "jacobian_check": checks,
             "picked_gains": [{"method": m, "seed": sd, "gain": gn}
                              for (m, sd), gn in picked.items()], **saved}, indent=1))
        plot_runs(plotted, Path(a.out) / "field.png")


if __name__ == "__main__":
    main()
