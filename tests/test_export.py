"""nactuator.export: TorchScript and ONNX files reproduce the eager actuator to 1e-5; the
int8 ONNX file stays within the documented quantization tolerances."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnxruntime  # noqa: F401  a hard dependency: a broken install fails, not skips
import pytest
import torch
from test_models import make_stats, make_window

import nactuator.export.quantize as quantize_module
from nactuator.cli import main as cli_main
from nactuator.export import (
    EXPORT_OUTPUTS,
    INT8_PROBABILITY_TOLERANCE,
    INT8_RELATIVE_TOLERANCE,
    PAD_INPUT,
    ExportableActuator,
    ExportError,
    export,
    int8_errors,
    int8_tolerances,
    load_torchscript,
    ort_session,
    parity_tolerance,
)
from nactuator.models import NeuralActuator, bundle_to_dict, load_actuator, save_bundle

FULL = ["command", "state", "telemetry", "error"]


# Small sizes keep the default tests fast; the full-size model is the slow test below.
SMALL = {"transformer": {"d_model": 64, "d_ff": 128, "n_layers": 2}, "lstm": {"hidden": 64},
         "gru": {"hidden": 64}, "mlp": {"hidden": 64, "n_layers": 2}}


def saved_bundle(tmp_path, arch="transformer", features=FULL, full_size=False):
    torch.manual_seed(0)
    sizes = {} if full_size else SMALL[arch]
    act = NeuralActuator(features, 5, make_stats(), {"arch": arch, **sizes})
    ema = {k: v + 0.01 for k, v in act.state_dict().items()}
    path = tmp_path / "actuator.pt"
    save_bundle(bundle_to_dict(act, "omx", {"ema_state_dict": ema}), path)
    return path


def graph_args(window, names):
    """The exported graph's positional inputs: the window channels, then ``pad`` (no
    padded frames unless the window says so)."""
    channels = [window[k] for k in names if k != PAD_INPUT]
    pad = window.get(PAD_INPUT, torch.zeros(channels[0].shape[:2], dtype=torch.bool))
    return [*channels, pad]


def eager(path, window):
    act, _ = load_actuator(path)  # EMA weights, like the export
    with torch.no_grad():
        out = act(window)
    return [out[k] for k in EXPORT_OUTPUTS]


@pytest.mark.parametrize(("arch", "features"), [("transformer", FULL),
                                                ("transformer", ["command", "state", "error"]),
                                                ("lstm", FULL)])
def test_torchscript_matches_eager(tmp_path, arch, features):
    bundle = saved_bundle(tmp_path, arch, features)
    out = export(bundle, tmp_path / "deploy" / "actuator.ts")
    assert sorted(p.name for p in (tmp_path / "deploy").iterdir()) == ["actuator.ts"]
    module, meta = load_torchscript(out)
    assert meta["platform"] == "omx" and meta["weights"] == "ema"
    assert meta["outputs"] == ["tau", "force", "gate", "condition"] and meta["window_length"] == 9
    for batch in (1, 7):
        window = make_window(batch=batch, seed=batch)
        got = module(*graph_args(window, meta["inputs"]))
        for g, e in zip(got, eager(bundle, window), strict=True):
            assert g.shape == e.shape and (g - e).abs().max() <= 1e-5


def test_onnx_matches_eager(int8_export):
    bundle, out, _, _ = int8_export  # the fp32 file: an ONNX export takes ~5 s, made once
    session = ort_session(out)
    names = [i.name for i in session.get_inputs()]
    assert names == ["q_cmd", "q", "qd", "effort", "voltage", "temperature", "pad"]
    assert "nactuator" in session.get_modelmeta().custom_metadata_map
    window = make_window(batch=3, seed=3)
    got = session.run(None, {k: x.numpy() for k, x in zip(names, graph_args(window, names),
                                                           strict=True)})
    for g, e in zip(got, eager(bundle, window), strict=True):
        assert g.shape == tuple(e.shape) and abs(g - e.numpy()).max() <= 1e-5


def test_export_errors_are_clear(tmp_path, monkeypatch):
    bundle = saved_bundle(tmp_path, "mlp")
    with pytest.raises(ValueError, match="unknown export format 'tflite'"):
        export(bundle, tmp_path / "a.tflite", fmt="tflite")
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if it were not installed
    with pytest.raises(ExportError, match="needs the onnx and onnxscript packages"):
        export(bundle, tmp_path / "a.onnx", fmt="onnx")
    assert not (tmp_path / "a.onnx").exists()
    (tmp_path / "junk.ckpt").write_bytes(b"\x00\x01junk")
    with pytest.raises(ValueError, match="junk.ckpt is not a torch checkpoint"):
        export(tmp_path / "junk.ckpt", tmp_path / "a.ts")


def stats_window(batch: int, seed: int) -> dict:
    """Windows as the deployed actuator sees them: each channel at its train-set mean and
    std (make_stats), unlike make_window's unit-scale noise."""
    g = torch.Generator().manual_seed(seed)
    stats = make_stats()
    return {k: torch.tensor(v["mean"]) + torch.randn(batch, 9, 5, generator=g)
            * torch.tensor(v["std"]) for k, v in stats.items() if k != "error"}


