"""The control room's benches still run (issue 24): bench/field.py and bench/jacobian.py at
tiny sizes, in this process, reading back the tables and JSON they print and write. The
baselines measured in the same run (rigid FK beside the field; the kinematic Jacobian
beside the actuator model's) must be there; the figures themselves are not judged."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_bench import bench_main, number, table_rows
from test_track import counterfactual_actuator

from nactuator.models import bundle_to_dict, save_bundle
from nactuator.paths import conf_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_bench_field_runs_field_and_rigid_fk(tmp_path, capsys):
    # The circle's first second (21 samples at 20 Hz): the loop then runs 1 s + extra_s.
    lines = (conf_dir() / "track" / "paths" / "so101_circle.csv").read_text().splitlines()
    short = tmp_path / "circle_1s.csv"
    short.write_text("\n".join(lines[:22]) + "\n")
    bench_main("field")(["--poses", "2", "--per-pose", "3", "--fit-steps", "20",
                         "--fit-payload-g", "0", "300", "--payload-g", "200",
                         "--variants", "q", "fk:q+effort+error", "--check-poses", "1",
                         "--path", str(short), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "field q seed 0: 12 perturbations at [0.0, 300.0] g" in out, out
    gains = [r for r in table_rows(out, "") if r[0] in ("0", "300") and len(r) == 6]
    assert [r[0] for r in gains] == ["0", "300"], out  # FK gains per payload, both fits
    assert all(float(r[3]) >= float(r[1]) - 1e-9 for r in gains)  # signs only add freedom
    labels = ["kinematic", "field q", "field fk:q+effort+error"]
    rows = [r for label in labels for r in table_rows(out, label) if len(r) == 11]
    assert [(r[0], r[2]) for r in rows] == [(label, "200") for label in labels], out
    assert all(math.isfinite(number(c)) for r in rows for c in r[3:7]), out  # rms..final
    saved = json.loads((tmp_path / "field.json").read_text())
    assert [f["samples"] for f in saved["fits"]] == [12, 12]
    assert all(math.isfinite(f["heldout_mse"]) for f in saved["fits"])
    assert [(r["method"], r["payload_g"]) for r in saved["runs"]] == [(label, 200.0)
                                                                      for label in labels]
    for printed, run in zip(rows, saved["runs"], strict=True):
        assert number(printed[3]) == pytest.approx(run["rms_mm"], abs=0.006)
        assert run["stop"] == printed[-1] and run["max_mm"] >= run["rms_mm"] > 0
    # Every Jacobian scored against the world's own dx/du at the one check pose.
    assert sorted(c["method"] for c in saved["jacobian_check"]) == sorted(labels)
    assert all(c["rel_error"] >= 0 for c in saved["jacobian_check"])
    assert (tmp_path / "field.png").stat().st_size > 0
    # The seed summary read back from the JSON: rms per method against rigid FK's.
    bench_main("field")(["--summarise", str(tmp_path / "field.json")])
    summary = capsys.readouterr().out
    for label in labels:
        (row,) = [r for r in table_rows(summary, label) if r[0] == label]
        rms = [r["rms_mm"] for r in saved["runs"] if r["method"] == label][0]
        assert row[2] == f"{rms:.2f} ({rms:.2f}–{rms:.2f})", row
        fk = saved["runs"][0]["rms_mm"]
        assert row[-1] == ("—" if label == "kinematic" else f"{int(rms < fk)}/1"), row
    # --gains: each method tuned on a tuning path/payload, evaluated at the gain it picked.
    bench_main("field")(["--poses", "2", "--per-pose", "3", "--fit-steps", "20",
                         "--fit-payload-g", "0", "--payload-g", "200", "--variants", "q",
                         "--gains", "0.3", "0.6", "--tune-path", str(short),
                         "--tune-payload-g", "100", "--path", str(short),
                         "--out", str(tmp_path / "gains")])
    capsys.readouterr()
    saved = json.loads((tmp_path / "gains" / "field.json").read_text())
    assert saved["tune"]["gains"] == [0.3, 0.6] and len(saved["tuning"]) == 4
    for pick in saved["picked_gains"]:
        tuned = {r["gain"]: r["rms_mm"] for r in saved["tuning"]
                 if r["method"] == pick["method"] and r["seed"] == pick["seed"]}
        assert pick["gain"] in (0.3, 0.6) and tuned[pick["gain"]] == min(tuned.values())
        (run,) = [r for r in saved["runs"] if r["method"] == pick["method"]]
        assert run["gain"] == pick["gain"] and math.isfinite(run["rms_mm"])
    bench_main("field")(["--summarise", str(tmp_path / "gains" / "field.json")])
    (row,) = [r for r in table_rows(capsys.readouterr().out, "kinematic") if len(r) == 10]
    assert row[-1] == f"{saved['picked_gains'][0]['gain']:g}", row


def test_bench_jacobian_scores_kinematic_and_model(tmp_path, capsys):
    ckpt = tmp_path / "cf.pt"
    save_bundle(bundle_to_dict(counterfactual_actuator(), "so101"), ckpt)
    bench_main("jacobian")(["--ckpt", str(ckpt), "--poses", "2", "--horizon", "4",
                            "--payload-g", "0", "350", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "dx/du over 4 steps" in out and "2 poses" in out, out
    rows = table_rows(out, "")[1:]
    assert [r[0] for r in rows] == ["0", "350"], out
    saved = json.loads((tmp_path / "jacobian.json").read_text())
    assert saved["horizon"] == 4 and len(saved["rows"]) == 4  # 2 payloads x 2 poses
    for printed, g in zip(rows, (0.0, 350.0), strict=True):
        sel = [r for r in saved["rows"] if r["payload_g"] == g]
        for cell, key in ((printed[1], "kinematic"), (printed[2], "actuator")):
            values = np.array([r[key] for r in sel])
            assert np.isfinite(values).all() and (values >= 0).all()
            assert cell == f"{values.mean():.2f} ({values.max():.2f})"
        ratio = np.mean([r["world_over_kinematic"] for r in sel])
        assert np.isfinite(ratio) and ratio > 0 and printed[3] == f"{ratio:.2f}"


def test_bench_track_seeds_summarises_the_spread_over_seeds(tmp_path, capsys):
    """Mean, sample sd and range per (method, payload) over the seeds' track.json files,
    recomputed here with numpy; errors in px when every report had a camera."""
    rng = np.random.default_rng(0)
    files, rms = [], {}
    for seed in range(3):
        runs = []
        for method in ("kinematic", "field"):
            r = float(rng.uniform(0.4, 1.0))
            rms.setdefault(method, []).append(r)
            runs.append({"method": method, "payload_g": 200.0, "metrics": {
                "rms_px": r, "max_px": 2 * r, "final_px": r / 2, "settling_s": 0.1 * seed,
                "decide_p50_ms": 3.0, "stop": "settled"}})
        path = tmp_path / f"s{seed}.json"
        path.write_text(json.dumps({"path": "circle_px.csv", "camera": "cam.yaml",
                                    "seed": seed, "runs": runs}))
        files.append(str(path))
    bench_main("track_seeds")(files + ["--out", str(tmp_path / "seeds.json")])
    out = capsys.readouterr().out
    assert out.startswith("errors in px"), out
    for method in ("kinematic", "field"):
        (row,) = table_rows(out, method)
        v = np.array(rms[method])
        assert row[1:3] == ["200", "3"]
        assert row[3] == (f"{v.mean():.2f} ± {v.std(ddof=1):.2f} ({v.min():.2f}–"
                          f"{v.max():.2f})"), row
    saved = json.loads((tmp_path / "seeds.json").read_text())
    assert saved[0]["seeds"] == [0, 1, 2]
    assert saved[0]["settling_s"]["max"] == pytest.approx(0.2)
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"path": "circle.csv", "seed": 9, "runs": []}))
    with pytest.raises(SystemExit, match="different paths"):
        bench_main("track_seeds")([files[0], str(bad)])
