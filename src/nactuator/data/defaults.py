"""The small synthetic dataset ``make train PLATFORM=<p>`` trains on when given no data.

Its recipe (seed, tasks, trajectory count and length) is ``conf/train/default_data.yaml``;
the world is ``conf/world/<platform>.yaml``. It is generated on first use and cached under a
folder named by a digest of everything that decides its content: the recipe, the world file,
the platform file and robot model, and the source of the world and of ``data.synth``. Editing
any of them (e.g. a task's posture or a register's sign) regenerates instead of reusing stale
data.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
from pathlib import Path

import yaml

from nactuator.data.schema import DataFormatError
from nactuator.platforms import conf_dir, load_platform

__all__ = ["default_dataset"]


def _generator_files(platform: str) -> list[Path]:
    """The files besides the recipe that decide what the default dataset contains."""
    import nactuator.data.synth as synth  # data reaches the world only through synth

    p = load_platform(platform)
    world_file = conf_dir() / "world" / f"{platform}.yaml"
    world_code = Path(inspect.getfile(synth.World)).parent
    code = [*sorted(world_code.glob("*.py")), world_code.parent / "servo_units.py",
            Path(synth.__file__)]
    return [world_file, p.source, p.robot_model_path(), *code]


def _digest(platform: str, spec: dict) -> str:
    h = hashlib.sha1(json.dumps(spec, sort_keys=True).encode())
    for path in _generator_files(platform):
        path = Path(path)
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"")
    return h.hexdigest()


def default_dataset(platform: str, cache: Path) -> Path:
    """The platform's default dataset under ``cache``, generated if missing.

    Generation goes to a temporary folder that is moved into place only when complete, so
    an interrupted run never leaves half a dataset.
    """
    spec_file = conf_dir() / "train" / "default_data.yaml"
    specs = yaml.safe_load(spec_file.read_text()) or {}
    if platform not in specs:
        raise DataFormatError(
            f"{spec_file}: no default dataset configured for platform {platform!r} "
            f"(have {sorted(specs)}); pass --data PATH")
    spec = dict(specs[platform])
    out = Path(cache) / f"{platform}-default-{_digest(platform, spec)[:8]}"
    if (out / "meta" / "info.json").is_file():
        return out
    from nactuator.data.synth import synthesize

    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    print(f"[nactuator] generating the default {platform} dataset in {out} ({spec})",
          flush=True)
    try:
        print(synthesize(platform, str(tmp), **spec), flush=True)
        if out.exists():  # a concurrent run finished first; keep its copy
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
