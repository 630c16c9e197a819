"""User-level contribution bounding over CSR blocks: trimming, clipping, weights, centering.

One implementation used by every method (the kernels live here, in ``privacy/``,
so that what bounds a user's influence is written once, next to the accountant
that relies on it). Kernels are ``@njit(cache=True, nogil=True)`` on raw arrays with
explicit dtypes and no ``fastmath``; the Python wrappers validate once and allocate.

A block is the CSR triple ``(indptr, items, ratings)`` with a local ``indptr``
(``indptr[0] == 0``), as :meth:`streamdp.storage.store.RatingStore.read_block`
returns it.

- :func:`trim_block`: keep a uniformly random subset of at most ``tau`` ratings per
  user (Liu et al. 2015's trimming; the sensitivity bounds of every method assume
  it). Deterministic in ``seed``; kept ratings stay in their original order.
- :func:`clip_rows`: scale each user's row of values to L2 norm at most ``L``.
- :func:`weight_rows` and :func:`personalized_weights`: per-user weights ``w_i``
  (personalized privacy, Liu et al. Thm 2).
- :func:`center_ratings`: subtract a public or privately estimated mean.
"""

from __future__ import annotations

import math

import numpy as np
from streamdp.kernels.jit import njit

from streamdp.errors import ParameterError
from streamdp.kernels.hashing import GOLDEN, splitmix64, unit_float
from streamdp.privacy.mechanisms import make_rng

__all__ = ["trim_block", "trim_mask", "contribution_weights", "adaptive_user_weights", "user_uniform_weights",
           "weighs_users_alike", "SAMPLING_RULES", "clip_rows", "row_norms", "weight_rows",
           "personalized_weights", "center_ratings",
           "contribution_bounds", "check_tau", "check_clip"]

# Rounding of the scaled values can raise a row's norm by a relative 2^-24 (float32)
# or 2^-53 (float64) per entry; clipping to L * (1 - 2^-20) resp. L * (1 - 2^-40)
# keeps the stored result's norm <= L.
_F32_SAFETY = 1.0 - 2.0 ** -20
_F64_SAFETY = 1.0 - 2.0 ** -40


def check_tau(tau) -> int:
    """Validate a per-user rating cap ``tau`` (an integer >= 1).

    >>> check_tau(5)
    5
    """
    if isinstance(tau, bool) or not isinstance(tau, (int, np.integer)) or tau < 1:
        raise ParameterError(f"tau: expected an integer >= 1 (ratings kept per user), got {tau!r}")
    return int(tau)


def check_clip(L) -> float:
    """Validate a row-norm bound ``L`` (> 0; ``inf`` means no clipping).

    >>> check_clip(2)
    2.0
    """
    try:
        L = float(L)
    except (TypeError, ValueError):
        raise ParameterError(f"L: expected a positive number (row-norm bound), got {L!r}") from None
    if math.isnan(L) or L <= 0:
        raise ParameterError(f"L: expected a positive number (row-norm bound), got {L}")
    return L


def _check_indptr(indptr: np.ndarray, n_values: int) -> np.ndarray:
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or indptr[-1] != n_values:
        raise ParameterError("indptr: expected a local CSR row pointer starting at 0 and ending at len(values)")
    return indptr


@njit(cache=True, nogil=True)
def _keep_smallest(indptr, keys, tau, mask):  # pragma: no cover - numba
    """``mask[p]`` = rating ``p`` is among the ``tau`` smallest ``keys`` of its user (all kept when fewer)."""
    for u in range(indptr.shape[0] - 1):
        a = indptr[u]
        b = indptr[u + 1]
        if b - a <= tau:
            for j in range(a, b):
                mask[j] = True
        else:
            for j in range(a, b):
                mask[j] = False
            sel = np.argsort(keys[a:b])[:tau]
            for t in range(tau):
                mask[a + sel[t]] = True