def run_onnx(path, window):
    session = ort_session(path)
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {k: x.numpy() for k, x in zip(names, graph_args(window, names),
                                                           strict=True)})


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory):
    """One bundle, its fp32 ONNX export (``export``) and its int8 one (``nactuator export
    --quantize int8``, and what that command printed): ONNX exports cost seconds each, so
    the tests of both share them."""
    import contextlib
    import io

    folder = tmp_path_factory.mktemp("int8")
    bundle = saved_bundle(folder)
    float32 = export(bundle, folder / "float32.onnx", fmt="onnx")
    int8 = folder / "deploy" / "int8.onnx"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli_main(["export", "--ckpt", str(bundle), "--out", str(int8), "--format",
                         "onnx", "--quantize", "int8"])
    assert code == 0
    return bundle, float32, int8, printed.getvalue()


def test_int8_errors_are_relative_for_tau_force_and_absolute_for_probabilities():
    expected = [torch.full((4, 5), 2.0), torch.full((4, 3), -0.5), torch.full((4, 1), 0.3),
                torch.full((4, 5), 0.9)]
    got = [e.clone() for e in expected]
    got[0][1, 2] += 0.2   # 0.2 N·m on an RMS of 2 N·m: 10 %
    got[1][3, 0] -= 0.01  # 0.01 N on an RMS of 0.5 N: 2 %
    got[2][0, 0] += 0.01  # probabilities: absolute
    errors = int8_errors(got, expected)
    assert errors == pytest.approx({"tau": 0.1, "force": 0.02, "gate": 0.01, "condition": 0.0},
                                   abs=1e-6)
    assert int8_tolerances() == {"tau": INT8_RELATIVE_TOLERANCE,
                                 "force": INT8_RELATIVE_TOLERANCE,
                                 "gate": INT8_PROBABILITY_TOLERANCE,
                                 "condition": INT8_PROBABILITY_TOLERANCE}


def test_int8_onnx_is_quantized_and_within_tolerance_of_eager(int8_export):
    import onnx

    bundle, float32, int8, _ = int8_export
    assert [p.name for p in int8.parent.iterdir()] == ["int8.onnx"]  # no scratch files
    model = onnx.load(int8)
    ops = {node.op_type for node in model.graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops
    # the weights are 8-bit (uint8 with a zero point, portable to AVX2-only CPUs: see
    # export.quantize): most stored values, and the file is half the float32 one
    sizes = {}
    eight_bit = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)
    for tensor in model.graph.initializer:
        kind = "int8" if tensor.data_type in eight_bit else "other"
        sizes[kind] = sizes.get(kind, 0) + onnx.numpy_helper.to_array(tensor).size
    assert sizes["int8"] > 0.9 * (sizes["int8"] + sizes["other"])
    assert onnx.load(float32).ByteSize() > 1.8 * model.ByteSize()
    meta = json.loads({p.key: p.value for p in model.metadata_props}["nactuator"])
    assert meta["quantize"] == "int8" and meta["platform"] == "omx"
    assert set(meta["int8_errors"]) == set(EXPORT_OUTPUTS)
    # windows the export check never saw (other seed, other batch size)
    for batch, seed in ((1, 11), (64, 12)):
        window = stats_window(batch, seed)
        got = run_onnx(int8, window)
        expected = eager(bundle, window)
        assert [g.shape for g in got] == [tuple(e.shape) for e in expected]
        errors = int8_errors(got, expected)
        assert all(errors[k] <= int8_tolerances()[k] for k in EXPORT_OUTPUTS), errors
    # and it is a different model from float32, not a copy of it
    assert max(int8_errors(got, expected).values()) > 1e-4


