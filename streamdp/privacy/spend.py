"""A store's spend, composed incrementally: each release adds its own events to the composition of those before.

:meth:`streamdp.privacy.budget.StoreBudget.reserve` composes every counted release of
the store with the accountant. Composed from scratch, that cost grew with the store's
history (a store with 400 releases took seconds per ``train``). Here the accountants'
states after the first ``n`` releases (RDP: the vector over orders; PLD: the discretized
privacy-loss distribution) are kept in ``STORE/privacy_budget.spend``
(:class:`SpendComposer`), and ``n + m`` releases compose only the last ``m`` onto them.
dp-accounting does every composition; nothing here adds epsilons.

Decisions a reader must know:

* it **equals the composition from scratch**, to the float: both accountants compose
  sequentially and the state is stored exactly (checked against :func:`full_spend`);
* a PLD is continued only on its own grid: :func:`ledger_grid` rounds the RDP epsilon
  *down* to a power of two (never coarser than the per-release rule), so the composition
  is redone from scratch a logarithmic number of times in a store's history;
* a state is used only if the chained SHA-256 of the ledger's first ``n`` releases
  matches; a damaged file is ignored; it is a cache, not a record;
* whoever can write the store can forge it, so a state's RDP vector is checked against
  the ledger's closed-form RDP composition, and :class:`~streamdp.privacy.budget.StoreBudget`
  recomposes from scratch (:meth:`SpendComposer.recompose`) when a claim is below the
  largest single release or a budget decision rests on the cache; ``streamdp budget
  --verify`` recomposes from scratch.

Design notes (why it equals a full composition, the grid, the cache's key and trust):
docs/design-notes.md#streamdpprivacyspendpy.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import zipfile

import numpy as np
from dp_accounting.pld import pld_pmf as _pmf
from dp_accounting.pld import privacy_loss_distribution as _pld

from streamdp.privacy.accountant import DP_ACCOUNTING_VERSION, pld_accountant, pld_grid, rdp_accountant
from streamdp.privacy.events import compose, event_from_dict
from streamdp.privacy.journal import canonical
from streamdp.storage import remote

__all__ = ["SPEND_FILE", "SpendComposer", "full_spend", "ledger_grid"]

#: The composition cache beside the ledger (``STORE/privacy_budget.spend``).
SPEND_FILE = "privacy_budget.spend"
_FORMAT = "streamdp-spend-cache-1"
#: How many states the file keeps (before and after the last reservation: the next one continues from one of them).
_KEEP = 2


def ledger_grid(event, eps_rdp: float) -> float:
    """The PLD grid of a ledger's composition: :func:`~streamdp.privacy.accountant.pld_grid` at ``eps_rdp`` rounded
    down to a power of two (see "Its grid").

    >>> ledger_grid(compose([]), 3.0) == ledger_grid(compose([]), 2.0) == 2e-3
    True
    """
    scale = max(eps_rdp, 1.0) if math.isfinite(eps_rdp) else 1.0
    return pld_grid(event, 2.0 ** math.floor(math.log2(scale)))


def _digests(event_lists: list[list[dict]]) -> list[str]:
    """``h[i]``: the chained hash of the first ``i`` releases' events (``h[0]`` of none)."""
    h = [""]
    for events in event_lists:
        h.append(hashlib.sha256((h[-1] + canonical(events)).encode()).hexdigest())
    return h


class _State:
    """The accountants after the first ``n`` releases: ``rdp`` (vector over the RDP accountant's orders) and, on
    ``grid``, the PLD ``pld`` and whether a non-private event was seen (``non_dp``)."""

    def __init__(self, n: int, key: str, rdp: np.ndarray, grid: float | None = None, pld=None,
                 non_dp: bool = False):
        self.n, self.key, self.rdp, self.grid, self.pld, self.non_dp = n, key, rdp, grid, pld, non_dp


