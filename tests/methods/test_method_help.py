"""Per-method help (``streamdp train --method X --help``) and ``streamdp methods``, generated from the methods.

Every method's help names all of its own options with their declared defaults and no
option that only other methods read; the declared defaults are the ones the methods
use; ``streamdp methods`` describes every registered method.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.methods import METHODS, load_builtin
from streamdp.methods.options import merge_options
from streamdp.workflows.catalog import CATALOG, GUARANTEE_KINDS, default_rank, guarantee_kind

load_builtin()
NAMES = sorted(METHODS)
#: Every method flag -> the methods that declare it.
DECLARED = {slot["by_method"][m].flag: set(slot["by_method"]) for slot in merge_options(METHODS).values()
            for m in slot["by_method"]}


def _help(*args: str) -> str:
    r = CliRunner().invoke(main, ["train", *args], terminal_width=400, max_content_width=400)
    assert r.exit_code == 0, r.output
    return r.output


def _flags_in(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def _entries(out: str) -> dict[str, str]:
    """Each option entry of a help text, by its first flag: the entry's lines joined, whitespace collapsed."""
    entries, key = {}, None
    for ln in out.splitlines():
        if ln.startswith("  -"):
            key = ln.split()[0]
            entries[key] = ln
        elif key and ln.startswith("   "):
            entries[key] += " " + ln
        else:
            key = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


@pytest.mark.parametrize("name", NAMES)
def test_method_help_shows_its_own_options_with_defaults_and_no_other_methods(name):
    out = _help("--method", name, "--help")
    cls = METHODS[name]
    lines = _entries(out)
    for o in cls.OPTIONS:
        assert o.flag in lines, f"{name}: {o.flag} missing from its help"
        assert o.describe() in lines[o.flag], f"{name}: {o.flag}'s help or default differs from its declaration"
    others = {f for f, ms in DECLARED.items() if name not in ms}
    shown = others & _flags_in(out)
    assert not shown, f"--method {name}'s help names options it does not read: {sorted(shown)}"
    if cls.FITS_FACTORS:
        assert f"(default {default_rank(cls)})" in lines["--rank"]
    else:
        assert "--rank" not in lines, f"{name} fits no factors: its help must not offer --rank"
    assert CATALOG[name].releases in " ".join(out.split())


def _sections(out: str) -> dict[str, list[str]]:
    """The flags of each section of a help text, by heading (``"Options"``, ``"Expert options ..."``)."""
    sections, head = {}, None
    for ln in out.splitlines():
        if ln and not ln.startswith(" ") and ln.endswith(":"):
            head = ln[:-1]
            sections[head] = []
        elif head and ln.startswith("  -"):
            sections[head].append(ln.split()[0].rstrip(","))
    return sections


@pytest.mark.parametrize("name", NAMES)
def test_method_help_lists_the_options_that_matter_first_and_the_expert_ones_under_a_heading(name):
    cls = METHODS[name]
    sections = _sections(_help("--method", name, "--help"))
    heads = list(sections)
    expert = [h for h in heads if h.startswith("Expert options")]
    assert len(expert) == 1 and heads[-1] == expert[0], heads
    assert heads.index("Options") < heads.index(f"Options of --method {name}") < heads.index(expert[0])
    main_flags = ["--" + n.replace("_", "-") for n in cls.MAIN_OPTIONS]
    assert sections[f"Options of --method {name}"] == main_flags
    assert set(sections[expert[0]]) == {o.flag for o in cls.OPTIONS if o.name not in cls.MAIN_OPTIONS} | {
        "--users-bound", "--workers", "--memory-limit", "--scheduler", "--state", "--over-budget"}
    for flag in ("--epsilon", "--delta", "--out", "--seed"):
        assert flag in sections["Options"]


def test_als_help_starts_with_the_few_options_that_matter():
    sections = _sections(_help("--method", "als", "--help"))
    assert sections["Options"][:5] == ["--method", "--epsilon", "--delta", "--rank", "--out"]
    assert sections["Options of --method als"] == ["--iters", "--mechanism", "--select", "--checkpoint"]
    assert "--noise-ridge" in sections["Expert options (their defaults are derived from the store and epsilon)"]


def test_means_help_has_no_rank_and_train_refuses_it(small_store, tmp_path):
    out = _help("--method", "means", "--help")
    assert "--rank" not in _entries(out) and "It fits no factors: --rank does not apply." in out
    r = CliRunner().invoke(main, ["train", small_store.path, "--method", "means", "--rank", "4", "--epsilon", "1",
                                  "--out", str(tmp_path / "m")])
    assert r.exit_code != 0 and not (tmp_path / "m").exists()
    assert r.output.strip().splitlines() == ["streamdp: error: --rank: --method means fits no factors (it releases "
                                             "item biases and the global mean only); leave --rank out"]


