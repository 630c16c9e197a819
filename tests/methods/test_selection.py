"""Defaults that adapt to the data's shape: the released user profile, the private choice of the release."""

from __future__ import annotations

import math

import numpy as np
import pytest

import streamdp
from streamdp.methods._profile import EDGES, effective_users, exact_histogram, profile_release
from streamdp.methods._selection import VALIDATION_CAP, choose, holdout
from streamdp.privacy import epsilon_of
from streamdp.privacy.events import compose, event_from_dict


def _csr(counts, rng):
    ip = np.r_[0, np.cumsum(counts)].astype(np.int64)
    return ip, rng.integers(0, 50, ip[-1]).astype(np.int32), rng.random(ip[-1]).astype(np.float32)


def test_holdout_splits_every_rating_once_and_is_keyed():
    rng = np.random.default_rng(0)
    counts = np.array([0, 1, 2, 3, 9, 40])
    ip, it, r = _csr(counts, rng)
    (tip, tit, tr), (vu, vi, vr) = holdout(ip, it, r, first_user=10, key=3)
    assert len(tit) + len(vi) == len(it)
    per_user = np.bincount(vu, minlength=len(counts))
    want = np.minimum(np.minimum(np.maximum(np.floor(0.1 * counts + 0.5), 1), np.maximum(counts - 1, 0)), VALIDATION_CAP)
    assert per_user.tolist() == want.astype(int).tolist()
    assert np.diff(tip).tolist() == (counts - per_user).tolist()
    # the multiset of ratings is preserved
    assert sorted(np.r_[tr, vr].tolist()) == sorted(r.tolist())
    again = holdout(ip, it, r, first_user=10, key=3)[1]
    other = holdout(ip, it, r, first_user=10, key=4)[1]
    assert np.array_equal(again[2], vr)
    assert not np.array_equal(other[2], vr)


def test_holdout_validates_only_on_eligible_items():
    rng = np.random.default_rng(1)
    ip, it, r = _csr(np.array([16, 28, 40]), rng)
    eligible = np.zeros(50, bool)
    eligible[::2] = True
    (_, _, _), (vu, vi, _) = holdout(ip, it, r, 0, key=9, eligible_items=eligible)
    assert len(vi) and eligible[vi].all()


def test_holdout_spares_users_below_min_count():
    ip = np.array([0, 2, 6, 16])  # users of 2, 4 and 10 ratings
    it = np.arange(16, dtype=np.int32)
    r = np.ones(16, np.float32)
    (_, _, _), (vu, _, _) = holdout(ip, it, r, 0, key=3)
    assert sorted(set(vu.tolist())) == [0, 1, 2]  # the default: every user of 2 or more gives one
    (tip, tit, _), (vu, _, _) = holdout(ip, it, r, 0, key=3, min_count=5)
    assert vu.tolist() == [2] and np.diff(tip).tolist() == [2, 4, 9]


@pytest.mark.parametrize("min_count", [2, 5])
def test_holdout_kernel_gives_the_numpy_paths_arrays(min_count):
    """The compiled one-pass hold-out (every block of every pass of ``ials --select auto``) returns the NumPy
    reference's arrays, bit for bit and of the same dtypes: users of 0-40 ratings, two blocks' first users."""
    from streamdp.methods._selection import _holdout_numpy

    rng = np.random.default_rng(3)
    cnt = rng.integers(0, 40, 500)
    ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    it = rng.integers(0, 300, ip[-1]).astype(np.int32)
    r = rng.uniform(1, 5, ip[-1]).astype(np.float32)
    for first in (0, 12345):
        got = holdout(ip, it, r, first, key=99, min_count=min_count)
        want = _holdout_numpy(ip, it, r, np.diff(ip), first, 99, None, min_count)
        for g, w in zip(got[0] + got[1], want[0] + want[1]):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
        assert len(got[1][0]) > 0


