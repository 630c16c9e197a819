"""``--method fw`` / ``svd``: dense NumPy references, the FW descent, the ledger (joint DP), resume, local use."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from streamdp.errors import ParameterError
from streamdp.methods import get_method
from streamdp.methods._subspace import canonical_signs
from streamdp.methods.frank_wolfe import RNG_KEY, passes_in
from streamdp.stream.engine import Engine

INF = float("inf")


@pytest.fixture(scope="module")
def rank1_store(tmp_path_factory):
    """Jain et al.'s synthetic set, small: exact rank one, entries in [-1, 1], uniform items, 20% test split."""
    from streamdp.storage.generate import generate_store

    return generate_store(str(tmp_path_factory.mktemp("fw") / "r1.zarr"), n_users=1500, n_items=40,
                          ratings_per_user=12, rank=1, noise=0.05, factors="uniform", rating_min=-1.0,
                          rating_max=1.0, rating_step=0.0, item_exponent=0.0, user_exponent=50.0,
                          test_fraction=0.2, seed=3, block_users=400)


def _fit(store, method="fw", epsilon=INF, rank=6, workers=1, seed=5, center="midpoint", **opts):
    """The dense references centre on the midpoint; the private centring is tested on its own below."""
    m = get_method(method)(epsilon=epsilon, delta=1e-6, rank=rank, seed=seed, center=center, **opts)
    with Engine(store, workers=workers, memory_limit="2GB") as eng:
        return m, m.fit(store, eng)


def _dense(store, split="train"):
    n_users, n = store.n_users, store.n_items
    X, M = np.zeros((n_users, n)), np.zeros((n_users, n), bool)
    for b in range(store.n_blocks):
        blk = store.read_block(b, split)
        rows = blk.first_user + np.repeat(np.arange(blk.n_users), np.diff(blk.indptr))
        X[rows, blk.items], M[rows, blk.items] = blk.ratings, True
    mid = (store.rating_min + store.rating_max) / 2.0
    return (X - mid) * M, M


def dense_fw(store, *, T, P, k, bound, seed):
    """Non-private private-FW in dense NumPy, rows ``Y_i`` held in full (no coefficients, no kernels).

    Same schedule as the method: the first iteration's power passes start from the run's
    init vector (family ``(RNG_KEY << 24) | (1 << 16)`` of the seed), every pass's input is
    rounded to float32; the step direction is the last pass's input ``d``, ``lambda^2`` its
    Rayleigh quotient; ``u_i`` is the user's own line search along ``d`` within
    ``|a_i . d| / lambda`` (Alg. 1's atom). Returns the basis, the lambdas and, per iteration, the objective
    ``F(Y_t)``, the FW gap and the curvature term ``||P_Omega(S_t - Y_{t-1})||^2 / |Omega|``.
    """
    from streamdp.privacy import spawn_rngs

    X, M = _dense(store)
    n_users, n = X.shape
    omega = M.sum()
    Y = np.zeros_like(X)
    v = spawn_rngs(seed, 1, key=(RNG_KEY << 24) | (1 << 16))[0].standard_normal((n, 1))
    v /= np.linalg.norm(v)
    eta = 1.0 / T
    V, lams, F, gaps, curv = np.zeros((n, T)), np.zeros(T), [0.5 * np.sum(X ** 2) / omega], [], []
    counts = M.sum(1)
    for t in range(1, T + 1):
        A = (Y - X) * M
        for _ in range(passes_in(t, P)):
            d = canonical_signs(v).astype(np.float32).astype(np.float64)
            d /= np.linalg.norm(d)
            Yv = A.T @ (A @ d)
            v = np.linalg.qr(Yv)[0]
            m2 = float(d[:, 0] @ Yv[:, 0])
        lam = math.sqrt(max(m2, 0.0))
        V[:, t - 1], lams[t - 1] = d[:, 0], lam
        # each user's line search along d for her own loss, within the FW atom's |u_i| = |a_i . d| / lambda
        g, sv, yv = (A @ d)[:, 0], (M * d[:, 0] ** 2).sum(1), ((Y * M) @ d)[:, 0]
        uls = np.where(sv > 0, (g - eta * yv) / (eta * k * np.maximum(sv, 1e-300)), 0.0)
        u = np.clip(uls, -np.abs(g) / lam, np.abs(g) / lam)
        S = -k * np.outer(u, d[:, 0])
        gaps.append(float(np.sum((Y - S) * A)) / omega)
        curv.append(float(np.sum(((S - Y) * M) ** 2)) / omega)
        Y = (1 - eta) * Y + eta * S
        norms = np.linalg.norm(Y * M, axis=1)
        lim = bound * np.sqrt(counts)
        Y *= np.where(norms > lim, lim / np.maximum(norms, 1e-300), 1.0)[:, None]
        F.append(0.5 * np.sum(((Y - X) * M) ** 2) / omega)
    return V, lams, np.array(F), np.array(gaps), np.array(curv), Y


