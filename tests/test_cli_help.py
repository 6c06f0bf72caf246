"""Every command and every option of `nactuator` explains itself in --help."""

from __future__ import annotations

import argparse

from nactuator.cli import build_parser


def _subparsers(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", helps.get(name), sub
                yield from _subparsers(sub, f"{prefix}{name} ")


def test_every_command_and_option_has_help():
    missing = []
    for name, summary, sub in _subparsers(build_parser()):
        if not summary:
            missing.append(f"{name} (command)")
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            if not action.help:
                missing.append(f"{name} {action.option_strings or action.dest}")
    assert not missing, f"options without help text: {missing}"


def test_top_level_help_lists_every_command_on_one_line(capsys):
    try:
        build_parser().parse_args(["--help"])
    except SystemExit:
        pass
    text = capsys.readouterr().out
    for command in ("train", "eval", "cv", "infer", "record", "live", "data", "sim-check"):
        assert f"    {command} " in text or f"    {command}\n" in text, command