def test_holdout_strides_compiled_are_the_numpy_counts_and_starts():
    """``holdout_strides`` (one compiled loop over a block's users, every block of every validating pass) gives
    ``_counts``' and ``_starts``' numbers: every minimum count (0 and 1 included, where NumPy's count of a user
    without ratings is -1), sampled and not, keys up to 2^64 and first users up to 2^63 (the hashes wrap)."""
    from streamdp.methods._selection import _counts, _starts, holdout_strides

    rng = np.random.default_rng(8)
    for trial in range(60):
        cnt = rng.integers(0, 40, int(rng.integers(0, 400))) * (rng.random() < 0.95)
        ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
        first, key = int(rng.integers(0, 2 ** 63 - 1)), int(rng.integers(0, 2 ** 63)) * 2 + 1
        rate, min_count = (1.0, 0.3, 0.05)[trial % 3], trial % 4
        v, start = holdout_strides(ip, first, key, min_count, rate)
        want = _counts(cnt, cnt, min_count, first, key, rate)
        users = np.flatnonzero(want > 0)
        want_start = np.zeros(len(cnt), np.int64)
        want_start[users] = _starts(users, cnt[users], key, first)
        assert v.tolist() == want.tolist() and start.tolist() == want_start.tolist()


def test_validation_sample_keeps_the_sampled_users_holdout_and_spares_the_rest():
    """Above VALIDATION_USERS users a keyed sample validates: a sampled user holds out exactly what she holds out
    when every user validates (the sample's hash is not the starts'), the others nothing; every entry point (the
    compiled hold-out, its NumPy reference, the positions, the strides) agrees; the sample is keyed and of the size
    asked: 200,000 users at rate 0.05 give 10,000 +- 4 standard deviations (sqrt(200,000 0.05 0.95) = 97)."""
    from streamdp.methods._selection import _holdout_numpy, _sampled, held_positions, holdout_strides

    rng = np.random.default_rng(5)
    cnt = rng.integers(0, 30, 2000)
    ip = np.r_[0, np.cumsum(cnt)].astype(np.int64)
    it = rng.integers(0, 300, ip[-1]).astype(np.int32)
    r = rng.uniform(1, 5, ip[-1]).astype(np.float32)
    (_, _, _), (vu_all, vi_all, _) = holdout(ip, it, r, 777, key=11)
    got = holdout(ip, it, r, 777, key=11, rate=0.3)
    want = _holdout_numpy(ip, it, r, np.diff(ip), 777, 11, None, 2, 0.3)
    for g, w in zip(got[0] + got[1], want[0] + want[1]):
        np.testing.assert_array_equal(g, w)
    (tip, tit, tr), (vu, vi, vr) = got
    inside = _sampled(len(cnt), 777, 11, 0.3)
    assert set(vu.tolist()) == set(vu_all.tolist()) & set(np.flatnonzero(inside).tolist())
    assert 0.2 < len(set(vu.tolist())) / len(set(vu_all.tolist())) < 0.4
    mine = np.isin(vu_all, np.flatnonzero(inside))
    np.testing.assert_array_equal(vi, vi_all[mine])  # the sampled users' held-out items, unchanged
    out = np.flatnonzero(~inside)
    np.testing.assert_array_equal(np.diff(tip)[out], cnt[out])  # the others keep every rating
    np.testing.assert_array_equal(np.delete(it, held_positions(ip, 777, 11, rate=0.3)), tit)
    v, _ = holdout_strides(ip, 777, 11, rate=0.3)
    assert np.bincount(vu, minlength=len(cnt)).tolist() == v.tolist()
    n = int(_sampled(200_000, 0, 3, 0.05).sum())
    assert abs(n - 10_000) < 4 * 97
    assert not np.array_equal(_sampled(1000, 0, 3, 0.5), _sampled(1000, 0, 4, 0.5))
    assert _sampled(10, 0, 3, 1.0) is None


def test_a_store_of_more_users_than_the_validation_sample_validates_on_a_sample(small_store, monkeypatch):
    """With the sample's size set below the store's 3,000 users, the run records the rate (of its released user
    count) and its choice stands within the budget; whether the choice can see anything is judged on the sample:
    1,000 validating users at epsilon 1 cannot (no choice, nothing spent on it), where all 3,000 could."""
    import streamdp.methods._selection as sel

    assert "selection" in streamdp.train(small_store, epsilon=1.0, seed=0).info
    monkeypatch.setattr(sel, "VALIDATION_USERS", 1000)
    m = streamdp.train(small_store, epsilon=4.0, seed=0)
    rec = m.info["selection"]
    assert rec["validation_rate"] == pytest.approx(1000 / m.info["n_users"])
    assert rec["validation_users"].startswith("a keyed sample of about 1,000 users")
    assert "keyed sample of the users" in " ".join(m.ledger.notes)
    acc = epsilon_of(compose([event_from_dict(e) for e in m.ledger.events]), m.ledger.delta)
    assert acc.epsilon <= 4.0 + 1e-9
    small = streamdp.train(small_store, epsilon=1.0, seed=0)
    assert "selection" not in small.info and "no choice was made" in " ".join(small.ledger.notes)
    monkeypatch.setattr(sel, "VALIDATION_USERS", 100_000)
    assert "validation_rate" not in streamdp.train(small_store, epsilon=4.0, seed=0).info["selection"]


