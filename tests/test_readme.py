"""README.md, docs/*.md and the CLI agree (click introspection).

- Every leaf command has a row in the README's Commands table and a reference section
  (a heading ``## streamdp COMMAND``) in some docs page; the synopsis of a row or
  section names only that command's options, and its text only options of that
  command or of a command it names in backticks (the budget section's
  ``train --over-budget``).
- Anywhere in the README and docs, an option in backticks or on a ``streamdp ...``
  example line is an option of some command.
- The README's Methods table has one row per method that ``streamdp methods`` lists.
- Every docs page is linked from the README, and every relative link resolves.
- The worked example runs, and prints what the README shows under it, line for line,
  but for timings, run ids and dates (``test_worked_example_prints_what_the_readme_shows``, ``-m slow``: a
  minute and more); by default the same commands run in process on a store of a tenth of the users and every
  command succeeds and prints each kind of line the README shows
  (``test_worked_example_runs_on_a_smaller_store``).

A new docs page is picked up without editing this file.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from streamdp.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README] + DOCS
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
HEADING = re.compile(r"^(#{1,3}) streamdp ([a-z][a-z -]*?)\s*$", re.M)


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


COMMANDS = _commands()


def _options(cmd: click.Command) -> set[str]:
    """The command's option names (``train``'s method options are loaded by ``get_params``)."""
    params = cmd.get_params(click.Context(cmd, info_name=cmd.name, help_option_names=["-h", "--help"]))
    return {o for p in params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}


def _table_rows(text: str, heading: str) -> list[tuple[str, str]]:
    """``(first cell, rest)`` of every body row of the first table under ``## heading``."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            first, rest = line[2:].split(" | ", 1)
            rows.append((first.strip("` "), rest))
    return rows


def _sections() -> list[tuple[str, str, str, str]]:
    """``(page, command, synopsis, text)`` of every ``## streamdp COMMAND`` section of the README and docs."""
    out = []
    for page in PAGES:
        text = page.read_text()
        heads = list(HEADING.finditer(text))
        for h in heads:
            level = len(h.group(1))
            body = text[h.end():]
            nxt = re.search(rf"^#{{1,{level}}} ", body, re.M)
            body = body[:nxt.start()] if nxt else body
            syn = re.search(r"^`(streamdp [^`]+)`\s*$", body, re.M)
            out.append((page.relative_to(ROOT).as_posix(), h.group(2), syn.group(1) if syn else "",
                        body[syn.end():] if syn else body))
    return out


def _command_of(synopsis: str) -> str:
    words = synopsis.split()[1:]  # after "streamdp"
    for n in (2, 1):
        name = " ".join(words[:n])
        if name in COMMANDS:
            return name
    raise AssertionError(f"the docs name a command the CLI does not have: {synopsis!r}")


def _check_options(name: str, synopsis: str, text: str, where: str) -> None:
    own = _options(COMMANDS[name])
    missing = [o for o in OPTION.findall(synopsis) if o not in own]
    assert not missing, f"`streamdp {name}` has no {missing} ({where}, synopsis)"
    named = {m for m in re.findall(r"`(?:streamdp )?([a-z]+(?: [a-z]+)?)", text) if m in COMMANDS}
    named |= {m.split()[0] for m in re.findall(r"`(?:streamdp )?([a-z]+)", text) if m in COMMANDS}
    allowed = own.union(*(_options(COMMANDS[n]) for n in named)) if named else own
    missing = [o for o in OPTION.findall(text) if o not in allowed]
    assert not missing, f"{where}: `streamdp {name}` names {missing}, options of none of {[name, *named]}"


ROWS = _table_rows(README.read_text(), "Commands")
SECTIONS = _sections()


def test_every_command_has_a_readme_row_and_a_reference_section():
    documented = {_command_of(s) for s, _ in ROWS}
    assert documented == set(COMMANDS), f"README Commands table: {sorted(set(COMMANDS) ^ documented)}"
    sections = {c for _, c, _, _ in SECTIONS}
    assert not sections - set(COMMANDS), f"sections for commands the CLI does not have: {sections - set(COMMANDS)}"
    missing = set(COMMANDS) - sections
    assert not missing, f"no '## streamdp COMMAND' section in docs/*.md for {sorted(missing)}"
    for page, command, synopsis, _ in SECTIONS:
        assert synopsis and _command_of(synopsis) == command, f"{page}: section {command} has no `streamdp {command} " \
                                                              f"...` synopsis line"


@pytest.mark.parametrize("synopsis,description", ROWS, ids=[r[0].split(" [")[0] for r in ROWS])
def test_readme_command_row_names_only_existing_options(synopsis, description):
    _check_options(_command_of(synopsis), synopsis, description, "README Commands table")


@pytest.mark.parametrize("page,command,synopsis,text", SECTIONS, ids=[f"{s[0]}:{s[1]}" for s in SECTIONS])
def test_reference_section_names_only_existing_options(page, command, synopsis, text):
    _check_options(command, synopsis, text, page)


