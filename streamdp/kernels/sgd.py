"""SGD and SGLD block kernels for biased matrix factorization (Liu, Wang & Smola 2015).

Model: ``r_ij ~ mu + bu_i + bv_j + <u_i, v_j>``. All kernels work on one user block
(local CSR ``indptr``/``items``/``ratings``) with the block's user rows ``U``/``bu``
updated in place and the item state ``V``/``bv`` shared between worker threads
(Hogwild: no locks, as in Niu et al. and Liu et al. Sec. 5.2).

Decisions a reader must know:

* **tiering**: users are taken in groups of ``group_users``; within a group the hot-tier
  ratings (item index ``< hot_items``, items being numbered by popularity) come first,
  then the cold ones (:func:`partition_tiers`); only the order changes, not the arithmetic;
* **SGD** (:func:`sgd_block`) is scikit-surprise's ``SVD`` update (regularization per
  rating) when the weight ``w = 1``;
* **SGLD** is one Langevin step of length ``h`` per epoch over the energy with the squared
  loss truncated at ``c``; the prior and the Brownian noise are applied **lazily** by the
  exact Ornstein-Uhlenbeck flow at a parameter's first touch in a step, which is exactly
  equal in distribution to the eager chain (:func:`sgld_epoch_eager_reference`): noise is
  drawn once per (step, touched item) and once per user per epoch, never per rating.
  Users' flows: :func:`user_flow_coefficients`; :func:`flush_items` brings every item to
  the end of the epoch before ``V`` is checkpointed or released. Under Hogwild a lost
  race can give an item one flow interval twice (more noise, never less);
* **the kernels draw nothing**: the caller fills ``noise`` with standard normals
  (:func:`streamdp.privacy.make_rng`/``spawn_rngs``), consumed ``k + 1`` per flow
  (:func:`count_block_draws` says how many a block needs); ``use_table=True`` reads Liu
  et al.'s Gaussian lookup table instead (no privacy proof);
* no ``fastmath`` in the SGLD kernels and flows: only :func:`sgd_block` reorders its arithmetic.

Design notes (the update rules, the flow's transition, why lazy equals eager, the noise
order): docs/design-notes.md#streamdpkernelssgdpy.
"""

from __future__ import annotations

import math
import os

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from streamdp.kernels.jit import njit

# ---------------------------------------------------------------------------------------
# block preparation
# ---------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def partition_tiers(indptr, items, ratings, hot_items, split):
    """Stable in-place partition of each user's ratings: hot items (``< hot_items``) first.

    Writes into ``split[u]`` the absolute position where user ``u``'s cold ratings
    start. Relative order within the hot and within the cold part is kept. A user
    whose hot ratings already come first (items sorted per user) costs one read pass.
    """
    n_users = len(indptr) - 1
    tmp_i = np.empty(0, np.int32)
    tmp_r = np.empty(0, np.float32)
    for u in range(n_users):
        s = indptr[u]
        e = indptr[u + 1]
        n = e - s
        if len(tmp_i) < n:
            tmp_i = np.empty(n, np.int32)
            tmp_r = np.empty(n, np.float32)
        h = 0
        ordered = True
        for p in range(s, e):
            if items[p] < hot_items:
                h += 1
                if p > s and items[p - 1] >= hot_items:
                    ordered = False
        if ordered:  # hot items already a prefix (e.g. items sorted per user, as stores keep them)
            split[u] = s + h
            continue
        c = h
        h2 = 0
        for p in range(s, e):
            if items[p] < hot_items:
                tmp_i[h2] = items[p]
                tmp_r[h2] = ratings[p]
                h2 += 1
            else:
                tmp_i[c] = items[p]
                tmp_r[c] = ratings[p]
                c += 1
        for q in range(n):
            items[s + q] = tmp_i[q]
            ratings[s + q] = tmp_r[q]
        split[u] = s + h


