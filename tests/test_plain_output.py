"""What ``train``, ``evaluate``, ``tune``, ``methods`` and ``--help`` print reads without the papers.

A line says what it means in words first; a formula may follow in parentheses
(issue 31: "0.05 h^2 per user", "n_eff epsilon / n_items", "nu sigma_B^2 Delta^2 / s^2"
were printed bare). :func:`formula_bits` finds what reads as a formula outside
parentheses: a power or norm (``^``, ``||``), a subscripted symbol (``n_items``,
``eta_0``), an equation (``c = 1 + ...``) or a Greek symbol standing alone. Option
names (``--noise-ridge``) and choice lists (``laplace|huber``) are words, not formulas.
A release without factors says that every user gets the same list, in words that say
what it holds (item biases, or an ``ials`` model's chart).
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.methods import METHODS, load_builtin
from streamdp.serving.local import NOT_PERSONALISED, NOT_PERSONALISED_CHART

load_builtin()

GREEK = (r"(?<![\w-])(?:lambda|sigma|sigma_B|Delta|Delta_pi|nu|mu|rho|eta|eta_0|eta_t|kappa|gamma|tau|alpha|h)"
         r"(?![\w-])")


def outside_parentheses(text: str) -> str:
    """``text`` without anything in (possibly nested) parentheses."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def formula_bits(text: str) -> list[str]:
    """What reads as a formula outside parentheses in ``text``.

    >>> formula_bits("weight nu of the noise-driven item ridge nu sigma_B^2 Delta^2 / s^2")
    ['nu', 'nu', 'sigma_B^2', 'Delta^2', 's^2']
    >>> formula_bits("extra regularisation of each item (weight nu of the ridge nu sigma_B^2 Delta^2 / s^2)")
    []
    >>> formula_bits("it needs 3 stds below 0.05 h^2 per user")
    ['h^2']
    >>> formula_bits("noise of every release: gaussian, laplace or huber (--mechanism laplace|huber, --noise-ridge)")
    []
    """
    # option names, paths and KEY=VALUES (a grid's syntax) are no formulas
    t = re.sub(r"--[a-z][a-z0-9-]*|\S*/\S*/\S*|\w+=\S+", "", outside_parentheses(text))
    return re.findall(r"\S*\^\S*|\|\||(?<![\w-])[A-Za-z]+_[A-Za-z0-9{},]+|\S+ = \S+|" + GREEK, t)


def _plain(lines, where: str) -> None:
    bad = [(ln, formula_bits(ln)) for ln in lines if formula_bits(ln)]
    assert not bad, f"{where}: lines with a bare formula (say it in words first, the formula in parentheses): {bad}"


def _help_entries(out: str) -> list[str]:
    """Each option entry of a help text as one line (its wrapped lines joined)."""
    entries, cur = [], None
    for ln in out.splitlines():
        if ln.startswith("  -"):
            cur = [ln]
            entries.append(cur)
        elif cur is not None and ln.startswith("   "):
            cur.append(ln)
        else:
            cur = None
    return [" ".join(" ".join(e).split()) for e in entries]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_option_help_says_it_in_words_before_any_formula(name):
    _plain([o.describe() for o in METHODS[name].OPTIONS], f"--method {name}'s options")


def test_the_noise_ridge_and_the_iterations_read_in_words():
    als = {o.name: o.describe() for o in METHODS["als"].OPTIONS}
    assert als["noise_ridge"].startswith("extra regularisation of each item in proportion to the noise it receives "
                                         "(weight nu of the ridge nu sigma_B^2 Delta^2 / s^2)")
    assert als["iters"].startswith("ALS iterations (0: release item biases only, no factors) (default: 0-9, more "
                                   "when there are many users with enough ratings for a factor per item at this "
                                   "epsilon (the proxy n_eff epsilon / n_items")


@pytest.mark.parametrize("args", [["train", "--help"], ["tune", "--help"], ["evaluate", "--help"], ["--help"],
                                  ["methods", "--help"]] + [["train", "--method", m, "--help"] for m in sorted(METHODS)],
                         ids=lambda a: " ".join(a))
def test_help_reads_without_bare_formulas(args):
    r = CliRunner().invoke(main, args, terminal_width=400, max_content_width=400)
    assert r.exit_code == 0, r.output
    _plain(_help_entries(r.output), " ".join(args))


def test_methods_listing_reads_without_bare_formulas():
    r = CliRunner().invoke(main, ["methods"])
    assert r.exit_code == 0
    _plain(r.output.splitlines(), "streamdp methods")
    assert ("use it:    nuclear-norm completion as in Jain et al. on large stores; with fewer users than about the "
            "number of items to the power 5/4 (n_items^(5/4)) its directions are mostly noise") in r.output


def test_means_rank_is_said_not_to_apply():
    listing = CliRunner().invoke(main, ["methods"]).output
    means = listing.split("\nmeans: ", 1)[1].split("\n\n", 1)[0]
    assert "  --rank:    does not apply: it fits no factors\n" in means + "\n"
    r = CliRunner().invoke(main, ["train", "--help"], terminal_width=400, max_content_width=400)
    rank = next(e for e in _help_entries(r.output) if e.startswith("--rank "))
    assert "means: not used (it fits no factors)." in rank


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """1,500 users x 150 items: too few users per item for factors at epsilon 1 (als: biases only)."""
    from streamdp.storage.generate import generate_store

    return generate_store(str(tmp_path_factory.mktemp("plain") / "tiny.zarr"), n_users=1500, n_items=150,
                          ratings_per_user=10, seed=3, test_fraction=0.2)


