"""``streamdp lowrank``: range finder without noise (HMT bounds), streamed == in memory, privacy ledger, CLI.

Gaussian measurements (Hardt & Roth) and randomized response, both streamed; see
:mod:`streamdp.methods.lowrank`.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.errors import ParameterError
from streamdp.methods.lowrank import (_OMEGA, _PROJECTION, _RR_NOISE, _SKETCH, NOISE_GROUP_USERS, LowRank,
                                      _noise_rows, _orthonormalizer)
from streamdp.privacy import epsilon_of
from streamdp.privacy.accountant import BOUNDED_ROW_CHANGE_RELATION, NEIGHBOURING_RELATION
from streamdp.privacy.ledger import GUARANTEE_ROW_DP, Ledger
from streamdp.serving.model import load_model
from streamdp.storage.coherence import generate_coherence_store
from streamdp.storage.store import open_store
from streamdp.storage.writer import StoreWriter
from streamdp.stream.engine import Engine
from streamdp.workflows.training import lowrank

EPS, DELTA = 2.0, 1e-6


def dense_store(path: str, A: np.ndarray, block_users: int) -> object:
    """``A`` (entries in [-1, 1]) as a dense store with the declared range [-1, 1] (midpoint 0: the matrix is A)."""
    m, n = A.shape
    with StoreWriter(path, n_users=m, n_items=n, block_users=block_users) as w:
        for b in range(w.n_blocks):
            rows = A[b * block_users:(b + 1) * block_users]
            w.write_block(b, np.arange(0, rows.size + 1, n, dtype=np.int64),
                          np.tile(np.arange(n, dtype=np.int32), len(rows)), rows.astype(np.float32).ravel())
        w.write_array("user_ids", np.arange(m, dtype=np.int64))
        w.write_array("item_ids", np.arange(n, dtype=np.int64))
        w.write_array("item_counts", np.full(n, m, np.int64))
        w.finalize({"rating_min": -1.0, "rating_max": 1.0, "rating_range_source": "declared"})
    return open_store(path)


def dense_matrix(store, clip: float) -> np.ndarray:
    """NumPy reference of the method's matrix: ratings clipped into the range, minus the midpoint, rows <= clip."""
    lo, hi = float(store.rating_min), float(store.rating_max)
    A = np.zeros((store.n_users, store.n_items))
    for blk in store.blocks():
        rows = np.repeat(np.arange(blk.n_users), np.diff(blk.indptr)) + blk.first_user
        A[rows, blk.items] = np.clip(blk.ratings.astype(np.float64), lo, hi) - (lo + hi) / 2.0
    norms = np.linalg.norm(A, axis=1, keepdims=True)
    return A * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def fit(store, workers=1, **kw):
    kw.setdefault("epsilon", EPS)
    kw.setdefault("delta", DELTA)
    m = LowRank(**kw)
    with Engine(store, workers=workers, memory_limit="4GB") as eng:
        f = m.fit(store, eng)
        errs = m.errors(store, eng)
    return m, f, errs


def projector(V):
    return V @ V.T


@pytest.fixture(scope="module")
def coh(tmp_path_factory):
    """A dense low-coherence store, 800 users x 60 items, blocks of 97 users (noise groups straddle blocks)."""
    return generate_coherence_store(str(tmp_path_factory.mktemp("lr") / "c.zarr"), n_users=800, n_items=60, rank=3,
                                    noise=0.1, seed=2, block_users=97)


# -- the range finder without noise: HMT's bounds ----------------------------------------------------------------------
def _spectrum_matrix(m, n, s, seed):
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((m, len(s))))[0]
    V = np.linalg.qr(rng.standard_normal((n, len(s))))[0]
    A = (U * s) @ V.T
    return A / np.abs(A).max()


