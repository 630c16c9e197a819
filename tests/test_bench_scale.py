"""``bench/scale.py``: the pass graph of Dask's threaded scheduler it measures, its labels, and a run end to end."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import dask.threaded
import pytest

from bench import scale


def test_kinds_and_sizes():
    assert scale._kind("als iteration 3/7") == "als iteration"
    assert scale._kind("als statistics (second release)") == "als statistics (second release)"
    assert scale._size("20M") == 20_000_000 and scale._size("1B") == 10 ** 9 and scale._size("2.5e6") == 2_500_000
    assert scale._label(1e9) == "1.00B" and scale._label(1e8) == "100M" and scale._label(60_000) == "60K"


def test_threaded_graph_combines_in_block_order_within_its_window():
    n, window = 40, 3
    d = scale._threaded_graph(n, window)
    lock, events = threading.Lock(), []

    def wrap(kind, f):
        def g(*a):
            with lock:
                events.append((kind, a[0] if kind == "read" else a[-1]))
            return f(*a)
        return g

    for key, task in list(d.items()):
        if isinstance(key, tuple) and key[0] in ("read", "part") and key[1] >= 0:
            d[key] = (wrap(key[0], task[0]),) + task[1:]
        elif key[0] == "acc" and key[1] >= 0:  # combine: record which block it adds
            d[key] = ((lambda acc, part, b=key[1]: (events.append(("acc", b)), acc + [b])[1]), task[1], task[2])
    d[("acc", -1)] = []
    with cf.ThreadPoolExecutor(4) as pool:
        assert dask.threaded.get(d, ("acc", n - 1), pool=pool, num_workers=4) == list(range(n))
    read, combined = set(), set()
    for kind, b in events:  # at no moment more than `window` + 1 blocks read and not yet combined
        (read if kind == "read" else combined if kind == "acc" else set()).add(b)
        assert len(read - combined) <= window + 1


@pytest.mark.slow
def test_scale_bench_end_to_end(tmp_path, capsys):
    out = tmp_path / "t.md"
    assert scale.main(["--sizes", "60K", "--repeats", "1", "--dir", str(tmp_path), "--overhead", "--dask",
                       "--out", str(out)]) == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    assert "| 60K (1,200 users" in text and "fit / scipy pass" in text and "| als statistics | 1 |" in text
    assert "Dask threaded scheduler" in text
    assert "| True |" in text  # dask's model is bit-identical to the thread pool's
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("bench-scale-")]  # its stores are removed