def test_every_option_the_docs_name_exists():
    every = set().union(*(_options(c) for c in COMMANDS.values()))
    for page in PAGES:
        text = page.read_text()
        spans = [s for s in re.findall(r"`([^`\n]+)`", text) if not s.startswith(("python ", "pip "))]  # bench
        spans += [ln for ln in text.splitlines() if ln.lstrip().startswith("streamdp ")]
        named = {o for span in spans for o in OPTION.findall(span)}
        assert not named - every, f"{page.name} names options no command has: {sorted(named - every)}"


def test_readme_methods_table_lists_every_method():
    from streamdp.workflows.catalog import methods_listing

    rows = {first.split("`")[0].strip() for first, _ in _table_rows(README.read_text(), "Methods")}
    assert rows == {m["name"] for m in methods_listing()}


def test_docs_pages_are_linked_and_links_resolve():
    readme = README.read_text()
    for page in DOCS:
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+://", target):
                assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


#: What differs from run to run in the worked example's output: timings, a budget entry's id and date.
VARYING = [(re.compile(r"\b\d+(?:\.\d+)?s\b"), "<T>s"),
           (re.compile(r"\b[0-9a-f]{12}  (complete|reserved|failed) \d{4}-\d\d-\d\dT[\d:]+\+00:00"), r"<ID>  \1 <DATE>")]


def _normalise(text: str) -> list[str]:
    for pattern, repl in VARYING:
        text = pattern.sub(repl, text)
    return [ln.rstrip() for ln in text.strip().splitlines()]


def worked_example() -> tuple[str, str]:
    """``(script, shown output)``: the ``sh`` block of the README's worked example and the ``text`` block after it."""
    section = README.read_text().split("\n## A worked example\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"^```sh\n(.*?)^```\n(?:(?!```).)*?^```text\n(.*?)^```", section, re.S | re.M)
    assert m, "the README's worked example has no ```sh block followed by the ```text block of its output"
    return m.group(1), m.group(2)


def _kind(line: str) -> str:
    """A shown or printed line up to its first colon or number: what kind of line it is (``wrote model:``,
    ``test RMSE``, ``budget``...)."""
    return re.match(r"[^\d<:]*:?", line).group(0).strip()


def test_worked_example_runs_on_a_smaller_store(tmp_path, monkeypatch):
    """The cheap guard of the worked example (the full size runs with ``-m slow``): the README's commands, with
    ``--users`` a tenth, run in process (the ``printf`` lines in bash); each ``streamdp`` command exits 0, the
    model and its privacy.json are written, and every kind of line the README shows is printed (the figures
    differ on the smaller store, and the lines that depend on them: the verdicts, the known items' lists)."""
    from click.testing import CliRunner

    script, shown = worked_example()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STREAMDP_PROGRESS", "0")
    printed = []
    for line in script.strip().splitlines():
        if not line.startswith("streamdp "):
            subprocess.run(["bash", "-c", line], check=True)
            continue
        args = shlex.split(line)[1:]
        if "--users" in args:
            i = args.index("--users") + 1
            args[i] = str(int(args[i]) // 10)
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, (line, r.output, r.exception)
        printed += r.output.splitlines()
    assert (tmp_path / "model" / "privacy.json").exists()
    kinds = {_kind(ln) for ln in printed}
    verdicts = ("verdict:", "ranking verdict:", "note:")  # their wording follows the figures
    missing = [ln for ln in _normalise(shown) if _kind(ln) not in kinds and not ln.startswith(verdicts)
               and not re.fullmatch(r"[\d\t.]+", ln)]
    assert not missing, f"the worked example, on a smaller store, does not print these kinds of line: {missing}"


@pytest.mark.slow
def test_worked_example_prints_what_the_readme_shows(tmp_path):
    """The worked example, run as a user would (stderr interleaved, as a terminal shows it), prints the shown lines."""
    script, shown = worked_example()
    env = dict(os.environ, STREAMDP_PROGRESS="0", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")  # this checkout's streamdp
    r = subprocess.run(["bash", "-c", "set -euo pipefail\nexec 2>&1\n" + script], cwd=tmp_path, env=env,
                       stdout=subprocess.PIPE, text=True, timeout=900)
    assert r.returncode == 0, f"README worked example failed (exit {r.returncode}):\n{r.stdout[-3000:]}"
    assert (tmp_path / "model" / "privacy.json").exists()
    got, want = _normalise(r.stdout), _normalise(shown)
    diff = [(i, w, g) for i, (w, g) in enumerate(zip(want, got)) if w != g]
    assert not diff and len(got) == len(want), (
        f"the README shows other output than the worked example prints (line, shown, printed): {diff[:5]}; "
        f"{len(want)} lines shown, {len(got)} printed:\n{r.stdout}")