def test_choose_keeps_the_default_unless_clearly_beaten():
    assert choose(np.array([100.0, 99.0, 101.0]), 0, 1.0) == 0
    assert choose(np.array([100.0, 90.0, 101.0]), 0, 1.0) == 1
    assert choose(np.array([100.0, 90.0, 101.0]), 0, 0.0) == 1  # non-private: the argmin


def test_profile_histogram_and_effective_users(small_store):
    h = exact_histogram(small_store)
    counts = np.concatenate([small_store.block_user_counts(b) for b in range(small_store.n_blocks)])
    assert h.sum() == (counts > 0).sum()
    want = np.bincount(np.searchsorted(EDGES, counts[counts > 0], side="right") - 1, minlength=len(EDGES))
    assert h.tolist() == want.tolist()
    assert 0 < effective_users(h, 8) <= h.sum()
    assert effective_users(h, 8) >= effective_users(h, 64)


def test_profile_release_takes_its_share_of_a_gaussian_budget():
    from streamdp.privacy.calibration import calibrate_gaussian

    rel = profile_release("gaussian", 1.0, 1e-6)
    assert rel.noise_multiplier == pytest.approx(calibrate_gaussian(1.0, 1e-6) / 0.1)
    assert profile_release("laplace", 2.0, 1e-6).mechanism == "laplace"
    assert profile_release("gaussian", math.inf, 1e-6).noise_multiplier == 0.0


@pytest.fixture(scope="module")
def sparse_store(tmp_path_factory):
    """Most users rate once or twice: factors cannot pay (the product-catalogue regime)."""
    return streamdp.generate(str(tmp_path_factory.mktemp("sel") / "sparse.zarr"), users=6_000, items=300,
                             ratings_per_user=1.3, test_fraction=0.2, seed=2, user_bias_std=0.3)


def test_sparse_store_releases_no_factors(sparse_store):
    """The default run's guard of the next test (``-m slow``): at epsilon 1 the sparse store gets no factors."""
    m = streamdp.train(sparse_store, epsilon=1.0, seed=0)
    assert m.info["parameters"]["iters"] == 0 and m.info["factors_released"] is False
    assert not np.any(m.item_factors)


@pytest.mark.slow  # three trainings, a measurement across epsilons; its guard is the test above
def test_sparse_store_releases_no_factors_and_does_not_get_worse_with_epsilon(sparse_store):
    """Fixed seeds; tolerance 0.01 RMSE (run-to-run spread here is about 0.003)."""
    rmse = {}
    for e in (1.0, 10.0):
        m = streamdp.train(sparse_store, epsilon=e, seed=0)
        assert m.info["parameters"]["iters"] == 0
        assert m.info["factors_released"] is False
        assert not np.any(m.item_factors)
        rmse[e] = m.summary["test_rmse"]
    assert rmse[10.0] <= rmse[1.0] + 0.01
    means = streamdp.train(sparse_store, epsilon=10.0, method="means", seed=0).summary
    assert rmse[10.0] <= means["test_rmse"] + 0.02


def test_ledger_counts_the_profile_and_the_selection(small_store):
    m = streamdp.train(small_store, epsilon=1.0, seed=0)
    releases = [e["release"] for e in m.ledger.bounds["releases"]]
    assert releases[0].startswith("number of users") and releases[1].startswith("histogram of training ratings")
    assert releases[-1].startswith("validation losses of the")
    acc = epsilon_of(compose([event_from_dict(e) for e in m.ledger.events]), m.ledger.delta)
    assert acc.epsilon <= 1.0 + 1e-9
    assert acc.epsilon == pytest.approx(m.ledger.accounting.epsilon)
    sel = m.info["selection"]
    assert sel["chosen"] in sel["candidates"] and len(sel["noisy_validation_losses"]) == len(sel["candidates"])
    assert "user_profile" in m.info