@njit(cache=True, nogil=True)
def count_group_touches(indptr, items, group_users, n_items, out):
    """Distinct items of each group of ``group_users`` users (the item flows of each step), into ``out``."""
    n_users = len(indptr) - 1
    stamp = np.full(n_items, -1, np.int64)
    g = 0
    for g0 in range(0, n_users, group_users):
        g1 = min(g0 + group_users, n_users)
        c = 0
        for p in range(indptr[g0], indptr[g1]):
            j = items[p]
            if stamp[j] != g:
                stamp[j] = g
                c += 1
        out[g] = c
        g += 1


def group_draws(indptr, items, group_users: int, n_items: int, k: int) -> np.ndarray:
    """Standard normals :func:`sgld_block` consumes per group, in order (users of the group, then its items).

    The kernel's noise buffer is the concatenation of these per-group segments, so
    each group's noise can come from its own generator.
    """
    n_users = len(indptr) - 1
    n_groups = -(-n_users // group_users) if n_users else 0
    touches = np.zeros(n_groups, np.int64)
    count_group_touches(indptr, items, int(group_users), int(n_items), touches)
    users = np.full(n_groups, group_users, np.int64)
    if n_groups:
        users[-1] = n_users - group_users * (n_groups - 1)
    return (users + touches) * (k + 1)


def count_block_draws(indptr, items, group_users: int, n_items: int, k: int) -> int:
    """Standard normals :func:`sgld_block` consumes for one block (all groups)."""
    return int(group_draws(indptr, items, group_users, n_items, k).sum())


def user_flow_coefficients(epoch: int, deltas, n_epoch: int) -> tuple[float, float]:
    """``(u_dt0, u_dt1)`` such that a user whose group starts at clock ``P`` flows ``u_dt0 + u_dt1 * P``.

    ``deltas[e - 1]`` is the clock unit of epoch ``e`` (1-based). A user's previous flow
    was at the same position ``P`` one epoch earlier (at time 0 before epoch 1), so
    the duration is ``delta_{e-1} (N - P) + delta_e P``.

    >>> user_flow_coefficients(1, [0.5], 10)
    (0.0, 0.5)
    >>> user_flow_coefficients(2, [0.5, 0.25], 10)
    (5.0, -0.25)
    """
    d = float(deltas[epoch - 1])
    if epoch == 1:
        return 0.0, d
    prev = float(deltas[epoch - 2])
    return prev * n_epoch, d - prev


def hot_tier_items(k: int, n_items: int, cache_bytes: int | None = None) -> int:
    """Items whose rows fit in half of one core's L2 cache (``k`` float32 + bias + clock).

    ``cache_bytes`` defaults to the L2 size of cpu0 read from sysfs (2 MiB when it
    cannot be read).

    >>> hot_tier_items(16, 10**6, cache_bytes=2**21)
    13797
    >>> hot_tier_items(16, 100, cache_bytes=2**21)
    100
    """
    if cache_bytes is None:
        cache_bytes = _l2_bytes()
    per = 4 * int(k) + 4 + 8
    return int(max(1, min(int(n_items), (int(cache_bytes) // 2) // per)))


def tiering_pays(k: int, n_items: int, *, noisy: bool = True, workers: int = 1,
                 l3_bytes: int | None = None) -> bool:
    """``--tiering auto``: tier sgld's epochs only when its item state exceeds the running workers' L3 share.

    The rule uses public parameters only: the method, the rank, the number of items (the
    public catalogue), the number of workers and this machine's caches. While all of
    ``V`` (``k`` float32, bias, clock per item) fits in the share of the last-level cache
    each running worker has, reordering a group's ratings hot-first saves no memory
    traffic and its bookkeeping costs a little; beyond it, the hot tier (half an L2,
    :func:`hot_tier_items`) stays resident while the cold rows stream from RAM.

    Measured on an idle 2-core machine (1 MiB L2 a core, one 32 MiB L3; a 20,000-user
    Netflix-shaped store, 17,770 items, steady-state epochs, medians of 3 repeats,
    tiered/untiered wall rates; ``docs/sgld.md``): sgld 0.91-0.99 at k=16 and 64 (V 1.4
    and 4.8 MB), at k=256 (18.4 MB) 0.95 on 1 worker (the whole L3 is its own) and 1.21
    on 2 (16 MiB each), at k=512 (36.6 MB) 1.06 and 1.21. ``sgd`` never gained from it
    (0.89-1.04 at every rank and worker count: its per-rating work is half sgld's and
    small ``V`` are replicated per worker), so ``noisy=False`` is always off. ``l3_bytes``
    defaults to cpu0's L3 from sysfs divided by ``min(workers, CPUs sharing it)`` (16 MiB
    when it cannot be read).

    >>> [tiering_pays(k, 17_770, l3_bytes=16 * 2**20) for k in (16, 64, 256, 512)]
    [False, False, True, True]
    >>> tiering_pays(512, 17_770, noisy=False, l3_bytes=16 * 2**20)
    False
    """
    if not noisy:
        return False
    if l3_bytes is None:
        l3_bytes = _l3_share_bytes(workers)
    return int(n_items) * (4 * int(k) + 4 + 8) > int(l3_bytes)


def _l3_share_bytes(workers: int | None = None) -> int:
    """cpu0's L3 size over the number of CPUs sharing it (sysfs ``shared_cpu_list``), or over ``workers`` when
    fewer run; 16 MiB if unknown."""
    size = _cache_bytes(3, 0)
    if not size:
        return 16 * 1024 * 1024
    n = 1
    try:
        base = "/sys/devices/system/cpu/cpu0/cache"
        for idx in sorted(os.listdir(base)):
            with open(os.path.join(base, idx, "level")) as f:
                if f.read().strip() != "3":
                    continue
            with open(os.path.join(base, idx, "shared_cpu_list")) as f:
                n = 0
                for part in f.read().strip().split(","):
                    lo, _, hi = part.partition("-")
                    n += int(hi or lo) - int(lo) + 1
            break
    except (OSError, ValueError):
        n = 1
    if workers is not None:
        n = min(n, max(int(workers), 1))
    return size // max(n, 1)


def _l2_bytes() -> int:
    return _cache_bytes(2, 2 * 1024 * 1024)


def _cache_bytes(level: int, default: int) -> int:
    """Size of cpu0's unified/data cache of ``level`` from sysfs; ``default`` when it cannot be read."""
    try:
        base = "/sys/devices/system/cpu/cpu0/cache"
        for idx in sorted(os.listdir(base)):
            with open(os.path.join(base, idx, "level")) as f:
                lv = f.read().strip()
            with open(os.path.join(base, idx, "type")) as f:
                typ = f.read().strip()
            if lv == str(level) and typ in ("Unified", "Data"):
                with open(os.path.join(base, idx, "size")) as f:
                    txt = f.read().strip().upper()
                mult = {"K": 1024, "M": 1024 * 1024}.get(txt[-1], 1)
                return int(txt.rstrip("KM")) * mult
    except (OSError, ValueError):
        pass
    return default


# ---------------------------------------------------------------------------------------
# reading ahead
# ---------------------------------------------------------------------------------------

#: Ratings ahead (in storage order) whose item row the kernels ask the cache for. Measured on
#: the kernel alone, 1M-rating blocks, 20k items: +7% at k=16 (V 1.3 MB), +21% at k=64,
#: 2.3x at k=256 (V 20 MB, a row is 16 cache lines the hardware does not fetch ahead of a
#: random item); 4 and 12 did no better.
PREFETCH_AHEAD = 8


def _prefetch_codegen(context, builder, sig, args):
    """``llvm.prefetch`` (read, keep in all cache levels, data) of ``arr[i, ...]``."""
    aty = sig.args[0]
    ary = context.make_array(aty)(context, builder, args[0])
    inds = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], sig.args[1:])]
    ptr = cgutils.get_item_pointer(context, builder, aty, ary, inds, wraparound=False)
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], fnty=ir.FunctionType(ir.VoidType(),
                                                                                       [i8p, i32, i32, i32]))
    builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
    return context.get_dummy_value()