def test_non_private_fw_matches_dense_numpy(rank1_store, tmp_path):
    from streamdp.serving.local import predict_block, solve_block
    from streamdp.serving.model import load_model

    st = rank1_store
    m, f = _fit(st, rank=6, passes=3, workers=2)
    s = m.settings(st)
    V, lams, F, _, _, Y = dense_fw(st, T=6, P=3, k=s.k, bound=s.bound, seed=5)
    assert f.ledger.guarantee == "non-private" and not f.ledger.events
    np.testing.assert_allclose(f.item_factors, V, atol=2e-6, rtol=0)
    np.testing.assert_allclose(f.extras["fw_lambda"], lams, rtol=1e-7)
    # each user's row, reconstructed on her device from the saved model = the dense iterate
    model = load_model(f.save(str(tmp_path / "fw"))).in_order_of(st.item_ids())
    for b in range(st.n_blocks):
        blk, te = st.read_block(b), st.read_block(b, "test")
        U = solve_block(model, blk.indptr, blk.items, blk.ratings, 1.0)
        rows = blk.first_user + np.repeat(np.arange(blk.n_users), np.diff(te.indptr))
        pred = predict_block(model, U, te.indptr, te.items)
        np.testing.assert_allclose(pred, np.clip(Y[rows, te.items], -1, 1), atol=1e-5)


def test_non_private_fw_descends_up_to_the_gap(rank1_store):
    """``F(Y_t) <= F(Y_{t-1}) - eta gap_t + eta^2 curv_t / 2`` (equality for Alg. 1's atom on the quadratic; the
    users' line search and the projection never add loss), so the objective falls at every iteration whose FW
    gap exceeds ``eta curv_t / 2``: here the first 9, down to 3% of ``F(0)``, near the noise floor
    ``noise^2 / 2``; after that it may move by at most the curvature term."""
    T = 12
    _, lams, F, gaps, curv, _ = dense_fw(rank1_store, T=T, P=3, k=0.6 * math.sqrt(1500 * 40), bound=1.0, seed=5)
    eta = 1.0 / T
    large = gaps > eta * curv / 2
    for t in range(1, T + 1):
        assert F[t] <= F[t - 1] - eta * gaps[t - 1] + eta * eta * curv[t - 1] / 2 + 1e-12, t
        if large[t - 1]:
            assert F[t] < F[t - 1], t
    assert large[:9].all() and np.all(np.diff(F[:10]) < 0)
    assert F[9] < 0.03 * F[0] and F[-1] < 0.05 * F[0] and F.min() > 0.05 ** 2 / 2 * 0.5