def test_method_help_wherever_method_is_given():
    assert _help("--help", "--method", "fw") == _help("--method=fw", "-h")
    assert "Frank-Wolfe iterations" in _help("ratings.zarr", "--method", "fw", "--help")


def test_train_help_without_method_lists_common_options_and_methods_only():
    out = _help("--help")
    flat = " ".join(out.split())
    for name in NAMES:
        assert f"{name} {METHODS[name].SUMMARY}" in flat
    assert "streamdp train --method METHOD --help" in flat and "streamdp methods" in flat
    assert not _flags_in(out) & set(DECLARED), "method options belong in the per-method help"
    for flag in ("--epsilon", "--delta", "--out", "--seed", "--workers", "--memory-limit", "--json"):
        assert f"  {flag}" in out
    assert "fw: the number T of Frank-Wolfe iterations (the rank of the release), default 30" in flat


def test_help_of_an_unknown_method_is_one_line():
    r = CliRunner().invoke(main, ["train", "--method", "nope", "--help"])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith("streamdp: error: --method: unknown method 'nope'")


def test_methods_command_describes_every_method():
    r = CliRunner().invoke(main, ["methods", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.output)["methods"]}
    assert set(rows) == set(METHODS) | {"lowrank"}
    for name, row in rows.items():
        assert name in CATALOG, f"{name} has no entry in streamdp/workflows/catalog.py"
        assert row["kind"] in GUARANTEE_KINDS and row["releases"] and row["when"] and row["guarantee"]
    assert rows["sgld"]["kind"] == "approximate" and rows["sgd"]["kind"] == "non-private"
    assert rows["als"]["kind"] == rows["fw"]["kind"] == "exact" and "joint" in rows["fw"]["guarantee"]
    assert rows["fw"]["default_rank"] == 30 and rows["als"]["default_rank"] == 8
    assert rows["oja"]["options"] == [o.flag for o in METHODS["oja"].OPTIONS]
    text = CliRunner().invoke(main, ["methods"]).output
    for name, row in rows.items():
        assert f"{name}: " in text and f"guarantee: {row['kind']}: " in text
        assert f"{row['command']} --help" in text


def test_guarantee_kind_follows_the_class():
    for name, cls in METHODS.items():
        kind = guarantee_kind(cls)
        if kind != "non-private":
            assert (kind == "approximate") == str(cls.guarantee).startswith("approximate:"), name
        else:
            with pytest.raises(ParameterError):
                cls(epsilon=1.0, delta=1e-6)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b or (a != a and b != b)


#: Options a method reads outside ``settings`` (checked by their own tests).
READ_IN_FIT = {("means", "user_intercept")}


def _settings(method, store) -> dict:
    """``method.settings(store)`` (a frozen :class:`~streamdp.methods.base.RunSettings`) as a dict."""
    return method.settings(store).as_dict()


def test_declared_defaults_are_the_defaults_the_methods_use(small_store, tmp_path):
    """The help prints ``Option.default``: giving that value must change nothing the method settles on."""
    pub = tmp_path / "public.txt"
    pub.write_text("\n".join(map(str, small_store.user_ids()[:300].tolist())))
    pp = {"public_fraction": 0.2, "public_users": str(pub)}
    contexts = {"public-private": [(1.0, pp), (math.inf, {**pp, "private_mechanism": "pmd"}),
                                   (math.inf, {**pp, "private_mechanism": "pmc"})],
                "sgd": [(math.inf, {})]}
    checked = 0
    for name, cls in METHODS.items():
        for o in cls.OPTIONS:
            if o.default is None or o.default_text:
                continue
            for eps, base in contexts.get(name, [(1.0, {})]):
                try:
                    given = _settings(cls(epsilon=eps, delta=1e-6, seed=1, **base, **{o.name: o.default}), small_store)
                except ParameterError:
                    continue  # the option is refused in this context (e.g. a pmd-only option): try the next
                absent = _settings(cls(epsilon=eps, delta=1e-6, seed=1, **base), small_store)
                if (name, o.name) not in READ_IN_FIT:
                    assert o.name in absent, f"{name}: {o.flag} is not in its settings"
                assert _same(absent, given), f"{name}: {o.flag}'s declared default {o.default!r} is not its default"
                checked += 1
                break
            else:
                raise AssertionError(f"{name}: {o.flag} {o.default!r} is refused in every context tried")
    assert checked > 50
