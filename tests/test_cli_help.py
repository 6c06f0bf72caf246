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


def _help(argv: list[str], capsys) -> str:
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        pass
    return capsys.readouterr().out


def _example(text: str) -> list[str]:
    """The command after "example:", joined over its backslash-continued lines."""
    lines = text.splitlines()
    k = lines.index("example:") + 1
    words = []
    while True:
        line = lines[k].rstrip()
        words += line.removesuffix("\\").split()
        if not line.endswith("\\"):
            return words
        k += 1


def test_train_help_says_how_lightning_options_pass_through(capsys):
    from nactuator.platforms import conf_dir

    text = _help(["train", "--help"], capsys)
    for option in ("--config YAML", "--trainer.KEY=VALUE", "--model.KEY=VALUE",
                   "--data.KEY=VALUE", "--logger", "nactuator fit --help"):
        assert option in text, option
    # The example parses: train's own options are taken, the rest is handed to `fit`.
    example = _example(text)
    assert example[:2] == ["nactuator", "train"]
    a, rest = build_parser().parse_known_args(example[1:])
    assert a.command == "train" and a.platform == "so101" and a.passthrough
    assert rest == ["--config", "conf/train/nad_so101.yaml", "--trainer.max_epochs=12",
                    "--trainer.default_root_dir=runs/so101-nad"]
    assert (conf_dir().parent / rest[1]).is_file()


def test_cv_help_explains_the_double_dash(capsys):
    from nactuator.platforms import conf_dir

    text = _help(["cv", "--help"], capsys)
    assert "everything after `--` goes to every fold's `nactuator train`" in text
    example = _example(text)
    a, rest = build_parser().parse_known_args(example[1:])
    assert a.command == "cv" and a.max_folds == 2 and a.jobs == 2
    passed = [x for x in rest if x != "--"]  # what _cv hands to every fold's train
    assert passed == ["--config", "conf/train/nad_omx.yaml", "--trainer.max_epochs=12"]
    assert (conf_dir().parent / passed[1]).is_file()


def test_one_name_for_our_on_disk_format():
    """"NAD" is the external CSV dataset; what nactuator writes is a "nactuator dataset"
    (docs/data-format.md, Names). The old "NAD shards" is gone from every help text and
    page, except the one sentence that says it was renamed."""
    from nactuator.platforms import conf_dir

    helps = []
    for _, summary, sub in _subparsers(build_parser()):
        helps.append(summary or "")
        helps += [a.help or "" for a in sub._actions]
    assert not [h for h in helps if "nad shard" in h.lower()]
    assert any("nactuator dataset" in h for h in helps)
    root = conf_dir().parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    old = {p.name: " ".join(p.read_text().lower().split()).count("nad shard") for p in pages}
    assert old.pop("data-format.md") == 1 and not any(old.values()), old
    assert "is a **nactuator dataset**" in (root / "docs" / "data-format.md").read_text()