def test_noiseless_range_finder_meets_hmt_expectation_bound(tmp_path):
    """HMT11 Thm 10.5 (the paper's Thm 3.1): E ||A - Q Q^T A||_F <= sqrt(1 + k / (p - 1)) (sum_{j>k} s_j^2)^{1/2}."""
    k, p = 5, 5
    s = np.concatenate([[10.0, 8.0, 6.0, 5.0, 4.0], 1.5 * 0.85 ** np.arange(55)])
    A = _spectrum_matrix(500, 60, s, 0)
    st = dense_store(str(tmp_path / "s.zarr"), A, block_users=128)
    sv = np.linalg.svd(A, compute_uv=False)
    tail_k, tail_kp = math.sqrt((sv[k:] ** 2).sum()), math.sqrt((sv[k + p:] ** 2).sum())
    bound = math.sqrt(1.0 + k / (p - 1)) * tail_k
    errs = [fit(st, epsilon=math.inf, rank=k, oversampling=p, clip=1e9, seed=seed)[2] for seed in range(12)]
    untr = np.array([e["error_untruncated"] for e in errs])
    assert untr.mean() <= bound, (untr.mean(), bound)
    assert untr.min() >= tail_kp * (1 - 1e-9)  # Q Q^T A has rank k + p: never below the best rank-(k+p) error
    trunc = np.array([e["error"] for e in errs])
    assert trunc.min() >= tail_k * (1 - 1e-9)  # the released rank-k output: never below the best rank k
    assert errs[0]["frobenius"] == pytest.approx(np.linalg.norm(A), rel=1e-6)
    # and the local projection on the released basis is the same rank-k error's right-side version
    assert all(e["error_local"] >= tail_k * (1 - 1e-9) for e in errs)


def test_noiseless_range_finder_is_exact_on_a_low_rank_matrix(tmp_path):
    A = _spectrum_matrix(300, 40, np.array([5.0, 3.0, 1.0]), 1)
    st = dense_store(str(tmp_path / "s.zarr"), A, block_users=64)
    m, f, e = fit(st, epsilon=math.inf, rank=3, oversampling=2, clip=1e9, seed=4)
    assert e["error_untruncated"] / e["frobenius"] < 1e-6 and e["error"] / e["frobenius"] < 1e-6
    _, s, Vt = np.linalg.svd(A)
    np.testing.assert_allclose(projector(f.extras["basis"].astype(np.float64)), projector(Vt[:3].T), atol=1e-5)
    np.testing.assert_allclose(f.extras["singular_values"], s[:3], rtol=1e-6)
    assert f.ledger.guarantee == "non-private" and f.ledger.relation == NEIGHBOURING_RELATION


# -- streamed == in memory ------------------------------------------------------------------------------------------
def test_noise_rows_do_not_depend_on_blocks_or_chunks(coh):
    from streamdp.privacy.release import Release
    from streamdp.stream.driver import Run

    rel = Release("x", "gaussian", 1.0, 2.0, shape=(1000, 7))
    with Run(coh, method="t", fingerprint="f", seed=5, rng_key=1) as run:
        whole = np.concatenate([N for _, _, N in _noise_rows(run, 3, rel, 0, 1000, 7, 1000)])
        for first, end, rows in ((0, 97, 13), (97, 400, 1000), (255, 257, 1), (300, 1000, 256)):
            part = np.concatenate([N for _, _, N in _noise_rows(run, 3, rel, first, end, 7, rows)])
            np.testing.assert_array_equal(part, whole[first:end])
    assert NOISE_GROUP_USERS == 256


@pytest.mark.parametrize("mechanism", ["measurements", "randomized-response"])
def test_streamed_equals_in_memory_and_workers(mechanism, small_store, small_store_in_memory):
    kw = dict(rank=3, seed=11, mechanism=mechanism, power_iters=4)
    _, f1, e1 = fit(small_store, workers=1, **kw)
    _, f2, e2 = fit(small_store, workers=2, **kw)
    for name in ("basis", "singular_values") + (("noisy_projection",) if mechanism == "measurements" else ()):
        assert np.array_equal(f1.extras[name], f2.extras[name]), name
    assert e1 == pytest.approx(e2, rel=1e-12)  # diagnostics: BLAS threads may round differently
    _, fm, em = fit(small_store_in_memory, workers=1, **kw)
    np.testing.assert_allclose(fm.extras["singular_values"], f1.extras["singular_values"], rtol=1e-6)
    B1, Bm = (projector(f.extras["basis"].astype(np.float64)) for f in (f1, fm))
    np.testing.assert_allclose(B1, Bm, atol=1e-5)
    for k in e1:
        assert em[k] == pytest.approx(e1[k], rel=1e-6)
    assert f1.ledger.events == fm.ledger.events


