"""What a user keeps is never half-written: a failed write leaves the old file intact."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nactuator.atomic import atomic_path, write_json, write_text


def test_failed_write_keeps_the_previous_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "metrics.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_json_is_strict_with_nan_as_null(tmp_path):
    path = write_json(tmp_path / "a" / "m.json", {"mae": math.nan, "n": np.int64(3),
                                                 "x": [np.float32(0.5), math.inf]})
    assert json.loads(path.read_text()) == {"mae": None, "n": 3, "x": [0.5, None]}
