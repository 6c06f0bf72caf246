"""`nactuator track`: one path, one or both Jacobians, in the hidden world or on a bus.

In the world (no ``--port``) every (method, payload) pair runs the same path from the same
start pose, with the payload hung at the end-effector and not told to the controller; the
errors are the world's own end-effector against the path. With ``--port`` the loop drives
a servo bus (real or ``nactuator emulate``) through :func:`nactuator.hardware.open.open_bus`:
torque on at connect, off when the loop ends, however it ends.

``--method field`` tracks with a learned Jacobian field from ``nactuator field fit``
(:func:`fit_field_file`: world point tracks under random command perturbations around the
config's start pose, then ``control.field.fit_field``).

With ``--camera`` (a camera file, :mod:`.image`) a pixel path (``time, u, v``) is tracked in
the image: the loop minimises the pixel error through d(pixel)/du; a 3-D path is tracked
as before and its errors are also reported in the camera's pixels (the projection of the
world's own end-effector against the projected target).

Outputs (``--out``): ``track.json`` (settings, metrics per run), ``track.md`` (the table),
``track.png`` (target vs tracked paths, error over time; ``track_px.png`` the same in the
image with a camera; ``path_px.csv`` a 3-D path projected into the image, in the pixel path
format) and one ``<method>_<payload>g.csv`` log per run (t, target, tracked point, its
pixel with a camera, joints, commands).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from nactuator.atomic import atomic_path, json_safe, write_json, write_png, write_text
from nactuator.errors import UserError
from nactuator.paths import conf_dir
from nactuator.platforms import Platform, load_platform

from .image import ImageView, check_in_image, load_view, read_pixel_path, write_pixel_path
from .jacobian import ActuatorJacobian, Points
from .plants import BusPlant, WorldPlant
from .track import (
    METHODS,
    PathError,
    Tracker,
    TrackResult,
    TrackSettings,
    read_path,
    run_tracking,
)

__all__ = ["circle_path", "fit_field_file", "load_field_config", "load_track_config",
           "plot_runs", "read_target_path",
           "track"]


def load_track_config(platform: Platform, path: str | os.PathLike | None = None
                      ) -> tuple[np.ndarray, TrackSettings]:
    """Start pose (n,) and settings from ``conf/track/<platform>.yaml`` (or ``path``)."""
    path = Path(path) if path else conf_dir() / "track" / f"{platform.name}.yaml"
    if not path.is_file():
        raise UserError(f"track config {path} does not exist (one per platform in "
                        "conf/track/)")
    cfg = yaml.safe_load(path.read_text()) or {}
    pose = np.asarray(cfg.get("start_pose", []), np.float64)
    if pose.shape != (platform.n,):
        raise UserError(f"{path}: start_pose needs {platform.n} joint values, got "
                        f"{pose.tolist()}")
    known = set(TrackSettings.__dataclass_fields__)
    extra = sorted(set(cfg.get("settings", {})) - known)
    if extra:
        raise UserError(f"{path}: unknown settings {extra}; known: {sorted(known)}")
    return pose, TrackSettings(**cfg.get("settings", {}))


def circle_path(center_start: np.ndarray, radius: float, seconds: float,
                dt: float = 0.05, tilt: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """A closed loop through ``center_start``: x–z circle of ``radius`` [m] with a y sway of
    ``tilt * radius``, once round in ``seconds``."""
    t = np.arange(0.0, seconds + 1e-9, dt)
    ph = 2 * np.pi * t / seconds
    offset = np.stack([radius * np.sin(ph), tilt * radius * np.sin(ph),
                       radius * (1 - np.cos(ph))], 1)
    return t, np.asarray(center_start, np.float64) + offset


def read_target_path(path: str | os.PathLike, view: ImageView | None, relative: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, str]:
    """A path file of either format -> times, targets, and ``"base"`` (``time, x, y, z``
    [m]) or ``"image"`` (``time, u, v`` [px], which needs the camera ``view``; inside its
    image unless ``relative``: offsets are checked once shifted, by the caller)."""
    path = Path(path)
    try:
        header = set(pd.read_csv(path, nrows=0).columns) if path.is_file() else set()
    except (ValueError, pd.errors.ParserError) as err:
        raise PathError(f"{path}: not a CSV file ({err})") from err
    if header & {"u", "v"} and not header & {"x", "y", "z"}:
        if view is None:
            raise PathError(f"{path}: a pixel path (columns time, u, v) needs --camera (the "
                            "camera whose pixels they are)")
        return (*read_pixel_path(path, None if relative else view), "image")
    return (*read_path(path), "base")


def _save_log(path: Path, r: TrackResult, names: list[str]) -> None:
    cols = {"t": r.t}
    if r.space == "image":
        cols.update(target_pixel_u=r.target[:, 0], target_pixel_v=r.target[:, 1])
    else:
        cols.update({f"target_{a}": r.target[:, k] for k, a in enumerate("xyz")})
    cols.update({a: r.x[:, k] for k, a in enumerate("xyz")})
    if r.x_px is not None:
        if r.space != "image":
            cols.update(target_pixel_u=r.target_px[:, 0], target_pixel_v=r.target_px[:, 1])
        cols.update(pixel_u=r.x_px[:, 0], pixel_v=r.x_px[:, 1])
    cols.update({f"q_{c}": r.q[:, j] for j, c in enumerate(names)})
    cols.update({f"u_{c}": r.u[:, j] for j, c in enumerate(names)})
    with atomic_path(path, suffix=".csv") as tmp:
        pd.DataFrame(cols).to_csv(tmp, index=False, float_format="%.6f")


def _colors(runs: list[tuple[str, float, TrackResult]]) -> dict[str, str]:
    """The methods' fixed colours; any other label (bench/field.py's field variants) the
    next free one of the default cycle, in order of appearance."""
    colors = {"kinematic": "tab:orange", "actuator": "tab:blue", "field": "tab:green"}
    spare = (c for c in ("tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                         "tab:cyan", "tab:gray") if c not in colors.values())
    for method, _, _ in runs:
        if method not in colors:
            colors[method] = next(spare, "black")
    return colors


def plot_runs(runs: list[tuple[str, float, TrackResult]], path: Path) -> Path:
    """Target vs tracked (x–z) and the world's error over time, one column per payload;
    ``runs`` are (label, payload [g], result)."""
    from matplotlib.figure import Figure

    runs = [run for run in runs if run[2].space == "base"]
    payloads = sorted({g for _, g, _ in runs})
    fig = Figure(figsize=(4.2 * len(payloads), 7.4))
    axes = fig.subplots(2, len(payloads), squeeze=False)
    colors = _colors(runs)
    for col, g in enumerate(payloads):
        top, bottom = axes[0, col], axes[1, col]
        first = True
        for method, grams, r in runs:
            if grams != g:
                continue
            if first:
                top.plot(1e3 * r.target[:, 0], 1e3 * r.target[:, 2], "k--", lw=1.2,
                         label="target")
                first = False
            top.plot(1e3 * r.x[:, 0], 1e3 * r.x[:, 2], color=colors[method], lw=1.0,
                     label=f"{method} ({r.metrics()['rms_mm']:.1f} mm rms)")
            bottom.plot(r.t, r.errors_mm(), color=colors[method], lw=1.0, label=method)
        top.set_title(f"unknown payload {g:.0f} g", fontsize=9)
        top.set_xlabel("x [mm]", fontsize=8)
        top.set_ylabel("z [mm]", fontsize=8)
        top.set_aspect("equal", adjustable="datalim")
        top.legend(fontsize=7)
        bottom.set_xlabel("time [s]", fontsize=8)
        bottom.set_ylabel("EE error [mm] (world)", fontsize=8)
        bottom.legend(fontsize=7)
        for ax in (top, bottom):
            ax.tick_params(labelsize=7)
    fig.tight_layout()
    return write_png(path, fig)


def _plot_pixels(runs: list[tuple[str, float, TrackResult]], view: ImageView,
                 path: Path) -> Path:
    """Target vs tracked in the image (u right, v down, the camera's resolution) and the
    pixel error over time, one column per payload."""
    from matplotlib.figure import Figure

    payloads = sorted({g for _, g, _ in runs})
    fig = Figure(figsize=(4.2 * len(payloads), 7.4))
    axes = fig.subplots(2, len(payloads), squeeze=False)
    colors = {"kinematic": "tab:orange", "actuator": "tab:blue", "field": "tab:green"}
    for col, g in enumerate(payloads):
        top, bottom = axes[0, col], axes[1, col]
        first = True
        for method, grams, r in runs:
            if grams != g:
                continue
            if first:
                top.plot(r.target_px[:, 0], r.target_px[:, 1], "k--", lw=1.2, label="target")
                first = False
            top.plot(r.x_px[:, 0], r.x_px[:, 1], color=colors[method], lw=1.0,
                     label=f"{method} ({r.metrics()['rms_px']:.2f} px rms)")
            bottom.plot(r.t, r.errors_px(), color=colors[method], lw=1.0, label=method)
        top.set_title(f"unknown payload {g:.0f} g ({view.width}x{view.height} px camera)",
                      fontsize=9)
        top.set_xlabel("u [px]", fontsize=8)
        top.set_ylabel("v [px]", fontsize=8)
        top.set_aspect("equal", adjustable="datalim")
        top.invert_yaxis()  # image rows grow downward
        top.legend(fontsize=7)
        bottom.set_xlabel("time [s]", fontsize=8)
        bottom.set_ylabel("EE error [px] (world, projected)", fontsize=8)
        bottom.legend(fontsize=7)
        for ax in (top, bottom):
            ax.tick_params(labelsize=7)
    fig.tight_layout()
    return write_png(path, fig)


def _cell(value: float, fmt: str = ".2f") -> str:
    return "—" if value is None or not np.isfinite(value) else format(value, fmt)


def _markdown(report: dict) -> str:
    camera = report.get("camera")
    lines = [f"# Point tracking: {report['where']}", "",
             f"path `{report['path']}` ({report['path_seconds']:.1f} s, "
             f"{'pixels' if report.get('space') == 'image' else '3-D'}), tick "
             f"{report['tick_hz']:.1f} Hz, checkpoint `{report.get('checkpoint')}`"
             + (f", camera `{camera}`" if camera else ""), "",
             "| method | payload [g] | rms [mm] | mean [mm] | max [mm] | final [mm] | "
             + ("rms [px] | max [px] | final [px] | " if camera else "")
             + "settling [s] | decide p50/p99 [ms] | cycles/s (lost) | ticks/s | stop |",
             "|---|---|---|---|---|---|" + ("---|---|---|" if camera else "")
             + "---|---|---|---|---|"]
    for r in report["runs"]:
        m = r["metrics"]
        px = (f"{_cell(m['rms_px'])} | {_cell(m['max_px'])} | {_cell(m['final_px'])} | "
              if camera else "")
        lines.append(f"| {r['method']} | {r['payload_g']:.0f} | {_cell(m['rms_mm'])} | "
                     f"{_cell(m['mean_mm'])} | {_cell(m['max_mm'])} | {_cell(m['final_mm'])} | "
                     f"{px}{_cell(m['settling_s'])} | {m['decide_p50_ms']:.1f}/"
                     f"{m['decide_p99_ms']:.1f} | {m['cycle_hz']:.1f} ({m['lost_slots']}) | "
                     f"{m['ticks_hz']:.1f} | "
                     f"{m['stop']} |")
    return "\n".join(lines) + "\n"


def track(path: str | os.PathLike, ckpt: str | os.PathLike | None = None,
          platform: str | Platform | None = None, methods: tuple[str, ...] = ("kinematic",),
          payloads_g: tuple[float, ...] = (0.0,), port: str | None = None,
          relative: bool = False, out: str | os.PathLike | None = None,
          config: str | os.PathLike | None = None, world: str | None = None,
          seed: int = 0, track_noise: float = 0.0, calibration: str | None = None,
          threads: int = 1, field: str | os.PathLike | None = None,
          camera: str | os.PathLike | None = None) -> str:
    """Run the closed loop (see the module docstring); returns the table as markdown."""
    import torch

    from nactuator.sim import Simulator

    torch.set_num_threads(threads)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(f"--method {unknown}: expected {list(METHODS)}")
    if ("field" in methods) != (field is not None):
        raise UserError("--method field and --field FILE go together (make the file with "
                        "`nactuator field fit`)")
    actuator = meta = None
    if ckpt is not None:
        from nactuator.models import load_actuator

        name = platform.name if isinstance(platform, Platform) else platform
        actuator, meta = load_actuator(ckpt, expect_platform=name)
        platform = platform or meta["platform"]
    elif "actuator" in methods:
        raise UserError("--method actuator needs --ckpt (a counterfactual checkpoint)")
    if platform is None:
        raise UserError("give --platform (or --ckpt, whose platform is used)")
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    q0, settings = load_track_config(p, config)
    view = None if camera is None else load_view(camera, p)
    times, points_path, space = read_target_path(path, view, relative)
    image = view if space == "image" else None  # the loop tracks in the image
    sim = Simulator(p)
    points = Points.end_effector(sim.kinematics)
    aj = (ActuatorJacobian(actuator, sim, points, horizon=settings.horizon)
          if "actuator" in methods else None)
    learned = None
    if field is not None:
        from .field import load_field

        learned = load_field(field, expect_platform=p.name)

    runs: list[tuple[str, float, TrackResult]] = []
    offsets: list[np.ndarray] = []  # each run's --relative shift of the path
    where = "hidden world" if port is None else f"bus {port}"
    if port is not None:
        if len(payloads_g) > 1 or payloads_g[0] != 0:
            raise UserError("--payload-g hangs a payload in the hidden world; on a bus the "
                            "payload is whatever the arm carries (leave --payload-g out)")
        from nactuator.hardware.open import open_bus
        from nactuator.hardware.signals import sigterm_as_interrupt

        for method in methods:
            # torque on at connect; leaving open_bus() switches it off, however we leave.
            with sigterm_as_interrupt(), open_bus(p, port, calibration, torque=True) as bus:
                bus.wait_ready()
                plant = BusPlant(bus, p, points, sim.kinematics)
                offset = _start_offset(plant, relative, points_path, image)
                offsets.append(offset)
                if image is not None and relative:
                    check_in_image(path, image, points_path + offset,
                                   " (shifted to the arm's start pixel)")
                tracker = Tracker(method, p, sim.kinematics, points, settings, aj,
                                  field=learned, image=image)
                try:
                    runs.append((method, 0.0, run_tracking(plant, tracker, times,
                                                           points_path + offset,
                                                           camera=view)))
                except KeyboardInterrupt:
                    return "track: interrupted; torque switched off"
    else:
        for grams in payloads_g:
            for method in methods:
                plant = WorldPlant(p, points, sim.kinematics, q0, payload_kg=grams / 1000.0,
                                   world=world, seed=seed, track_noise=track_noise)
                offset = _start_offset(plant, relative, points_path, image)
                offsets.append(offset)
                if image is not None and relative:
                    check_in_image(path, image, points_path + offset,
                                   " (shifted to the arm's start pixel)")
                tracker = Tracker(method, p, sim.kinematics, points, settings, aj,
                                  field=learned, image=image)
                runs.append((method, grams, run_tracking(plant, tracker, times,
                                                         points_path + offset, camera=view)))
    report = {
        "where": where, "path": str(path), "path_seconds": float(times[-1]),
        "checkpoint": None if ckpt is None else str(ckpt), "platform": p.name,
        "field": None if field is None else str(field),
        "camera": None if view is None else view.source, "space": space,
        "resolution_px": None if view is None else [view.width, view.height],
        "tick_hz": p.fps / settings.period, "settings": json_safe(vars(settings)),
        "world": world or "default", "seed": seed, "track_noise_m": track_noise,
        "runs": [{"method": m, "payload_g": g, "metrics": r.metrics()} for m, g, r in runs],
    }
    if out is not None:
        out = Path(out)
        for m, g, r in runs:
            _save_log(out / f"{m}_{g:.0f}g.csv", r, p.channel_names)
        if space == "base":
            report["plot"] = plot_runs(runs, out / "track.png").name
        if view is not None:
            report["plot_px"] = _plot_pixels(runs, view, out / "track_px.png").name
            if space == "base":
                # The 3-D path as the camera sees it, in the pixel path format (the first
                # run's, with its --relative offset): `track --camera` can follow it.
                write_pixel_path(out / "path_px.csv", times,
                                 view.project(points_path + offsets[0]))
        write_json(out / "track.json", json_safe(report))
        write_text(out / "track.md", _markdown(report))
    return _markdown(report)


def _start_offset(plant, relative: bool, path_points: np.ndarray,
                  image: ImageView | None = None) -> np.ndarray:
    """With ``relative`` the path is offsets from where the tracked point is at the start
    (its pixel, for a pixel path)."""
    if not relative:
        return np.zeros(path_points.shape[1])
    x = plant.read().x
    return (x[0] if image is None else image.project(x)[0]) - path_points[0]


def load_field_config(platform: Platform, path: str | os.PathLike | None = None) -> dict:
    """The ``field:`` section of the track config (``nactuator field fit``'s defaults):
    ``payloads_g``, ``observation``, ``prior``, ``signed``, ``poses``, ``per_pose``; those it
    leaves out are the joints-only recipe's (one payload, 0 g)."""
    path = Path(path) if path else conf_dir() / "track" / f"{platform.name}.yaml"
    cfg = (yaml.safe_load(path.read_text()) or {}).get("field", {}) if path.is_file() else {}
    defaults = {"payloads_g": [0.0], "observation": ["q"], "prior": "none", "signed": False,
                "poses": 96, "per_pose": 8}
    extra = sorted(set(cfg) - set(defaults))
    if extra:
        raise UserError(f"{path}: unknown field settings {extra}; known: {sorted(defaults)}")
    return {**defaults, **cfg}


def fit_field_file(out: str | os.PathLike, platform: str | Platform = "so101",
                   poses: int | None = None, per_pose: int | None = None,
                   payload_g: float | list[float] | None = None, steps: int = 3000,
                   noise: float = 0.0005, config: str | os.PathLike | None = None,
                   world: str | None = None, seed: int = 0, threads: int = 1,
                   observation: list[str] | None = None, prior: str | None = None,
                   signed: bool | None = None) -> dict:
    """``nactuator field fit``: collect ``poses × per_pose`` perturbations per payload in
    the hidden world around the track config's start pose (its joints and horizon), fit the
    field on the observation, save it to ``out``; returns what was saved as ``info``.
    Arguments left None come from the config's ``field:`` section (:func:`load_field_config`)."""
    import time

    import torch

    from .field import collect_perturbations, fit_field, fk_priors, save_field

    torch.set_num_threads(threads)
    p = platform if isinstance(platform, Platform) else load_platform(platform)
    q0, s = load_track_config(p, config)
    fc = load_field_config(p, config)
    poses = fc["poses"] if poses is None else poses
    per_pose = fc["per_pose"] if per_pose is None else per_pose
    payloads = [float(g) for g in np.atleast_1d(fc["payloads_g"] if payload_g is None
                                                 else payload_g)]
    observation = list(fc["observation"] if observation is None else observation)
    prior = fc["prior"] if prior is None else prior
    signed = bool(fc["signed"] if signed is None else signed)
    joints = s.joints or [j for j in range(p.n) if j not in p.gripper_indices]
    if poses < 2 or per_pose < 1:
        raise UserError(f"--poses {poses} / --per-pose {per_pose}: need ≥ 2 poses and ≥ 1 "
                        "perturbation per pose (a hold-out needs samples)")
    t0 = time.perf_counter()
    data = collect_perturbations(p, q0, joints, poses, per_pose, s.horizon, noise=noise,
                                 payload_kg=[g / 1000.0 for g in payloads], world=world,
                                 seed=seed)
    t1 = time.perf_counter()
    priors = None
    if prior != "none":
        from nactuator.sim import Simulator

        priors = fk_priors(Simulator(p).kinematics, data["q"])
    learned, fit = fit_field(data, p.n, joints, steps=steps, seed=seed,
                             observation=observation, prior=prior, priors=priors,
                             signed=signed)
    info = {**fit, "poses": poses, "per_pose": per_pose, "horizon": s.horizon,
            "track_noise_m": noise, "payload_g": payloads, "world": world or "default",
            "seed": seed, "collect_s": t1 - t0, "fit_s": time.perf_counter() - t1,
            "start_pose": q0.tolist()}
    save_field(out, learned, p.name, info)
    return info
