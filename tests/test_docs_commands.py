"""Every `nactuator ...` command written in README.md and docs/*.md parses with today's CLI:
subcommands and flags exist, and the LightningCLI arguments handed to `train`/`cv`/`fit`
are keys the module and the DataModule accept. (tests/test_readme.py runs the README.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from nactuator.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = re.compile(r"\[[^\]]*\]|<[^>]*>|\.\.\.")  # [--opt], <p>, ... in usage lines


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        # every fence pairs with its own close, so a ```python block cannot shift the pairing
        blocks = re.findall(r"```(\w*)\n(.*?)```", path.read_text(), flags=re.S)
        for block in (text for lang, text in blocks if lang in ("", "bash", "sh")):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("nactuator ") and "..." not in line:
                    found.append((path.name, line))
    return found


COMMANDS = documented_commands()


def test_the_docs_have_commands():
    assert len(COMMANDS) > 20


def _lightning_keys(args: list[str]) -> list[str]:
    # `--trainer.callbacks+=CLASS` appends to a list (jsonargparse), then
    # `--trainer.callbacks.KEY=V` sets an argument of the class just appended.
    ours = [a for a in args if a.startswith(("--model.", "--data.", "--trainer."))]
    keys = [a.split("=")[0].removesuffix("+") for a in ours]
    appended = {k for k, a in zip(keys, ours, strict=True) if "+=" in a}
    return [k for k in keys if not any(k.startswith(f"{p}.") for p in appended)]


@pytest.fixture(scope="module")
def lightning_parser():
    from nactuator.data.datamodule import NADDataModule
    from nactuator.training.cli import _make_cli_class
    from nactuator.training.module import NeuralActuatorModule

    cli = _make_cli_class()(NeuralActuatorModule, NADDataModule, run=False,
                            args=["--platform", "so101", "--data.paths=[x]"],
                            parser_kwargs={"default_env": False})
    return cli.parser


@pytest.mark.parametrize("where, line", COMMANDS, ids=[f"{w}:{i}" for i, (w, _) in
                                                        enumerate(COMMANDS)])
def test_documented_command_parses(where, line, lightning_parser):
    argv = [a for a in shlex.split(PLACEHOLDER.sub("", line))[1:] if a != "&"]
    parser = build_parser()
    if argv[0] in ("fit", "validate", "test"):
        rest = argv[1:]
    else:
        try:
            a, rest = parser.parse_known_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `{line}` does not parse with today's CLI")
        if not getattr(a, "passthrough", False):
            assert not rest, f"{where}: `{line}`: unknown arguments {rest}"
            return
    rest = [x for x in rest if x not in ("--", "&")]
    unknown = [k for k in _lightning_keys(rest) if not _known(k[2:], lightning_parser)]
    assert not unknown, f"{where}: `{line}`: LightningCLI does not know {unknown}"


def _known(key: str, parser) -> bool:
    """A key of the parser, a group of keys, or inside a free-form (dict) value."""
    defaults = parser.get_defaults()
    keys = list(defaults.keys())
    return (key in keys or any(k.startswith(key + ".") for k in keys)
            or any(key.startswith(k + ".") and isinstance(defaults[k], dict | None)
                   for k in keys))
