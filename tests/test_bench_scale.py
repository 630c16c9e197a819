"""``bench/scale.py``: its labels and sizes, and a run end to end."""

from __future__ import annotations

import pytest

from bench import scale


def test_kinds_and_sizes():
    assert scale._kind("als iteration 3/7") == "als iteration"
    assert scale._kind("als statistics (second release)") == "als statistics (second release)"
    assert scale._size("20M") == 20_000_000 and scale._size("1B") == 10 ** 9 and scale._size("2.5e6") == 2_500_000
    assert scale._label(1e9) == "1.00B" and scale._label(1e8) == "100M" and scale._label(60_000) == "60K"


@pytest.mark.slow
def test_scale_bench_end_to_end(tmp_path, capsys, monkeypatch):
    out = tmp_path / "t.md"
    calls = []  # the warm-up's fit, then the measured ones "compile" (a kernel cache index written during each)
    monkeypatch.setattr(scale, "compiled_between",
                        lambda a, b: calls.append(1) or (["als.grid_em"] if len(calls) > 1 else []))
    assert scale.main(["--sizes", "60K", "--repeats", "1", "--dir", str(tmp_path), "--overhead", "--dask",
                       "--fits", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    assert "K (1,200 users," in text and "fit / scipy pass" in text and "| als statistics | 1 |" in text
    assert "local engine (Dask threaded scheduler)" in text and "its pass graph alone" in text
    assert "| True |" in text  # dask's model is bit-identical to the thread pool's
    assert "K: 2 fits, each against the scipy pass measured before it" in text
    assert ("K: the fit compiled 1 kernel(s) while timed (the warm-up missed their path; its seconds include "
            "compiling): als.grid_em") in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("bench-scale-")]  # its stores are removed
