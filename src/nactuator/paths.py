"""Where nactuator finds its configuration and keeps its caches: one definition.

``conf_dir()`` is the ``conf/`` folder (``$NACTUATOR_CONF`` if set), ``project_root()`` the
folder above it, ``cache_dir()`` the project-local cache (``$NACTUATOR_CACHE`` if set: the
default datasets). Compiled Warp kernels are kept per user, not per checkout
(:func:`warp_cache_dir`): a cold cache costs minutes of compilation (the chain kernel is
unrolled per arm geometry: ~40 s for SO-101, ~95 s for Franka), and Warp keys every module by
a hash of its source and options, so a second clone, a worktree or a CI run reuses what an
earlier one compiled without ever loading a stale kernel. :func:`use_warp_cache` points Warp
there (before Warp initialises) unless ``$WARP_CACHE_PATH`` says otherwise. Stdlib only:
every room may import it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "conf_dir", "project_root", "use_warp_cache", "warp_cache_dir"]


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
    """Where Warp keeps compiled kernels: ``$WARP_CACHE_PATH``; else ``$NACTUATOR_CACHE/warp``
    if that is set; else the user's cache, ``${XDG_CACHE_HOME:-~/.cache}/nactuator/warp``
    (the project's ``.cache/warp`` where the home folder cannot be written)."""
    if "WARP_CACHE_PATH" in os.environ:
        return Path(os.environ["WARP_CACHE_PATH"])
    if "NACTUATOR_CACHE" in os.environ:
        return cache_dir() / "warp"
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nactuator" / "warp"
    try:
        user.mkdir(parents=True, exist_ok=True)
    except OSError:
        return cache_dir() / "warp"
    return user if os.access(user, os.W_OK) else cache_dir() / "warp"


def use_warp_cache() -> Path:
    """Set ``$WARP_CACHE_PATH`` to :func:`warp_cache_dir` (before Warp initialises)."""
    path = warp_cache_dir()
    os.environ.setdefault("WARP_CACHE_PATH", str(path))
    return path