class SpendComposer:
    """Composes ledgers' events with dp-accounting, continuing from the states in ``cache`` (a path or URL of
    :data:`SPEND_FILE`; None: none). :meth:`spend` as often as needed, then :meth:`save`. ``checked``: a state
    is used only if its RDP vector is the releases' own (module docstring)."""

    def __init__(self, cache: str | os.PathLike | None, *, checked: bool = True):
        self.cache = None if cache is None else str(cache)
        #: False: the cache's states are taken as they are (what ``budget --verify`` compares with the truth)
        self.checked = checked
        self._states: list[_State] | None = None
        self._made: list[_State] = []

    def _known(self) -> list[_State]:
        if self._states is None:
            self._states = _load(self.cache) if self.cache is not None else []
        return self._states + self._made

    def spend(self, event_lists: list[list[dict]], delta: float) -> tuple[float, float]:
        """``(epsilon, epsilon_rdp)`` of the releases whose events (as the ledger records them) are ``event_lists``,
        in ledger order, at ``delta``: PLD on :func:`ledger_grid`, RDP beside it."""
        h = _digests(event_lists)
        n = len(event_lists)
        usable = [s for s in self._known() if s.n <= n and h[s.n] == s.key]
        rdp_from = max(usable, key=lambda s: s.n, default=None)
        rdp = rdp_accountant()
        start = 0
        if rdp_from is not None and len(rdp_from.rdp) == len(rdp._orders):
            rdp._rdp = rdp_from.rdp.copy()
            start = rdp_from.n
        rdp.compose(_events(event_lists[start:]))
        if start and self.checked and not _rdp_matches(rdp._rdp, event_lists):  # forged or stale: none of it is used
            return self.recompose(event_lists, delta)
        eps_rdp, _ = rdp.get_epsilon_and_optimal_order(delta)
        eps_rdp = float(eps_rdp)
        unique = {canonical(ev): ev for events in event_lists for ev in events}
        grid = ledger_grid(_events([list(unique.values())]), eps_rdp)

        pld = pld_accountant(grid)
        on_grid = [s for s in usable if s.grid == grid and s.pld is not None]
        start = 0
        if on_grid:
            best = max(on_grid, key=lambda s: s.n)
            pld._pld, pld._contains_non_dp_event, start = best.pld, best.non_dp, best.n
        try:
            pld.compose(_events(event_lists[start:]))
            eps = float(pld.get_epsilon(delta))
        except OverflowError:  # as epsilon_of: beyond float64, inf bounds it
            return math.inf, eps_rdp
        self._made.append(_State(n, h[n], rdp._rdp.copy(), grid, pld._pld, pld._contains_non_dp_event))
        return eps, eps_rdp

    def recompose(self, event_lists: list[list[dict]], delta: float) -> tuple[float, float]:
        """:meth:`spend` from scratch, trusting no state read from the cache (nor composed on one): what the budget
        runs when a cached claim is implausible or decides a release (:mod:`streamdp.privacy.budget`). The next
        :meth:`save` replaces the file's states with the ones composed here."""
        self._states, self._made = [], []
        return self.spend(event_lists, delta)

    def save(self) -> None:
        """Keep the last states composed (best effort: a cache that cannot be written is composed again)."""
        if self.cache is None or not self._made:
            return
        keep, seen = [], set()
        for s in [*reversed(self._made), *(self._states or [])]:  # the newest first
            if (s.n, s.key, s.grid) not in seen and s.pld is not None:
                seen.add((s.n, s.key, s.grid))
                keep.append(s)
        with contextlib.suppress(OSError, ValueError):
            _save(self.cache, keep[:_KEEP])


def full_spend(event_lists: list[list[dict]], delta: float) -> tuple[float, float]:
    """What :meth:`SpendComposer.spend` returns, composed from scratch (no cache): the reference it must equal."""
    return SpendComposer(None).spend(event_lists, delta)


def _rdp_matches(rdp: np.ndarray, event_lists: list[list[dict]]) -> bool:
    """Whether ``rdp`` (an RDP vector continued from a cached state) is the RDP composition of ``event_lists`` from
    scratch: cheap (closed forms summed over the orders, no PLD), so it is checked every time a state is used. A
    state whose vector was zeroed or lowered is then never used, its PLD neither."""
    fresh = rdp_accountant()
    fresh.compose(_events(event_lists))
    return bool(np.allclose(rdp, fresh._rdp, rtol=1e-9, atol=1e-12))


