"""Where the Warp kernels are kept: per user by default, so a second checkout compiles nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from nactuator import paths


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("WARP_CACHE_PATH", "NACTUATOR_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_kernels_go_to_the_users_cache_shared_by_every_checkout(clean_env, tmp_path):
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.warp_cache_dir() == tmp_path / "xdg" / "nactuator" / "warp"
    assert (tmp_path / "xdg" / "nactuator" / "warp").is_dir()
    clean_env.delenv("XDG_CACHE_HOME")
    clean_env.setenv("HOME", str(tmp_path / "home"))
    assert paths.warp_cache_dir() == tmp_path / "home" / ".cache" / "nactuator" / "warp"


def test_explicit_settings_win_in_order(clean_env, tmp_path):
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    clean_env.setenv("NACTUATOR_CACHE", str(tmp_path / "project"))
    assert paths.warp_cache_dir() == tmp_path / "project" / "warp"
    clean_env.setenv("WARP_CACHE_PATH", str(tmp_path / "mine"))
    assert paths.warp_cache_dir() == tmp_path / "mine"
    assert paths.use_warp_cache() == tmp_path / "mine"


def test_an_unwritable_home_falls_back_to_the_project_cache(clean_env, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    clean_env.setenv("XDG_CACHE_HOME", str(blocker))  # mkdir under a file fails
    assert paths.warp_cache_dir() == paths.cache_dir() / "warp"
    assert Path(paths.cache_dir()).name == ".cache"