@njit(cache=True, nogil=True)
def hash_keys(first_user, indptr, items, seed, out):  # pragma: no cover - numba
    """``out[p]`` uniform in [0, 1): splitmix64 of (seed, global user, item) for each rating."""
    for u in range(indptr.shape[0] - 1):
        gu = np.uint64(first_user + u)
        for p in range(indptr[u], indptr[u + 1]):
            z = np.uint64(seed) ^ (gu * GOLDEN) ^ (np.uint64(items[p]) * np.uint64(0xC2B2AE3D27D4EB4F))
            out[p] = unit_float(splitmix64(z + GOLDEN))


def trim_mask(indptr, keys, tau) -> np.ndarray:
    """Boolean mask keeping, per user, the ratings with the ``tau`` smallest ``keys`` (all of a user with fewer).

    The one trimming rule: :func:`trim_block` draws uniform keys (a random subset),
    :func:`contribution_weights` uses hashed keys (``uniform``) or the items' noisy
    counts (``tail``: the user's rarest items).

    >>> trim_mask(np.array([0, 3, 4]), np.array([0.5, 0.1, 0.9, 0.3]), 2).tolist()
    [True, True, False, True]
    """
    tau = check_tau(tau)
    keys = np.ascontiguousarray(keys, dtype=np.float64)
    indptr = _check_indptr(indptr, keys.size)
    mask = np.empty(keys.size, dtype=np.bool_)
    _keep_smallest(indptr, keys, np.int64(tau), mask)
    return mask


def trim_block(indptr, items, ratings, tau, seed=None):
    """Keep a uniformly random subset of at most ``tau`` ratings of each user.

    Parameters
    ----------
    indptr : ndarray of int
        Local CSR row pointer of the block (``n_users_in_block + 1``).
    items, ratings : ndarray
        Item index and value of each rating (any numeric dtypes; kept).
    tau : int
        Ratings kept per user, >= 1.
    seed : int, numpy.random.Generator or None
        Randomness for the subset; give the block's own seed (e.g. from
        :func:`streamdp.privacy.mechanisms.spawn_rngs`) for a result that does
        not depend on scheduling. ``None`` uses OS entropy.

    Returns
    -------
    (indptr, items, ratings)
        New arrays (the inputs are not modified); ``indptr`` is int64. Users
        with at most ``tau`` ratings are kept whole, in order; for the others the
        kept ratings keep their original relative order.

    Examples
    --------
    >>> ip, it, r = trim_block(np.array([0, 3, 4]), np.array([5, 6, 7, 8], np.int32),
    ...                        np.array([1, 2, 3, 4], np.float32), 2, seed=0)
    >>> ip.tolist(), len(it), int(it[-1])
    ([0, 2, 3], 3, 8)
    """
    tau = check_tau(tau)
    items = np.ascontiguousarray(items)
    ratings = np.ascontiguousarray(ratings)
    if items.shape != ratings.shape or items.ndim != 1:
        raise ParameterError("trim_block: items and ratings must be 1-d arrays of the same length")
    indptr = _check_indptr(indptr, items.size)
    counts = np.diff(indptr)
    if counts.size == 0 or counts.max() <= tau:
        return indptr.copy(), items.copy(), ratings.copy()
    rng = seed if isinstance(seed, np.random.Generator) else make_rng(seed)
    mask = trim_mask(indptr, rng.random(items.size), tau)
    out_indptr = np.zeros_like(indptr)
    np.cumsum(np.minimum(counts, tau), out=out_indptr[1:])
    out_items, out_ratings = items[mask], ratings[mask]
    return out_indptr, out_items, out_ratings


@njit(cache=True, nogil=True)
def _row_norms_kernel(indptr, values, out):  # pragma: no cover - numba
    for u in range(indptr.shape[0] - 1):
        s = 0.0
        for j in range(indptr[u], indptr[u + 1]):
            v = np.float64(values[j])
            s += v * v
        out[u] = math.sqrt(s)


@njit(cache=True, nogil=True)
def _repeat_rows_kernel(indptr, per_row, out):  # pragma: no cover - numba
    # unsigned: a signed index is checked for wrapping around at each store, which keeps the fill from vectorizing
    for u in range(indptr.shape[0] - 1):
        f = per_row[u]
        for j in range(np.uint64(indptr[u]), np.uint64(indptr[u + 1])):
            out[j] = f