def _run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout.splitlines(), r.stderr.splitlines()


def test_train_without_factors_says_so_in_words_and_why(tiny, tmp_path):
    out, err = _run("train", tiny.path, "--method", "als", "--epsilon", 1, "--out", tmp_path / "m", "--seed", 1)
    _plain(out + err, "train --method als")
    assert out[0].startswith(f"wrote {tmp_path / 'm'}: als released item biases and the global mean only (no factors "
                             f"released, so rank 8 was not used), user-level (epsilon, delta)-DP, epsilon 1 ")
    assert "note: " + NOT_PERSONALISED in out
    assert NOT_PERSONALISED == "only item biases released: every user gets the same list (apart from the items she " \
                               "rated)"
    assert ("streamdp: warning: no factors fitted: at this epsilon there are too few users per item for factors to "
            "rise above the noise (--iters 0 by default), so the release is the private item biases and global mean "
            "only; users' own intercepts do the rest") in err
    assert not any("iters = 0" in ln or "unused" in ln for ln in out + err)

    out, _ = _run("evaluate", tmp_path / "m", tiny.path)
    _plain(out, "evaluate")
    assert "  note: " + NOT_PERSONALISED in out
    assert ("  lists ranked by predicted rating plus a bonus for items popular by the released counts (predicted "
            "rating + 1 x log(1 + released noisy_item_weight))") in out


def test_ials_without_factors_names_its_chart_not_biases(tiny, tmp_path):
    out, err = _run("train", tiny.path, "--method", "ials", "--epsilon", 0.5, "--out", tmp_path / "m", "--seed", 1)
    _plain(out + err, "train --method ials")
    # 16 factors, or 8 on counts low against the noise (streamdp.methods.ials.private_rank): the columns less popularity
    rank = json.load(open(tmp_path / "m" / "model.json"))["rank"] - 1
    assert rank in (8, 16)
    assert out[0].startswith(f"wrote {tmp_path / 'm'}: ials released the most-popular chart by its noisy item counts "
                             f"only (no factors released, so rank {rank} was not used)")
    assert "note: " + NOT_PERSONALISED_CHART in out and "note: " + NOT_PERSONALISED not in out
    assert any(ln.startswith("streamdp: warning: no factors released: at this epsilon they carried too little signal "
                             "above the noise (") for ln in err)
    out, _ = _run("evaluate", tmp_path / "m", tiny.path)
    assert "  lists ranked by the model's preference score" in out and "  note: " + NOT_PERSONALISED_CHART in out


def test_nonprivate_ials_says_it_chose_the_exact_chart(tiny, tmp_path):
    """``tiny``'s users choose by popularity alone: a non-private ials run releases the exact chart (``--select
    auto``); train and evaluate say which was chosen and why, no privacy warning."""
    out, err = _run("train", tiny.path, "--method", "ials", "--epsilon", "inf", "--yes", "--out", tmp_path / "m",
                    "--seed", 1)
    _plain(out + err, "train --method ials --epsilon inf")
    assert out[0].startswith(f"wrote {tmp_path / 'm'}: ials released the most-popular chart by its exact item counts "
                             f"only (no factors released, so rank 16 was not used), non-private")
    choice = [ln for ln in out if ln.startswith("choice: ")]
    assert len(choice) == 1 and choice[0].startswith("choice: the chart by the exact training counts was released "
                                                     "instead of the factors (--select auto): ")
    assert not [ln for ln in err if "no factors" in ln]
    out, _ = _run("evaluate", tmp_path / "m", tiny.path)
    assert choice[0] in out and "  note: " + NOT_PERSONALISED_CHART in out


def test_means_says_it_fits_no_factors(tiny, tmp_path):
    out, err = _run("train", tiny.path, "--method", "means", "--epsilon", 1, "--out", tmp_path / "m", "--seed", 1)
    _plain(out + err, "train --method means")
    assert out[0].startswith(f"wrote {tmp_path / 'm'}: means released item biases and the global mean (it fits no "
                             f"factors), user-level")


def test_tune_says_in_words_why_it_made_no_choice(tiny, tmp_path):
    out, err = _run("tune", tiny.path, "--epsilon", 1, "--out", tmp_path / "m", "--grid", "rank=4,8", "--seed", 1)
    _plain(out + err, "tune")
    line = next(ln for ln in out if ln.startswith("tune: "))
    assert re.fullmatch(r"tune: no choice made: the store is too small to tell configurations apart: the noise on "
                        r"their validation losses \(std [0-9.]+\) would hide any difference smaller than 5% of the "
                        r"largest error per user over [0-9,]+ users \(3 noise stds below 0.05 h\^2 per user, h half "
                        r"the rating range\); trained rank=8 with the whole epsilon", line), line
    assert "(no factors released, so rank 8 was not used)" in out[0]
    assert any(ln.startswith("streamdp: warning: no factors fitted: at this epsilon there are too few users per item")
               for ln in err)