def test_measurements_match_a_dense_reference(coh):
    """The streamed sketch, orthonormalization, projection and its realized sensitivity against dense NumPy."""
    m, f, e = fit(coh, rank=4, seed=3, clip=1.0, epsilon=8.0)
    plan = m.plan(coh)
    st, s = m._state, plan.settings
    run, rel1, rel2 = st["run"], *plan.releases
    A = dense_matrix(coh, 1.0)
    Y = A @ st["Omega"]
    nrm = np.linalg.norm(Y, axis=1, keepdims=True)
    Y = Y * np.minimum(1.0, s.sketch_clip / nrm)
    Y += np.concatenate([N for _, _, N in _noise_rows(run, _SKETCH, rel1, 0, coh.n_users, Y.shape[1], 1000)])
    T = _orthonormalizer(Y.T @ Y)
    Q = Y @ T
    np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-8)
    mu = np.linalg.norm(Q, axis=1).max()
    assert st["mu"] == pytest.approx(mu, rel=1e-9)
    realized = replace(rel2, sensitivity=mu * 1.0, shape=(Q.shape[1], coh.n_items))
    Bt = realized.add(A.T @ Q, run.rng(_PROJECTION, 0))
    # column signs of T may differ between the streamed and the dense Gram: compare sign-free quantities
    np.testing.assert_allclose(np.abs(st["noisy_projection"]), np.abs(Bt), rtol=1e-6, atol=1e-8)
    Uo, S, _ = np.linalg.svd(Bt, full_matrices=False)
    np.testing.assert_allclose(f.extras["singular_values"], S[:4], rtol=1e-6)
    np.testing.assert_allclose(projector(st["basis"]), projector(Uo[:, :4]), atol=1e-6)
    # the ledger records the realized sensitivity of the projection
    proj = f.ledger.bounds["releases"][1]
    assert proj["sensitivity"] == pytest.approx(mu) and proj["sensitivity_rule"].startswith("L max_i")
    assert np.array_equal(st["Omega"], run.rng(_OMEGA, 0).standard_normal(st["Omega"].shape))
    # the paper's rank-k output Q [B~]_k, dense
    Ab = Q @ (Bt.T @ Uo[:, :4]) @ Uo[:, :4].T
    assert e["error"] == pytest.approx(np.linalg.norm(A - Ab), rel=1e-6)
    assert e["error_local"] == pytest.approx(np.linalg.norm(A - A @ projector(st["basis"])), rel=1e-6)
    assert e["error_untruncated"] == pytest.approx(np.linalg.norm(A - Q @ Bt.T), rel=1e-6)


def test_randomized_response_is_the_truncated_svd_of_the_same_noisy_matrix(coh):
    """Streamed subspace iteration (noise regenerated every pass) == exact SVD of A + N held in memory."""
    m, f, e = fit(coh, rank=3, seed=5, clip=1.0, epsilon=100.0, mechanism="randomized-response", power_iters=30)
    st, rel = m._state, m.plan(coh).releases[0]
    A = dense_matrix(coh, 1.0)
    N = np.concatenate([N for _, _, N in _noise_rows(st["run"], _RR_NOISE, rel, 0, coh.n_users, coh.n_items, 50)])
    assert N.std() == pytest.approx(rel.scale, rel=0.02)
    _, S, Vt = np.linalg.svd(A + N)
    np.testing.assert_allclose(f.extras["singular_values"], S[:3], rtol=1e-8)
    np.testing.assert_allclose(projector(st["basis"]), projector(Vt[:3].T), atol=1e-8)
    P = projector(Vt[:3].T)
    assert e["error"] == pytest.approx(np.linalg.norm(A - (A + N) @ P), rel=1e-6)
    assert e["error_local"] == pytest.approx(np.linalg.norm(A - A @ P), rel=1e-6)