def test_int8_export_refuses_to_write_beyond_tolerance(tmp_path, monkeypatch):
    bundle = saved_bundle(tmp_path)
    monkeypatch.setattr(quantize_module, "INT8_RELATIVE_TOLERANCE", 1e-6)
    with pytest.raises(ExportError, match=r"int8 ONNX export is too far from eager .*tau "
                                          r".* > 1e-06 \(relative to its RMS\).*not written"):
        export(bundle, tmp_path / "deploy" / "int8.onnx", fmt="onnx", quantize="int8")
    assert list((tmp_path / "deploy").iterdir()) == []  # not even a temp file left


def test_bad_quantize_values_are_clear_errors(tmp_path, capsys):
    bundle = saved_bundle(tmp_path, "mlp")
    with pytest.raises(ValueError, match=r"unknown quantize option 'int4'; expected one of "
                                         r"\['none', 'int8'\]"):
        export(bundle, tmp_path / "a.onnx", fmt="onnx", quantize="int4")
    with pytest.raises(ValueError, match="quantize='int8' is available for fmt='onnx' only, "
                                         "got fmt='torchscript'"):
        export(bundle, tmp_path / "a.ts", quantize="int8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actuator.pt"]
    with pytest.raises(SystemExit):
        cli_main(["export", "--ckpt", str(bundle), "--out", str(tmp_path / "a.onnx"),
                  "--format", "onnx", "--quantize", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_cli_writes_an_int8_onnx(int8_export):
    bundle, _, out, printed = int8_export  # written by `nactuator export --quantize int8`
    assert printed.strip() == str(out)
    window = stats_window(8, 21)
    errors = int8_errors(run_onnx(out, window), eager(bundle, window))
    assert all(errors[k] <= int8_tolerances()[k] for k in EXPORT_OUTPUTS), errors


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["transformer", "mlp", "gru", "lstm"])
def test_full_size_exports_match_eager(tmp_path, arch):
    """1e-5, or a few times eager's own float32 rounding error where that is larger (on
    these inputs the untrained MLP and GRU are ~1e-5 from float64 before any export)."""
    bundle = saved_bundle(tmp_path, arch, full_size=True)
    window = make_window(batch=4, seed=4)
    expected = eager(bundle, window)
    module, meta = load_torchscript(export(bundle, tmp_path / "a.ts"))
    inputs = tuple(graph_args(window, meta["inputs"]))
    tolerance = parity_tolerance(ExportableActuator(load_actuator(bundle)[0]), inputs)
    assert tolerance <= 1e-4  # the floor is rounding, not a loose check
    got = module(*inputs)
    assert all((g - e).abs().max() <= tolerance for g, e in zip(got, expected, strict=True))
    session = ort_session(export(bundle, tmp_path / "a.onnx", fmt="onnx"))
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, {k: x.numpy() for k, x in zip(names, inputs, strict=True)})
    assert all(abs(g - e.numpy()).max() <= tolerance
               for g, e in zip(got, expected, strict=True))