def test_given_iters_skips_the_profile_and_select_off_is_the_old_release(small_store):
    m = streamdp.train(small_store, epsilon=1.0, seed=0, iters=2, select="off")
    releases = [e["release"] for e in m.ledger.bounds["releases"]]
    assert not any(r.startswith(("histogram", "validation")) for r in releases)
    assert "selection" not in m.info and "user_profile" not in m.info
    assert m.info["factors_released"] is True


def test_non_private_run_chooses_on_held_out_ratings_then_refits_on_all(sparse_store):
    m = streamdp.train(sparse_store, epsilon=math.inf, allow_nonprivate=True, seed=0)
    sel = m.info["selection"]
    assert "validation_losses" in sel and sel["chosen"] in sel["candidates"]
    item_mean = m.summary["baselines"]["item_mean"]["rmse"]
    assert m.summary["test_rmse"] <= item_mean + 0.005


@pytest.fixture(scope="module")
def jokes_store(tmp_path_factory):
    """4,000 users x 60 items on -10..10, ~16 training ratings each, weak low-rank signal (the regime suite's
    jokes14 at a size that trains in seconds): the private factors lose to the biases at epsilon 2."""
    from bench.regimes import REGIMES

    kw = {**REGIMES["jokes14"][1], "users": 4_000, "items": 60, "ratings_per_user": 20}
    return streamdp.generate(str(tmp_path_factory.mktemp("stores") / "jokes.zarr"), seed=1, test_fraction=0.2, **kw)


def _gaussian_total(ledger) -> float:
    """``sum count / z^2`` over a ledger's releases: the squared mu of the Gaussian they compose to."""
    return sum(e["count"] / e["noise_multiplier"] ** 2 for e in ledger.bounds["releases"])


def test_gated_run_whose_factors_lose_spends_the_rest_on_the_statistics(jokes_store):
    """Fixed seed 0; tolerance 0.015 RMSE (0.0015 h, the regime suite's) against the biases-only run."""
    gated = streamdp.train(jokes_store, epsilon=2.0, seed=0)
    late = streamdp.train(jokes_store, epsilon=2.0, seed=0, select_after=99)  # the choice after the last iteration
    biases = streamdp.train(jokes_store, epsilon=2.0, seed=0, iters=0)
    T, gate = gated.info["parameters"]["iters"], gated.info["selection"]["chosen_after_iteration"]
    assert 0 < gate < T and gated.info["iterations_run"] == gate
    assert gated.info["selection"]["chosen"].startswith("bias") and not gated.info["factors_released"]
    releases = {e["release"].split(" (")[0]: e for e in gated.ledger.bounds["releases"]}
    assert releases["item right-hand sides sum_i c_ij y_ij x_i"]["count"] == gate
    assert "second release of the item sums" in releases and "second release of the item weight totals" in releases
    # the same Gaussian whichever branch: what was spent equals the full plan's sum of 1 / z^2
    assert late.info["iterations_run"] == T
    assert _gaussian_total(gated.ledger) == pytest.approx(_gaussian_total(late.ledger), rel=1e-2)
    assert _gaussian_total(gated.ledger) <= _gaussian_total(late.ledger) * (1 + 1e-12)
    acc = epsilon_of(compose([event_from_dict(e) for e in gated.ledger.events]), gated.ledger.delta)
    assert acc.epsilon <= 2.0 and acc.epsilon == pytest.approx(gated.ledger.accounting.epsilon)
    assert any("second release of the item sums and weight totals" in n for n in gated.ledger.notes)
    # the second release makes the biases-only choice about as good as a biases-only run
    assert gated.summary["test_rmse"] < late.summary["test_rmse"]
    assert gated.summary["test_rmse"] <= biases.summary["test_rmse"] + 0.015
    # and the users' intercepts take the ridge of the offset moments released from the same left-over budget
    assert releases["users' offset moments: over users with at least two training ratings, sums of the mean "
                    "product of two of her residuals r - mu - b_j"]["count"] == 1
    assert gated.info["ridge"] == gated.info["selection"]["offset_ridge"]["ridge"]