@njit(cache=True, nogil=True)
def _normalised_rows_kernel(indptr, nj, tot, l2, scale, out):  # pragma: no cover - numba
    """``out[p] = scale * nj[p] / r_u * _F64_SAFETY``, ``r_u = sqrt(tot_u)`` (``l2``) or ``tot_u``, ``tot`` holding one
    entry per user with ratings, in order: the adaptive weights' NumPy expression, its operations in its order (so
    the same bits), without its four arrays the size of the block (measured 5 ns a rating of the 15 the weights took,
    one core, 1M ratings)."""
    k = 0
    for u in range(indptr.shape[0] - 1):
        a, b = indptr[u], indptr[u + 1]
        if b > a:
            r = math.sqrt(tot[k]) if l2 else tot[k]
            k += 1
            for p in range(a, b):
                out[p] = ((scale * nj[p]) / r) * _F64_SAFETY


@njit(cache=True, nogil=True)
def _scale_rows_kernel(indptr, values, factors, out):  # pragma: no cover - numba
    for u in range(indptr.shape[0] - 1):
        f = factors[u]
        if f != 1.0:
            for j in range(indptr[u], indptr[u + 1]):
                out[j] = values[j] * f
        else:
            for j in range(indptr[u], indptr[u + 1]):
                out[j] = values[j]


#: ``contribution_weights`` rules.
SAMPLING_RULES = ("uniform", "tail", "adaptive")


def adaptive_user_weights(counts, tau: int, norm: str = "l2") -> np.ndarray:
    """The ``adaptive`` rule's weights without item counts, one per user (:func:`contribution_weights` repeats each
    over the user's ratings): ``sqrt(tau / n_i)`` (``norm="l2"``) or ``tau / n_i`` (``"l1"``), scaled by ``1 - 2^-40``;
    0 for a user with no rating. ``counts`` are the users' rating counts.

    >>> adaptive_user_weights(np.array([4, 0, 1]), 4).round(9).tolist()
    [1.0, 0.0, 2.0]
    """
    counts = np.asarray(counts)
    per_user = np.where(counts > 0, tau / np.maximum(counts, 1), 0.0)
    return (np.sqrt(per_user) if norm == "l2" else per_user) * _F64_SAFETY


def user_uniform_weights(counts, *, rule: str, tau: int, norm: str = "l2", exponent: float = 0.0,
                         scales=None) -> np.ndarray | None:
    """:func:`contribution_weights`' weights, one per user, where the rule weighs every rating of a user alike
    (``adaptive`` with exponent 0 and no per-rating scales: :func:`adaptive_user_weights`); ``None`` for a rule
    whose weights differ within a user. A kernel that takes a weight per user (the ALS item side) reads these
    instead of the per-rating array that repeats them.

    >>> user_uniform_weights(np.array([4, 1]), rule="adaptive", tau=4).round(9).tolist()
    [1.0, 2.0]
    >>> user_uniform_weights(np.array([4, 1]), rule="tail", tau=4) is None
    True
    """
    if not weighs_users_alike(rule, exponent, scales):
        return None
    return adaptive_user_weights(counts, tau, norm)


def weighs_users_alike(rule: str, exponent: float = 0.0, scales=None) -> bool:
    """Whether the rule gives every rating of a user the same weight (:func:`user_uniform_weights`)."""
    return rule == "adaptive" and exponent == 0.0 and scales is None


