"""README.md and the CLI agree: every command and every ``--option`` the README names exists (click introspection).

The Commands table: each row's command exists, every option of its synopsis is
that command's, and every option its description names is that command's or one
of a command the row names in backticks (the budget row's ``train ... --over-budget``).
Every leaf command of the CLI has a row. Anywhere else in the README, an option in
backticks or on a ``streamdp ...`` example line is an option of some command.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from streamdp.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _commands() -> dict[str, click.Command]:
    """Every leaf command by its full name: ``train``, ``privacy epsilon``, ..."""
    out = {}

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                walk(cmd, f"{prefix}{name} ")
            else:
                out[f"{prefix}{name}"] = cmd

    walk(main, "")
    return out


def _options(cmd: click.Command) -> set[str]:
    """The command's option names (``train``'s method options are loaded by ``get_params``)."""
    params = cmd.get_params(click.Context(cmd, info_name=cmd.name))
    return {o for p in params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}


def _rows() -> list[tuple[str, str]]:
    """``(synopsis, description)`` of every row of the Commands table."""
    section = README.read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `streamdp "):
            synopsis, description = line[2:].split(" | ", 1)
            rows.append((synopsis.strip("` "), description))
    return rows


def _command_of(synopsis: str, commands) -> str:
    words = synopsis.split()[1:]  # after "streamdp"
    for n in (2, 1):
        name = " ".join(words[:n])
        if name in commands:
            return name
    raise AssertionError(f"README names a command the CLI does not have: {synopsis!r}")


ROWS = _rows()


def test_readme_has_a_command_table_row_for_every_command():
    commands = _commands()
    assert len(ROWS) >= 10
    documented = {_command_of(s, commands) for s, _ in ROWS}
    assert documented == set(commands), sorted(set(commands) ^ documented)


@pytest.mark.parametrize("synopsis,description", ROWS, ids=[r[0].split(" [")[0] for r in ROWS])
def test_readme_command_row_names_only_existing_options(synopsis, description):
    commands = _commands()
    name = _command_of(synopsis, commands)
    own = _options(commands[name])
    missing = [o for o in OPTION.findall(synopsis) if o not in own]
    assert not missing, f"`streamdp {name}` has no {missing} (README synopsis)"
    named = {m for m in re.findall(r"`(?:streamdp )?([a-z]+(?: [a-z]+)?)", description) if m in commands}
    named |= {m.split()[0] for m in re.findall(r"`(?:streamdp )?([a-z]+)", description) if m in commands}
    allowed = own.union(*(_options(commands[n]) for n in named)) if named else own
    missing = [o for o in OPTION.findall(description) if o not in allowed]
    assert not missing, f"README's row of `streamdp {name}` names {missing}, options of none of {[name, *named]}"


def test_every_option_the_readme_names_exists():
    every = set().union(*(_options(c) for c in _commands().values()))
    text = README.read_text()
    spans = [s for s in re.findall(r"`([^`\n]+)`", text) if not s.startswith(("python ", "pip "))]  # bench, pytest
    spans += [ln for ln in text.splitlines() if ln.lstrip().startswith("streamdp ")]
    named = {o for span in spans for o in OPTION.findall(span)}
    assert named, "no options found in README"
    assert not named - every, f"README names options no command has: {sorted(named - every)}"
