"""``bench/append.py --quick``: base ingest, appends, train on the segments, compact, train again, in process."""

from __future__ import annotations

import os

import pytest

from bench import append


@pytest.mark.slow  # a bench smoke run (3 s on an idle machine, 10-40 s beside other jobs); the guard is below
def test_append_quick_prints_both_tables_and_the_twins_give_the_same_model(tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text("# Benchmarks\n\n## Another section\n\nkept\n")
    # in process: the limit is the test worker's, which holds the interpreter and everything earlier tests loaded
    assert append.main(["--quick", "--size", "4000", "--items", "100", "--appends", "2", "--dir", str(tmp_path / "w"),
                        "--memory-limit", "4GB", "--write", str(page)]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert lines[0] == "| " + " | ".join(append.COLUMNS) + " |"
    steps = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:lines.index(
        "| target (issue 43) | measured | target | met |")]]
    assert [r[0] for r in steps] == ["ingest the base", "append 1 of 2", "append 2 of 2", "train, 3 segments",
                                     "compact", "train, compacted",
                                     append.ONE_APPEND]
    assert [r[1] for r in steps[:3]] == ["3,960", "20", "20"] and steps[6][1] == "40"  # 1% of 4,000: in 2, in 1
    for r in steps:
        assert len(r) == len(append.COLUMNS) and float(r[2]) > 0 and float(r[3]) >= 0 and r[4] == "in process"
    assert steps[3][5].startswith("fit ") and steps[5][5].startswith("fit ")
    targets = {r[0]: r for r in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines) if len(r) == 4}
    same = next(r for k, r in targets.items() if k.startswith("seeded, the same model"))
    assert same[1:] == ["identical", "identical", "yes"]
    assert any(k.startswith("all 2 appends (40 ratings) / ingesting the whole store") for k in targets)
    assert any(k.startswith("one append of all 40 ratings / ingesting the whole store") for k in targets)
    text = page.read_text()
    assert append.HEADING in text and "## Another section\n\nkept" in text and "| ingest the base | 3,960 |" in text
    assert not list((tmp_path / "w").iterdir())  # the files and stores removed


def test_bad_arguments_are_refused_before_anything_is_made(tmp_path):
    with pytest.raises(SystemExit) as e:
        append.main(["--quick", "--appends", "0", "--dir", str(tmp_path / "w")])
    assert e.value.code == 2 and not (tmp_path / "w").exists()


def test_a_step_that_compiles_a_kernel_is_said(tmp_path, monkeypatch):
    """The guard against a warm-up that missed a path: a kernel index written during a step names the kernel."""
    from bench.ingest import compiled_between, kernel_cache_state

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    (tmp_path / "kernels").mkdir()
    old = tmp_path / "kernels" / "als.grid_em-626.py311.nbi"
    old.write_bytes(b"1")
    before = kernel_cache_state()
    assert compiled_between(before, kernel_cache_state()) == []
    os.utime(old, ns=(before[str(old)] + 10**9,) * 2)  # recompiled: its index rewritten
    (tmp_path / "kernels" / "ingest.bucket_rows-153.py311.nbi").write_bytes(b"2")  # compiled for the first time
    assert compiled_between(before, kernel_cache_state()) == ["als.grid_em", "ingest.bucket_rows"]


def test_the_warm_up_keeps_users_per_item_with_at_most_its_users():
    from bench.ingest import WARM_USERS, warm_shape

    assert warm_shape(2_000_000, 20_000) == (WARM_USERS, 2_000)  # 100 users per item, as the 100M bench store
    assert warm_shape(1_200, 20_000) == (1_200, 20_000)  # small enough: its own shape
    assert warm_shape(10_000_000, 500, min_items=100) == (WARM_USERS, 100)


def test_a_measured_child_may_write_the_bytecode_cache(monkeypatch):
    """``run_measured``'s child runs as an installed package does: with Python's bytecode cache (a sandbox's
    ``PYTHONDONTWRITEBYTECODE`` made every child compile streamdp's sources again)."""
    import sys

    from bench.ingest import run_measured

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("STREAMDP_BENCH_PROBE", "kept")
    _, _, _, out = run_measured([sys.executable, "-c", "import os, sys; print(sys.flags.dont_write_bytecode, "
                                 "os.environ['STREAMDP_BENCH_PROBE'])"], with_stdout=True)
    assert out.split() == ["0", "kept"]


def test_fit_repeats_default_to_three_and_quick_runs_one():
    assert append.parse(["--size", "100M"]).fit_repeats == 3 and append.parse(["--quick"]).fit_repeats == 1
    assert append.parse(["--quick", "--fit-repeats", "2"]).fit_repeats == 2
    with pytest.raises(SystemExit):
        append.parse(["--fit-repeats", "0"])


@pytest.mark.slow  # a second bench smoke run (1 s idle); the argument check above is its guard
def test_the_fits_alternate_and_the_target_reads_their_medians(tmp_path, capsys):
    assert append.main(["--quick", "--size", "4000", "--items", "100", "--appends", "2", "--dir", str(tmp_path / "w"),
                        "--memory-limit", "4GB", "--fit-repeats", "2"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    labels = [ln.strip("|").split("|")[0].strip() for ln in lines]
    fits = [x for x in labels if x.startswith("train, ")]
    assert fits == ["train, 3 segments (1 of 2)", "train, compacted (1 of 2)", "train, 3 segments (2 of 2)",
                    "train, compacted (2 of 2)"]
    assert labels.index("compact") == labels.index("train, 3 segments (1 of 2)") + 1
    assert any(x.endswith("(`train_seconds`, medians of 2 alternated runs each)") for x in labels)
    assert not (tmp_path / "w" / "segmented.zarr").exists()
