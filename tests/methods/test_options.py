"""The declarative option schema and the train command generated from it."""

import pytest
from click.testing import CliRunner

from streamdp.errors import ParameterError
from streamdp.methods import METHODS, load_builtin, get_method
from streamdp.methods.options import Option, merge_options, option_help


def test_every_registered_method_declares_consistent_options():
    load_builtin()
    merged = merge_options(METHODS)  # raises if one flag has two kinds
    for name, slot in merged.items():
        for m, o in slot["by_method"].items():
            assert o.help and o.name == name, (m, name)


def test_conflicting_kinds_are_refused():
    class A:
        OPTIONS = (Option("x", int, "an int"),)

    class B:
        OPTIONS = (Option("x", ("a", "b"), "a choice"),)

    with pytest.raises(ValueError, match="--x"):
        merge_options({"a": A, "b": B})


def test_option_check_names_the_flag():
    o = Option("item_frac", float, "fraction", minimum=0, exclusive_minimum=True, maximum=1.0)
    assert o.check("0.5") == 0.5
    for bad, msg in (("0", "> 0"), ("2", "<= 1"), ("x", "a number"), ("nan", "finite")):
        with pytest.raises(ParameterError, match=f"--item-frac.*{msg}"):
            o.check(bad)
    assert Option("n", int, "n").check(3.0) == 3
    with pytest.raises(ParameterError, match="an integer"):
        Option("n", int, "n").check(2.5)
    with pytest.raises(ParameterError, match="one of"):
        Option("c", ("a", "b"), "c").check("z")


def test_unknown_and_invalid_method_options_are_one_line_errors():
    with pytest.raises(ParameterError, match="--passes: not an option of --method als"):
        get_method("als")(epsilon=1.0, delta=1e-6, passes=3)
    with pytest.raises(ParameterError, match="--iters must be >= 0"):
        get_method("als")(epsilon=1.0, delta=1e-6, iters=-1)


def test_train_help_lists_methods_and_per_method_meanings():
    from streamdp.cli import main

    out = CliRunner().invoke(main, ["train", "--help"]).output
    load_builtin()
    for m in METHODS:
        assert m in out
    sgd = CliRunner().invoke(main, ["train", "--method", "sgd", "--help"]).output
    assert "L2 regularization per rating (default 0.02)" in " ".join(sgd.split())
    help_reg = option_help(merge_options(METHODS)["reg"]["by_method"])
    assert "[als/irls]" in help_reg and "[sgld]" in help_reg


def test_train_rejects_an_unknown_method_with_the_choices():
    from streamdp.cli import main

    r = CliRunner().invoke(main, ["train", "nostore", "--method", "nope", "--epsilon", "1", "--out", "x"])
    assert r.exit_code == 2 and "als" in r.output and "oja" in r.output
