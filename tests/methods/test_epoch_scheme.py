"""``--epoch-scheme blocks``: sgd/sgld epochs as engine passes (each block from the epoch's V, deltas in block
order), so they run on any scheduler, bit-identical for 1 or N workers and local vs Dask."""

from __future__ import annotations

import numpy as np
import pytest

from streamdp.workflows.api import train

INF = float("inf")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("epochs") / "s.zarr"
    return generate_store(str(path), n_users=1600, n_items=150, ratings_per_user=15, rank=3, seed=5,
                          test_fraction=0.2, block_users=400, show_progress=False)


def _train(store, **kw):
    base = dict(rank=3, seed=4, over_budget=True, epochs=2, epoch_scheme="blocks", allow_nonprivate=True)
    base.update(kw)
    return train(store, **base)


# sgld at epsilon inf (s = 1): at epsilon 1 on a store this small the prior's flow forgets everything but the
# epoch's last draw, and both schemes release the same prior noise
@pytest.mark.parametrize("method, eps", [("sgd", INF), ("sgld", INF)])
def test_blocks_scheme_same_model_for_any_workers_and_on_dask(store, method, eps):
    a = _train(store, method=method, epsilon=eps, workers=1, evaluate=False)
    b = _train(store, method=method, epsilon=eps, workers=2, evaluate=False)
    c = _train(store, method=method, epsilon=eps, workers=2, scheduler="dask", evaluate=False)
    assert c.info["engine"]["scheduler"] == "dask"
    for m in (b, c):
        assert np.array_equal(a.item_factors, m.item_factors) and np.array_equal(a.item_bias, m.item_bias)
    assert a.info["parameters"]["epoch_scheme"] == "blocks"
    # it is another algorithm than Hogwild: the model differs from the default scheme's
    h = _train(store, method=method, epsilon=eps, workers=1, evaluate=False, epoch_scheme="hogwild")
    assert not np.array_equal(a.item_factors, h.item_factors)


def test_blocks_sgld_flows_every_item_over_the_whole_epoch(store):
    """Noise only (no prior, tiny steps): after one epoch from V = 0 each coordinate has variance 2 T h = eta.

    Each block flows the items it touched over its own span of the clock, the epoch's end over what no block
    covered: the same Langevin time per item as Hogwild (a block missing the rest, or every block flowing from
    the epoch's start, would give far less or far more)."""
    eta = 1e-4
    kw = dict(method="sgld", epsilon=INF, epochs=1, eta=eta, reg=0.0, reg_bias=0.0, init_std=0.0, evaluate=False,
              workers=2, rank=8)
    for scheme in ("hogwild", "blocks"):
        v = _train(store, epoch_scheme=scheme, **kw).item_factors
        ratio = float(np.var(v)) / eta
        assert 0.85 < ratio < 1.15, (scheme, ratio)


def test_ledger_says_the_blocks_chain(store):
    m = _train(store, method="sgld", epsilon=1.0, workers=1, evaluate=False)
    notes = " ".join(m.ledger.notes)
    assert "--epoch-scheme blocks" in notes and "Markov chain" in notes


@pytest.mark.slow
@pytest.mark.parametrize("method, eps", [("sgd", INF), ("sgld", 1.0)])
def test_blocks_scheme_on_a_process_cluster_equals_local(store, tmp_path, method, eps):
    distributed = pytest.importorskip("distributed")
    a = _train(store, method=method, epsilon=eps, workers=2)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  memory_limit="1GB") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        b = _train(store, method=method, epsilon=eps, scheduler=client, state=str(tmp_path / "st"))
    assert b.info["engine"]["scheduler"] == "distributed"
    assert np.array_equal(a.item_factors, b.item_factors) and np.array_equal(a.item_bias, b.item_bias)
    assert a.summary["test_rmse"] == b.summary["test_rmse"]


def test_hogwild_epochs_on_a_cluster_are_refused_before_any_spend(store, tmp_path):
    """One line naming --scheduler and the way out; nothing reserved in the budget, no model."""
    import json

    from click.testing import CliRunner

    from streamdp.cli import main

    out = tmp_path / "m"
    r = CliRunner().invoke(main, ["train", store.path, "--method", "sgld", "--epsilon", "1", "--out", str(out),
                                  "--scheduler", "tcp://127.0.0.1:9"])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: --scheduler tcp://127.0.0.1:9:")
    assert "--epoch-scheme blocks" in lines[0] and not out.exists()
    entries = json.loads(CliRunner().invoke(main, ["budget", store.path, "--json"]).stdout)["entries"]
    assert not any(e.get("model") == str(out) for e in entries)