def contribution_weights(indptr, items, *, rule: str, tau: int, norm: str = "l2", first_user: int = 0,
                         seed: int = 0, item_counts=None, exponent: float = 0.0, scales=None, out=None) -> np.ndarray:
    """Per-rating weights ``c_ij`` bounding each user's contribution: ``||c_i||_2 <= sqrt(tau)`` or ``||c_i||_1 <= tau``.

    Rules (all public: they use only the user's own ratings, public parameters and
    already released noisy item counts):

    * ``uniform``: weight 1 on ``tau`` ratings of the user chosen uniformly at random
      (all of a user with fewer), 0 on the rest. The choice is a keyed hash of
      ``(seed, global user, item)``: deterministic in the seed, the same in every
      pass and whatever the blocks are (no random stream is consumed), and
      independent of the other users. It is not the privacy noise: a subset chosen
      by any rule of the user's own data keeps the bound, randomness only avoids bias.
    * ``tail``: weight 1 on the user's ``tau`` rarest items by ``item_counts`` (ties by
      the same hash), 0 on the rest.
    * ``adaptive`` (Krichene et al. 2023): every rating kept, with
      ``c_ij = sqrt(tau) n_j^mu / sqrt(sum_{j' in user} n_{j'}^(2 mu))`` (``norm="l2"``) or
      ``tau n_j^mu / sum_{j'} n_{j'}^mu`` (``norm="l1"``), ``n_j = max(item_counts_j, 1)``
      and ``mu = exponent <= 0``: rarer items weigh more, and every user's weights
      have the same norm, so a light user's ratings count more each and the noise,
      fixed by the bound, meets as much signal from every user as it can. With
      ``exponent = 0`` no counts are needed: ``c_ij = sqrt(tau / n_i)`` (``tau / n_i``).
      ``scales`` (one positive number per rating, a function of the user's own rating
      and public parameters, e.g. :func:`rating_tilt`) multiplies ``n_j^mu`` before the
      normalisation: the user's weight leans toward those ratings, the norm stays.

    The bound is exact for ``uniform``/``tail`` (``min(n_i, tau)`` ones); for
    ``adaptive`` the weights are scaled by ``1 - 2^-40`` so rounding cannot exceed it.
    ``out`` (float64, one per rating): the weights are written there and it is returned (a
    pass's reused buffer: the same values, no array of their own).

    >>> ip, it = np.array([0, 4, 5]), np.array([0, 1, 2, 3, 0], np.int32)
    >>> w = contribution_weights(ip, it, rule="adaptive", tau=4)
    >>> [round(float(np.sum(w[a:b] ** 2)), 9) for a, b in ((0, 4), (4, 5))]
    [4.0, 4.0]
    >>> contribution_weights(ip, it, rule="tail", tau=2, item_counts=np.array([9, 5, 1, 7])).tolist()
    [0.0, 1.0, 1.0, 0.0, 1.0]
    >>> w = contribution_weights(ip, it, rule="adaptive", tau=4, scales=np.array([1.0, 1.0, 0.5, 0.5, 0.5]))
    >>> [round(float(np.sum(w[a:b] ** 2)), 9) for a, b in ((0, 4), (4, 5))], round(float(w[0] / w[2]), 9)
    ([4.0, 4.0], 2.0)
    """
    tau = check_tau(tau)
    if rule not in SAMPLING_RULES:
        raise ParameterError(f"--sampling: expected one of {', '.join(SAMPLING_RULES)}, got {rule!r}")
    if norm not in ("l1", "l2"):
        raise ParameterError(f"norm: expected 'l1' or 'l2', got {norm!r}")
    items = np.ascontiguousarray(items, dtype=np.int32)
    indptr = _check_indptr(indptr, items.size)
    counts = np.diff(indptr)
    if scales is not None and rule != "adaptive":
        raise ParameterError("per-rating scales need the adaptive rule")
    if rule == "adaptive":
        if exponent > 0 or not math.isfinite(exponent):
            raise ParameterError(f"--adaptive-exponent must be <= 0, got {exponent}")
        per_user = user_uniform_weights(counts, rule=rule, tau=tau, norm=norm, exponent=exponent, scales=scales)
        if per_user is not None:  # one weight per user, repeated over their ratings
            if out is None:
                return np.repeat(per_user, counts)
            _repeat_rows_kernel(indptr, per_user, out)
            return out
        else:
            if item_counts is None and exponent != 0.0:
                raise ParameterError("adaptive weights with a non-zero exponent need the noisy item counts")
            # n_j^mu per item, then gathered: the same values as raising every rating's count (one power per item,
            # not per rating: 8 of the weights' 15 ns a rating)
            nj = (np.ones(items.size) if exponent == 0.0 else
                  (np.maximum(np.asarray(item_counts, np.float64), 1.0) ** exponent)[items])
            if scales is not None:
                scales = np.asarray(scales, np.float64)
                if scales.shape != items.shape or not np.all(scales > 0):
                    raise ParameterError("scales: expected one positive number per rating")
                nj = nj * scales
            starts = indptr[:-1][counts > 0]
            l2 = norm == "l2"
            tot = np.add.reduceat(nj * nj if l2 else nj, starts) if starts.size else np.zeros(0)
            out = np.empty(items.size, np.float64) if out is None else out
            _normalised_rows_kernel(indptr, nj, tot, l2, float(math.sqrt(tau) if l2 else tau), out)
            return out
    keys = np.empty(items.size, np.float64)
    hash_keys(np.int64(first_user), indptr, items, np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF), keys)
    if rule == "tail":
        if item_counts is None:
            raise ParameterError("--sampling tail needs the noisy item counts")
        # rarest first; the hash (in [0, 1)) only breaks ties between equal counts
        keys = np.floor(np.asarray(item_counts, np.float64)[items]) + keys
    w = trim_mask(indptr, keys, tau)
    if out is None:
        return w.astype(np.float64)
    out[:] = w
    return out