@intrinsic
def _prefetch1(typingctx, arr, i):
    """Ask the cache for ``arr[i]`` (a hint: never faults, changes no result)."""
    if isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(i, types.Integer):
        return types.void(arr, i), _prefetch_codegen
    return None


@intrinsic
def _prefetch2(typingctx, arr, i, j):
    """Ask the cache for ``arr[i, j]`` (a hint: never faults, changes no result)."""
    if isinstance(arr, types.Array) and arr.ndim == 2 and isinstance(i, types.Integer) and \
            isinstance(j, types.Integer):
        return types.void(arr, i, j), _prefetch_codegen
    return None


@njit(cache=True, nogil=True, inline="always")
def _prefetch_item(V, bv, j):
    """Ask the cache for item ``j``'s row of ``V`` (each 64-byte line) and its bias.

    The kernels call it for the item :data:`PREFETCH_AHEAD` ratings after the current
    one in storage order, which is the processing order within a user's sweep
    (elsewhere the hint is for a row needed a little later, or wasted).
    """
    for d in range(0, V.shape[1], 16):
        _prefetch2(V, j, d)
    _prefetch1(bv, j)


# ---------------------------------------------------------------------------------------
# SGD
# ---------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _span(indptr, split, i, sweep):
    """User ``i``'s ratings in sweep 0 (hot tier) or 1 (cold tier)."""
    if sweep == 0:
        return indptr[i], split[i]
    return split[i], indptr[i + 1]


