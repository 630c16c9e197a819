"""The Numba kernels of ingest against slow NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from streamdp.kernels.ingest import bucket_rows, group_dedup, nonzero_counts, remap_sort

#: group_dedup's optional arguments as ingest passes them when nothing is split or timed (every argument given,
#: so that the tests and ingest share one compiled signature)
NO_SPLIT = (False, np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.uint8))


def group_dedup_reference(users, items, ratings, ts, has_ts, n_users):
    """Sort by (user, item), keep per pair the max (timestamp, input position)."""
    pos = np.arange(len(users))
    key_ts = ts if has_ts else np.zeros(len(users), np.int64)
    order = np.lexsort((pos, key_ts, items, users))  # last of each (user, item) run wins
    u, i = users[order], items[order]
    last = np.ones(len(order), bool)
    last[:-1] = (u[1:] != u[:-1]) | (i[1:] != i[:-1])
    keep = order[last]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(users[keep], minlength=n_users))])
    return indptr, items[keep], ratings[keep], len(users) - len(keep)


@pytest.mark.parametrize("has_ts", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_dedup_matches_reference(has_ts, seed):
    rng = np.random.default_rng(seed)
    n, n_users, n_items = 5000, 97, 40
    users = rng.integers(0, n_users, n).astype(np.int32)
    items = rng.integers(0, n_items, n).astype(np.int32)
    ratings = rng.random(n).astype(np.float32)
    ts = rng.integers(0, 5, n).astype(np.int64)  # many ties
    ip = np.empty(n_users + 1, np.int64)
    oi = np.empty(n, np.int32)
    orr = np.empty(n, np.float32)
    nnz, dropped, _ = group_dedup(users, items, ratings, ts, has_ts, n_users, n_items, ip, oi, orr, *NO_SPLIT)
    rip, ri, rr, rd = group_dedup_reference(users, items, ratings, ts, has_ts, n_users)
    assert nnz == len(ri) and dropped == rd
    np.testing.assert_array_equal(ip, rip)
    # within a user the kernel keeps first-appearance order; compare sorted by item
    for u in range(n_users):
        s, e = ip[u], ip[u + 1]
        o = np.argsort(oi[s:e])
        np.testing.assert_array_equal(oi[s:e][o], ri[s:e])
        np.testing.assert_array_equal(orr[s:e][o], rr[s:e])


def test_remap_sort_and_bucket_rows():
    rng = np.random.default_rng(3)
    n_users, n_items = 50, 30
    counts = rng.integers(0, 12, n_users)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.concatenate([rng.choice(n_items, c, replace=False) for c in counts]).astype(np.int32)
    ratings = rng.random(len(items)).astype(np.float32)
    perm = rng.permutation(n_items).astype(np.int32)
    it, rt = items.copy(), ratings.copy()
    remap_sort(indptr, it, rt, perm, np.empty(0, np.int64))  # every argument, as ingest passes them
    for u in range(n_users):
        s, e = indptr[u], indptr[u + 1]
        o = np.argsort(perm[items[s:e]])
        np.testing.assert_array_equal(it[s:e], perm[items[s:e]][o])
        np.testing.assert_array_equal(rt[s:e], ratings[s:e][o])
    part_of_block = np.array([0, 0, 1, 2, 2, 2, 3, 4, 5, 6], np.int32)
    users = rng.integers(0, 10 * 13, 1000).astype(np.int32)  # 13 users a block
    part = part_of_block[users // 13]
    order = np.empty(1000, np.int64)
    starts = np.empty(8, np.int64)
    bucket_rows(users, 13, part_of_block, order, starts)
    np.testing.assert_array_equal(order, np.argsort(part, kind="stable"))
    np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(np.bincount(part, minlength=7))]))


@pytest.mark.parametrize("lo", [0, -7, 10**12])
def test_nonzero_counts_is_flatnonzero_and_its_gathers(lo):
    rng = np.random.default_rng(5)
    counts = np.where(rng.random(5000) < 0.3, rng.integers(1, 9, 5000), 0).astype(np.int64)
    counts[0], counts[-1] = 0, 4
    keys, got = nonzero_counts(counts, lo)
    nz = np.flatnonzero(counts)
    np.testing.assert_array_equal(keys, nz.astype(np.int64) + lo)
    np.testing.assert_array_equal(got, counts[nz])
    empty = nonzero_counts(np.zeros(3, np.int64), lo)
    assert len(empty[0]) == len(empty[1]) == 0


@pytest.mark.parametrize("max_range", [10, 1000, 10**6])
def test_int_counter_matches_unique(max_range):
    import pyarrow as pa

    from streamdp.storage.ingest import _IntCounter

    rng = np.random.default_rng(max_range)
    c = _IntCounter(max_range, 64)
    parts = [rng.integers(-50, 50, 100) * (k + 1) + 7 * k for k in range(12)]  # widening range
    for p in parts:
        c.add(pa.array(p))
    keys, counts = c.finish()
    ref_k, ref_c = np.unique(np.concatenate(parts), return_counts=True)
    np.testing.assert_array_equal(keys.to_numpy(), ref_k)
    np.testing.assert_array_equal(counts, ref_c)


def test_int_counter_stays_dense_while_the_ids_span_less_than_its_range():
    """Batches whose smallest and largest ids jitter (every batch of a shuffled file) keep the dense count: the
    array's slack is not counted as ids seen (it was, and a 99M-rating ingest fell back to hashing 2M user ids,
    peaking at 1.4 GB under a 512 MB limit)."""
    import pyarrow as pa

    from streamdp.storage.ingest import _IntCounter

    rng = np.random.default_rng(3)
    c = _IntCounter(1000, 64)
    parts = [rng.integers(0, 900, 50) * 1 + 11 for _ in range(40)]
    for p in parts:
        c.add(pa.array(p))
        assert c.fallback is None and len(c.counts) <= 1000
    keys, counts = c.finish()
    ref_k, ref_c = np.unique(np.concatenate(parts), return_counts=True)
    np.testing.assert_array_equal(keys.to_numpy(), ref_k)
    np.testing.assert_array_equal(counts, ref_c)
    c.add(pa.array(np.array([ref_k[0] + 1000])))  # the ids now span 1001: hashing, the counts kept
    assert c.fallback is not None
    keys, counts = c.finish()
    assert keys.to_numpy()[-1] == ref_k[0] + 1000 and counts.sum() == sum(len(p) for p in parts) + 1


def test_int_counter_sizes_its_array_to_the_ids_it_has_seen():
    """Shuffled ids from near 0 (an append's users) are counted in one array of at most 9/8 of their span,
    allocated once; ids that widen batch by batch (a file sorted by user) regrow it a logarithmic number of
    times. The array was doubled on every regrowth: a 1M-rating append of ids up to 6M faulted in 278 MB."""
    import pyarrow as pa

    from streamdp.storage.ingest import _IntCounter

    rng = np.random.default_rng(4)
    c = _IntCounter(10**6, 64)
    arrays = set()
    parts = [rng.integers(11, 60_000, 500) for _ in range(30)]
    for p in parts:
        c.add(pa.array(p))
        arrays.add(id(c.counts))
    hi = max(int(p.max()) for p in parts)
    assert c.lo == 0 and len(c.counts) <= hi * 9 // 8 + 1 and len(arrays) <= 2  # the first batch's span, then all
    keys, counts = c.finish()
    ref_k, ref_c = np.unique(np.concatenate(parts), return_counts=True)
    np.testing.assert_array_equal(keys.to_numpy(), ref_k)
    np.testing.assert_array_equal(counts, ref_c)

    c, grown, last = _IntCounter(10**6, 64), 0, None
    for k in range(1000):  # ids 1000..101,000 in ascending batches of 100
        c.add(pa.array(np.arange(1000 + 100 * k, 1100 + 100 * k)))
        grown += c.counts is not last
        last = c.counts
    assert grown <= 40 and len(c.counts) <= 101_000 * 5 // 4
    keys, counts = c.finish()
    np.testing.assert_array_equal(keys.to_numpy(), np.arange(1000, 101_000))
    assert (counts == 1).all()


@pytest.mark.parametrize("collide", [False, True])
def test_key_counter_counts_string_ids_exactly(monkeypatch, collide):
    """String ids are counted by hash, every group checked byte for byte: the counts of np.unique, also when
    many keys share a hash (the exact merge then)."""
    import pyarrow as pa

    from streamdp.storage import ingest as I

    if collide:
        real = I._string_hashes
        monkeypatch.setattr(I, "_string_hashes", lambda a: real(a) % np.uint64(7))
    rng = np.random.default_rng(9)
    c = I._KeyCounter(max_buffered=300)
    parts = [[f"id{v}" for v in rng.integers(0, 2000, 500)] + ["", "é" * (k % 3)] for k in range(12)]
    for p in parts:
        c.add(pa.array(p))
    keys, counts = c.finish()
    ref_k, ref_c = np.unique(np.concatenate(parts), return_counts=True)
    assert keys.to_pylist() == sorted(ref_k.tolist(), key=lambda x: x.encode())
    np.testing.assert_array_equal(counts, ref_c[np.argsort([x.encode() for x in ref_k.tolist()], kind="stable")])


@pytest.mark.parametrize("collide", [False, True])
def test_string_id_map_is_index_in(monkeypatch, collide):
    """String ids map through their hashes, each match checked: the same indices as pyarrow's index_in, with
    hashes shared by many keys too (a collision is looked up exactly, never a wrong id)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from streamdp.storage import ingest as I

    if collide:
        real = I._string_hashes
        monkeypatch.setattr(I, "_string_hashes", lambda a: real(a) % np.uint64(7))
    rng = np.random.default_rng(5)
    keys = pa.array(sorted({f"u{v}" for v in rng.integers(0, 5000, 3000)} | {"", "é", "u1" * 40}))
    m = I._IdMap(keys)
    batch = pa.array(rng.choice(keys.to_pylist(), 2000).tolist()).slice(7, 1500)  # a slice: offsets shifted
    np.testing.assert_array_equal(m(batch), pc.index_in(batch, value_set=keys).to_numpy())
    assert m(pa.array([], pa.string())).shape == (0,)


@pytest.mark.parametrize("seed", [0, 1])
def test_group_dedup_aggregates_repeated_pairs(seed):
    """Interaction logs (implicit stores): the values of a repeated (user, item) pair are summed."""
    rng = np.random.default_rng(seed)
    n, n_users, n_items = 4000, 53, 30
    users = rng.integers(0, n_users, n).astype(np.int32)
    items = rng.integers(0, n_items, n).astype(np.int32)
    counts = rng.integers(1, 4, n).astype(np.float32)
    ip = np.empty(n_users + 1, np.int64)
    oi = np.empty(n, np.int32)
    orr = np.empty(n, np.float32)
    nnz, merged, _ = group_dedup(users, items, counts, np.empty(0, np.int64), False, n_users, n_items, ip, oi, orr, True,
                                 *NO_SPLIT[1:])
    ref = np.zeros((n_users, n_items))
    np.add.at(ref, (users, items), counts)
    got = np.zeros((n_users, n_items))
    rows = np.repeat(np.arange(n_users), np.diff(ip))
    got[rows, oi[:nnz]] = orr[:nnz]
    np.testing.assert_array_equal(got, ref)
    assert nnz == np.count_nonzero(ref) and merged == n - nnz


@pytest.mark.parametrize("lut_entries", [0, 2 * 10**6])
def test_id_map_sparse_int_ids_onto_values(lut_entries):
    """Sparse integer ids (a range 190x the keys): a binary search, or a lookup table when ``lut_entries`` allows
    it (an append's ids within the memory limit); the same indices either way, and ``values`` (an append's
    store indices) folded into the result."""
    import pyarrow as pa

    from streamdp.storage import ingest as I

    rng = np.random.default_rng(11)
    keys = np.unique(rng.integers(0, 50_000, 10_000)) * 37 + 11
    values = rng.permutation(len(keys)).astype(np.int64) + 5
    batch = rng.choice(keys, 4000)
    plain, onto = I._IdMap(pa.array(keys), lut_entries=lut_entries), I._IdMap(pa.array(keys), values, lut_entries)
    assert (plain.lut is not None) == (lut_entries > 0)
    np.testing.assert_array_equal(plain(pa.array(batch)), np.searchsorted(keys, batch))
    np.testing.assert_array_equal(onto(pa.array(batch)), values[np.searchsorted(keys, batch)])
    assert onto(pa.array(batch)).dtype == np.int32
