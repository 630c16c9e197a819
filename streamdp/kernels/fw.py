"""Kernels of private Frank-Wolfe's local component and of the private SVD baseline, on CSR user blocks.

A user's row of the Frank-Wolfe iterate is kept implicitly: ``Y_i = c_i V^T`` where
``V`` (``n_items x T``) is the released basis (column ``s`` = the noisy top
eigenvector of iteration ``s + 1``) and ``c_i`` her ``T`` coefficients. Every local
step is then a few operations on ``c_i`` and on the predictions ``P_Omega(Y_i)`` at
the items she rated (``x`` = her centred ratings there):

* ``a = P_Omega(Y_i) - x`` (her residual row, the gradient's row), clipped to
  L2 norm ``clip`` as in the global sum: ``a <- a min(1, clip / ||a||)``,
* ``u_hat = f (a . v_s) / lam_s`` (Jain et al. Alg. 1, ``A_local``; ``f`` the row's
  clipping factor), then replaced by the user's own line search along ``v_s`` within
  ``|u_hat|`` (:func:`_direction`),
* ``c <- (1 - eta_s) c``, ``c_s <- -eta_s k u_hat``,
* ``Pi_{Omega}``: ``c <- c min(1, b_i / ||P_Omega(c V^T)||)`` with ``b_i = bound sqrt(n_i)``.

All kernels take raw arrays and write into preallocated outputs; each has a NumPy
reference below, checked in ``tests/kernels/test_fw.py``.
"""

from __future__ import annotations

import math

import numpy as np
from streamdp.kernels.jit import njit


@njit(cache=True, nogil=True)
def fw_step(indptr, items, x, C_in, V, s, lam, eta, k, clip, bound, C_out, resid):
    """Local step ``s`` (0-based) of every user of a block; the residuals after it.

    ``C_in`` (``n_users x T``) holds the coefficients after ``s`` steps (columns ``>= s``
    are ignored); ``C_out`` gets those after step ``s`` (columns ``> s`` zero) and
    ``resid[p] = P_Omega(Y_i)_p - x[p]`` for the new row. ``lam <= 0`` means no
    direction (``u_hat = 0``: only the shrinking by ``1 - eta``). ``clip`` bounds the
    residual row's norm in ``u_hat`` and ``bound`` is the projection's per-rating
    scale (``inf``: none).
    """
    T = C_out.shape[1]
    for u in range(len(indptr) - 1):
        a0 = indptr[u]
        a1 = indptr[u + 1]
        g = 0.0
        na = 0.0
        sv = 0.0
        yv = 0.0
        for p in range(a0, a1):
            j = items[p]
            pred = 0.0
            for q in range(s):
                pred += C_in[u, q] * V[j, q]
            a = pred - x[p]
            g += a * V[j, s]
            na += a * a
            sv += V[j, s] * V[j, s]
            yv += pred * V[j, s]
        uhat = _direction(g, na, sv, yv, clip, lam, eta, k)
        for q in range(s):
            C_out[u, q] = (1.0 - eta) * C_in[u, q]
        C_out[u, s] = -eta * k * uhat
        for q in range(s + 1, T):
            C_out[u, q] = 0.0
        nrm2 = 0.0
        for p in range(a0, a1):
            j = items[p]
            pred = 0.0
            for q in range(s + 1):
                pred += C_out[u, q] * V[j, q]
            resid[p] = pred
            nrm2 += pred * pred
        f = _shrink(nrm2, bound, a1 - a0)
        if f != 1.0:
            for q in range(s + 1):
                C_out[u, q] *= f
        for p in range(a0, a1):
            resid[p] = f * resid[p] - x[p]