def test_streamed_training_objective_falls(rank1_store, tmp_path):
    """The streamed run (coefficients on disk, local replay) reproduces the dense objective curve."""
    from streamdp.serving.local import predict_block, solve_block
    from streamdp.serving.model import load_model

    st = rank1_store
    k = 0.6 * math.sqrt(st.n_users * st.n_items)
    _, f = _fit(st, rank=12, passes=3, nuclear_norm=k)
    _, _, F, _, _, _ = dense_fw(st, T=12, P=3, k=k, bound=1.0, seed=5)
    model = load_model(f.save(str(tmp_path / "fw"))).in_order_of(st.item_ids())
    se = n = 0.0
    for b in range(st.n_blocks):
        blk = st.read_block(b)
        U = solve_block(model, blk.indptr, blk.items, blk.ratings, 1.0)
        se += float(np.sum((predict_block(model, U, blk.indptr, blk.items) - blk.ratings) ** 2))
        n += blk.nnz
    assert 0.5 * se / n == pytest.approx(F[-1], rel=1e-4)


def test_private_ledger_is_joint_dp_with_every_release(rank1_store):
    m, f = _fit(rank1_store, epsilon=1.0, rank=5, passes=2, seed=1)
    led = f.ledger
    assert led.guarantee == "joint user-level (epsilon, delta)-DP"
    assert led.accounting.epsilon <= 1.0 and led.recompute().epsilon == pytest.approx(led.accounting.epsilon)
    assert led.bounds["releases"][0]["release"].startswith("number of users")  # released first (Laplace)
    rel = led.bounds["releases"][1:]
    L = m.settings(rank1_store).clip
    assert rel[0]["mechanism"] == "gaussian" and rel[0]["sensitivity"] == pytest.approx(L * L)
    assert rel[0]["count"] == 5 * 2 + 1 == sum(passes_in(t, 2) for t in range(1, 6))
    assert rel[0]["shape"] == [rank1_store.n_items, 1]
    assert rel[1]["mechanism"] == "post-processing"
    assert any(n.startswith("joint DP") for n in led.notes)
    assert m.planned_ledger(rank1_store).events == led.events


@pytest.mark.parametrize("method", ["fw", "svd"])
def test_private_centring_is_released_first_and_used_locally(rank1_store, tmp_path, method):
    """``--center private`` (default): a private global mean and item biases, two more Gaussian releases in the one
    composed ledger; non-private, the exact mean of user means; the model centres the users' devices on them."""
    from streamdp.serving.evaluate import evaluate_model

    st = rank1_store
    m, f = _fit(st, method=method, epsilon=1.0, rank=3, seed=1, center="private")
    led = f.ledger
    rel = led.bounds["releases"]
    assert [r["mechanism"] for r in rel] == ["laplace"] + ["gaussian"] * 3 + ["post-processing"]  # the count first
    assert "private global mean" in led.bounds["centering"]
    assert led.accounting.epsilon <= 1.0 and led.recompute().epsilon == pytest.approx(led.accounting.epsilon)
    assert m.planned_ledger(st).events == led.events
    assert np.any(f.item_bias != 0) and abs(f.global_mean) < 0.2
    _, g = _fit(st, method=method, epsilon=INF, rank=3, center="private")
    X, M = _dense(st)
    assert g.global_mean == pytest.approx(float(np.mean(X.sum(1)[M.any(1)] / M.sum(1)[M.any(1)])), abs=1e-9)
    assert evaluate_model(g.save(str(tmp_path / method)), st, baselines=False)["rmse"] < 0.2


def test_paper_calibration_reports_the_epsilon_it_gives(rank1_store):
    from streamdp.privacy import paper_sigma_jain

    m = get_method("fw")(epsilon=1.0, delta=1e-6, rank=4, passes=1, calibration="paper", center="midpoint")
    led = m.planned_ledger(rank1_store)
    count = 4 + 1
    z = led.bounds["releases"][1]["noise_multiplier"]  # after the count of users, at 1% of epsilon
    assert z == pytest.approx(paper_sigma_jain(0.99, 1e-6, count, "alg1"))
    assert led.accounting.epsilon < 0.4  # far more noise than the target needs
    tight = get_method("fw")(epsilon=1.0, delta=1e-6, rank=4, passes=1, center="midpoint").planned_ledger(rank1_store)
    assert tight.bounds["releases"][1]["noise_multiplier"] < z / 5