def row_norms(indptr, values) -> np.ndarray:
    """L2 norm of each user's row of ``values`` (float64).

    >>> row_norms(np.array([0, 2, 3]), np.array([3.0, 4.0, 1.0])).tolist()
    [5.0, 1.0]
    """
    values = np.ascontiguousarray(values)
    indptr = _check_indptr(indptr, values.size)
    out = np.empty(indptr.size - 1, dtype=np.float64)
    _row_norms_kernel(indptr, values, out)
    return out


def _float_values(values, inplace: bool) -> np.ndarray:
    values = np.asarray(values)
    if values.ndim != 1:
        raise ParameterError("values: expected a 1-d array (one value per rating)")
    if inplace:
        if values.dtype not in (np.float32, np.float64) or not values.flags.c_contiguous:
            raise ParameterError("values: in-place bounding needs a contiguous float32/float64 array")
        return values
    return np.ascontiguousarray(values, dtype=values.dtype if values.dtype in (np.float32, np.float64)
                                else np.float64)


def clip_rows(indptr, values, L, *, inplace: bool = False) -> np.ndarray:
    """Scale each user's row of ``values`` so that its L2 norm is at most ``L``.

    Parameters
    ----------
    indptr : ndarray of int
        Local CSR row pointer.
    values : ndarray
        One value per rating (e.g. centered ratings).
    L : float
        Row-norm bound, > 0 (``inf``: no clipping).
    inplace : bool
        Modify ``values`` (contiguous float32/float64) instead of returning a copy.
        By default a **copy** is returned (float64 unless the input is float32/64).

    Returns
    -------
    ndarray
        The clipped values; rows already within ``L`` are unchanged. Rows over ``L`` are scaled to
        ``L (1 - 2^-20)`` (float32) or ``L (1 - 2^-40)`` (float64) so that rounding
        cannot take the stored norm past ``L``.

    Examples
    --------
    >>> clip_rows(np.array([0, 2, 3]), np.array([3.0, 4.0, 0.5]), 1.0).round(9).tolist()
    [0.6, 0.8, 0.5]
    """
    L = check_clip(L)
    out = _float_values(values, inplace)
    src = np.ascontiguousarray(values) if not inplace else out
    indptr = _check_indptr(indptr, out.size)
    if math.isinf(L):
        if not inplace and out is src:
            out = out.copy()
        return out
    norms = row_norms(indptr, src)
    target = L * (_F32_SAFETY if out.dtype == np.float32 else _F64_SAFETY)
    factors = np.where(norms > L, target / np.maximum(norms, 1e-300), 1.0)
    if not inplace:
        res = np.empty_like(out)
        _scale_rows_kernel(indptr, out, factors, res)
        return res
    _scale_rows_kernel(indptr, out, factors, out)
    return out