# ------------------------------------------------- running exports: infer, eval, loader


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A small so101 dataset, a bundle that filters temperature like its training did
    (median 5) and its three exports: TorchScript, ONNX fp32, ONNX int8."""
    from test_eval import synthetic_frames

    from nactuator.data import DatasetWriter
    from nactuator.platforms import load_platform

    root = tmp_path_factory.mktemp("deployed")
    platform = load_platform("so101")
    data = root / "data"
    with DatasetWriter(data, platform, fps=platform.fps) as w:
        w.add_episode(synthetic_frames(platform, 70, 1, payload=True), "carry", "test")
        w.add_episode(synthetic_frames(platform, 40, 2, payload=False), "idle", "test")
    stats = {k: {"mean": [0.0] * 6, "std": [0.3] * 6} for k in
             ("q_cmd", "q", "qd", "effort", "error")}
    stats["voltage"] = {"mean": [12.0] * 6, "std": [0.05] * 6}
    stats["temperature"] = {"mean": [35.0] * 6, "std": [1.0] * 6}
    torch.manual_seed(1)
    act = NeuralActuator(FULL, 6, stats, {"arch": "transformer", **SMALL["transformer"]})
    training = {"data": {"temperature_median": 5}, "model": {"lr": 1e-3}}
    ckpt = root / "model.ckpt"
    save_bundle(bundle_to_dict(act, "so101", {"training_config": training}), ckpt)
    files = {"torchscript": export(ckpt, root / "model.pt"),
             "onnx": export(ckpt, root / "model.onnx"),
             "int8": export(ckpt, root / "model-int8.onnx", quantize="int8")}
    return {"root": root, "data": data, "ckpt": ckpt, "files": files}


def infer_csv(model, deployed, name):
    from nactuator.eval.infer import infer

    out = deployed["root"] / f"{name}.csv"
    infer(model, deployed["data"], out=out)
    import pandas as pd

    return pd.read_csv(out)


def test_infer_gives_the_checkpoints_outputs_with_every_export(deployed):
    """Every frame, padded start frames included, through the same temperature filter."""
    reference = infer_csv(deployed["ckpt"], deployed, "ckpt")
    assert len(reference) == 110 and reference["frame"].min() == 0
    values = [c for c in reference.columns if c not in ("episode", "frame", "timestamp")]
    assert values == ["fx", "fy", "fz", "gate"] + [f"condition_{c}" for c in
                                                   ("shoulder_pan", "shoulder_lift",
                                                    "elbow_flex", "wrist_flex",
                                                    "wrist_roll", "gripper")]
    want = torch.tensor(reference[values].to_numpy())
    rounding = 1e-5 * want.abs() + 1e-9  # the CSV keeps 6 significant digits
    for kind in ("torchscript", "onnx"):
        got = infer_csv(deployed["files"][kind], deployed, kind)
        assert got[["episode", "frame", "timestamp"]].equals(
            reference[["episode", "frame", "timestamp"]])
        diff = (torch.tensor(got[values].to_numpy()) - want).abs()
        assert (diff <= 1e-5 + rounding).all(), (kind, float(diff.max()))
    # int8: within the export's own int8 tolerances (force relative to its RMS over all
    # frames, probabilities absolute), and not a float copy.
    got = infer_csv(deployed["files"]["int8"], deployed, "int8")
    force = ["fx", "fy", "fz"]
    conditions = [c for c in values if c.startswith("condition_")]
    want_force = reference[force].to_numpy()
    force_error = abs(got[force].to_numpy() - want_force).max()
    assert 1e-4 < force_error / (want_force**2).mean() ** 0.5 <= INT8_RELATIVE_TOLERANCE
    for cols in (["gate"], conditions):
        assert abs(got[cols].to_numpy() - reference[cols].to_numpy()).max() \
            <= INT8_PROBABILITY_TOLERANCE


def test_the_input_filters_of_training_travel_with_the_export(deployed):
    from nactuator.models import load_model

    _, reference = load_model(deployed["ckpt"])
    assert reference["input_filters"]["median"] == {"temperature": 5}
    for path in deployed["files"].values():
        _, meta = load_model(path)
        assert meta["input_filters"] == reference["input_filters"], path
        assert meta["platform"] == "so101" and meta["mode"] == "telemetry"


def test_an_export_drives_the_simulator_rollout_like_its_checkpoint(deployed):
    """eval's rollout (the protocol: start at q[0], qd = 0, never reset) with the exported
    torque: the same simulated trajectory, step after step."""
    from nactuator.eval.episodes import load_episodes
    from nactuator.eval.protocol import episode_rollouts
    from nactuator.models import load_model
    from nactuator.platforms import load_platform
    from nactuator.sim import Simulator

    platform = load_platform("so101")
    episodes = load_episodes(deployed["data"], platform, "test")
    sim = Simulator(platform)
    reference = episode_rollouts(load_model(deployed["ckpt"])[0], sim, episodes)
    assert [r.q.shape for r in reference] == [(70, 6), (40, 6)]
    for kind in ("torchscript", "onnx"):
        exported, _ = load_model(deployed["files"][kind])
        for want, got in zip(reference, episode_rollouts(exported, sim, episodes), strict=True):
            assert got.q.shape == want.q.shape
            assert abs(got.q - want.q).max() <= 1e-4, kind
            assert abs(got.tau - want.tau).max() <= 1e-4, kind
            assert abs(got.gate - want.gate).max() <= 1e-5, kind


@pytest.mark.slow
def test_eval_rolls_an_export_out_like_its_checkpoint(deployed):
    """``evaluate`` end to end on an ONNX export: the same joint and force errors."""
    from nactuator.eval import evaluate

    def joint_errors(model, name):
        out = deployed["root"] / f"eval-{name}"
        evaluate(model, deployed["data"], split="test", out=out)
        metrics = json.loads((out / "metrics.json").read_text())
        return metrics, torch.tensor([e["joints"]["model"]["full"]
                                      for e in metrics["per_episode"]])

    reference, want = joint_errors(deployed["ckpt"], "ckpt")
    metrics, got = joint_errors(deployed["files"]["onnx"], "onnx")
    assert metrics["checkpoint"] == deployed["files"]["onnx"]
    assert metrics["temperature_median"] == 5 and metrics["steps"] == 69 + 39
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), got - want
    for group in ("model", "model_causal"):  # rollout force, and the infer path's
        force = metrics["aggregate"]["all"]["mean"]["force"][group]["full"]["mae_axes"]
        assert force == pytest.approx(
            reference["aggregate"]["all"]["mean"]["force"][group]["full"]["mae_axes"],
            rel=1e-4)


@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory) -> tuple[Path, Path]:
    """A small MLP bundle and its ONNX export, the format chosen by the .onnx extension
    (no ``fmt``): made once for the tests that need an ONNX file of it."""
    folder = tmp_path_factory.mktemp("mlp_onnx")
    bundle = saved_bundle(folder, "mlp")
    return bundle, Path(export(bundle, folder / "b.onnx"))


def test_exports_follow_the_extension_and_refuse_a_mismatch(tmp_path, mlp_onnx):
    bundle, onnx_file = mlp_onnx
    import onnx

    from nactuator.model_files import ModelFileError

    _, meta = load_torchscript(export(bundle, tmp_path / "a.ts"))  # no --format: TorchScript
    assert meta["format"] == "nactuator-export/2"
    graph = onnx.load(onnx_file).graph  # no --format: ONNX
    assert [i.name for i in graph.input] == [*meta["inputs"], "pad"]
    with pytest.raises(ModelFileError, match=r"x.onnx: the extension .onnx means onnx, but "
                                          r"--format torchscript was asked; name the file "
                                          r"\.pt or \.ts or drop --format"):
        export(bundle, tmp_path / "x.onnx", fmt="torchscript")
    with pytest.raises(ModelFileError, match=r"the extension .pt means torchscript, but "
                                          r"--format onnx was asked; name the file \.onnx"):
        export(bundle, tmp_path / "x.pt", fmt="onnx")
    with pytest.raises(ModelFileError, match=r"x.bin: export writes .pt \(torchscript\), .ts "
                                          r"\(torchscript\), .onnx \(onnx\) files"):
        export(bundle, tmp_path / "x.bin")
    assert not any(p.name.startswith("x.") for p in tmp_path.iterdir())


def test_metadata_gives_every_input_and_output_its_unit(deployed):
    import onnx

    from nactuator.platforms import load_platform

    so101 = load_platform("so101")
    meta = json.loads({p.key: p.value for p in
                       onnx.load(deployed["files"]["int8"]).metadata_props}["nactuator"])
    units = meta["units"]
    assert units["channels"] == so101.channel_names
    assert units["inputs"]["q"] == ["rad"] * 6 and units["inputs"]["qd"] == ["rad/s"] * 6
    assert units["inputs"]["voltage"] == ["V"] * 6
    assert units["inputs"]["temperature"] == ["°C"] * 6
    # so101's effort is the STS3215 load register as a fraction of max torque, not amps
    assert so101.effort_signal == "load"
    assert all(u.startswith("fraction of max torque") for u in units["inputs"]["effort"])
    assert set(units["inputs"]) == set(meta["inputs"])
    assert units["outputs"]["tau"] == ["N·m"] * 6 and units["outputs"]["force"].startswith("N,")
    assert meta["graph_inputs"] == [*meta["inputs"], "pad"]
    assert meta["input_shapes"]["pad"] == ["batch", 9]
    assert meta["output_shapes"]["condition"] == ["batch", 6]


def test_units_follow_the_platform_omx_gripper_is_prismatic():
    from nactuator.export import export_units
    from nactuator.platforms import load_platform

    omx = load_platform("omx")
    units = export_units(omx, ["q_cmd", "q", "qd", "effort"])
    kinds = [c.kind for c in omx.channels]
    assert kinds[-1] == "prismatic" and set(kinds[:-1]) == {"revolute"}
    assert units["inputs"]["q"] == ["rad"] * 4 + ["m"]
    assert units["inputs"]["qd"] == ["rad/s"] * 4 + ["m/s"]
    assert units["inputs"]["effort"] == ["A (Present Current)"] * 5
    assert units["outputs"]["tau"] == ["N·m"] * 4 + ["N"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_exported_files_honour_the_umask(tmp_path, umask):
    import os
    import stat

    bundle = saved_bundle(tmp_path, "mlp")
    old = os.umask(umask)
    try:
        path = Path(export(bundle, tmp_path / "deploy" / "a.pt"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in path.parent.iterdir()] == ["a.pt"]


def test_commands_that_need_a_checkpoint_say_so_for_an_export(deployed):
    from nactuator.models import BundleError

    for kind, path in deployed["files"].items():
        name = "torchscript" if kind == "torchscript" else "onnx"
        with pytest.raises(BundleError, match=rf"is an exported {name} model: infer, live "
                                              r"and eval run it, but this needs the "
                                              r"checkpoint \(.ckpt\)"):
            load_actuator(path)
    with pytest.raises(BundleError, match="is an exported torchscript model"):
        export(deployed["files"]["torchscript"], deployed["root"] / "again.onnx")


def test_a_file_of_an_older_export_format_is_refused_with_what_to_do(tmp_path, mlp_onnx):
    import onnx

    from nactuator.models import BundleError, load_model

    path = tmp_path / "a.onnx"
    model = onnx.load(mlp_onnx[1])
    meta = json.loads({p.key: p.value for p in model.metadata_props}["nactuator"])
    onnx.helper.set_model_props(model, {"nactuator": json.dumps(
        {**meta, "format": "nactuator-export/1"})})
    onnx.save(model, path)
    with pytest.raises(BundleError, match=r"a.onnx was exported in format "
                                          r"'nactuator-export/1'; .* export it again"):
        load_model(path)
    (tmp_path / "b.onnx").write_bytes(b"not a protobuf")
    with pytest.raises(BundleError, match="b.onnx is not a readable ONNX model"):
        load_model(tmp_path / "b.onnx")


def test_the_model_kind_is_read_from_the_content_not_the_name(tmp_path, deployed):
    """A bundle saved as .pt is a checkpoint; a TorchScript file named .onnx (what
    `export --out x.onnx` wrote before the extension decided) still runs as TorchScript."""
    import shutil

    from nactuator.model_files import model_kind
    from nactuator.models import load_model

    assert model_kind(saved_bundle(tmp_path, "mlp")) == "checkpoint"  # actuator.pt
    assert model_kind(deployed["files"]["torchscript"]) == "torchscript"
    assert model_kind(deployed["files"]["int8"]) == "onnx"
    misnamed = shutil.copy(deployed["files"]["torchscript"], tmp_path / "misnamed.onnx")
    assert model_kind(misnamed) == "torchscript"
    assert load_model(misnamed)[0].kind == "torchscript"
