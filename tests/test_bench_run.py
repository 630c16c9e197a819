"""``python -m bench --write PATH``: one run's whole page (header and table) written to PATH, a failed part kept
out of it."""

from __future__ import annotations

import os
import re

import pytest

from bench import ranking, run


@pytest.fixture
def tiny_lists(monkeypatch, tmp_path):
    """The lists part on a tiny generated store, real data made absent (its row says so)."""
    monkeypatch.setattr(ranking, "GENERATED", {"tiny": dict(users=600, items=60, ratings_per_user=12)})
    monkeypatch.setattr(ranking, "IMPLICIT_GRID", [dict(factors=16, regularization=0.1, alpha=1.0)])
    monkeypatch.setattr(ranking, "EASE_LAMBDAS", (10.0,))
    monkeypatch.setenv("STREAMDP_SHARED_DATA", str(tmp_path / "no-data"))


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def check_header(text: str, part: str) -> None:
    """The page's header: when, which commit, which machine and how loaded, how long."""
    assert text.startswith("# Benchmarks\n")
    assert re.search(r"\*\*Run\*\*: \d{4}-\d\d-\d\d \d\d:\d\d UTC, commit [0-9a-f]{7,}", text)
    assert re.search(r"\*\*Machine\*\*: \d+ CPUs.*load average \(1, 5, 15 min\) [\d.]+ / [\d.]+ / [\d.]+ at the "
                     r"start, [\d.]+ / [\d.]+ / [\d.]+ at the end", text)
    assert re.search(rf"\*\*Run time\*\*: \d+ (min \d\d )?s \({part} \d+ (min \d\d )?s\); CPU time ", text)
    assert "\n| what | streamdp | peer (same run) | ratio |\n|---|---|---|---|\n" in text


@pytest.mark.slow  # trains five models and fits the peers: about 5 s of CPU, minutes on a loaded machine
def test_write_gives_the_header_and_the_lists_table(tiny_lists, tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("an older run\n")
    assert run.main(["--only", "lists", "--lists-stores", "ml-100k,tiny", "--write", str(page)]) == 0
    text = page.read_text()
    check_header(text, "lists")
    assert f"| ml-100k absent ({tmp_path / 'no-data' / 'ml-100k' / 'u.data'}) | skipped |" in text
    assert "**lists on tiny: 600 users x 60 items" in text
    for row in ("| most popular by the exact training counts (non-private reference) |  | 0.",
                "| default (`train --epsilon 1`, test RMSE ", "| ials epsilon 1 vs the exact chart",
                "| ials non-private vs implicit's ALS", "| EASE (non-private peer, the best of its grid on the test "
                "split: lambda 10) vs the exact chart |  | 0."):
        assert row in text, row
    assert [p.name for p in tmp_path.iterdir() if p.name != "no-data"] == ["benchmarks.md"]  # no temporary file left


def test_a_failed_part_is_a_row_and_keeps_the_page(tmp_path, monkeypatch, capsys):
    page = tmp_path / "benchmarks.md"
    page.write_text("an older run\n")
    bad = tmp_path / "data" / "filmtrust" / "ratings.txt"  # a data set that is not a rating file: its ingest fails
    bad.parent.mkdir(parents=True)
    bad.write_text("these are not ratings\n")
    monkeypatch.setenv("STREAMDP_SHARED_DATA", str(tmp_path / "data"))
    assert run.main(["--only", "lists", "--lists-stores", "filmtrust", "--write", str(page)]) == 1
    assert page.read_text() == "an older run\n"
    assert (tmp_path / "benchmarks.md.failed").stat().st_mode & 0o044 == 0o044 & ~_umask()  # readable as a page
    failed = (tmp_path / "benchmarks.md.failed").read_text()
    check_header(failed, "lists")
    assert "\n| part `lists` failed: InputError: " in failed
    assert "not to" in capsys.readouterr().err


def test_bad_arguments_are_refused_before_the_run(tmp_path):
    for argv in (["--only", "lists,nope"], ["--lists-stores", "nope"], ["--ratings", "lots"],
                 ["--write", str(tmp_path / "no-dir" / "b.md")]):
        with pytest.raises(SystemExit) as exc:
            run.main(argv)
        assert exc.value.code == 2, argv


def test_the_kept_sections_are_the_roofline_and_the_issue_42_lists(tmp_path):
    """The sections other scripts write survive ``--write``: bench/roofline.py's and bench/ranking.py's table on issue
    42's shapes (each up to the next ``## ``), nothing else of the old page."""
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nold table\n\n## Training at scale (`bench/scale.py`)\n\nold scale\n\n"
                    "## ALS-family kernels against the machine (`bench/roofline.py`)\n\nroofline\n\n"
                    "## Lists on issue 42's shapes (`bench/ranking.py`)\n\n| a | b |\n")
    kept = run.kept_sections(str(page))
    assert "roofline" in kept and "| a | b |" in kept and "old" not in kept
    assert kept.index("roofline") < kept.index("| a | b |")


def test_bench_append_section_is_kept(tmp_path):
    """``bench/append.py --write``'s section (its :data:`bench.append.HEADING`) survives ``python -m bench --write``."""
    from bench import append

    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nold table\n\n" + append.HEADING + "\n\n| appended |\n")
    assert "| appended |" in run.kept_sections(str(page)) and "old" not in run.kept_sections(str(page))
