"""Warp's "no CUDA driver" notice is dropped on CPU runs; everything else it prints stays."""

from __future__ import annotations

import os

from nactuator.sim import warp_runtime

NOTICE = ("Warp CUDA warning: Could not find or load the NVIDIA CUDA driver. GPU execution "
          "will not be available.\n")


def test_only_the_driver_notice_is_dropped():
    text = "first\n" + NOTICE + "Warp CUDA error: Failed to get function cuGetProcAddress\n"
    assert warp_runtime.without_driver_notice(text) == (
        "first\nWarp CUDA error: Failed to get function cuGetProcAddress\n")


def _fake_init(calls):
    def init():  # what Warp's native library does: write straight to file descriptor 2
        calls.append(1)
        os.write(2, NOTICE.encode() + b"Warp CUDA error: driver too old\n")
    return init


def test_cpu_init_passes_on_every_other_line_and_runs_once(monkeypatch, capfd):
    calls = []
    monkeypatch.setattr(warp_runtime, "_initialised", False)
    monkeypatch.setattr(warp_runtime.wp, "init", _fake_init(calls))
    warp_runtime.init_warp("cpu")
    warp_runtime.init_warp("cpu")
    err = capfd.readouterr().err
    assert calls == [1]
    assert "Could not find or load the NVIDIA CUDA driver" not in err
    assert "Warp CUDA error: driver too old" in err
    os.write(2, b"after\n")  # fd 2 is the terminal's again
    assert capfd.readouterr().err == "after\n"


def test_a_gpu_request_keeps_the_notice(monkeypatch, capfd):
    monkeypatch.setattr(warp_runtime, "_initialised", False)
    monkeypatch.setattr(warp_runtime.wp, "init", _fake_init([]))
    warp_runtime.init_warp("cuda:0")
    assert "Could not find or load the NVIDIA CUDA driver" in capfd.readouterr().err