@njit(cache=True, nogil=True, inline="always")
def _dot_8_lanes(U, i, V, j):
    """``<U[i], V[j]>`` in a fixed order: 8 running sums (coordinates ``d = l mod 8``), added pairwise, then the tail.

    Strict IEEE arithmetic in an order that does not depend on the machine; the
    eight sums are independent chains, where one running sum waits ``k`` additions.
    """
    k = U.shape[1]
    n8 = k - k % 8
    z = np.float32(0.0)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = z
    for d in range(0, n8, 8):
        a0 += U[i, d] * V[j, d]
        a1 += U[i, d + 1] * V[j, d + 1]
        a2 += U[i, d + 2] * V[j, d + 2]
        a3 += U[i, d + 3] * V[j, d + 3]
        a4 += U[i, d + 4] * V[j, d + 4]
        a5 += U[i, d + 5] * V[j, d + 5]
        a6 += U[i, d + 6] * V[j, d + 6]
        a7 += U[i, d + 7] * V[j, d + 7]
    dot = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
    for d in range(n8, k):
        dot += U[i, d] * V[j, d]
    return dot


@njit(cache=True, nogil=True, inline="always")
def _predict(U, bu, V, bv, mu, i, j):
    return mu + bu[i] + bv[j] + _dot_8_lanes(U, i, V, j)


@njit(cache=True, nogil=True, inline="always")
def _kick(U, bu, V, bv, i, j, g, lr, reg, reg_b):
    """One rating's update with gradient factor ``g = w * e`` (old values on the right)."""
    k = U.shape[1]
    bu[i] += lr * (g - reg_b * bu[i])
    bv[j] += lr * (g - reg_b * bv[j])
    for d in range(k):
        ud = U[i, d]
        vd = V[j, d]
        U[i, d] = ud + lr * (g * vd - reg * ud)
        V[j, d] = vd + lr * (g * ud - reg * vd)


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _dot_any_order(U, i, V, j):
    """``<U[i], V[j]>`` summed in whichever order vectorizes: for :func:`sgd_block` only.

    A separate function so that its flags stay on its own instructions when LLVM
    inlines it (Numba's ``inline="always"`` would compile it with the caller's
    flags). ``reassoc`` lets the loop vectorizer split the sum into vector lanes;
    the serial sum it replaces was one dependent add per coordinate (measured,
    kernel alone on a 1M-rating block: 1.2x at k=16, 2.4x at k=64, 3.1x at k=256
    with ``contract``). The lanes depend on the CPU's vector width, so SGD results
    are reproducible on one machine, not bit for bit across CPUs.
    """
    k = U.shape[1]
    dot = np.float32(0.0)
    for d in range(k):
        dot += U[i, d] * V[j, d]
    return dot