@pytest.mark.parametrize("factors_win", [False, True])
def test_a_gated_run_reads_the_offset_moments_only_when_its_factors_lose(jokes_store, monkeypatch, factors_win):
    """The offset moments of a gated run cost a pass of their own, made only once the factors lost (the iterations
    not run pay for it): a run whose factors win (the choice forced here) reads no more than before, and its ledger
    holds no such release. Where they lose, the intercepts' ridge is read off the moments: on this store at epsilon
    10 (seed 0) the model beats the same biases with the candidate's ridge 3 (scored locally, no privacy cost)."""
    import streamdp.methods.als as als_mod
    from streamdp.stream.engine import Engine

    seen, orig = [], Engine.map_reduce

    def spy(self, *a, desc="pass", **k):
        seen.append(desc)
        return orig(self, *a, desc=desc, **k)

    monkeypatch.setattr(Engine, "map_reduce", spy)
    if factors_win:
        monkeypatch.setattr(als_mod, "choose", lambda noisy, default, std: 0)  # "factors, ridge 10"
    m = streamdp.train(jokes_store, epsilon=10.0, seed=0)
    offsets = [e for e in m.ledger.bounds["releases"] if e["release"].startswith("users' offset moments")]
    assert m.info["factors_released"] is factors_win
    assert bool(offsets) is not factors_win and any("offset moments" in d for d in seen) is not factors_win
    if not factors_win:
        ridge = m.info["ridge"]
        assert ridge == m.info["selection"]["offset_ridge"]["ridge"] and ridge > 3.0
        assert m.summary["test_rmse"] < streamdp.evaluate(m, jokes_store, ridge=3.0)["rmse"]


def test_the_second_release_adds_its_noise_to_the_first_pass_sums(jokes_store, monkeypatch):
    """The second release sums what the first statistics pass summed (the same ratings, weights and centre): it
    takes those exact sums instead of a pass of its own, and the model is the one the pass gave, bit for bit."""
    from streamdp.methods.als import ALS
    from streamdp.stream.engine import Engine

    seen, orig = [], Engine.map_reduce

    def spy(self, *a, desc="pass", **k):
        seen.append(desc)
        return orig(self, *a, desc=desc, **k)

    monkeypatch.setattr(Engine, "map_reduce", spy)
    reused = streamdp.train(jokes_store, epsilon=2.0, seed=0)
    assert not reused.info["factors_released"]
    assert not [d for d in seen if "second release" in d] and sum("statistics" in d for d in seen) == 1
    stats = ALS._statistics
    monkeypatch.setattr(ALS, "_statistics", lambda *a, **k: stats(*a, **k)[:4] + (None,))  # as if resumed
    seen.clear()
    summed = streamdp.train(jokes_store, epsilon=2.0, seed=0)
    assert [d for d in seen if "second release" in d]
    assert np.array_equal(reused.item_bias, summed.item_bias) and reused.global_mean == summed.global_mean
    assert np.array_equal(reused.extras["noisy_item_weight"], summed.extras["noisy_item_weight"])


@pytest.mark.parametrize("store, epsilon, wins", [("small_store", 20.0, True), ("jokes_store", 2.0, False)])
def test_choice_riding_the_next_iteration_is_the_two_passes_bit_for_bit(store, epsilon, wins, request, monkeypatch):
    """The gate's one pass (the choice and iteration gate + 1's sums) releases what the two passes did: the factors
    winning (the sums used) and losing (the sums dropped)."""
    from streamdp.methods import als

    st = request.getfixturevalue(store)
    riding = streamdp.train(st, epsilon=epsilon, seed=0, evaluate=False)

    def two_passes(self, store, engine, run, s, rel, mu, bias0, bias, V, C, d, t):
        return (self._select(store, engine, run, s, rel, mu, bias0, bias, V, C),
                self._iteration_sums(store, engine, run, s, mu, bias, V, C, d, validation=False))

    monkeypatch.setattr(als._AlsBase, "_select_riding", two_passes)
    separate = streamdp.train(st, epsilon=epsilon, seed=0, evaluate=False)
    assert 0 < riding.info["selection"]["chosen_after_iteration"] < riding.info["parameters"]["iters"]
    assert riding.info["selection"]["chosen"].startswith("factors") == wins
    assert riding.info["selection"] == separate.info["selection"]
    assert np.array_equal(riding.item_factors, separate.item_factors)
    assert np.array_equal(riding.item_bias, separate.item_bias) and riding.global_mean == separate.global_mean


