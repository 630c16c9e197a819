"""Private choice of the released model among candidates, by held-out training ratings.

Users cannot tune on private data, and a default that is right on one store is wrong
on another (a private ALS's factors, a user's own intercept). So the run itself chooses,
privately, among a few candidate releases that it computes anyway. Public names:
:func:`holdout`, :func:`held_positions`, :func:`holdout_strides`, :func:`loss_sensitivity`, :func:`choose`,
:func:`candidate_name`, :func:`validation_rate`, :data:`MARGIN`, :data:`VALIDATION_CAP`, :data:`VALIDATION_USERS`.

Decisions a reader must know:

* **validation ratings**: every user with at least two training ratings gives 10% of
  them (at least one, at most :data:`VALIDATION_CAP`; a keyed hash, the same in every
  pass); private runs leave them out of the users' solves and the factor iterations, not
  of the item biases; non-private runs leave them out of the whole fit and refit the
  choice; the test split is never looked at;
* **validation users**: every user on a store of at most :data:`VALIDATION_USERS` users; on a larger one a keyed
  sample of about that many (each user with probability :func:`validation_rate` of the run's public or
  released user count, by a keyed hash of her index independent of her start), the others holding nothing out.
  The choice's noise is fixed by its sensitivity, its signal grows with the validation users: 100,000 of them
  tell the candidates apart where the measured choices were made (mostly thousands to tens of thousands), while
  scoring every user cost a large store's fit most of a pass for nothing (2M users, ``als``: the choice 1.3 s of
  a 10.9 s fit; 400,000 users, ``ials``: 5.5 s of 8.8 s). The users left out train on all their ratings;
* **candidates** are complete released models (``("factors", r)``, ``("bias", r)``,
  ``("mean", r)``); each validation user solves her row as on her device
  (:mod:`streamdp.serving.local`) and her loss is the mean of her squared errors clipped
  to ``h^2``, so the summed losses have L2 sensitivity ``h^2 sqrt(m)`` (L1 ``h^2 m``) and
  are one release of the run's mechanism, calibrated jointly with the others;
* **per user, not per rating**: capping per-rating weights threw away most of the signal;
* **the choice** (post-processing) keeps the default candidate unless another one's noisy
  loss is lower by more than :data:`MARGIN` noise standard deviations; non-private runs
  take the argmin.

Design notes (the candidates and scores in full, the measurement behind per user):
docs/design-notes.md#streamdpmethods_selectionpy.
"""

from __future__ import annotations

import math

import numpy as np

from streamdp.kernels.csr import holdout_counts, holdout_strided, masked_indptr

__all__ = ["MARGIN", "VALIDATION_CAP", "VALIDATION_FRACTION", "VALIDATION_USERS", "holdout", "holdout_strides",
           "validation_rate", "validating_users", "sample_record", "choose",
           "candidate_name", "loss_sensitivity"]

#: Noise standard deviations by which a candidate must beat the default to replace it.
MARGIN = 3.0
#: Fraction of a user's ratings held out for validation.
VALIDATION_FRACTION = 0.1
#: Most validation ratings per user (a user's loss is the mean over theirs, so at most ``h^2``).
VALIDATION_CAP = 2
#: About how many users a run validates on at most (:func:`validation_rate`).
VALIDATION_USERS = 100_000
#: Salt of the validation sample's hash (the starts' hash has none: the two are independent).
SAMPLE_SALT = np.uint64(0x5DEECE66D2545F49)
MIX = np.uint64(0x9E3779B97F4A7C15)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def holdout(indptr, items, ratings, first_user: int, key: int, eligible_items=None, min_count: int = 2,
            rate: float = 1.0):
    """Split one block's training ratings into the rest and each user's validation ratings.

    A user with ``n`` ratings of which ``e`` are on eligible items (``eligible_items``, a
    boolean mask over items; default all) gives ``v = floor(0.1 n + 1/2)`` of the
    eligible ones, at least 1 when ``n >= 2``, at most ``n - 1``,
    ``e`` and ``VALIDATION_CAP``, spread over them (a keyed random start, a stride of
    ``e // v``); a user with fewer than ``min_count`` ratings gives none, and so does one outside the keyed
    sample of users of probability ``rate`` (:func:`validation_rate`; 1: every user).
    Returns ``(indptr, items, ratings)`` of the rest and ``(users, items, ratings)`` of
    the validation ratings (``users`` local to the block, one entry per rating).
    Deterministic in ``key`` and the users' global indices.

    >>> ip = np.array([0, 1, 4]); it = np.array([5, 1, 2, 3], np.int32); r = np.array([1, 2, 3, 4], np.float32)
    >>> (tip, tit, tr), (vu, vi, vr) = holdout(ip, it, r, 0, key=7)
    >>> tip.tolist(), len(tit), vu.tolist(), int(vi[0]) in (1, 2, 3)
    ([0, 1, 3], 3, [1], True)
    """
    ip = np.asarray(indptr, np.int64)
    items = np.asarray(items)
    cnt = np.diff(ip)
    if eligible_items is None and len(ip) > 1 and ip[0] == 0:
        return _holdout_kernel(ip, items, np.asarray(ratings), cnt, first_user, key, min_count, rate)
    return _holdout_numpy(ip, items, ratings, cnt, first_user, key, eligible_items, min_count, rate)


