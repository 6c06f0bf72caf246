"""Where nactuator finds its configuration and keeps its caches: one definition.

``conf_dir()`` is the ``conf/`` folder (``$NACTUATOR_CONF`` if set), ``project_root()`` the
folder above it, ``cache_dir()`` the project-local cache (``$NACTUATOR_CACHE`` if set: the
default datasets, the Warp kernels). :func:`use_project_warp_cache` points Warp at
``cache_dir()/warp`` unless ``$WARP_CACHE_PATH`` says otherwise, so kernels compile once per
checkout wherever a command runs from. Stdlib only: every room may import it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "conf_dir", "project_root", "use_project_warp_cache", "warp_cache_dir"]


def conf_dir() -> Path:
    """The ``conf/`` folder: ``$NACTUATOR_CONF`` if set, else the repository's ``conf/``."""
    env = os.environ.get("NACTUATOR_CONF")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "conf"


def project_root() -> Path:
    return conf_dir().parent


def cache_dir() -> Path:
    """Project-local cache (``$NACTUATOR_CACHE`` if set): Warp kernels, default datasets."""
    return Path(os.environ.get("NACTUATOR_CACHE", project_root() / ".cache"))


def warp_cache_dir() -> Path:
    """Where Warp keeps compiled kernels: ``$WARP_CACHE_PATH``, else ``cache_dir()/warp``."""
    return Path(os.environ.get("WARP_CACHE_PATH", cache_dir() / "warp"))


def use_project_warp_cache() -> Path:
    """Set ``$WARP_CACHE_PATH`` to :func:`warp_cache_dir` (before Warp initialises)."""
    path = warp_cache_dir()
    os.environ.setdefault("WARP_CACHE_PATH", str(path))
    return path