def test_gated_run_resumes_across_the_gate(jokes_store, tmp_path, interrupted_after_checkpoint):
    opts = dict(epsilon=2.0, seed=0)
    full = streamdp.train(jokes_store, checkpoint=str(tmp_path / "full"), **opts)
    gate = full.info["selection"]["chosen_after_iteration"]
    with interrupted_after_checkpoint(gate):
        streamdp.train(jokes_store, checkpoint=str(tmp_path / "ck"), **opts)
    res = streamdp.train(jokes_store, checkpoint=str(tmp_path / "ck"), **opts)
    assert res.info["resumed_from_iteration"] == gate
    np.testing.assert_array_equal(res.item_bias, full.item_bias)
    assert res.ledger.bounds["releases"] == full.ledger.bounds["releases"]


def test_non_private_run_chooses_the_item_ridge_on_held_out_ratings(small_store):
    from streamdp.methods.als import NONPRIVATE_ITEM_RIDGES

    m = streamdp.train(small_store, epsilon=math.inf, allow_nonprivate=True, seed=0, iters=3)
    tried = m.info["selection"]["item_ridges"]
    assert [(t["reg"], t["reg_exponent"]) for t in tried] == list(NONPRIVATE_ITEM_RIDGES)
    best = min(tried, key=lambda t: t["validation_loss"])
    assert (m.info["parameters"]["reg"], m.info["parameters"]["reg_exponent"]) == (best["reg"], best["reg_exponent"])
    assert any("item-side ridge" in n for n in m.ledger.notes)
    given = streamdp.train(small_store, epsilon=math.inf, allow_nonprivate=True, seed=0, iters=3, reg=10.0)
    assert "item_ridges" not in given.info["selection"] and given.info["parameters"]["reg"] == 10.0


def test_laplace_runs_choose_after_the_last_iteration(small_store):
    m = streamdp.train(small_store, epsilon=2.0, seed=0, iters=2, mechanism="laplace")
    assert "chosen_after_iteration" not in m.info["selection"] and m.info["iterations_run"] == 2


def test_generator_adds_user_offsets_outliers_and_string_ids(tmp_path):
    plain = streamdp.generate(str(tmp_path / "a.zarr"), users=400, items=40, ratings_per_user=10, seed=3)
    real = streamdp.generate(str(tmp_path / "b.zarr"), users=400, items=40, ratings_per_user=10, seed=3,
                             user_bias_std=1.0, outlier_fraction=0.1, string_ids=True)
    a, b = plain.read_block(0), real.read_block(0)
    assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.items, b.items)
    ends = np.isin(b.ratings, [1.0, 5.0]).mean()
    assert ends > np.isin(a.ratings, [1.0, 5.0]).mean() + 0.05
    assert str(real.item_ids()[0]) == "B00000000" and str(real.user_ids(0, 1)[0]) == "u00000000"
    same = streamdp.generate(str(tmp_path / "c.zarr"), users=400, items=40, ratings_per_user=10, seed=3)
    assert np.array_equal(same.read_block(0).ratings, a.ratings)  # the defaults leave old seeds' stores unchanged


def test_selection_share_shrinks_only_where_its_noise_resolves_far_finer_than_matters():
    """``_select_share``: 15% unless ``MARGIN`` noise stds resolve below 0.1% of ``h^2`` per user; never below 2%."""
    from types import SimpleNamespace

    from streamdp.methods.als import (SELECT_RESOLUTION, SELECT_SHARE_FACTORS, SELECT_SHARE_FLOOR, _select_share)
    from streamdp.methods._selection import MARGIN

    s = SimpleNamespace(half_range=2.0, select_share=SELECT_SHARE_FACTORS)
    n = 10_000
    coarse = SimpleNamespace(mechanism="gaussian", scale=2 * SELECT_RESOLUTION * 4.0 * n / MARGIN)
    assert _select_share(coarse, s, n) == SELECT_SHARE_FACTORS
    # resolving half the resolution: the std may double, the share goes down by 4
    fine = SimpleNamespace(mechanism="gaussian", scale=0.5 * SELECT_RESOLUTION * 4.0 * n / MARGIN)
    assert _select_share(fine, s, n) == pytest.approx(SELECT_SHARE_FACTORS / 4)
    assert _select_share(SimpleNamespace(mechanism="gaussian", scale=1e-9), s, n) == SELECT_SHARE_FLOOR
    assert _select_share(SimpleNamespace(mechanism="laplace", scale=1e-9), s, n) == SELECT_SHARE_FACTORS