def test_svd_ledger_and_paper_sigma(rank1_store):
    from streamdp.privacy import paper_sigma_jain

    m, f = _fit(rank1_store, method="svd", epsilon=1.0, rank=2, seed=1)
    led = f.ledger
    D = m.settings(rank1_store).clip
    rel = led.bounds["releases"][1]  # after the count of users
    assert led.guarantee == "joint user-level (epsilon, delta)-DP" and led.accounting.epsilon <= 1.0
    assert rel["sensitivity"] == pytest.approx(D * D) and rel["symmetric"] and rel["count"] == 1
    assert f.item_factors.shape == (rank1_store.n_items, 2)
    p = get_method("svd")(epsilon=1.0, delta=1e-6, rank=2, calibration="paper",
                          center="midpoint").planned_ledger(rank1_store)
    assert p.bounds["releases"][1]["noise_multiplier"] == pytest.approx(paper_sigma_jain(0.99, 1e-6, 1, "alg1"))


def test_non_private_svd_is_the_top_subspace_and_projects(rank1_store, tmp_path):
    from streamdp.serving.local import solve_block
    from streamdp.serving.model import load_model

    st = rank1_store
    _, f = _fit(st, method="svd", rank=2)
    X, M = _dense(st)
    w, E = np.linalg.eigh(X.T @ X)
    ref = canonical_signs(E[:, np.argsort(w)[::-1][:2]])
    np.testing.assert_allclose(f.item_factors, ref, atol=1e-5)
    model = load_model(f.save(str(tmp_path / "svd"))).in_order_of(st.item_ids())
    blk = st.read_block(0)
    U = solve_block(model, blk.indptr, blk.items, blk.ratings, 1.0)
    rows = np.arange(blk.n_users)
    expect = (X[rows] @ ref) * (st.n_items / np.maximum(M[rows].sum(1), 1))[:, None]
    np.testing.assert_allclose(U, expect, atol=1e-5)


def test_fw_beats_svd_on_the_small_rank1_store(rank1_store, tmp_path):
    from streamdp.serving.evaluate import evaluate_model

    out = {}
    for meth, eps, opts in (("fw", INF, {"rank": 20}), ("svd", INF, {"rank": 1})):
        _, f = _fit(rank1_store, method=meth, epsilon=eps, **opts)
        out[meth] = evaluate_model(f.save(str(tmp_path / meth)), rank1_store, baselines=True)
    assert out["fw"]["rmse"] < out["svd"]["rmse"] < out["svd"]["baselines"]["item_mean"]["rmse"]


def test_resume_after_interruption_gives_the_same_model(rank1_store, tmp_path, interrupted_after_checkpoint):
    opts = dict(epsilon=1.0, rank=4, passes=2, seed=7)
    _, full = _fit(rank1_store, checkpoint=str(tmp_path / "full"), **opts)
    with interrupted_after_checkpoint(2):
        _fit(rank1_store, checkpoint=str(tmp_path / "ck"), **opts)
    _, res = _fit(rank1_store, checkpoint=str(tmp_path / "ck"), **opts)
    assert res.model_info["resumed_from_iteration"] == 2
    np.testing.assert_array_equal(res.item_factors, full.item_factors)
    np.testing.assert_array_equal(res.extras["fw_lambda"], full.extras["fw_lambda"])
    with pytest.raises(ParameterError, match="different run"):
        _fit(rank1_store, checkpoint=str(tmp_path / "ck"), **{**opts, "passes": 1})


def test_bad_options_are_one_line_errors(rank1_store):
    with pytest.raises(ParameterError, match="--passes must be >= 1"):
        get_method("fw")(epsilon=1.0, delta=1e-6, passes=0)
    with pytest.raises(ParameterError, match="--step: expected one of"):
        get_method("fw")(epsilon=1.0, delta=1e-6, step="linesearch")
    with pytest.raises(ParameterError, match="--nuclear-norm must be > 0"):
        get_method("fw")(epsilon=1.0, delta=1e-6, nuclear_norm=0)
    with pytest.raises(ParameterError, match="--passes: not an option of --method svd"):
        get_method("svd")(epsilon=1.0, delta=1e-6, passes=2)


