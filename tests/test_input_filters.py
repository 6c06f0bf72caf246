"""The input filters (nactuator.input_filters): the fill rule for missing telemetry, the
causal running median, the causal pooled statistics, streaming equal to offline, and the
spec a bundle carries."""

from __future__ import annotations

import numpy as np
import pytest

from nactuator.input_filters import (
    POOLED_KEYS,
    SLOPE_FLOOR,
    InputFilterError,
    check_spec,
    filter_inputs,
    input_filter_spec,
    legacy_spec,
)
from nactuator.models import BundleError, NeuralActuator, bundle_to_dict, load_actuator

NAN = np.nan


def test_a_failed_read_holds_the_last_valid_reading_or_reads_zero():
    q = np.array([[NAN, 1.0], [2.0, NAN], [NAN, NAN], [4.0, 5.0]], np.float32)
    valid = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], np.float32)
    frames = {"q": q, "telemetry_valid": valid, "q_cmd": q.copy()}
    held, state = filter_inputs(frames, input_filter_spec(1, "hold_last_valid"))
    np.testing.assert_array_equal(held["q"], [[NAN, 1.0], [2.0, 1.0], [2.0, 1.0], [4.0, 5.0]])
    np.testing.assert_array_equal(state.held["q"], [4.0, 5.0])
    zero, _ = filter_inputs(frames, input_filter_spec(1, "zero"))
    np.testing.assert_array_equal(zero["q"], [[0, 1.0], [2.0, 0], [0, 0], [4.0, 5.0]])
    # Commands are what was sent: never filled. The input is not modified.
    assert np.isnan(held["q_cmd"][0, 0]) and np.isnan(q[0, 0])
    # A stale value on a frame flagged unread is not trusted either.
    stale = {"q": np.array([[1.0], [9.0]], np.float32), "telemetry_valid": np.array([[1], [0]])}
    np.testing.assert_array_equal(filter_inputs(stale, input_filter_spec(1))[0]["q"], [[1], [1]])


def test_the_running_median_is_causal_and_removes_glitches():
    temp = np.full((40, 1), 35.0, np.float32)
    temp[10] = 150.0  # a one-frame glitch
    temp[20:23] = 95.0  # a burst of 3 (up to window // 2 = 5 are removed)
    temp[30:] = 40.0  # a real step
    out = filter_inputs({"temperature": temp}, input_filter_spec(11))[0]["temperature"][:, 0]
    assert out[:30].max() == 35.0
    # The step shows once 6 of the trailing 11 frames hold it: frame 35, never earlier.
    assert out[34] == 35.0 and out[35] == 40.0 and (out[35:] == 40.0).all()
    # No future frame is read: changing frames after t leaves frames <= t unchanged.
    changed = temp.copy()
    changed[25:] = 80.0
    again = filter_inputs({"temperature": changed}, input_filter_spec(11))[0]["temperature"]
    np.testing.assert_array_equal(again[:25, 0], out[:25])
    # At the start only the frames that exist count; the lower middle for an even count.
    start = np.array([[30.0], [150.0], [31.0], [32.0]], np.float32)
    got = filter_inputs({"temperature": start}, input_filter_spec(11))[0]["temperature"]
    np.testing.assert_array_equal(got[:, 0], [30.0, 30.0, 31.0, 31.0])


def _recording(length: int = 120, n: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    frames = {k: rng.normal(size=(length, n)).astype(np.float32)
              for k in ("q_cmd", "q", "qd", "effort", "voltage")}
    frames["temperature"] = (35 + rng.normal(size=(length, n))).astype(np.float32)
    frames["temperature"][rng.random((length, n)) < 0.05] = 150.0  # glitches
    valid = (rng.random((length, n)) > 0.15).astype(np.float32)
    valid[:3, 0] = 0  # a motor not read before its first reading
    for key in ("q", "qd", "effort", "voltage", "temperature"):
        frames[key][valid == 0] = NAN
    frames["telemetry_valid"] = valid
    return frames


@pytest.mark.parametrize("pool", [None, 16], ids=["plain", "pooled"])
@pytest.mark.parametrize("missing", ["hold_last_valid", "zero"])
def test_a_stream_filtered_chunk_by_chunk_equals_the_whole_episode(missing, pool):
    frames = _recording()
    spec = input_filter_spec(11, missing, pool)
    whole, _ = filter_inputs(frames, spec)
    rng = np.random.default_rng(1)
    cuts = np.unique(np.concatenate([[0], rng.integers(1, 120, 20), np.arange(0, 12), [120]]))
    state, parts = None, []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):  # chunks of 1 frame and longer
        out, state = filter_inputs({k: v[a:b] for k, v in frames.items()}, spec, state)
        parts.append(out)
    pooled = list(POOLED_KEYS) if pool else []
    assert all(k in whole for k in pooled) and (pool or not any(k in whole for k in POOLED_KEYS))
    for key in [*spec["telemetry"], *pooled]:
        streamed = np.concatenate([p[key] for p in parts])
        np.testing.assert_array_equal(streamed, whole[key])  # bit-identical
    assert np.isnan(whole["q"][:3, 0]).all() == (missing == "hold_last_valid")
    assert not np.isnan(whole["temperature"][3:]).any()