# -- privacy ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["measurements", "randomized-response"])
def test_ledger_states_the_weaker_relation(mechanism, coh):
    m, f, _ = fit(coh, rank=3, seed=1, clip=1.0, mechanism=mechanism, power_iters=2)
    led = f.ledger
    assert led.guarantee == GUARANTEE_ROW_DP and led.relation == BOUNDED_ROW_CHANGE_RELATION
    assert "weaker than user-level add/remove" in led.guarantee
    assert any("WEAKER than streamdp's user-level add/remove" in n for n in led.notes)
    d = led.to_dict()
    assert d["neighbouring_relation"] == BOUNDED_ROW_CHANGE_RELATION
    assert d["accounting"]["neighbouring_relation"] == BOUNDED_ROW_CHANGE_RELATION
    assert Ledger.from_dict(json.loads(json.dumps(d))).relation == BOUNDED_ROW_CHANGE_RELATION
    assert led.accounting.epsilon <= EPS * (1 + 1e-9) and led.recompute().epsilon == pytest.approx(
        led.accounting.epsilon, rel=1e-6)
    assert m.planned_ledger(coh).events == led.events  # what the budget reserved is what was spent
    b = led.bounds
    assert set(b["relation_covers"]) == {"bounded_row_change", "zero_out", "replace_one", "add_remove"}
    assert b["relation_covers"]["add_remove"].startswith("NOT covered")
    assert b["epsilon_replace_one"] > led.epsilon
    rel = b["releases"]
    if mechanism == "measurements":
        C = b["sketch_clip_C"]
        assert rel[0]["sensitivity"] == pytest.approx(2 * C) and rel[0]["shape"] == [800, 6]
        z1, z2 = rel[0]["noise_multiplier"], rel[1]["noise_multiplier"]
        # sum 1/z^2 split evenly (default share 0.5)
        assert 1 / z1 ** 2 == pytest.approx(1 / z2 ** 2, rel=1e-9)
        from streamdp.privacy import compose, gaussian_event
        assert b["epsilon_replace_one"] == pytest.approx(
            epsilon_of(compose([gaussian_event(z1), gaussian_event(z2 / 2)]), DELTA).epsilon, rel=1e-9)
    else:
        assert rel[0]["sensitivity"] == 1.0 and rel[0]["shape"] == [800, 60]


def test_ledger_refuses_a_relation_without_its_guarantee():
    from streamdp.privacy.ledger import GUARANTEE_USER_DP

    with pytest.raises(ParameterError, match="does not go with"):
        Ledger(method="x", guarantee=GUARANTEE_USER_DP, epsilon=1.0, delta=1e-6, relation=BOUNDED_ROW_CHANGE_RELATION)
    with pytest.raises(ParameterError, match="does not go with"):
        Ledger(method="x", guarantee=GUARANTEE_ROW_DP, epsilon=1.0, delta=1e-6)


def test_sensitivities_under_the_relation_hold():
    """Property: for neighbours differing in one row by ||e|| <= L, the sketch rows move by <= 2C, the projection by
    <= L max_i ||Q_i||, the matrix by <= L (what the releases are calibrated to)."""
    from streamdp.methods.lowrank import _clip_dense_rows

    rng = np.random.default_rng(0)
    n, kp, L = 30, 6, 1.5
    Omega = rng.standard_normal((n, kp))
    C = 0.7 * L * math.sqrt(kp)  # any C: the bound is the clipping's
    Q = np.linalg.qr(rng.standard_normal((40, kp)))[0]
    mu = np.linalg.norm(Q, axis=1).max()
    for _ in range(300):
        a = rng.standard_normal(n) * rng.uniform(0, 3)
        a *= min(1.0, L / np.linalg.norm(a))
        e = rng.standard_normal(n)
        e *= rng.uniform(0, L) / np.linalg.norm(e)
        b = a + e
        b *= min(1.0, L / np.linalg.norm(b))  # the neighbour's row, clipped too
        y = _clip_dense_rows(np.stack([a @ Omega, b @ Omega]), C)
        assert np.linalg.norm(y[0] - y[1]) <= 2 * C * (1 + 1e-12)
        i = rng.integers(40)
        assert np.linalg.norm(np.outer(Q[i], a - b)) <= mu * 2 * L  # any replacement: 2 mu L ...
        assert np.linalg.norm(np.outer(Q[i], e)) <= mu * L * (1 + 1e-12)  # ... a change e of the relation: mu L


def test_errors_needs_a_fit(coh):
    with Engine(coh, workers=1, memory_limit="2GB") as eng, pytest.raises(ParameterError, match="fit first"):
        LowRank(epsilon=1.0, delta=DELTA, rank=2).errors(coh, eng)