def test_cli_train_prints_joint_dp_and_evaluate_recommend_work(rank1_store, tmp_path):
    from click.testing import CliRunner

    from streamdp.cli import main

    out = str(tmp_path / "m")
    r = CliRunner().invoke(main, ["train", rank1_store.path, "--method", "fw", "--epsilon", "2", "--rank", "4",
                                  "--passes", "1", "--seed", "1", "--out", out])
    assert r.exit_code == 0, r.output
    assert "fw rank 4 (its number of Frank-Wolfe iterations), joint user-level (epsilon, delta)-DP" in r.output
    r = CliRunner().invoke(main, ["evaluate", out, rank1_store.path, "--json"])
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout)
    assert ev["guarantee"].startswith("joint") and math.isfinite(ev["rmse"])
    mine = tmp_path / "mine.csv"
    mine.write_text("item,rating\n0,0.5\n1,-0.25\n2,0.75\n")
    r = CliRunner().invoke(main, ["recommend", out, "--ratings", str(mine), "--top", "3"])
    assert r.exit_code == 0, r.output
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) >= 3


def test_temporary_run_directory_is_removed(rank1_store):
    import os

    _fit(rank1_store, epsilon=1.0, rank=2, passes=1)
    assert not os.path.exists(str(rank1_store.path).rstrip("/") + ".state")


def test_generate_uniform_is_the_papers_exact_rank1_set(tmp_path):
    """``streamdp generate --factors uniform --rank 1 --noise 0 --scale -1,1,0``: ``r_ij = u_i v_j`` in [-1, 1]."""
    from click.testing import CliRunner

    from streamdp.cli import main
    from streamdp.storage.store import open_store

    out = str(tmp_path / "r1.zarr")
    r = CliRunner().invoke(main, ["generate", "--out", out, "--users", "300", "--items", "30", "--ratings-per-user",
                                  "8", "--rank", "1", "--noise", "0", "--scale=-1,1,0", "--factors", "uniform",
                                  "--item-exponent", "0"])
    assert r.exit_code == 0, r.output
    st = open_store(out)
    v = st.array("truth/item_factors")[:][:, 0].astype(np.float64)
    assert not np.any(st.array("truth/item_bias")[:]) and np.abs(v).max() <= 1
    blk = st.read_block(0)
    assert np.abs(blk.ratings).max() <= 1 and st.rating_min == -1 and st.rating_max == 1
    for u in range(blk.n_users):
        sl = slice(blk.indptr[u], blk.indptr[u + 1])
        ratio = blk.ratings[sl] / v[blk.items[sl]]
        np.testing.assert_allclose(ratio, ratio[0], rtol=1e-5)  # one u_i per user: exactly rank one
        assert abs(ratio[0]) <= 1


def test_rank_above_the_number_of_items_is_refused_only_where_rank_counts_factors(tmp_path):
    """fw's ``--rank`` is its number of iterations ``T`` (``RANK_IS_FACTORS`` false): a basis of ``T > n_items``
    columns (later directions repeat earlier ones) trains, saves and predicts; a method whose rank counts factors
    (als) is refused before anything runs."""
    from streamdp.storage.generate import generate_store
    from streamdp.workflows.training import train

    st = generate_store(str(tmp_path / "s.zarr"), n_users=300, n_items=12, ratings_per_user=6, rank=2, seed=3,
                        test_fraction=0.2, block_users=100)
    assert not get_method("fw").RANK_IS_FACTORS and get_method("als").RANK_IS_FACTORS
    s = train(st, method="fw", out=str(tmp_path / "fw"), epsilon=2.0, delta=1e-6, seed=0, passes=1)
    assert s["rank"] == 30 > st.n_items and s["effective_rank"] == 30 and math.isfinite(s["test_rmse"])
    with pytest.raises(ParameterError, match="--rank 13 exceeds the number of items"):
        train(st, method="als", out=str(tmp_path / "als"), epsilon=2.0, delta=1e-6, rank=13)