@njit(cache=True, nogil=True)
def _direction(g, na2, sv, yv, clip, lam, eta, k):
    """A user's ``u_hat``: her own line search along ``v``, within the Frank-Wolfe atom's ``|u_fw|``.

    ``g = a . v``, ``na2 = ||a||^2`` (``a`` her residual row at her items), ``sv = ||v|_Omega||^2``,
    ``yv = P_Omega(Y_i) . v``. The FW value is ``u_fw = f g / lam`` with
    ``f = min(1, clip / sqrt(na2))`` (0 when ``lam <= 0``); the step
    ``Y_i <- (1 - eta) Y_i - eta k u_hat v^T`` minimizes her loss at her items for
    ``u_ls = (g - eta yv) / (eta k sv)``; the result is ``u_ls`` clipped to
    ``[-|u_fw|, |u_fw|]``: never a larger atom than Alg. 1's, never a larger loss.
    """
    if not lam > 0:
        return 0.0
    f = 1.0
    if na2 > clip * clip:
        f = clip / math.sqrt(na2)
    ufw = abs(f * g / lam)
    d = eta * k * sv
    if not d > 0:
        return 0.0
    uls = (g - eta * yv) / d
    return min(max(uls, -ufw), ufw)


@njit(cache=True, nogil=True)
def _shrink(nrm2, bound, n):
    """``min(1, bound sqrt(n) / sqrt(nrm2))`` (1 when ``bound`` is infinite or the row is within it)."""
    if not bound < np.inf or n == 0:
        return 1.0
    b = bound * math.sqrt(n)
    if nrm2 > b * b:
        return b / math.sqrt(nrm2)
    return 1.0


@njit(cache=True, nogil=True)
def fw_replay(indptr, items, x, V, lam, eta, k, clip, bound, C_out):
    """All ``len(lam)`` local steps of every user from ``Y_i = 0``: what a user runs on her device.

    The same arithmetic as ``len(lam)`` calls of :func:`fw_step`, with the predictions
    at the user's items updated incrementally (``O(T n_i)`` per user instead of
    ``O(T^2 n_i)``). ``C_out`` (``n_users x T``) gets the final coefficients.
    """
    T = len(lam)
    longest = 0
    for u in range(len(indptr) - 1):
        longest = max(longest, indptr[u + 1] - indptr[u])
    pred = np.zeros(longest, dtype=np.float64)
    for u in range(len(indptr) - 1):
        a0 = indptr[u]
        a1 = indptr[u + 1]
        for p in range(a1 - a0):
            pred[p] = 0.0
        for q in range(C_out.shape[1]):
            C_out[u, q] = 0.0
        for t in range(T):
            g = 0.0
            na = 0.0
            sv = 0.0
            yv = 0.0
            for p in range(a0, a1):
                y = pred[p - a0]
                a = y - x[p]
                vt = V[items[p], t]
                g += a * vt
                na += a * a
                sv += vt * vt
                yv += y * vt
            e = eta[t]
            uhat = _direction(g, na, sv, yv, clip, lam[t], e, k)
            a = -e * k * uhat
            nrm2 = 0.0
            for p in range(a0, a1):
                y = (1.0 - e) * pred[p - a0] + a * V[items[p], t]
                pred[p - a0] = y
                nrm2 += y * y
            for q in range(t):
                C_out[u, q] *= 1.0 - e
            C_out[u, t] = a
            f = _shrink(nrm2, bound, a1 - a0)
            if f != 1.0:
                for q in range(t + 1):
                    C_out[u, q] *= f
                for p in range(a1 - a0):
                    pred[p] *= f


@njit(cache=True, nogil=True)
def project_rows(indptr, items, x, V, n_items, C_out):
    """``C_out[u] = (n_items / n_u) sum_{p in I_u} x[p] V[items[p]]``: the SVD baseline's local projection.

    ``P_Omega(x_u) V`` rescaled by the inverse of the user's own sampling rate
    ``n_u / n_items`` (0 for a user without ratings).
    """
    r = V.shape[1]
    for u in range(len(indptr) - 1):
        a0 = indptr[u]
        a1 = indptr[u + 1]
        for d in range(r):
            C_out[u, d] = 0.0
        if a1 == a0:
            continue
        for p in range(a0, a1):
            j = items[p]
            xp = x[p]
            for d in range(r):
                C_out[u, d] += xp * V[j, d]
        f = n_items / (a1 - a0)
        for d in range(r):
            C_out[u, d] *= f


