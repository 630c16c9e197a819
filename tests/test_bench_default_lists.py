"""``bench/default_lists.py`` on a tiny generated store: the runs are the default's, the summary their means."""

from __future__ import annotations

import math

import pytest

from bench import default_lists


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import streamdp

    path = tmp_path_factory.mktemp("dl") / "tiny.zarr"
    streamdp.generate(str(path), users=600, items=60, ratings_per_user=12, seed=3, test_fraction=0.2)
    return str(path)


@pytest.mark.slow
def test_one_run_is_the_default_evaluated_over_every_user(tiny, tmp_path):
    import streamdp
    from streamdp.serving.evaluate import evaluate_model
    from streamdp.storage.store import open_store

    st = open_store(tiny)
    got = default_lists.one_run(st, 2, str(tmp_path), 5, {})
    model = streamdp.train(st, epsilon=1.0, seed=2, workers=1, evaluate=False)  # the same seed: the same release
    ev = evaluate_model(model, st, workers=1, k=5, baselines=False, ranking_users="all")
    assert got["recall"] == ev["ranking"]["recall"]
    assert got["chart"] == ev["ranking"]["baselines"]["popularity"]["recall"]
    assert got["rmse"] == ev["rmse"]


@pytest.mark.slow
def test_summary_line_is_the_mean_and_paired_difference(tiny, capsys):
    assert default_lists.main(["--stores", tiny, "--seeds", "1,2", "--k", "5"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("| tiny.zarr")][0]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "2"
    chart = float(cells[2])
    rec, se = (float(x) for x in cells[4].split("+-"))
    diff = float(cells[5].split("+-")[0])
    assert 0 <= rec <= 1 and se >= 0
    assert math.isclose(diff, rec - chart, abs_tol=2e-4)


def test_mean_se():
    assert default_lists.mean_se([0.5]) == (0.5, 0.0)
    m, se = default_lists.mean_se([1.0, 3.0])
    assert m == 2.0 and math.isclose(se, 1.0)


def test_simulate_without_noise_is_the_exact_score(tiny):
    import numpy as np

    from streamdp.methods._biases import item_biases
    from streamdp.storage.store import open_store

    ex = default_lists.Exact(open_store(tiny))
    res = default_lists.simulate(ex, 1e16, [1], k=5)  # a budget so large the noise is nil
    S0, C0 = ex.totals(weights=ex.w * ex.e), ex.totals()
    want = ex.recall(item_biases(S0, C0, 0.0, ex.h, clip=ex.c) + ex.h / 2 * np.log1p(C0), 5)
    for v in ("default", "exact counts", "exact biases", "counts 0.6"):
        assert res[v]["recall"][0] == pytest.approx(want, abs=1e-12), v
    assert res["default"]["rmse"][0] == pytest.approx(ex.rmse(item_biases(S0, C0, 0.0, ex.h, clip=ex.c)), abs=1e-3)
    assert res["default"]["recall"][0] > 0