def validation_rate(n_users: float) -> float:
    """The probability that a user validates: 1 up to :data:`VALIDATION_USERS` users, then that many over
    ``n_users`` (the run's public or released user count, so that the sample reads nothing else off the data).

    >>> validation_rate(943), validation_rate(2_000_000)
    (1.0, 0.05)
    """
    n = float(n_users)
    return 1.0 if not n > VALIDATION_USERS else VALIDATION_USERS / n


def validating_users(n_users: float) -> float:
    """How many of ``n_users`` (public or released) are expected to validate: ``n_users`` times
    :func:`validation_rate` (``min(n_users, VALIDATION_USERS)``); what a test of whether the choice can see a
    difference counts.

    >>> validating_users(943), validating_users(2_000_000)
    (943.0, 100000.0)
    """
    return float(n_users) * validation_rate(n_users)


def sample_record(rate: float) -> dict:
    """What ``model.json``'s ``selection`` says of the validation users: nothing when every user validates.

    >>> sample_record(1.0), sample_record(0.05)["validation_users"]
    ({}, 'a keyed sample of about 100,000 users: each with probability 0.05')
    """
    if rate >= 1.0:
        return {}
    return {"validation_users": f"a keyed sample of about {VALIDATION_USERS:,} users: each with probability "
                                f"{rate:.4g}", "validation_rate": rate}


def _sampled(n: int, first_user: int, key: int, rate: float) -> np.ndarray | None:
    """Whether each of a block's ``n`` users (global indices from ``first_user``) is in the keyed validation sample
    of probability ``rate``; None when every user is (``rate >= 1``)."""
    if rate >= 1.0:
        return None
    users = np.arange(n, dtype=np.uint64) + np.uint64(first_user)
    with np.errstate(over="ignore"):
        h = mix((np.uint64(key) * MIX) ^ SAMPLE_SALT ^ users * MIX)
    return h < _threshold(rate)


def _threshold(rate: float) -> np.uint64:
    """The hash below which a user is in the keyed validation sample of probability ``rate`` (:func:`_sampled`)."""
    return np.uint64(min(int(min(rate, 1.0) * 2.0 ** 64), 2 ** 64 - 1))


def _holdout_numpy(ip, items, ratings, cnt, first_user: int, key: int, eligible_items, min_count: int,
                   rate: float = 1.0):
    """:func:`holdout` in NumPy (with ``eligible_items``; the reference of :func:`_holdout_kernel`)."""
    if eligible_items is None:
        P = np.arange(len(items), dtype=np.int64)
        ecnt = cnt
    else:
        ok = np.asarray(eligible_items, bool)[items]
        P = np.flatnonzero(ok).astype(np.int64)
        eip = np.empty(len(ip), np.int64)
        masked_indptr(ip, ok, eip)
        ecnt = np.diff(eip)
    estart = np.cumsum(ecnt) - ecnt  # offset of each user's first eligible rating in P
    v = _counts(cnt, ecnt, min_count, first_user, key, rate)
    users = np.flatnonzero(v > 0)
    n, vv = ecnt[users], v[users]
    start = _starts(users, n, key, first_user)
    step = n // vv
    rep = np.repeat(np.arange(len(users)), vv)
    j = np.arange(len(rep)) - np.repeat(np.cumsum(vv) - vv, vv)
    pos = P[estart[users][rep] + (start[rep] + j * step[rep]) % n[rep]]
    keep = np.ones(len(items), bool)
    keep[pos] = False
    removed = np.zeros(len(cnt) + 1, np.int64)
    removed[users + 1] = vv
    tip = ip - np.cumsum(removed)
    return (tip, np.ascontiguousarray(items[keep]), np.ascontiguousarray(np.asarray(ratings)[keep])), \
        (users[rep], items[pos], np.asarray(ratings)[pos])