def _pooled_reference(u: np.ndarray, c: np.ndarray, t: int, frames: int) -> dict[str, float]:
    """The pooled statistics of one motor at frame ``t`` written out as weighted sums over
    frames k <= t (weight α (1 − α)^(t − k), α = 2 / (frames + 1), frames whose inputs are
    NaN left out, each moment divided by its total weight): no recursion, no state."""
    alpha = 2.0 / (frames + 1.0)
    k = np.arange(t + 1)
    weight = alpha * (1.0 - alpha) ** (t - k)
    u, c = u[: t + 1].astype(np.float64), c[: t + 1].astype(np.float64)
    du = np.concatenate([[np.nan], np.diff(u)])
    dc = np.concatenate([[np.nan], np.diff(c)])

    def mean(x):
        ok = np.isfinite(x)
        return np.sum(weight[ok] * x[ok]) / np.sum(weight[ok]) if ok.any() else np.nan

    eu, ec = mean(u), mean(c)
    var_u, var_c = mean(u * u) - eu**2, mean(c * c) - ec**2
    cov = mean(u * c) - eu * ec
    den = np.sqrt(max(var_u, 0.0) * max(var_c, 0.0))
    return {"pool_effort_mean": eu, "pool_effort_std": np.sqrt(max(var_u, 0.0)),
            "pool_effort_abs": mean(np.abs(u)), "pool_command_std": np.sqrt(max(var_c, 0.0)),
            "pool_effort_command_corr": cov / den if den > 1e-12 else 0.0,  # constant: 0
            "pool_effort_command_slope": cov / (var_c + SLOPE_FLOOR**2),
            "pool_command_speed": mean(np.abs(dc)), "pool_effort_drive": mean(u * np.sign(dc)),
            "pool_effort_roughness": mean(np.abs(du))}


def test_pooled_statistics_are_weighted_averages_of_the_past_only():
    """Each pooled channel at frame t equals its definition computed from frames <= t of
    the filled effort and the command (an independent weighted sum, float32 tolerance);
    frames after t change nothing at t; a motor's frames before its first reading add
    nothing, and no pooled channel exists without ``pool``."""
    rng = np.random.default_rng(4)
    length, frames = 200, 32
    c = np.cumsum(rng.normal(0, 0.02, (length, 2)), axis=0).astype(np.float32)
    u = (0.8 * c + rng.normal(0, 0.03, (length, 2))).astype(np.float32)  # a spring + noise
    valid = np.ones((length, 2), np.float32)
    valid[:5, 1] = 0  # motor 1 not read yet
    effort = np.where(valid > 0, u, np.nan).astype(np.float32)
    recording = {"q_cmd": c, "effort": effort, "telemetry_valid": valid}
    spec = input_filter_spec(1, "hold_last_valid", frames)
    out, _ = filter_inputs(recording, spec)
    for t in (0, 1, 6, 40, 199):
        for motor in (0, 1):
            if motor == 1 and t < 5:
                assert all(np.isnan(out[k][t, 1]) for k in POOLED_KEYS[:3])
                continue
            want = _pooled_reference(effort[:, motor], c[:, motor], t, frames)
            for key in POOLED_KEYS:
                if t == 0 or (motor == 1 and t == 5):  # no finite difference yet
                    if key in ("pool_command_speed", "pool_effort_drive",
                               "pool_effort_roughness"):
                        continue
                np.testing.assert_allclose(out[key][t, motor], want[key], rtol=2e-4,
                                           atol=1e-6, err_msg=f"{key} t={t} motor={motor}")
    # the spring shows: effort follows the command with slope ~0.8 once the joint moved
    assert 0.5 < out["pool_effort_command_slope"][-1, 0] < 1.1
    assert out["pool_effort_command_corr"][-1, 0] > 0.5
    changed = {k: v.copy() for k, v in recording.items()}
    changed["effort"][120:] += 3.0
    changed["q_cmd"][120:] -= 1.0
    again, _ = filter_inputs(changed, spec)
    for key in POOLED_KEYS:
        np.testing.assert_array_equal(again[key][:120], out[key][:120])
        assert not np.array_equal(again[key][120:], out[key][120:])
    plain, _ = filter_inputs(recording, input_filter_spec(1, "hold_last_valid"))
    assert not set(POOLED_KEYS) & set(plain)


