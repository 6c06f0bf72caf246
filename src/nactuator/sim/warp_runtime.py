"""Warp's one-time initialisation, without its "no CUDA driver" notice on CPU runs.

``wp.init()`` probes for a CUDA driver and, on a machine without one, its native library
prints ``Warp CUDA warning: Could not find or load the NVIDIA CUDA driver ...`` straight
to file descriptor 2 — on every CPU command, where nobody asked for a GPU. For a CPU
device :func:`init_warp` runs the probe with fd 2 captured and passes on everything Warp
wrote except that one line. A GPU request initialises Warp plainly (the simulator's
``_warp_device``), so there the notice, and our own "Warp sees no CUDA device" error,
both reach the user.
"""

from __future__ import annotations

import os
import sys
import tempfile

import warp as wp

__all__ = ["NO_DRIVER_NOTICE", "init_warp", "without_driver_notice"]

NO_DRIVER_NOTICE = "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver"

_initialised = False


def without_driver_notice(text: str) -> str:
    """``text`` without the lines of Warp's no-driver notice; every other line kept."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith(NO_DRIVER_NOTICE))


def init_warp(device: str = "cpu") -> None:
    """``wp.init()`` once; for ``device == "cpu"`` without Warp's no-driver notice."""
    global _initialised
    if _initialised:
        return
    if device != "cpu":
        wp.init()
        _initialised = True
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            wp.init()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = without_driver_notice(captured.read().decode("utf-8", "replace"))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
    _initialised = True