@njit(cache=True, nogil=True, fastmath={"contract"})
def sgd_block(indptr, items, ratings, weights, split, U, bu, V, bv, mu, lr, reg, reg_b, group_users):
    """One SGD sweep over a block (in place on ``U``, ``bu``, ``V``, ``bv``).

    ``weights`` (float32, per user) multiplies each user's loss; ``split`` from
    :func:`partition_tiers` (or ``indptr[1:]`` for no tiering). Returns the sum of
    ``w * e^2`` before each update (a training-loss monitor).

    The plain squared loss, no noise and no clipping, so the arithmetic may be
    contracted (fused multiply-adds) and the dot product summed in any order
    (:func:`_dot_any_order`): results match :func:`sgd_block_reference` to float32
    rounding, not bit for bit. The truncated loss and the noise are
    :func:`sgld_block`'s, which keeps IEEE order throughout.
    """
    n_users = len(indptr) - 1
    n_ratings = len(items)
    lr32 = np.float32(lr)
    reg32 = np.float32(reg)
    regb32 = np.float32(reg_b)
    mu32 = np.float32(mu)
    sse = 0.0
    for g0 in range(0, n_users, group_users):
        g1 = min(g0 + group_users, n_users)
        for sweep in range(2):
            for i in range(g0, g1):
                s, e = _span(indptr, split, i, sweep)
                w = weights[i]
                for p in range(s, e):
                    if p + PREFETCH_AHEAD < n_ratings:
                        _prefetch_item(V, bv, items[p + PREFETCH_AHEAD])
                    j = items[p]
                    err = ratings[p] - (mu32 + bu[i] + bv[j] + _dot_any_order(U, i, V, j))
                    sse += w * err * err
                    _kick(U, bu, V, bv, i, j, w * err, lr32, reg32, regb32)
    return sse


# ---------------------------------------------------------------------------------------
# SGLD
# ---------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _flow_scale(a, tau, temp):
    """``(decay, sd)`` of the exact OU transition over ``tau``."""
    if a > 0.0:
        decay = math.exp(-a * tau)
        var = -temp * math.expm1(-2.0 * a * tau) / a
    else:
        decay = 1.0
        var = 2.0 * temp * tau
    return decay, math.sqrt(var)


@njit(cache=True, nogil=True, inline="always")
def _flow_row(X, b, r, tau, a, a_b, temp, noise, base):
    if tau <= 0.0:
        return
    k = X.shape[1]
    dec, sd = _flow_scale(a, tau, temp)
    dec32 = np.float32(dec)
    sd32 = np.float32(sd)
    for d in range(k):
        X[r, d] = X[r, d] * dec32 + sd32 * noise[base + d]
    decb, sdb = _flow_scale(a_b, tau, temp)
    b[r] = b[r] * np.float32(decb) + np.float32(sdb) * noise[base + k]


