"""Each user's privacy over a store's lifetime: an individual Renyi filter (Feldman & Zrnic 2021).

A store's **user budget** ``(epsilon, delta)`` (``ingest --user-budget``, ``budget --set-user``)
caps what every user loses over every release from the store. It is a filter at one RDP
order ``alpha`` with bound ``B``: user ``i`` takes part in a release only if her accumulated
RDP at ``alpha`` plus the release's stays ``<= B``; then every user is ``(epsilon', delta)``-DP
over the whole sequence, ``epsilon'`` dp-accounting's conversion of ``B`` at ``alpha``
(:func:`~streamdp.privacy.accountant.rdp_epsilon`). :func:`filter_parameters` picks ``alpha``
among dp-accounting's orders as the one where most Gaussian releases fit (``B(alpha)/alpha``
largest: a Gaussian's RDP grows linearly in ``alpha``), ``B(alpha)`` the largest with
``epsilon' <= epsilon``.

A release's RDP at ``alpha`` is the same for every user who contributes to it (user-level
sensitivity), 0 for one who does not (not yet a user; ``contributors``: the hook a window
fills). It is charged in stages (:func:`advance`): the pre-fit count of users first, then
the rest; a user who cannot afford a stage is **retired** (left out of it and of every later
release) and charged only the stages before it. Retired users' rows are dropped on read
(:class:`~streamdp.storage.retired.RetiredView`).

Out of core: each release writes a new **generation** ``STORE/user_spend/ENTRY/`` (Zarr:
``rdp`` float64 and ``retired`` bool per user), streamed block by block from the one before,
before its budget entry is reserved (the entry records it, :data:`FILTER_DIR`). The current
generation is the last counted entry's: a failed release spends nothing on anyone.
Public names: :func:`filter_parameters`, :func:`parse_user_budget`, :func:`current`,
:class:`FilterState`, :class:`FilterMask`, :class:`FilterRequest`, :func:`advance`,
:func:`prune`, :func:`distribution`, :func:`statement`.
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from streamdp.errors import ParameterError, StoreError
from streamdp.privacy.accountant import check_privacy_params, filter_orders, parse_epsilon, rdp_at_order, rdp_epsilon

__all__ = ["FILTER_DIR", "BLOCK", "filter_parameters", "parse_user_budget", "current", "FilterState", "FilterMask",
           "FilterRequest", "advance", "prune", "distribution", "statement", "summary"]

#: Where the generations of the per-user state live, inside the store's directory.
FILTER_DIR = "user_spend"
#: Users a pass over the per-user state reads or writes at a time.
BLOCK = 1 << 20
#: Users a Zarr chunk of a generation holds (a divisor of :data:`BLOCK`): a view reads the chunks of one store block.
CHUNK = 1 << 16
#: The statuses whose entries count (as :data:`streamdp.privacy.budget.COUNTED`).
_COUNTED = ("reserved", "complete", "stale")
PAPER = "individual Renyi filter (Feldman & Zrnic 2021, 'Individual privacy accounting via a Renyi filter')"


def filter_parameters(epsilon: float, delta: float) -> dict:
    """``{"epsilon", "delta", "alpha", "bound", "epsilon_guarantee"}`` of the filter for the cap ``(epsilon, delta)``.

    >>> p = filter_parameters(5.0, 1e-6)
    >>> p["alpha"], round(p["bound"], 3), p["epsilon_guarantee"] <= 5.0
    (6.1, 2.825, True)
    """
    best = None
    for a in filter_orders():
        c = rdp_epsilon(a, epsilon, delta) - epsilon  # the conversion is rdp + c(alpha) above rdp ~ delta^2
        bound = epsilon - c
        if not bound > 0:
            continue
        eps = rdp_epsilon(a, bound, delta)
        while eps > epsilon and bound > 0:  # a float's last bit: stay at or under the cap
            bound = math.nextafter(bound, 0.0)
            eps = rdp_epsilon(a, bound, delta)
        if bound > 0 and (best is None or bound / a > best[1] / best[0]):
            best = (a, bound, eps)
    if best is None:
        raise ParameterError(f"--user-budget {epsilon:g},{delta:g}: too small a cap for any Renyi order to convert "
                             f"to it at that delta (raise epsilon or delta)")
    return {"epsilon": float(epsilon), "delta": float(delta), "alpha": best[0], "bound": best[1],
            "epsilon_guarantee": best[2]}


def parse_user_budget(text, *, n_users: int, flag: str = "--user-budget") -> tuple[float, float]:
    """``(epsilon, delta)`` from ``"EPS[,DELTA]"`` (DELTA by default the store's default delta); one-line errors.

    >>> parse_user_budget("5", n_users=943)
    (5.0, 1e-06)
    """
    from streamdp.privacy.params import default_delta

    parts = [p.strip() for p in str(text).split(",")] if isinstance(text, str) else list(text)
    if not 1 <= len(parts) <= 2:
        raise ParameterError(f"{flag}: expected EPSILON[,DELTA], got {text!r}")
    eps = parse_epsilon(parts[0], flag)
    if not math.isfinite(eps):
        raise ParameterError(f"{flag}: a cap must be finite (leave it out for no per-user cap)")
    try:
        delta = float(parts[1]) if len(parts) == 2 else default_delta(n_users)
    except ValueError:
        raise ParameterError(f"{flag}: expected EPSILON[,DELTA], got {text!r}") from None
    try:
        check_privacy_params(eps, delta, n_users=n_users)
    except ParameterError as exc:
        raise ParameterError(f"{flag}: {exc}") from None
    return eps, delta


def current(entries: list) -> str | None:
    """The current generation: the last counted entry's (``None``: no release under the filter yet)."""
    for e in reversed(entries):
        if e["status"] in _COUNTED and isinstance(e.get("user_filter"), dict):
            return e["user_filter"]["generation"]
    return None


@dataclass
class FilterState:
    """The per-user state of one generation (``generation=None``: before the first release), read by blocks.

    A user past the generation's length (appended since) has spent nothing and is not retired; one below
    ``carried_users`` (a user when the budget was set) starts at ``carried_rdp`` (the releases before it).
    """

    store: str
    user_budget: dict
    generation: str | None

    @property
    def path(self) -> Path | None:
        return None if self.generation is None else Path(self.store) / FILTER_DIR / self.generation

    def __post_init__(self):
        self._group = None
        self.n = 0
        if self.generation is not None:
            try:
                self._group = zarr.open_group(str(self.path), mode="r")
                self.n = int(self._group["rdp"].shape[0])
            except Exception as exc:  # a missing or damaged generation: nothing may be released on a guess
                raise StoreError(f"{self.path}: the per-user privacy state of the store's last release cannot be "
                                 f"read ({type(exc).__name__}); restore it from a backup") from None

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rdp, retired)`` of users ``lo .. hi - 1``."""
        rdp = np.zeros(hi - lo, np.float64)
        retired = np.zeros(hi - lo, bool)
        top = min(hi, self.n)
        if lo < top:
            rdp[:top - lo] = self._group["rdp"][lo:top]
            retired[:top - lo] = self._group["retired"][lo:top]
        ub = self.user_budget
        c_hi = min(hi, int(ub.get("carried_users", 0)))
        start = max(lo, self.n)
        if start < c_hi:
            rdp[start - lo:c_hi - lo] = float(ub.get("carried_rdp", 0.0))
        return rdp, retired


@dataclass(frozen=True)
class FilterMask:
    """Which users a read keeps (picklable, for :class:`~streamdp.storage.retired.RetiredView`): those not retired
    in ``generation`` whose accumulated RDP plus ``threshold`` stays within the bound (``threshold=None``: not
    retired only)."""

    store: str
    user_budget: dict = field(hash=False, compare=False)
    generation: str | None
    threshold: float | None = None

    @property
    def key(self):
        return ("user-filter", self.store, self.generation, self.threshold)

    def keep(self, lo: int, hi: int) -> np.ndarray:
        rdp, retired = FilterState(self.store, self.user_budget, self.generation).read(lo, hi)
        keep = ~retired
        if self.threshold is not None:
            keep &= rdp + self.threshold <= self.user_budget["bound"]
        return keep

    def count(self, n_users: int) -> int:
        """How many of the first ``n_users`` users are kept (read block by block)."""
        return sum(int(self.keep(lo, min(n_users, lo + BLOCK)).sum()) for lo in range(0, n_users, BLOCK))


@dataclass
class FilterRequest:
    """What a release asks of the filter when it is reserved.

    ``generation``: the generation its view was made from (the release is refused if another release advanced the
    filter since); ``n_users``: the store's users at release time; ``stages``: the RDP at the filter's order of the
    parts of the release that read the data before the rest (the count of users), charged first;
    ``contributors(lo, hi)``: which users contributed a rating to it (``None``: every user of the store; a period's
    users, :func:`streamdp.storage.timeline.contributors`, for a run on a time window or the store as of a
    segment). ``result`` is set by the reservation (the entry's ``user_filter`` record), ``view`` is the run's
    :class:`~streamdp.storage.retired.RetiredView`.
    """

    generation: str | None
    n_users: int
    stages: list = field(default_factory=list)
    contributors: object = None
    view: object = None
    user_budget: dict | None = None
    result: dict | None = None


def advance(store: str | os.PathLike, user_budget: dict, entries: list, entry: dict,
            request: FilterRequest) -> dict:
    """Write the generation after the release ``entry`` (its events) and return its ``user_filter`` record.

    Streams the current generation block by block into ``STORE/user_spend/ENTRY`` (written beside, renamed into
    place). Each contributing user not retired is charged the release's stages while she can afford them: all of
    them (she takes part), or the first few (she is retired now, charged those). Under the budget's lock.
    """
    gen = current(entries)
    if gen != request.generation:
        raise StoreError(f"{store}: another release from this store was reserved while this run prepared its own "
                         f"(the per-user filter moved on); nothing was released, run again")
    alpha, bound = user_budget["alpha"], user_budget["bound"]
    from streamdp.privacy.events import compose, event_from_dict

    r = rdp_at_order(compose([event_from_dict(e) for e in entry["events"]]), alpha) if entry["events"] else 0.0
    if not math.isfinite(r) or r > bound:
        raise ParameterError(f"{store}: this release alone (RDP {r:.4g} at order {alpha:g}) is past every user's "
                             f"cap (bound {bound:.4g}): no user could take part; release with a smaller epsilon")
    stages = sorted({float(s) for s in request.stages if 0 < s < r}) + [r]
    old = FilterState(str(store), user_budget, gen)
    final = Path(store) / FILTER_DIR / entry["id"]
    tmp = final.with_name(f".{entry['id']}.{uuid.uuid4().hex[:8]}.tmp")
    n = max(int(request.n_users), old.n)  # a view of fewer users (the store as of a segment) keeps the others' spend
    counts = {"participants": 0, "retired_now": 0, "retired_total": 0}
    try:
        g = zarr.open_group(str(tmp), mode="w")
        chunk = (max(1, min(n, CHUNK)),)
        out_rdp = g.create_array("rdp", shape=(n,), dtype="float64", chunks=chunk)
        out_ret = g.create_array("retired", shape=(n,), dtype="bool", chunks=chunk)
        for lo in range(0, n, BLOCK):
            hi = min(n, lo + BLOCK)
            rdp, retired = old.read(lo, hi)
            contrib = np.ones(hi - lo, bool) if request.contributors is None else \
                np.asarray(request.contributors(lo, hi), bool)
            new_rdp, new_ret, k, now = _charge(rdp, retired, contrib, stages, bound)
            out_rdp[lo:hi] = new_rdp
            out_ret[lo:hi] = new_ret
            counts["participants"] += k
            counts["retired_now"] += now
            counts["retired_total"] += int(new_ret.sum())
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"generation": entry["id"], "from": gen, "alpha": alpha, "bound": bound, "release_rdp": r,
            "stages": stages, "n_users": n, **counts}


def _charge(rdp, retired, contrib, stages, bound):
    """One block of :func:`advance`: ``(rdp, retired, participants, retired now)`` after the release."""
    active = contrib & ~retired
    charge = np.zeros(len(rdp))
    for s in stages:  # increasing: the last affordable stage is what she is charged
        charge = np.where(active & (rdp + s <= bound), s, charge)
    takes_part = active & (rdp + stages[-1] <= bound)
    now = active & ~takes_part
    return rdp + charge, retired | now, int(takes_part.sum()), int(now.sum())


def prune(store: str | os.PathLike, entries: list) -> None:
    """Remove the generations nothing needs: those of failed entries, those superseded by the last complete one,
    and any left by a run killed before its reservation was recorded. Under the budget's lock."""
    root = Path(store) / FILTER_DIR
    if not root.is_dir():
        return
    gens = [e for e in entries if isinstance(e.get("user_filter"), dict)]
    last = max((i for i, e in enumerate(gens) if e["status"] == "complete"), default=0)
    keep = {e["id"] for i, e in enumerate(gens) if i >= last and e["status"] in _COUNTED}
    for p in root.iterdir():
        if p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)


