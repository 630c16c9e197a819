"""``bench/roofline.py --quick``: the table's columns and one row per kernel and ``k``."""

from __future__ import annotations

import pytest

from bench import roofline


@pytest.mark.slow  # a bench smoke run (20-30 s from a cold Numba cache: the "before" kernels compile); guards below
def test_quick_roofline_table(capsys):
    assert roofline.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert rows[0] == "| " + " | ".join(roofline.COLUMNS) + " |"
    body = [r.strip("|").split(" | ") for r in rows[1:]]
    assert len(body) == 8 * 3 and all(len(c) == len(roofline.COLUMNS) for c in body)
    names = {c[0].strip() for c in body}
    assert {"als user solve", "als item side, shared Gramian", "als item side, shared Gramian, a weight per user",
            "als item side, per-item Gramians", "ials user sweep", "ials item sums, per-item Gramians",
            "top-10 scorer"} <= names
    assert sorted({int(c[1]) for c in body}) == [8, 16, 64]
    for c in body:  # a rate, the roofline and the fraction of it are always there
        assert c[3].endswith("M") and c[8].endswith("M") and float(c[9]) > 0
        if c[0].startswith(("als", "ials user")):  # the kernels of issue 44 have a before row
            assert c[4].endswith("M") and c[5].endswith("x")
    assert "dgemm (numpy.matmul" in out


def test_bad_arguments_are_one_line(capsys):
    assert roofline.main(["--ks", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ks" in err


def test_bench_write_keeps_the_roofline_section(tmp_path):
    from bench.run import kept_sections

    page = tmp_path / "b.md"
    assert kept_sections(str(page)) == ""
    page.write_text("# Benchmarks\n\n| a |\n\n## ALS-family kernels against the machine (`bench/roofline.py`)\n\n"
                    "| kernel |\n|---|\n\n## Training at scale\n\nx\n")
    kept = kept_sections(str(page))
    assert kept.startswith("\n## ALS-family kernels against the machine") and kept.endswith("|---|\n")
    assert "Training at scale" not in kept