def _events(event_lists: list[list[dict]]):
    return compose([event_from_dict(ev) for events in event_lists for ev in events])


# -- the file ------------------------------------------------------------------------------------------------------


def _pmf_arrays(pmf, prefix: str) -> tuple[dict, dict]:
    meta = {"discretization": float(pmf._discretization), "infinity_mass": float(pmf._infinity_mass),
            "pessimistic": bool(pmf._pessimistic_estimate)}
    if isinstance(pmf, _pmf.DensePLDPmf):
        meta.update(kind="dense", lower_loss=int(pmf._lower_loss))
        return meta, {prefix + "probs": np.asarray(pmf._probs, dtype=np.float64)}
    if isinstance(pmf, _pmf.SparsePLDPmf):
        meta["kind"] = "sparse"
        losses = list(pmf._loss_probs)  # in the dict's order: a sparse composition sums in that order
        return meta, {prefix + "losses": np.asarray(losses, dtype=np.int64),
                      prefix + "probs": np.asarray([pmf._loss_probs[k] for k in losses], dtype=np.float64)}
    raise ValueError(f"unknown PLD pmf {type(pmf).__name__}")


def _pmf_from(meta: dict, arrays, prefix: str):
    if meta["kind"] == "dense":
        return _pmf.DensePLDPmf(meta["discretization"], meta["lower_loss"], np.array(arrays[prefix + "probs"]),
                                meta["infinity_mass"], meta["pessimistic"])
    losses, probs = arrays[prefix + "losses"].tolist(), arrays[prefix + "probs"].tolist()
    return _pmf.SparsePLDPmf(dict(zip(losses, probs)), meta["discretization"], meta["infinity_mass"],
                             meta["pessimistic"])


def _checksum(meta_text: str, arrays: dict) -> str:
    h = hashlib.sha256(meta_text.encode())
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def _save(path: str, states: list[_State]) -> None:
    metas, arrays = [], {}
    for i, s in enumerate(states):
        p = s.pld
        rm, a = _pmf_arrays(p._pmf_remove, f"s{i}_remove_")
        arrays.update(a)
        add = None
        if not p._symmetric:
            add, a = _pmf_arrays(p._pmf_add, f"s{i}_add_")
            arrays.update(a)
        arrays[f"s{i}_rdp"] = np.asarray(s.rdp, dtype=np.float64)
        metas.append({"n": s.n, "key": s.key, "grid": s.grid, "non_dp": bool(s.non_dp), "remove": rm, "add": add})
    meta_text = json.dumps({"format": _FORMAT, "dp_accounting": DP_ACCOUNTING_VERSION, "states": metas},
                           sort_keys=True)
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(meta_text), checksum=np.array(_checksum(meta_text, arrays)), **arrays)
    data = buf.getvalue()
    if remote.is_url(path):
        remote.put(path, data)
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _load(path: str) -> list[_State]:
    """The states in the cache at ``path``; none if there is no file or it is not one this code wrote whole."""
    try:
        if remote.is_url(path):
            data = remote.read_bytes(path)
            if data is None:
                return []
        else:
            if not os.path.isfile(path):
                return []
            with open(path, "rb") as fh:
                data = fh.read()
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta_text = str(arrays.pop("meta"))
        if str(arrays.pop("checksum")) != _checksum(meta_text, arrays):
            return []
        meta = json.loads(meta_text)
        if meta.get("format") != _FORMAT or meta.get("dp_accounting") != DP_ACCOUNTING_VERSION:
            return []
        out = []
        for i, m in enumerate(meta["states"]):
            remove = _pmf_from(m["remove"], arrays, f"s{i}_remove_")
            add = None if m["add"] is None else _pmf_from(m["add"], arrays, f"s{i}_add_")
            out.append(_State(int(m["n"]), str(m["key"]), np.array(arrays[f"s{i}_rdp"]), float(m["grid"]),
                              _pld.PrivacyLossDistribution(remove, add), bool(m["non_dp"])))
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile):
        return []  # no cache, or a damaged one: composed from scratch
