"""The README's list of commands is the CLI's: a subcommand added (or renamed) shows up in it."""

import argparse
import re
from pathlib import Path

from specray.cluster.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_readme_lists_every_command():
    line = next(line for line in README.read_text().splitlines() if line.startswith("CLI (`--help` on each command;"))
    listed = re.findall(r"`([a-z|]+(?: [a-z|]+)?)`", line)
    commands = _subcommands(build_parser())
    bench = _subcommands(commands["bench"])
    named = {name for item in listed for name in item.split()[:1]}
    assert named == set(commands), line
    (bench_item,) = [item for item in listed if item.startswith("bench ")]
    assert set(bench_item.split()[1].split("|")) == set(bench), line
