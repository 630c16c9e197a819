"""The ALS-family kernels against the machine: ratings/s per core beside the same run's dgemm and a plain kernel.

    python bench/roofline.py [--quick] [--ks 8,16,64] [--repeats 3] [--only TEXT] [--out FILE]

On a generated in-memory CSR (200,000 users x 20,000 items, 10M ratings: user lengths
lognormal around 50, item popularity a power law; ``--quick``: 1,000 x 400, 20,000
ratings, a smoke test) each kernel of the ALS family runs on one thread
(``numba.set_num_threads(1)``, BLAS under ``threadpoolctl`` limit 1) at each ``k``:

* **als user solve** (:func:`streamdp.kernels.linalg.solve_users_huber`: each user's
  Gramian, right-hand side and Cholesky solve against ``[V, 1]``, ``d = k + 1``; the
  user solve of als, irls (``irls 1``: one reweighting), public-private and the local
  solve);
* **als item side** (:func:`streamdp.kernels.als.als_accumulate`): ``shared`` (the
  private default: right-hand sides per item, one users' Gramian) and ``per-item``
  (``--gramian item``, the non-private default: a packed Gramian per item);
* **ials user sweep** (:func:`streamdp.kernels.ials.ials_solve_users`, the exact solve)
  and **ials item sums** (:func:`streamdp.kernels.ials.ials_accumulate` with per-item
  Gramians), ``d = k``, confidences ``1 + 10 r``;
* **top-10 scorer** (:func:`streamdp.kernels.topk.topn_blocked`: every user's 10 best
  unseen items of 20,000), counted per rating of the users it serves.

Per kernel and ``k`` the table gives the rate of today's kernel; the **before** kernel
(``bench/_before.py``: the kernel as it was before issue 44, where it changed) and its
speed-up; a **plain** Numba kernel doing the same arithmetic as a simple triple loop (per
rating ``for a: for b >= a: G[a, b] += w q_a q_b`` plus the right-hand side, then the old
row-by-row Cholesky solve; for the scorer :func:`streamdp.kernels.topk.topn_scores`, its float64 loop);
and the **roofline**: the same run's dgemm rate (``numpy.matmul`` of two 1,500 x 1,500
float64 matrices, ``1500^3`` multiply-adds) divided by the kernel's multiply-adds per rating
(column ``madds``):

* user solves: ``d (d + 1) / 2 + d`` (Gramian's upper triangle and right-hand side; irls 1:
  ``2 (d (d + 1) / 2 + d) + d``, the second Gramian and the residuals), the solve's
  ``d^3 / 6`` per user not counted;
* item side: ``d`` (right-hand side) plus ``d (d + 1) / 2`` per rating (per-item) or per
  user (shared: ``d (d + 1) / 2 x users / ratings``);
* scorer: ``n_items (k + 1) x users / ratings``.

So ``roofline ratings/s = dgemm multiply-adds/s / madds``: what the kernel would reach if it
ran at dgemm's rate. Rates are medians of ``--repeats`` round-robin repeats (each repeat times
dgemm and every kernel once, in turn); ratios are of those medians. Each timed call covers
the first users of the CSR up to about ``BUDGET`` multiply-adds (all of them when cheaper),
so k = 64 takes seconds, not minutes. Times are the timing thread's CPU time
(``time.thread_time``; every kernel and BLAS run on it), so the time slices other jobs take
on a shared machine do not count; their use of the caches and memory still does: only the
ratios of one run mean much.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from bench._before import ridge_solve  # noqa: E402

#: ``(users, items, ratings)`` of the generated CSR: full and ``--quick``.
FULL, QUICK = (200_000, 20_000, 10_000_000), (1_000, 400, 20_000)
#: Multiply-adds per timed call (a prefix of the users): full and ``--quick``.
BUDGET, QUICK_BUDGET = 1.5e9, 2e6
#: Side of dgemm's square matrices: full and ``--quick``.
DGEMM_N, QUICK_DGEMM_N = 1500, 200
#: The table's columns.
COLUMNS = ("kernel", "k", "madds", "ratings/s", "before", "speed-up", "plain Numba", "of plain", "roofline (dgemm)",
           "of roofline")


def generate(users: int, items: int, ratings: int, seed: int = 0):
    """``(indptr int64, items int32, ratings float64 in 1..5)``: lognormal user lengths (each >= 1), power-law items."""
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 1.0, users)
    lengths = 1 + rng.multinomial(ratings - users, w / w.sum())
    indptr = np.zeros(users + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    pop = 1.0 / (np.arange(items) + 10.0) ** 0.8
    it = rng.permutation(items)[rng.choice(items, size=ratings, p=pop / pop.sum())].astype(np.int32)
    rows = np.repeat(np.arange(users), lengths)
    order = np.lexsort((it, rows))
    r = rng.integers(1, 6, size=ratings).astype(np.float64)
    return indptr, it[order], r


def dgemm_rate(n: int) -> float:
    """Multiply-adds per CPU second of one ``n x n`` float64 ``numpy.matmul`` (``n^3`` multiply-adds)."""
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(n, n)), rng.normal(size=(n, n))
    t = time.thread_time()
    np.matmul(a, b)
    return n ** 3 / (time.thread_time() - t)


# -- the plain kernels: simple triple loops ----------------------------------------------


@njit(cache=True, nogil=True)
def plain_user_solve(indptr, items, val, wts, Q, G0, U):
    """Per user: ``G = G0 + sum_p w_p q_p q_p^T`` (upper triangle, per rating ``for a: for b >= a``),
    ``x = sum_p val_p q_p``, then the old row-by-row Cholesky (``bench/_before.py: ridge_solve``)."""
    d = Q.shape[1]
    G = np.empty((d, d))
    x = np.empty(d)
    for u in range(len(indptr) - 1):
        for a in range(d):
            x[a] = 0.0
            for b in range(d):
                G[a, b] = G0[a, b]
        for p in range(indptr[u], indptr[u + 1]):
            j = items[p]
            for a in range(d):
                x[a] += val[p] * Q[j, a]
                for b in range(a, d):
                    G[a, b] += wts[p] * Q[j, a] * Q[j, b]
        for a in range(d):
            for b in range(a):
                G[a, b] = G[b, a]
        if indptr[u + 1] > indptr[u]:
            ridge_solve(G, x, d)
        for a in range(d):
            U[u, a] = x[a]


@njit(cache=True, nogil=True)
def plain_item_sums(indptr, items, val, wts, X, B, A, S):
    """Per rating ``B[j] += val_p x_u`` and (``A`` non-empty) ``A[j] += w_p x_u x_u^T`` (packed upper triangle,
    ``for a: for b >= a``); per user (``S`` non-empty) ``S += x_u x_u^T``."""
    d = X.shape[1]
    for u in range(len(indptr) - 1):
        if indptr[u + 1] == indptr[u]:
            continue
        if S.shape[0] > 0:
            for a in range(d):
                for b in range(a, d):
                    S[a, b] += X[u, a] * X[u, b]
        for p in range(indptr[u], indptr[u + 1]):
            j = items[p]
            for a in range(B.shape[1]):
                B[j, a] += val[p] * X[u, a]
            if A.shape[0] > 0:
                q = 0
                for a in range(d):
                    for b in range(a, d):
                        A[j, q] += wts[p] * X[u, a] * X[u, b]
                        q += 1


# -- the kernels ---------------------------------------------------------------------------


class Case:
    """One kernel at one ``k``: ``calls`` maps a variant (``now``, ``before``, ``plain``) to a no-argument callable."""

    def __init__(self, name, k, madds, ratings, calls):
        self.name, self.k, self.madds, self.ratings, self.calls = name, k, madds, ratings, calls
        self.times = {v: [] for v in calls}


def _prefix(indptr, madds, budget):
    """Users ``0 .. u`` whose ratings cost about ``budget`` multiply-adds at ``madds`` per rating (at least one user)."""
    target = min(int(indptr[-1]), max(1, int(budget / madds)))
    return max(1, min(len(indptr) - 1, int(np.searchsorted(indptr, target))))


def cases(data, n_items, k, budget):
    """Every kernel's :class:`Case` at ``k`` on ``data`` (the CSR of :func:`generate`)."""
    from bench._before import als_accumulate_before, ials_solve_users_before, solve_users_huber_before
    from streamdp.kernels.als import als_accumulate
    from streamdp.kernels.ials import ials_accumulate, ials_solve_users
    from streamdp.kernels.linalg import solve_users_huber
    from streamdp.kernels.topk import topn_blocked, topn_prepare, topn_scores

    indptr, items, r = data
    rng = np.random.default_rng(k)
    out = []

    def csr(madds):
        u = _prefix(indptr, madds, budget)
        n = int(indptr[u])
        return u, indptr[:u + 1], items[:n], n

    # als / irls user solve: [V, 1], d = k + 1
    d = k + 1
    Q = np.hstack([rng.normal(0, 0.3, (n_items, k)), np.ones((n_items, 1))])
    resid = r - 3.5
    for iters in (0, 1):
        madds = (iters + 1) * (d * (d + 1) / 2 + d) + iters * d
        u, ip, it, n = csr(madds)
        res, ones, U = resid[:n], np.ones(n), np.zeros((u, d))
        G0 = 0.5 * np.eye(d)
        calls = {
            "now": lambda ip=ip, it=it, res=res, U=U, i=iters: solve_users_huber(ip, it, res, Q, 0.5, i, 1.0, U),
            "before": lambda ip=ip, it=it, res=res, U=U, i=iters: solve_users_huber_before(ip, it, res, Q, 0.5, i,
                                                                                              1.0, U),
        }
        if iters == 0:
            calls["plain"] = lambda ip=ip, it=it, res=res, ones=ones, U=U, G0=G0: plain_user_solve(ip, it, res, ones, Q,
                                                                                                  G0, U)
        out.append(Case("als user solve" + (" (irls 1)" if iters else ""), k, madds, n, calls))

    # als item side: x = [clipped u, 1], d = k + 1
    for per_item in (False, True):
        nonempty = int((np.diff(indptr) > 0).sum())
        madds = d + d * (d + 1) / 2 * (1.0 if per_item else nonempty / len(items))
        u, ip, it, n = csr(madds)
        Uf = np.hstack([rng.normal(0, 0.3, (u, k)), rng.normal(0, 0.2, (u, 1))])
        tgt, w = resid[:n], np.ones(n)
        B = np.zeros((n_items, d))
        A = np.zeros((n_items, d * (d + 1) // 2) if per_item else (0, 1))
        S = np.zeros((0, 0) if per_item else (d, d))
        X = np.hstack([Uf[:, :k], np.ones((u, 1))])
        calls = {
            "now": lambda ip=ip, it=it, tgt=tgt, w=w, Uf=Uf, B=B, A=A, S=S: als_accumulate(ip, it, tgt, w, Uf, 1.0, 2.0,
                                                                                           1.0, B, A, S),
            "before": lambda ip=ip, it=it, tgt=tgt, w=w, Uf=Uf, B=B, A=A, S=S: als_accumulate_before(
                ip, it, tgt, w, Uf, 1.0, 2.0, 1.0, B, A, S),
            "plain": lambda ip=ip, it=it, tgt=tgt, w=w, X=X, B=B, A=A, S=S: plain_item_sums(ip, it, tgt, w, X, B, A, S),
        }
        out.append(Case("als item side, " + ("per-item Gramians" if per_item else "shared Gramian"), k, madds, n,
                        calls))
        if not per_item:  # the fit's form under the default adaptive rule: one weight per user, no per-rating array
            wu = np.ones(u)
            out.append(Case("als item side, shared Gramian, a weight per user", k, madds, n, {
                "now": lambda ip=ip, it=it, tgt=tgt, wu=wu, Uf=Uf, B=B, A=A, S=S: als_accumulate(
                    ip, it, tgt, wu, Uf, 1.0, 2.0, 1.0, B, A, S, True),
                "before": calls["before"], "plain": calls["plain"]}))

    # ials: d = k, confidence 1 + 10 r
    conf = 1.0 + 10.0 * r / 5.0
    Y = rng.normal(0, 0.3, (n_items, k))
    YtY = Y.T @ Y
    madds = k * (k + 1) / 2 + k
    u, ip, it, n = csr(madds)
    c, U = conf[:n], np.zeros((u, k))
    G0 = YtY + 0.5 * np.eye(k)
    out.append(Case("ials user sweep", k, madds, n, {
        "now": lambda ip=ip, it=it, c=c, U=U: ials_solve_users(ip, it, c, Y, YtY, 0.5, U, False),
        "before": lambda ip=ip, it=it, c=c, U=U: ials_solve_users_before(ip, it, c, Y, YtY, 0.5, U),
        "plain": lambda ip=ip, it=it, c=c, U=U, cm=c - 1.0, G0=G0: plain_user_solve(ip, it, c, cm, Y, G0, U),
    }))
    madds = k + k * (k + 1) / 2
    u, ip, it, n = csr(madds)
    c, w = conf[:n], np.ones(n)
    Uf = rng.normal(0, 0.3, (u, k))
    B, A, G = np.zeros((n_items, k)), np.zeros((n_items, k * (k + 1) // 2)), np.zeros((k, k))
    out.append(Case("ials item sums, per-item Gramians", k, madds, n, {
        "now": lambda ip=ip, it=it, c=c, w=w, Uf=Uf, B=B, A=A, G=G: ials_accumulate(ip, it, c, w, Uf, 10.0, np.inf,
                                                                                    B, A, G),
        "plain": lambda ip=ip, it=it, c=c, w=w, Uf=Uf, B=B, A=A, G=G, cm=c - 1.0: plain_item_sums(ip, it, c, cm, Uf,
                                                                                                 B, A, G),
    }))

    # top-10 scorer
    Vq = rng.normal(0, 0.3, (n_items, k))
    bias, tie = rng.normal(0, 0.1, n_items), np.arange(n_items, dtype=np.int64)
    per_rating = n_items * (k + 1) * (len(indptr) - 1) / len(items)
    u, ip, it, n = csr(per_rating)
    Uu = rng.normal(0, 0.3, (u, k))
    want = np.ones(u, np.int8)
    oi, osc = np.empty((u, 10), np.int32), np.empty((u, 10))
    prepared = topn_prepare(Vq, bias, 3.5)
    out.append(Case("top-10 scorer", k, n_items * (k + 1) * u / max(n, 1), n, {
        "now": lambda ip=ip, it=it, Uu=Uu, want=want, oi=oi, osc=osc: topn_blocked(
            ip, it, want, Uu, Vq, bias, 3.5, tie, oi, osc, prepared=prepared),
        "plain": lambda ip=ip, it=it, Uu=Uu, want=want, oi=oi, osc=osc: topn_scores(ip, it, want, Uu, Vq, bias, 3.5,
                                                                                   tie, oi, osc),
    }))
    return out


def _rate(m):
    return f"{m / 1e6:.1f}M" if m >= 1e5 else f"{m / 1e6:.3f}M"


def run(quick: bool = False, ks=(8, 16, 64), repeats: int = 3, log=None, only: str = "") -> str:
    """Measure every kernel at each ``k`` (see the module docstring); the markdown table."""
    import numba
    from threadpoolctl import threadpool_limits

    users, n_items, ratings = QUICK if quick else FULL
    budget = QUICK_BUDGET if quick else BUDGET
    dn = QUICK_DGEMM_N if quick else DGEMM_N
    numba.set_num_threads(1)
    with threadpool_limits(1):
        data = generate(users, n_items, ratings)
        all_cases = [c for k in ks for c in cases(data, n_items, k, budget) if only in c.name]
        for c in all_cases:  # compile and warm
            for f in c.calls.values():
                f()
        gemm = []
        for rep in range(repeats):
            gemm.append(dgemm_rate(dn))
            for c in all_cases:
                for v, f in c.calls.items():
                    t = time.thread_time()
                    f()
                    c.times[v].append(time.thread_time() - t)
            if log:
                log(f"repeat {rep + 1}/{repeats} done")
    peak = statistics.median(gemm)
    lines = [f"dgemm (numpy.matmul, {dn} x {dn} float64, one thread): {peak / 1e9:.2f} G multiply-adds/s; "
             f"CSR {users:,} users x {n_items:,} items, {ratings:,} ratings; medians of {repeats} repeats", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for c in all_cases:
        rate = {v: c.ratings / statistics.median(t) for v, t in c.times.items()}
        roof = peak / c.madds
        cells = [c.name, str(c.k), f"{c.madds:.0f}", _rate(rate["now"]),
                 _rate(rate["before"]) if "before" in rate else "",
                 f"{rate['now'] / rate['before']:.2f}x" if "before" in rate else "",
                 _rate(rate["plain"]) if "plain" in rate else "",
                 f"{rate['now'] / rate['plain']:.2f}x" if "plain" in rate else "",
                 _rate(roof), f"{rate['now'] / roof:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a small CSR (a smoke test, seconds)")
    p.add_argument("--ks", default="8,16,64", help="factor counts (default 8,16,64)")
    p.add_argument("--repeats", type=int, default=3, help="repeats; medians (default 3)")
    p.add_argument("--only", default="", help="only the kernels whose name contains this text")
    p.add_argument("--out", help="also write the table to this file")
    a = p.parse_args(argv)
    try:
        ks = tuple(int(x) for x in a.ks.split(","))
        if not ks or min(ks) < 1 or a.repeats < 1:
            raise ValueError
    except ValueError:
        print(f"roofline: --ks must be positive integers and --repeats >= 1 (got {a.ks!r}, {a.repeats})",
              file=sys.stderr)
        return 2
    text = run(a.quick, ks, a.repeats, log=lambda m: print(m, file=sys.stderr, flush=True), only=a.only)
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