# -- the command -----------------------------------------------------------------------------------------------------
def test_cli_releases_item_side_and_says_the_relation_is_weaker(coh, tmp_path):
    out = str(tmp_path / "lr")
    res = CliRunner().invoke(main, ["lowrank", coh.path, "--rank", "3", "--epsilon", "1", "--out", out, "--seed", "2",
                                    "--clip", "1"])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "released: " in text and "basis: item basis V_k" in text and "noisy_projection" in text
    assert "not released: user-side factors" in text
    assert "neighbouring relation: one user's row of the clipped matrix changes by a vector of L2 norm at most L" \
        in text
    assert "WEAKER than streamdp's user-level add/remove" in text  # the warning (stderr, mixed in by CliRunner)
    assert "add/remove one user: NOT covered" in text
    mdl = load_model(out)
    assert mdl.info["method"] == "lowrank" and mdl.rank == 3
    assert mdl.extras["basis"].shape == (60, 3) and mdl.extras["noisy_projection"].shape == (60, 6)
    assert mdl.ledger.relation == BOUNDED_ROW_CHANGE_RELATION
    budget = json.loads((open(coh.path + "/privacy_budget.json")).read())
    assert budget["entries"][-1]["status"] == "complete"
    assert budget["entries"][-1]["neighbouring_relation"] == BOUNDED_ROW_CHANGE_RELATION
    res = CliRunner().invoke(main, ["budget", coh.path])
    assert "weaker relation than add/remove" in res.output


def test_cli_json_randomized_response(coh, tmp_path):
    out = str(tmp_path / "rr")
    res = CliRunner().invoke(main, ["lowrank", coh.path, "--rank", "2", "--epsilon", "3", "--out", out,
                                    "--mechanism", "randomized-response", "--power-iters", "2", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["mechanism"] == "randomized-response" and d["weaker_than_user_level"] is True
    assert d["guarantee"] == GUARANTEE_ROW_DP and d["epsilon_spent"] <= 3.0 < d["epsilon_replace_one"]
    assert d["neighbouring_relation"] == BOUNDED_ROW_CHANGE_RELATION
    assert "WEAKER" in res.stderr


@pytest.mark.parametrize("args,message", [
    (["--rank", "0"], "--rank must be a positive integer"),
    (["--rank", "61"], "--rank 61 exceeds the number of items"),
    (["--rank", "2", "--epsilon", "0"], "epsilon: expected a positive number"),
    (["--rank", "2", "--sketch-share", "1"], "--sketch-share must be < 1"),
    (["--rank", "2", "--clip", "-1"], "--clip must be > 0"),
    (["--rank", "2", "--oversampling", "-1"], "--oversampling must be >= 0"),
    (["--rank", "2", "--power-iters", "0"], "--power-iters must be >= 1"),
    (["--rank", "2", "--delta", "0.5"], "delta: must be below 1/n_users"),
])
def test_cli_bad_parameters_are_one_line_errors_and_write_nothing(coh, tmp_path, args, message):
    argv = ["lowrank", coh.path, "--out", str(tmp_path / "o")] + args
    if "--epsilon" not in args:
        argv += ["--epsilon", "1"]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: ") and message in lines[0], res.output
    assert not (tmp_path / "o").exists()


def test_cli_refuses_an_existing_destination_and_a_non_store(coh, tmp_path):
    (tmp_path / "o").mkdir()
    res = CliRunner().invoke(main, ["lowrank", coh.path, "--rank", "2", "--epsilon", "1", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "already exists" in res.output
    res = CliRunner().invoke(main, ["lowrank", str(tmp_path), "--rank", "2", "--epsilon", "1", "--out",
                                    str(tmp_path / "p")])
    assert res.exit_code == 2 and res.output.startswith("streamdp: error: ") and len(res.output.splitlines()) == 1


def test_library_function_summary(coh, tmp_path):
    s = lowrank(coh, rank=2, epsilon=math.inf, delta=DELTA, out=str(tmp_path / "np"), clip=1.0, seed=0)
    assert s["guarantee"] == "non-private" and "epsilon_replace_one" not in s


def test_cli_help_states_the_library_defaults():
    defaults = LowRank.Options()
    res = CliRunner().invoke(main, ["lowrank", "--help"])
    text = " ".join(res.output.split())
    assert f"(default {defaults.power_iters})" in text and f"default {defaults.sketch_share:g})" in text
    assert "WEAKER than the user-level add/remove guarantee" in text