def test_many_users_give_the_selection_less_and_the_factors_more(small_store, tmp_path):
    """3,000 users at epsilon 100: the choice's 15% resolves far below 0.1% of h^2, so its share (and noise
    multiplier's inverse square) shrinks, and the ledger still composes within the target."""
    from streamdp.methods.als import SELECT_SHARE_FACTORS

    m = streamdp.train(small_store, epsilon=100.0, seed=0)
    assert m.info["factors_released"]
    rel = [e for e in m.ledger.bounds["releases"] if e["release"].startswith("validation losses")][0]
    total = _gaussian_total(m.ledger)
    assert 1.0 / rel["noise_multiplier"] ** 2 < 0.5 * SELECT_SHARE_FACTORS * total
    acc = epsilon_of(compose([event_from_dict(e) for e in m.ledger.events]), m.ledger.delta)
    assert acc.epsilon <= 100.0 * (1 + 1e-9)


def test_iterations_after_the_gate_use_the_validation_ratings_again(small_store, monkeypatch):
    """The choice is made at the gate; the factors' later iterations train on every rating."""
    from streamdp.methods import als

    from streamdp.stream.engine import Engine

    calls, passes = [], []
    original, map_reduce = als._AlsBase._iteration_pass, Engine.map_reduce

    def spy(self, *a, validation=True, **kw):
        calls.append(validation)
        return original(self, *a, validation=validation, **kw)

    def seen(self, *a, desc="pass", **kw):
        passes.append(desc)
        return map_reduce(self, *a, desc=desc, **kw)

    monkeypatch.setattr(als._AlsBase, "_iteration_pass", spy)
    monkeypatch.setattr(Engine, "map_reduce", seen)
    m = streamdp.train(small_store, epsilon=20.0, seed=0)
    gate, T = m.info["selection"]["chosen_after_iteration"], m.info["parameters"]["iters"]
    assert m.info["selection"]["chosen"].startswith("factors") and 0 < gate < T
    assert calls == [True] * gate + [False] * (T - gate)
    # the choice rides along iteration gate + 1's pass: one read of each block serves both
    fit = [p for p in passes if "iteration" in p or "selection" in p]
    # and the first rides along the statistics pass (_first_rides)
    before, after = range(2, gate + 1), range(gate + 2, T + 1)
    assert fit == [f"als statistics + iteration 1/{T}"] + [f"als iteration {t}/{T}" for t in before] + \
        [f"als selection + iteration {gate + 1}/{T}"] + [f"als iteration {t}/{T}" for t in after]


@pytest.mark.slow  # four trainings of a 30,000-user store (about 20 s busy)
def test_selection_costs_the_factors_little_where_they_clearly_win(tmp_path):
    """30,000 users x 300 items (rank 8, ~16 training ratings each), epsilon 1, seeds 0 and 1: the default run
    within 0.016 test RMSE of ``--select off`` (measured 0.0125; 0.021 when the choice kept 15% and the
    validation ratings out of every iteration)."""
    st = streamdp.generate(str(tmp_path / "g.zarr"), users=30_000, items=300, ratings_per_user=20, rank=8, seed=11,
                           test_fraction=0.2)
    for sd in (0, 1):
        auto = streamdp.train(st, epsilon=1.0, seed=sd)
        off = streamdp.train(st, epsilon=1.0, seed=sd, select="off")
        assert auto.info["selection"]["chosen"].startswith("factors")
        assert auto.summary["test_rmse"] <= off.summary["test_rmse"] + 0.016