def distribution(store: str | os.PathLike, user_budget: dict, entries: list, n_users: int, *,
                 bins: int = 10, fine: int = 2000) -> dict:
    """The users' spend (epsilon at the cap's delta of each one's accumulated RDP), read block by block.

    Returns ``n_users``, ``retired``, ``none`` (users who spent nothing), ``quantiles`` (0, 0.5, 0.9, 0.99, 1: 0
    for a user who spent nothing, else the upper edge of her bin of ``B / fine`` in RDP, converted) and
    ``histogram``: ``bins`` equal bins of RDP over ``(0, B]`` as ``[share_lo, share_hi, epsilon_hi, count]``
    (shares of ``B``; ``over_cap``: a spend carried from before the cap above it). Memory: one block and the bins.
    """
    state = FilterState(str(store), user_budget, current(entries))
    alpha, bound, delta = user_budget["alpha"], user_budget["bound"], user_budget["delta"]
    hist = np.zeros(fine + 2, np.int64)  # 0: nothing spent; 1..fine: (B (i-1)/fine, B i/fine]; fine+1: above B
    retired = 0
    for lo in range(0, n_users, BLOCK):
        rdp, ret = state.read(lo, min(n_users, lo + BLOCK))
        retired += int(ret.sum())
        idx = np.minimum(np.ceil(rdp / bound * fine).astype(np.int64), fine + 1)
        hist += np.bincount(idx, minlength=fine + 2)
    cum = np.cumsum(hist)

    def eps(x):
        return rdp_epsilon(alpha, x, delta) if x > 0 else 0.0

    quantiles = {}
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        if n_users == 0:
            break
        i = int(np.searchsorted(cum, max(1, math.ceil(q * n_users))))
        quantiles[f"{q:g}"] = eps(bound * i / fine) if i <= fine else math.inf
    coarse = [[k / bins, (k + 1) / bins, eps(bound * (k + 1) / bins),
               int(hist[1 + k * fine // bins:1 + (k + 1) * fine // bins].sum())] for k in range(bins)]
    return {"n_users": n_users, "retired": retired, "none": int(hist[0]), "quantiles": quantiles,
            "histogram": coarse, "over_cap": int(hist[fine + 1])}


def statement(user_budget: dict, record: dict) -> dict:
    """What ``privacy.json`` states of the filter for a release (``record``: its entry's ``user_filter``): the cap,
    the filter and the per-user guarantee, none of the record's counts of users (exact statistics)."""
    return {
        "filter": PAPER,
        "per_user_guarantee": {"epsilon": rdp_epsilon(user_budget["alpha"], user_budget["bound"],
                                                      user_budget["delta"]),
                               "delta": user_budget["delta"],
                               "holds_for": "every user of the store, over every release from it (lifetime)"},
        "cap": {"epsilon": user_budget["epsilon"], "delta": user_budget["delta"]},
        "alpha": user_budget["alpha"], "bound_rdp": user_budget["bound"],
        "release_rdp": record["release_rdp"], "stages_rdp": record["stages"],
        "retired": ("users whose next release would cross the cap are left out of it and of every later one; how "
                    "many is an exact count of the data, kept in the store's budget ledger (streamdp budget STORE) "
                    "and never written into a model"),
    }


def summary(record: dict) -> dict:
    """What ``train`` prints for the data owner (exact counts: never in a model): ``participants``, ``retired_now``,
    ``retired_total``."""
    return {k: record[k] for k in ("participants", "retired_now", "retired_total")}