def test_spec_errors_name_the_field():
    good = input_filter_spec(11)
    assert check_spec(good) == good
    pooled = input_filter_spec(11, pool_frames=64)
    assert check_spec(pooled) == pooled and pooled["pool"] == {"frames": 64}
    assert "pool" not in good  # specs without pooling are what older bundles hold
    for change, field in (({"missing": "interpolate"}, "missing"),
                          ({"median": {"temperature": 4}}, "median.temperature"),
                          ({"format": "other/1"}, "format"),
                          ({"pool": {"frames": 1}}, "pool"),
                          ({"pool": 64}, "pool"),
                          ({"telemetry": "q"}, "telemetry")):
        with pytest.raises(InputFilterError, match=f"input_filters.{field}"):
            check_spec({**good, **change})


STATS = {k: {"mean": [0.0] * 2, "std": [1.0] * 2}
         for k in ("q_cmd", "q", "qd", "effort", "voltage", "temperature", "error")}


def test_bundles_carry_the_spec_and_older_ones_get_what_they_were_trained_with():
    actuator = NeuralActuator(n_motors=2, norm_stats=STATS, model_config={"arch": "mlp"})
    spec = input_filter_spec(7, "hold_last_valid")
    bundle = bundle_to_dict(actuator, "omx", {"input_filters": spec})
    assert bundle["input_filters"] == spec
    assert load_actuator(bundle)[1]["input_filters"] == spec
    # Saved before bundles had a spec: zero fill, the training's median width (trailing).
    old = bundle_to_dict(actuator, "omx", {"training_config": {"data": {
        "temperature_median": 11}}})
    old.pop("input_filters")
    assert load_actuator(old)[1]["input_filters"] == {
        "format": "nactuator-input-filters/1", "missing": "zero",
        "telemetry": ["q", "qd", "effort", "voltage", "temperature"],
        "median": {"temperature": 11}}
    assert legacy_spec(None)["median"] == {}  # a bare bundle: raw temperature
    broken = {**bundle, "input_filters": {**spec, "missing": "guess"}}
    with pytest.raises(BundleError, match="input_filters.missing must be one of"):
        load_actuator(broken)


def test_a_bundle_saved_before_pooling_reads_and_runs_as_before():
    """The shipped SO-101 bundle (saved before the spec had ``pool``): its spec gains no
    pooled statistics, the channels it reads are bit-identical whether or not a spec pools
    (pooling adds channels, never changes one), so its outputs are too, and its live window
    reads exactly the channels it did."""
    from nactuator.rollout import StreamingWindow, causal_outputs

    actuator, meta = load_actuator("pretrained/so101")
    spec = meta["input_filters"]
    assert "pool" not in spec and not set(POOLED_KEYS) & set(actuator.inputs)
    frames = _recording(n=6)
    for key in actuator.inputs:
        frames.setdefault(key, np.zeros_like(frames["q"]))
    plain, _ = filter_inputs(frames, spec)
    pooled, _ = filter_inputs(frames, {**spec, "pool": {"frames": 64}})
    assert not set(POOLED_KEYS) & set(plain) and set(POOLED_KEYS) <= set(pooled)
    for key in plain:
        np.testing.assert_array_equal(plain[key], pooled[key], err_msg=key)
    (before,), (after,) = causal_outputs(actuator, [plain]), causal_outputs(actuator, [pooled])
    for key in ("tau", "force", "gate", "condition"):
        np.testing.assert_array_equal(before[key], after[key], err_msg=key)
    window = StreamingWindow(actuator.inputs, actuator.window_length, 6, filters=spec)
    assert window.frame_keys == list(actuator.inputs)