def held_positions(indptr, first_user: int, key: int, min_count: int = 2, rate: float = 1.0) -> np.ndarray:
    """The positions in the block's arrays of :func:`holdout`'s validation ratings (no ``eligible_items``,
    ``indptr[0] == 0``), without a copy of the rest: for a pass that only leaves them out of its sums (weight 0).

    >>> ip = np.array([0, 1, 4]); (tip, tit, _), _ = holdout(ip, np.array([5, 1, 2, 3]), np.zeros(4), 0, key=7)
    >>> np.delete(np.array([5, 1, 2, 3]), held_positions(ip, 0, key=7)).tolist() == tit.tolist()
    True
    """
    ip = np.asarray(indptr, np.int64)
    cnt = np.diff(ip)
    v = _counts(cnt, cnt, min_count, first_user, key, rate)
    users = np.flatnonzero(v > 0)
    n, vv = cnt[users], v[users]
    start = _starts(users, n, key, first_user)
    rep = np.repeat(np.arange(len(users)), vv)
    j = np.arange(len(rep)) - np.repeat(np.cumsum(vv) - vv, vv)
    return ip[users][rep] + (start[rep] + j * (n // vv)[rep]) % n[rep]


def holdout_strides(indptr, first_user: int, key: int, min_count: int = 2, rate: float = 1.0):
    """``(v, start)``: each user's number of :func:`holdout` validation ratings (no ``eligible_items``) and the
    keyed offset of the first (0 where ``v`` is 0); held out are the offsets ``(start + j (n // v)) % n``, ``j < v``."""
    ip = np.asarray(indptr, np.int64)
    v, start = np.empty(len(ip) - 1, np.int64), np.empty(len(ip) - 1, np.int64)
    with np.errstate(over="ignore"):
        key_mix = np.uint64(key) * MIX
    holdout_counts(ip, int(first_user), key_mix, MIX, int(min_count), VALIDATION_FRACTION, VALIDATION_CAP,
                   rate < 1.0, SAMPLE_SALT, _threshold(rate), v, start)
    return v, start


def _counts(cnt, ecnt, min_count: int, first_user: int = 0, key: int = 0, rate: float = 1.0) -> np.ndarray:
    """Validation ratings per user: ``floor(0.1 n + 1/2)``, at least 1, at most ``n - 1``, ``e`` and the cap; 0
    below ``min_count`` ratings and outside the sample (:func:`_sampled`)."""
    v = np.maximum(np.floor(VALIDATION_FRACTION * cnt + 0.5).astype(np.int64), 1)
    v = np.minimum(np.minimum(v, cnt - 1), np.minimum(ecnt, VALIDATION_CAP))
    v[cnt < min_count] = 0
    inside = _sampled(len(cnt), first_user, key, rate)
    if inside is not None:
        v[~inside] = 0
    return v


def _starts(users, n, key: int, first_user: int) -> np.ndarray:
    """Each validation user's keyed random start among her ``n`` (eligible) ratings."""
    with np.errstate(over="ignore"):
        h = mix((np.uint64(key) * MIX) ^ (users.astype(np.uint64) + np.uint64(first_user)) * MIX)
    return (h % n.astype(np.uint64)).astype(np.int64)


def _holdout_kernel(ip, items, ratings, cnt, first_user: int, key: int, min_count: int, rate: float = 1.0):
    """:func:`holdout` without ``eligible_items`` in one compiled pass over the pairs
    (:func:`streamdp.kernels.csr.holdout_strided`); the same arrays as its NumPy path. Every pass of a run that holds
    items out (``ials`` with ``--select auto``) calls it on every block: the NumPy path took 31 ms of CPU per
    1M-pair block (13% of a non-private ``ials`` iteration at 64 factors)."""
    v, start = holdout_strides(ip, first_user, key, min_count, rate)
    users = np.flatnonzero(v > 0)
    tip = np.empty(len(ip), np.int64)
    tit, tr = np.empty(len(items), items.dtype), np.empty(len(ratings), ratings.dtype)
    pos = np.empty(int(v.sum()), np.int64)
    a = holdout_strided(ip, items, ratings, v, start, tip, tit, tr, pos)
    return (tip, tit[:a], tr[:a]), (np.repeat(users, v[users]), items[pos], ratings[pos])


def candidate_name(c) -> str:
    """``("factors", 10.0)`` -> ``"factors, ridge 10"``; ``("bias", inf)`` -> ``"bias, no intercept"``."""
    kind, r = c
    return f"{kind}, " + ("no intercept" if math.isinf(r) else f"ridge {r:g}")


def loss_sensitivity(bound: float, m: int, norm: str) -> float:
    """Sensitivity of the vector of ``m`` summed losses, each user adding at most ``bound^2`` per coordinate."""
    each = bound * bound
    return each * (math.sqrt(m) if norm == "l2" else m)


def choose(noisy: np.ndarray, default: int, noise_std: float) -> int:
    """Index of the chosen candidate: the default unless another is lower by more than ``MARGIN`` noise stds.

    >>> choose(np.array([10.0, 8.0, 12.0]), 0, 1.0), choose(np.array([10.0, 6.0, 12.0]), 0, 1.0)
    (0, 1)
    """
    noisy = np.asarray(noisy, np.float64)
    adj = noisy + MARGIN * noise_std
    adj[default] = noisy[default]
    return int(np.argmin(adj))
