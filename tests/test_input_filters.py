"""The input filters (nactuator.input_filters): the fill rule for missing telemetry, the
causal running median, streaming equal to offline, and the spec a bundle carries."""

from __future__ import annotations

import numpy as np
import pytest

from nactuator.input_filters import (
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


@pytest.mark.parametrize("missing", ["hold_last_valid", "zero"])
def test_a_stream_filtered_chunk_by_chunk_equals_the_whole_episode(missing):
    frames = _recording()
    spec = input_filter_spec(11, missing)
    whole, _ = filter_inputs(frames, spec)
    rng = np.random.default_rng(1)
    cuts = np.unique(np.concatenate([[0], rng.integers(1, 120, 20), np.arange(0, 12), [120]]))
    state, parts = None, []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):  # chunks of 1 frame and longer
        out, state = filter_inputs({k: v[a:b] for k, v in frames.items()}, spec, state)
        parts.append(out)
    for key in spec["telemetry"]:
        streamed = np.concatenate([p[key] for p in parts])
        np.testing.assert_array_equal(streamed, whole[key])  # bit-identical
    assert np.isnan(whole["q"][:3, 0]).all() == (missing == "hold_last_valid")
    assert not np.isnan(whole["temperature"][3:]).any()


def test_spec_errors_name_the_field():
    good = input_filter_spec(11)
    assert check_spec(good) == good
    for change, field in (({"missing": "interpolate"}, "missing"),
                          ({"median": {"temperature": 4}}, "median.temperature"),
                          ({"format": "other/1"}, "format"),
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