@njit(cache=True, nogil=True)
def sgld_block(indptr, items, ratings, weights, split, U, bu, V, bv, item_last, mu, lr, clip, group_users,
               pos0, delta, u_dt0, u_dt1, a, a_b, temp, noise, offsets, use_table):
    """One SGLD sweep over a block with lazy noise (see the module docstring).

    Parameters beyond :func:`sgd_block`: ``item_last`` (int64, shared) clock position of
    each item's last flow; ``pos0`` clock position of the block's first rating;
    ``delta`` Langevin time per clock unit; ``u_dt0 + u_dt1 * P`` the users' flow
    duration (:func:`user_flow_coefficients`); ``a``/``a_b`` OU rates of factors and
    biases (``2 s lam``); ``temp`` temperature; ``noise`` standard normals (or the table),
    ``offsets`` slot starts when ``use_table``. Returns ``(sum of w e^2, flows drawn)``.
    """
    n_users = len(indptr) - 1
    n_ratings = len(items)
    n_items = V.shape[0]
    k = V.shape[1]
    lr32 = np.float32(lr)
    zero = np.float32(0.0)
    mu32 = np.float32(mu)
    stamp = np.full(n_items, -1, np.int64)
    slot = 0
    sse = 0.0
    g = 0
    for g0 in range(0, n_users, group_users):
        g1 = min(g0 + group_users, n_users)
        P = pos0 + indptr[g0]
        # users: one flow each at the start of their group
        tau_u = u_dt0 + u_dt1 * P
        for i in range(g0, g1):
            base = offsets[slot] if use_table else slot * (k + 1)
            _flow_row(U, bu, i, tau_u, a, a_b, temp, noise, base)
            slot += 1
        for sweep in range(2):
            for i in range(g0, g1):
                s, e = _span(indptr, split, i, sweep)
                w = weights[i]
                for p in range(s, e):
                    if p + PREFETCH_AHEAD < n_ratings:
                        _prefetch_item(V, bv, items[p + PREFETCH_AHEAD])
                    j = items[p]
                    if stamp[j] != g:
                        stamp[j] = g
                        base = offsets[slot] if use_table else slot * (k + 1)
                        slot += 1
                        last = item_last[j]
                        if last < P:
                            item_last[j] = P
                            _flow_row(V, bv, j, delta * (P - last), a, a_b, temp, noise, base)
                    err = ratings[p] - _predict(U, bu, V, bv, mu32, i, j)
                    sse += w * err * err
                    if clip > 0.0 and abs(err) > clip:
                        continue
                    _kick(U, bu, V, bv, i, j, w * err, lr32, zero, zero)
        g += 1
    return sse, slot


@njit(cache=True, nogil=True)
def flush_items(V, bv, item_last, P_end, delta, a, a_b, temp, noise, offsets, use_table):
    """Flow every item to clock position ``P_end`` (one slot per item, in item order); reset ``item_last`` to 0."""
    n_items = V.shape[0]
    k = V.shape[1]
    for j in range(n_items):
        base = offsets[j] if use_table else j * (k + 1)
        last = item_last[j]
        if last < P_end:
            _flow_row(V, bv, j, delta * (P_end - last), a, a_b, temp, noise, base)
        item_last[j] = 0


# ---------------------------------------------------------------------------------------
# slow NumPy references (for tests)
# ---------------------------------------------------------------------------------------


def _rating_reference(U, bu, V, bv, i, j, r, w, mu, lr, reg, reg_b, clip):
    """One rating's update in plain NumPy (float32 state); returns ``w * e^2`` before it."""
    f = np.float32
    err = f(r) - (f(mu) + bu[i] + bv[j] + f(np.dot(U[i], V[j])))
    loss = float(w) * float(err) ** 2
    if clip > 0 and abs(err) > clip:
        return loss
    gr = f(w * err)
    ui, vj = U[i].copy(), V[j].copy()
    bu[i] += f(lr) * (gr - f(reg_b) * bu[i])
    bv[j] += f(lr) * (gr - f(reg_b) * bv[j])
    U[i] = ui + f(lr) * (gr * vj - f(reg) * ui)
    V[j] = vj + f(lr) * (gr * ui - f(reg) * vj)
    return loss


def _order(indptr, split, group_users):
    """(group start, [(user, lo, hi), ...]) in the kernels' processing order."""
    n = len(indptr) - 1
    for g0 in range(0, n, group_users):
        g1 = min(g0 + group_users, n)
        spans = [(i, indptr[i], split[i]) for i in range(g0, g1)]
        spans += [(i, split[i], indptr[i + 1]) for i in range(g0, g1)]
        yield g0, g1, spans