def test_factor_candidates_share_each_users_gramian_bit_for_bit(small_store, monkeypatch):
    import streamdp.methods.als as als
    from streamdp.kernels.linalg import selection_losses

    losses = []

    def recorded(noisy, default, std):  # the noisy losses, exactly (model.json rounds them)
        losses.append(np.array(noisy))
        return choose(noisy, default, std)

    monkeypatch.setattr(als, "choose", recorded)
    shared = streamdp.train(small_store, epsilon=1.0, seed=0, iters=2, evaluate=False)
    calls = []

    def one_candidate_at_a_time(ip, it, r, v, start, lo, hi, mu, Q, biases, kinds, lams, irls, delta, h, out):
        calls.append(lams[kinds == 0].tolist())  # each candidate alone: a Gramian of its own per user
        for c in range(len(kinds)):
            selection_losses(ip, it, r, v, start, lo, hi, mu, Q, biases, kinds[c:c + 1], lams[c:c + 1], irls, delta,
                             h, out[c:c + 1])

    monkeypatch.setattr(als, "selection_losses", one_candidate_at_a_time)
    separate = streamdp.train(small_store, epsilon=1.0, seed=0, iters=2, evaluate=False)
    assert calls and calls[0] == [10.0, 30.0]
    factors = [c for c in shared.info["selection"]["candidates"] if c.startswith("factors")]
    assert factors == ["factors, ridge 10", "factors, ridge 30"]
    assert len(losses) == 2 and np.array_equal(losses[0], losses[1])
    assert np.array_equal(shared.item_factors, separate.item_factors)


@pytest.mark.parametrize("epsilon", [1.0, 10.0, 100.0, 500.0])
def test_a_plan_that_skips_the_first_calibration_is_the_plan_that_makes_it(small_store, monkeypatch, epsilon):
    """``_choice_at_floor``: where a bound on the noise already puts the choice's share at the floor, the plan is
    made with one calibration; its settings, releases and events are those of the plan that calibrates first (the
    shortcut turned off), and at epsilon 500 on this store (3,000 users) it is taken."""
    from streamdp.methods import als
    from streamdp.methods.als import SELECT_SHARE_FLOOR
    from streamdp.workflows.training import prepare

    def plan(shortcut: bool):
        taken = []
        original = als._AlsBase._choice_at_floor

        def spy(self, *a, **k):
            got = original(self, *a, **k) if shortcut else None
            taken.append(got is not None)
            return got

        with monkeypatch.context() as mp:
            mp.setattr(als._AlsBase, "_choice_at_floor", spy)
            _, m = prepare(small_store, method="als", out=str(small_store.path) + ".unused", epsilon=epsilon,
                           delta=1e-6, seed=0)
            return m.plan(small_store), taken

    fast, taken = plan(True)
    slow, _ = plan(False)
    assert fast.settings.replace(profile=None) == slow.settings.replace(profile=None)  # the profile: same draw
    assert [repr(e) for e in fast.events] == [repr(e) for e in slow.events] and fast.entries == slow.entries
    if epsilon >= 500.0:
        assert taken == [True] and fast.settings.select_share == SELECT_SHARE_FLOOR


def test_the_bound_on_a_calibration_is_at_least_it_and_asks_before_its_pld_evaluation():
    """``calibrate_bound``: at least ``calibrate``'s answer (and within budget); ``None`` where the caller's
    ``accept``, asked once with the bound, refuses it, or epsilon is infinite."""
    from streamdp.privacy import calibrate, compose, epsilon_of, gaussian_event, laplace_event
    from streamdp.privacy.calibration import calibrate_bound

    for make, eps, delta in [(lambda z: gaussian_event(z, 10), 1.0, 1e-6),
                             (lambda z: compose([laplace_event(100.0, 1), gaussian_event(z, 7)]), 0.5, 1e-8),
                             (lambda z: gaussian_event(z, 3), 50.0, 1e-5)]:
        up = calibrate_bound(make, eps, delta)
        assert up is not None and up >= calibrate(make, eps, delta)
        assert epsilon_of(make(up), delta).epsilon <= eps
        asked = []
        assert calibrate_bound(make, eps, delta, accept=lambda z: asked.append(z) or False) is None
        assert asked == [pytest.approx(up)]
    assert calibrate_bound(lambda z: gaussian_event(z, 1), math.inf, 1e-6) is None