@njit(cache=True, nogil=True)
def gram_upper(indptr, items, values, out):
    """``out += `` the upper triangle (diagonal included) of ``A^T A`` for the CSR rows ``(indptr, items, values)``.

    Each pair of one user's ratings adds ``x_p x_q`` to ``out[min(j, l), max(j, l)]``
    once; the lower triangle of ``out`` is not touched (see
    :func:`streamdp.kernels.als.symmetrize_upper`). Cost ``sum_u n_u (n_u + 1) / 2``.
    """
    for u in range(len(indptr) - 1):
        a0 = indptr[u]
        a1 = indptr[u + 1]
        for p in range(a0, a1):
            j = items[p]
            xp = values[p]
            for q in range(p, a1):
                l = items[q]
                if j <= l:
                    out[j, l] += xp * values[q]
                else:
                    out[l, j] += xp * values[q]


# -- NumPy references (tests) ---------------------------------------------------------------------------------------
def fw_step_reference(indptr, items, x, C_in, V, s, lam, eta, k, clip, bound):
    """NumPy reference of :func:`fw_step`: ``(C_out, resid)``."""
    n_users, T = C_in.shape
    C_out = np.zeros((n_users, T))
    resid = np.zeros(len(items))
    for u in range(n_users):
        sl = slice(indptr[u], indptr[u + 1])
        Vi = V[items[sl]]
        y = Vi[:, :s] @ C_in[u, :s]
        a = y - x[sl]
        na = float(np.linalg.norm(a))
        f = clip / na if na > clip else 1.0
        vs = Vi[:, s]
        uhat = 0.0
        if lam > 0 and vs @ vs > 0:
            ufw = abs(f * float(a @ vs) / lam)
            uls = float(a @ vs - eta * (y @ vs)) / (eta * k * float(vs @ vs))
            uhat = float(np.clip(uls, -ufw, ufw))
        c = np.zeros(T)
        c[:s] = (1.0 - eta) * C_in[u, :s]
        c[s] = -eta * k * uhat
        p = Vi @ c
        n = len(p)
        nrm = float(np.linalg.norm(p))
        if np.isfinite(bound) and n and nrm > bound * np.sqrt(n):
            c *= bound * np.sqrt(n) / nrm
        C_out[u] = c
        resid[sl] = Vi @ c - x[sl]
    return C_out, resid


def fw_replay_reference(indptr, items, x, V, lam, eta, k, clip, bound):
    """NumPy reference of :func:`fw_replay`: ``len(lam)`` calls of :func:`fw_step_reference`."""
    C = np.zeros((len(indptr) - 1, V.shape[1]))
    for s in range(len(lam)):
        C, _ = fw_step_reference(indptr, items, x, C, V, s, lam[s], eta[s], k, clip, bound)
    return C


def project_rows_reference(indptr, items, x, V, n_items):
    """SciPy reference of :func:`project_rows`."""
    import scipy.sparse as sp

    counts = np.diff(indptr)
    A = sp.csr_matrix((np.asarray(x, np.float64), items, indptr), shape=(len(indptr) - 1, n_items))
    return (A @ V) * np.where(counts > 0, n_items / np.maximum(counts, 1), 0.0)[:, None]


def gram_upper_reference(indptr, items, values, n_items):
    """SciPy reference of :func:`gram_upper`: ``triu(A^T A)``."""
    import scipy.sparse as sp

    A = sp.csr_matrix((np.asarray(values, np.float64), items, indptr), shape=(len(indptr) - 1, n_items))
    return np.triu((A.T @ A).toarray())