def sgd_block_reference(indptr, items, ratings, weights, split, U, bu, V, bv, mu, lr, reg, reg_b, group_users):
    """Plain-Python :func:`sgd_block` (float32 state, same order), in place; returns the loss monitor."""
    sse = 0.0
    for _, _, spans in _order(indptr, split, group_users):
        for i, lo, hi in spans:
            for p in range(lo, hi):
                sse += _rating_reference(U, bu, V, bv, i, items[p], ratings[p], weights[i], mu, lr, reg, reg_b, 0.0)
    return sse


def _ou(x, tau, a, temp, z):
    if tau <= 0:
        return x
    if a > 0:
        dec, var = np.exp(-a * tau), temp * (1 - np.exp(-2 * a * tau)) / a
    else:
        dec, var = 1.0, 2 * temp * tau
    return (x * dec + np.sqrt(var) * z).astype(np.float32)


def sgld_block_reference(indptr, items, ratings, weights, split, U, bu, V, bv, item_last, mu, lr, clip,
                         group_users, pos0, delta, u_dt0, u_dt1, a, a_b, temp, noise):
    """Plain-Python :func:`sgld_block` (lazy noise, sequential slots), in place; returns ``(sse, slots)``."""
    k = V.shape[1]
    slot = 0
    sse = 0.0

    def take():
        nonlocal slot
        z = noise[slot * (k + 1): (slot + 1) * (k + 1)].astype(np.float64)
        slot += 1
        return z

    for g0, g1, spans in _order(indptr, split, group_users):
        P = pos0 + indptr[g0]
        for i in range(g0, g1):
            z = take()
            tau = u_dt0 + u_dt1 * P
            U[i] = _ou(U[i].astype(np.float64), tau, a, temp, z[:k])
            bu[i] = _ou(np.float64(bu[i]), tau, a_b, temp, z[k])
        seen = set()
        for i, lo, hi in spans:
            for p in range(lo, hi):
                j = items[p]
                if j not in seen:
                    seen.add(j)
                    z = take()
                    if item_last[j] < P:
                        tau = delta * (P - item_last[j])
                        V[j] = _ou(V[j].astype(np.float64), tau, a, temp, z[:k])
                        bv[j] = _ou(np.float64(bv[j]), tau, a_b, temp, z[k])
                        item_last[j] = P
                sse += _rating_reference(U, bu, V, bv, i, j, ratings[p], weights[i], mu, lr, 0.0, 0.0, clip)
    return sse, slot


def sgld_epoch_eager_reference(indptr, items, ratings, weights, U, bu, V, bv, mu, lr, clip, group_users,
                               delta, a, a_b, temp, rng):
    """The **eager** chain of one epoch over one block holding all users (no tiering).

    At the start of every step (group) the OU flow of the previous step's duration
    is applied to *every* parameter with fresh draws from ``rng``; then the step's
    kicks; at the end of the epoch everything is flowed to the epoch's end. The lazy
    kernels are equal to this in distribution (tested statistically).
    """
    n = len(indptr) - 1
    N = int(indptr[-1])
    prev = 0

    def flow_all(tau):
        for X, b in ((U, bu), (V, bv)):
            if tau <= 0:
                continue
            z = rng.standard_normal(X.shape)
            X[:] = _ou(X.astype(np.float64), tau, a, temp, z)
            b[:] = _ou(b.astype(np.float64), tau, a_b, temp, rng.standard_normal(b.shape))

    for g0 in range(0, n, group_users):
        g1 = min(g0 + group_users, n)
        P = int(indptr[g0])
        flow_all(delta * (P - prev))
        prev = P
        for i in range(g0, g1):
            for p in range(indptr[i], indptr[i + 1]):
                _rating_reference(U, bu, V, bv, i, items[p], ratings[p], weights[i], mu, lr, 0.0, 0.0, clip)
    flow_all(delta * (N - prev))
