"""The merge of a block's rows across segments against its plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest

from streamdp.kernels.segments import SMALL_MAX, append_delta, merge_rows, merge_rows_reference

#: merge_rows's base arrays when every source is in the one array (none read in place): empty, as the stores pass
#: them (every argument given, so that the tests and the stores share one compiled signature)
NO_BASE = (np.empty(0, np.int32), np.empty(0, np.float32))


def _sources(rng, n_users, n_parts, n_items, shuffled=False, most=5):
    """Each part's train and test rows (0 to ``most`` a user): a pair in one split of a part, items sorted within a
    user (``shuffled``: in any order, as a store not written by ingest could hold them)."""
    ips, its, rs, split_of = [], [], [], []
    for _ in range(n_parts):
        rows = [[], []]
        for _u in range(n_users):
            chosen = np.sort(rng.choice(n_items, rng.integers(0, most + 1), replace=False))
            test = rng.random(len(chosen)) < 0.3
            if shuffled:
                chosen = rng.permutation(chosen)
            for s in (0, 1):
                rows[s].append(chosen[test == bool(s)])
        for s in (0, 1):
            ips.append(np.concatenate([[0], np.cumsum([len(x) for x in rows[s]])]).astype(np.int64))
            its.append(np.concatenate(rows[s]).astype(np.int32) if rows[s] else np.empty(0, np.int32))
            rs.append(rng.integers(1, 6, len(its[-1])).astype(np.float32))
            split_of.append(s)
    starts = np.concatenate([[0], np.cumsum([len(x) for x in its])[:-1]]).astype(np.int64)
    part_of = np.arange(len(split_of), dtype=np.int64) // 2
    return np.stack(ips), starts, np.concatenate(its), np.concatenate(rs), part_of, np.array(split_of, np.int64)


@pytest.mark.parametrize("implicit,cap", [(False, 0.0), (True, 0.0), (True, 6.0)])
@pytest.mark.parametrize("seed", range(7))
def test_merge_rows_matches_its_reference(seed, implicit, cap):
    rng = np.random.default_rng(seed)
    n_users = 30
    shuffled = seed in (4, 6)  # runs out of item order: the merge sorts the user's rows instead of placing them
    # seeds 5 and 6: up to 24 rows a part in 6 to 8 parts, so that some users hold more than SMALL_MAX rows outside
    # their longest source (their rows sorted) and others fewer (each placed in the longest source's run)
    parts, most = (int(rng.integers(6, 9)), 24) if seed >= 5 else (int(rng.integers(1, 4)), 5)
    ips, starts, items, ratings, part_of, split_of = _sources(rng, n_users, parts, 300 if seed >= 5 else 12,
                                                              shuffled, most)
    if seed >= 5:
        outside = [int(sum(np.diff(ips[:, u:u + 2], axis=1).ravel()) - np.diff(ips[:, u:u + 2], axis=1).max())
                   for u in range(n_users)]
        assert max(outside) > SMALL_MAX >= min(outside)
    n0 = int(starts[1]) if len(starts) > 1 else len(items)
    for want in (0, 1):
        ref = merge_rows_reference(n_users, ips, starts, items, ratings, part_of, split_of, want, implicit, cap)
        for apart in (False, True):  # source 0 in the one array, or in arrays of its own (read in place)
            ip, oi, orr, src = (np.empty(n_users + 1, np.int64), np.empty(len(items), np.int32),
                                np.empty(len(items), np.float32), np.empty(len(items), np.int64))
            args = (items[n0:], ratings[n0:], part_of, split_of, want, implicit, cap, ip, oi, orr, src,
                    items[:n0], ratings[:n0]) if apart else (items, ratings, part_of, split_of, want, implicit,
                                                             cap, ip, oi, orr, src, *NO_BASE)
            nnz = merge_rows(n_users, ips, starts, *args)
            assert np.array_equal(ip, ref[0]) and np.array_equal(oi[:nnz], ref[1])
            assert np.array_equal(orr[:nnz], ref[2]) and np.array_equal(items[src[:nnz]], oi[:nnz])


@pytest.mark.parametrize("implicit,cap", [(False, 0.0), (True, 6.0)])
@pytest.mark.parametrize("seed", range(6))
def test_merge_rows_in_place_over_the_base_it_reads(seed, implicit, cap):
    # the segmented store's layout (SegmentedStore._read_base_into): the base's rows of the wanted split at the end
    # of the output arrays, after a gap of the other sources' rows plus the base's longest row
    rng = np.random.default_rng(100 + seed)
    n_users = 40
    ips, starts, items, ratings, part_of, split_of = _sources(rng, n_users, int(rng.integers(2, 5)), 12, seed >= 4)
    n0 = int(starts[1])
    gap = len(items) - n0 + int(np.diff(ips[0]).max())
    ref = merge_rows_reference(n_users, ips, starts, items, ratings, part_of, split_of, 0, implicit, cap)
    bi, br = np.empty(gap + n0, np.int32), np.empty(gap + n0, np.float32)
    bi[gap:], br[gap:] = items[:n0], ratings[:n0]
    ip = np.empty(n_users + 1, np.int64)
    nnz = merge_rows(n_users, ips, starts, items[n0:], ratings[n0:], part_of, split_of, 0, implicit, cap, ip, bi,
                     br, np.empty(0, np.int64), bi[gap:], br[gap:])
    assert np.array_equal(ip, ref[0]) and np.array_equal(bi[:nnz], ref[1]) and np.array_equal(br[:nnz], ref[2])


def test_merge_rows_in_place_keeps_a_user_s_rows_it_sorts():
    # the last user's base rows out of item order, one segment row: the merge finds the disorder and sorts the
    # user's rows; the base's longest row in the gap keeps them unwritten until read
    base_items, base_r = np.array([1, 2, 5, 4, 3], np.int32), np.array([1, 2, 5, 4, 3], np.float32)
    ips = np.array([[0, 5], [0, 1]], np.int64)
    starts, part_of, split_of = np.array([0, 5], np.int64), np.array([0, 1], np.int64), np.zeros(2, np.int64)
    gap = 1 + 5
    bi, br = np.zeros(gap + 5, np.int32), np.zeros(gap + 5, np.float32)
    bi[gap:], br[gap:] = base_items, base_r
    ip = np.empty(2, np.int64)
    nnz = merge_rows(1, ips, starts, np.array([0], np.int32), np.array([0.5], np.float32), part_of, split_of, 0,
                     False, 0.0, ip, bi, br, np.empty(0, np.int64), bi[gap:], br[gap:])
    assert nnz == 6 and list(bi[:6]) == [0, 1, 2, 3, 4, 5] and list(br[:6]) == [0.5, 1, 2, 3, 4, 5]


def test_the_latest_part_wins_in_its_split():
    # user 0: item 3 in the base's train (4.0), then in a segment's test (2.0): test only, the segment's rating
    ips = np.array([[0, 1], [0, 0], [0, 0], [0, 1]], np.int64)
    items, ratings = np.array([3, 3], np.int32), np.array([4.0, 2.0], np.float32)
    starts, split_of = np.array([0, 1, 1, 1], np.int64), np.array([0, 1, 0, 1], np.int64)
    part_of = np.array([0, 0, 1, 1], np.int64)
    out = [np.empty(2, np.int64), np.empty(2, np.int32), np.empty(2, np.float32), np.empty(0, np.int64), *NO_BASE]
    assert merge_rows(1, ips, starts, items, ratings, part_of, split_of, 0, False, 0.0, *out) == 0
    assert merge_rows(1, ips, starts, items, ratings, part_of, split_of, 1, False, 0.0, *out) == 1
    assert out[2][0] == 2.0


@pytest.mark.parametrize("seed", range(6))
def test_append_delta_is_the_merges_with_and_without_the_last_part(seed):
    rng = np.random.default_rng(seed)
    n_users, n_items = 30, 12
    ips, starts, items, ratings, part_of, split_of = _sources(rng, n_users, int(rng.integers(2, 5)), n_items)
    last = int(part_of.max())
    before = part_of < last

    def merged(keep, want):
        ip, oi, _ = merge_rows_reference(n_users, ips[keep], starts[keep], items, ratings, part_of[keep],
                                         split_of[keep], want, False, 0.0)
        return ip, oi

    du, di = np.zeros(n_users, np.int64), np.zeros(n_items, np.int64)
    ds, dr = np.zeros(2, np.int64), np.zeros(2, np.uint8)
    n0 = int(starts[1])
    append_delta(n_users, ips, starts, items[n0:], part_of, split_of, last, n_items, du, di, ds, dr, items[:n0])
    all_ = np.ones(len(part_of), bool)
    want_du, want_di = np.zeros(n_users, np.int64), np.zeros(n_items, np.int64)
    for s in (0, 1):
        (ip1, i1), (ip0, i0) = merged(all_, s), merged(before, s)
        want_du += np.diff(ip1) - np.diff(ip0)
        want_di += np.bincount(i1, minlength=n_items) - np.bincount(i0, minlength=n_items)
        assert ds[s] == len(i1) - len(i0)
        # the last part's rows of split s replace a pair that was in the other split before it
        u_o = np.repeat(np.arange(n_users), np.diff(merged(before, 1 - s)[0]))
        other = set(zip(u_o.tolist(), merged(before, 1 - s)[1].tolist()))
        mine = set()
        for k in np.flatnonzero((part_of == last) & (split_of == s)):
            for u in range(n_users):
                mine |= {(u, int(i)) for i in items[starts[k] + ips[k, u]: starts[k] + ips[k, u + 1]]}
        assert dr[s] == bool(mine & other)
    assert np.array_equal(du, want_du) and np.array_equal(di, want_di)