def weight_rows(indptr, values, weights, *, inplace: bool = False) -> np.ndarray:
    """Multiply each user's row of ``values`` by that user's weight ``w_i`` in ``[0, inf)``.

    Returns a copy unless ``inplace`` (as :func:`clip_rows`).

    Examples
    --------
    >>> weight_rows(np.array([0, 2, 3]), np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.0])).tolist()
    [0.5, 1.0, 0.0]
    """
    out = _float_values(values, inplace)
    indptr = _check_indptr(indptr, out.size)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if w.shape != (indptr.size - 1,):
        raise ParameterError(f"weights: expected one weight per user ({indptr.size - 1}), got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ParameterError("weights: expected finite non-negative per-user weights")
    res = out if inplace else np.empty_like(out)
    _scale_rows_kernel(indptr, out, w, res)
    return res


def personalized_weights(counts, tau, fractions) -> np.ndarray:
    """Per-user weights for personalized privacy (Liu et al. 2015, Thm 2).

    Thm 2: with ``B_i = min(tau, m_i) w_i (4 + kappa)^2 <= B``, user ``i`` gets
    ``epsilon B_i / (2B)``-personalized DP, i.e. a fraction ``B_i / B`` of the
    guarantee of a full user (``B = tau (4 + kappa)^2``). For a wanted fraction
    ``f_i`` in ``[0, 1]`` of the global epsilon, ``w_i = f_i tau / min(tau, m_i)``
    (``f_i = 0`` removes the user, ``f_i = 1`` is the default budget). Users with
    no ratings get weight 0.

    Parameters
    ----------
    counts : ndarray of int
        Ratings of each user (``m_i``), before trimming.
    tau : int
        Per-user rating cap.
    fractions : float or ndarray
        ``f_i`` in ``[0, 1]``.

    Examples
    --------
    >>> personalized_weights(np.array([10, 2, 0]), 4, np.array([1.0, 0.5, 1.0])).tolist()
    [1.0, 1.0, 0.0]
    """
    tau = check_tau(tau)
    m = np.minimum(np.asarray(counts, dtype=np.int64), tau)
    f = np.broadcast_to(np.asarray(fractions, dtype=np.float64), m.shape)
    if np.any(~np.isfinite(f)) or np.any((f < 0) | (f > 1)):
        raise ParameterError("fractions: expected per-user privacy fractions in [0, 1]")
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(m > 0, f * tau / np.maximum(m, 1), 0.0)
    return w


def center_ratings(ratings, mean) -> np.ndarray:
    """``ratings - mean`` as a new float array (float32 stays float32).

    ``mean`` must be public (a declared scale midpoint) or privately estimated
    and accounted by the caller.

    Examples
    --------
    >>> center_ratings(np.array([1, 5], np.float32), 3.0).tolist()
    [-2.0, 2.0]
    """
    mean = float(mean)
    if not math.isfinite(mean):
        raise ParameterError(f"mean: expected a finite number, got {mean}")
    r = np.asarray(ratings)
    dtype = r.dtype if r.dtype in (np.float32, np.float64) else np.float64
    return (r - np.asarray(mean, dtype=dtype)).astype(dtype, copy=False)


def contribution_bounds(*, tau: int | None = None, L: float | None = None, weights=None, **extra) -> dict:
    """The ledger's ``bounds`` entry: ``tau``, ``L`` and a summary of the per-user weights.

    Examples
    --------
    >>> contribution_bounds(tau=50, L=2.0, weights=np.array([1.0, 0.5, 0.0]), mean="public midpoint")
    {'tau': 50, 'L': 2.0, 'weights': {'n_users': 3, 'min': 0.0, 'mean': 0.5, 'max': 1.0, 'n_zero': 1}, 'mean': 'public midpoint'}
    """
    out: dict = {"tau": None if tau is None else check_tau(tau), "L": None if L is None else check_clip(L)}
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        out["weights"] = {"n_users": int(w.size), "min": float(w.min()) if w.size else 0.0,
                          "mean": float(w.mean()) if w.size else 0.0, "max": float(w.max()) if w.size else 0.0,
                          "n_zero": int((w == 0).sum())}
    else:
        out["weights"] = "none (every user weight 1)"
    out.update(extra)
    return out
