"""A store's ratings in time: a time window (``train --since/--until/--window``), the store as of a segment
(``train --until-segment``), and a segment as the future a model must predict (``evaluate --segment``).

Views of an opened store, like :class:`~streamdp.storage.catalogue.CatalogueView`: every method, the
evaluator and the lists read them like any store.

Decisions a reader must know:

* a window is ``[since, until)`` in UTC seconds (times of a store that keeps them, :mod:`.schema`); ``--window
  90d`` ends at ``--until`` if given, else at the wall clock of the run, never at the newest rating: that one
  is read off the data (a release whose period ends at it would publish when the last rating was made), while
  ``--until`` and the clock are public (the user chose the first, anyone knows the second); the window is
  recorded in the model and the ledger (``data_window``: public, the user chose it);
* the window keeps ratings by their own time, block by block on read (:func:`~streamdp.kernels.window.keep_window`,
  inside the memory limit); a user with no rating in it has an empty row: she contributes nothing
  (:meth:`TimeWindowView.contributed`, per block), and the released user count counts only those who do;
* the store **as of segment N** is the base and its first ``N`` segments, as it read after the ``N``-th append
  (its checksum is the one committed then, so a model trained on it and one trained before the next append
  carry the same fingerprint);
* **evaluate --segment K** scores on segment ``K``'s own ratings (train and test parts: all of them are the
  future) with the store as of segment ``K - 1`` as the users' training ratings; a model trained on the store
  as of ``K - 1`` (``train --until-segment K-1``, or trained before the ``K``-th append) matches it, any other
  is refused as for another store. A user or item new in segment ``K`` is a cold one.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import replace

import numpy as np

from streamdp.errors import ParameterError, StoreError
from streamdp.storage.schema import SPLITS
from streamdp.storage.segments import SegmentedStore, merged_checksum, plan_kept_blocks
from streamdp.storage.store import Block, RatingStore
from streamdp.storage.view import StoreView, ViewSpec

__all__ = ["TimeWindowView", "check_contributions", "contributors", "data_period", "format_time", "parse_time",
           "parse_window", "period_users", "resolve_window", "segment_future", "store_as_of", "time_window"]

_UNITS = {"h": 3600, "d": 86400, "w": 7 * 86400}
_OPEN_LO, _OPEN_HI = np.iinfo(np.int64).min, np.iinfo(np.int64).max
#: Bytes of a window view's cache of which users contribute (one bit a user: 512M users).
CONTRIBUTED_CACHE = 64 << 20


def format_time(t: int) -> str:
    """``0`` -> ``'1970-01-01T00:00:00Z'`` (UTC)."""
    return _dt.datetime.fromtimestamp(int(t), _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str, flag: str = "--since") -> int:
    """An ISO date or date and time (UTC unless it names an offset) -> seconds since the epoch.

    >>> parse_time("1970-01-02"), parse_time("1970-01-01T01:00:00Z"), parse_time("1970-01-01T02:00+01:00")
    (86400, 3600, 3600)
    """
    s = str(text).strip()
    try:
        d = _dt.datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s)
    except ValueError:
        raise ParameterError(f"{flag} {text!r}: not an ISO date or date and time (e.g. 2024-01-31 or "
                             f"2024-01-31T12:00:00Z; UTC unless an offset is given)") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return int(d.timestamp())


def parse_window(text: str) -> int:
    """``"90d"`` -> seconds (units ``h``, ``d``, ``w``).

    >>> parse_window("2w"), parse_window("36h")
    (1209600, 129600)
    """
    m = re.fullmatch(r"\s*(\d+)\s*([hdw])\s*", str(text))
    if not m or int(m.group(1)) == 0:
        raise ParameterError(f"--window {text!r}: expected a positive length in hours, days or weeks (e.g. 36h, "
                             f"90d, 12w)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def resolve_window(since=None, until=None, window=None, *, now: float | None = None) -> dict | None:
    """The period ``train`` reads, as the ``data_window`` record (``since``/``until`` in seconds, ``None`` when
    open, their UTC dates, ``window`` and what it ends at), or ``None`` when no option is given."""
    if since is None and until is None and window is None:
        return None
    if since is not None and window is not None:
        raise ParameterError("--since and --window: give one (a window starts --window before --until, or now)")
    hi = parse_time(until, "--until") if until is not None else None
    lo = parse_time(since, "--since") if since is not None else None
    rec = {}
    if window is not None:
        anchor = hi if hi is not None else int(now if now is not None else _dt.datetime.now(_dt.timezone.utc)
                                               .timestamp())
        lo = anchor - parse_window(window)
        rec = {"window": str(window).strip(), "ends_at": "--until" if hi is not None else "the clock of the run"}
    if lo is not None and hi is not None and lo >= hi:
        raise ParameterError(f"--since {format_time(lo)} is not before --until {format_time(hi)}: the window is "
                             f"empty")
    return {"since": lo, "until": hi, "since_utc": None if lo is None else format_time(lo),
            "until_utc": None if hi is None else format_time(hi), **rec}


def _with_window(inner: RatingStore, rec: dict) -> dict:
    return {**(getattr(inner, "data_window", None) or {}), **rec}


class TimeWindowView(StoreView):
    """``store`` seen through the period ``[lo, hi)`` of its ratings' times (module docstring).

    Per-user and per-item counts are counted from the kept ratings (a pass, on demand); ``block_nnz`` stays the
    store's, an upper bound (what memory planning needs); ``train_item_stats`` is ``None`` (who needs them
    makes a pass).
    """

    recounts = True

    def __init__(self, store: RatingStore, lo: int | None, hi: int | None, record: dict | None = None):  # noqa: D107
        if not store.has_times:
            raise ParameterError(f"--since/--until/--window: {store.path} keeps no rating times (its input had no "
                                 f"timestamp column); ingest it from a file with one")
        super().__init__(store)
        self._lo = _OPEN_LO if lo is None else int(lo)
        self._hi = _OPEN_HI if hi is None else int(hi)
        self.data_window = _with_window(store, record or {"since": lo, "until": hi})
        self._counts: dict = {}
        # what a block read adds to the engine's per-rating budget: the times read (8 bytes) and the kept copy (20)
        self.extra_bytes_per_rating = int(getattr(store, "extra_bytes_per_rating", 0)) + 28

    def read_block_times(self, b: int, split: str = "train", since: int | None = None) -> tuple[Block, np.ndarray]:
        from streamdp.kernels.window import keep_window  # numba: on first read, not at import

        lo = self._lo if since is None else max(self._lo, int(since))
        blk, t = self._inner.read_block_times(b, split, since=None if lo == _OPEN_LO else lo)
        n = len(blk.items)
        ip, it, r, ts = np.empty_like(blk.indptr), np.empty(n, np.int32), np.empty(n, np.float32), np.empty(n, np.int64)
        w = keep_window(blk.indptr, blk.items, blk.ratings, t, self._lo, self._hi, ip, it, r, ts)
        return Block(blk.first_user, ip, it[:w], r[:w]), ts[:w]

    def block_times(self, b: int, split: str, nnz: int) -> np.ndarray:
        return self.read_block_times(b, split)[1]

    def read_block(self, b: int, split: str = "train") -> Block:
        return self.read_block_times(b, split)[0]

    def read_block_unchecked(self, b: int, split: str = "train"):
        return self.read_block(b, split), True  # checked by the inner store's read

    def contributed(self, b: int) -> np.ndarray:
        """Which users of block ``b`` have a training rating in the window (bool): those a release reads.

        Kept as bits (up to :data:`CONTRIBUTED_CACHE` bytes, then read again): the count of users, the per-user
        filter's count and its charge ask the same blocks, each a pass over the window otherwise.
        """
        cache = self._counts.setdefault("contributed", {})
        if b in cache:
            return np.unpackbits(cache[b][1], count=cache[b][0]).astype(bool)
        c = self.block_user_counts(b, "train") > 0
        if sum(len(v[1]) for v in cache.values()) + len(c) // 8 + 1 <= CONTRIBUTED_CACHE:
            cache[b] = (len(c), np.packbits(c))
        return c

    def n_contributors(self) -> int:
        """How many users have a training rating in the window (exact: the owner's; released only with noise)."""
        if "contributors" not in self._counts:
            self._counts["contributors"] = int(sum(int(self.contributed(b).sum()) for b in range(self.n_blocks)))
        return self._counts["contributors"]

    def read_ahead(self) -> None:
        """Nothing: a period's reads merge the parts with their times (``read_block_times``), which keep nothing."""

    def block_digests(self, split: str = "train"):
        return None

    def user_counts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        stop = self.n_users if stop is None else min(stop, self.n_users)
        bu, out = self.block_users, []
        for b in range(start // bu, -(-stop // bu)):
            c = sum(self.block_user_counts(b, s) for s in SPLITS if self._has_split(s))
            out.append(c)
        allc = np.concatenate(out) if out else np.zeros(0, np.int64)
        first = (start // bu) * bu
        return allc[start - first: stop - first].astype(np.int64)

    def _has_split(self, split: str) -> bool:
        return split == "train" or self._inner.has_test

    def item_counts(self) -> np.ndarray:
        if "items" not in self._counts:
            c = np.zeros(self.n_items, np.int64)
            for b in range(self.n_blocks):
                for s in SPLITS:
                    if self._has_split(s):
                        c += np.bincount(self.read_block(b, s).items, minlength=self.n_items)
            self._counts["items"] = c
        return self._counts["items"].copy()

    def train_item_stats(self):
        return None

    def _spec_args(self) -> tuple:
        return (self._lo, self._hi, self.data_window)

    def _spec_key(self):
        return repr(self._spec_args())  # data_window is a dict


def time_window(store: RatingStore, *, since=None, until=None, window=None, now=None) -> RatingStore:
    """``store`` seen through the period the options name (:func:`resolve_window`), or itself without one."""
    rec = resolve_window(since, until, window, now=now)
    if rec is None:
        return store
    if not store.has_times:
        raise ParameterError(f"--since/--until/--window: {store.path} keeps no rating times (its input had no "
                             f"timestamp column); ingest it from a file with one")
    return TimeWindowView(store, rec["since"], rec["until"], rec)


# -- segments: the store as it was, and a segment as its future -----------------------------------------------
def _segments(st: RatingStore) -> list:
    return list(st.segments) if isinstance(st, SegmentedStore) else []


def _checksum_as_of(st: RatingStore, n: int) -> str:
    """The checksum the store had after its ``n``-th append (its base's for ``n = 0``), as committed then."""
    c = st.attrs["base"]["checksum"]
    for e in st.attrs["segments"][:n]:
        c = merged_checksum(c, e["checksum"], e["merge_digest"])
    return c


def _prefix(st: RatingStore, n: int, cls, *, shape_of=None):
    """A copy of the segmented ``st`` reading its base and first ``n`` segments only, of class ``cls``; its users,
    items and blocks are those of the part ``shape_of`` (default: the last part read)."""
    v = object.__new__(cls)
    v.__dict__.update(st.__dict__)
    v.segments = st.segments[:n]
    v.parts = [st.base] + v.segments
    entries = st.attrs["segments"][:n]
    last = shape_of if shape_of is not None else v.parts[-1]
    base = st.attrs["base"]
    n_ratings = int(base["n_ratings"]) + sum(int(e["n_ratings_added"]) for e in entries)
    n_test = int(base.get("n_test", 0)) + sum(int(e["n_test_added"]) for e in entries)
    checksum = _checksum_as_of(st, n)
    v.info = replace(st.info, n_users=last.info.n_users, n_items=last.info.n_items, n_blocks=last.info.n_blocks,
                     n_ratings=n_ratings, n_test=n_test, checksum=checksum)
    v.attrs = dict(st.attrs, segments=entries, n_users=v.info.n_users, n_items=v.info.n_items,
                   n_blocks=v.info.n_blocks, n_ratings=n_ratings, n_test=n_test, checksum=checksum)
    v._nnz = {}
    v._whole = st
    plan_kept_blocks(v)
    return v


def store_as_of(st: RatingStore, n: int) -> RatingStore:
    """The store as it read after its ``n``-th append (``train --until-segment N``; 0: the store before its first)."""
    total = len(_segments(st))
    if total == 0 and st.attrs.get("compacted"):
        raise ParameterError(f"--until-segment {n}: {st.path} was compacted (its segments folded into one store): "
                             f"what it held before each append is no longer told apart")
    if not 0 <= int(n) <= total:
        raise ParameterError(f"--until-segment {n}: {st.path} has {total} segment(s) (0 is the store before its "
                             f"first append)")
    n = int(n)
    if total == 0:
        v = object.__new__(_PlainAsOf)
        v.__dict__.update(st.__dict__)
    else:
        v = _prefix(st, n, _AsOf)
    v._as_of = n
    v.data_window = {**(getattr(st, "data_window", None) or {}), "until_segment": n}
    return v


class _AsOf(SegmentedStore):
    """:func:`store_as_of` of a segmented store."""

    def remote_view(self):
        return ViewSpec(store_as_of, None, (self._as_of,))


class _PlainAsOf(RatingStore):
    """:func:`store_as_of` of a store without segments (itself, with its ``data_window`` recorded)."""

    def remote_view(self):
        return ViewSpec(store_as_of, None, (self._as_of,))


def segment_future(st: RatingStore, k) -> RatingStore:
    """Segment ``k`` (1-based, or ``"last"``) of ``st`` as the test split of the store as of segment ``k - 1``
    (``evaluate --segment``; module docstring)."""
    segs = _segments(st)
    if not segs:
        raise ParameterError(f"--segment {k}: {st.path} has no segments (nothing was appended to it)")
    if str(k).strip().lower() == "last":
        k = len(segs)
    try:
        k = int(k)
    except ValueError:
        raise ParameterError(f"--segment {k!r}: expected a segment number (1 is the first append) or 'last'") \
            from None
    if not 1 <= k <= len(segs):
        raise ParameterError(f"--segment {k}: {st.path} has segments 1..{len(segs)}")
    seg = segs[k - 1]
    v = _prefix(st, k - 1, _Future, shape_of=seg)
    v._segment = seg
    v._segment_number = k
    n_future = int(seg.info.n_ratings + seg.info.n_test)
    v.info = replace(v.info, n_test=n_future)
    v.attrs = dict(v.attrs, n_test=n_future)
    v.segment_record = {"number": k, "name": st.attrs["segments"][k - 1]["name"], "n_ratings": n_future}
    return v


class _Future(SegmentedStore):
    """:func:`segment_future`: the training split of the store as of segment ``k - 1``, segment ``k``'s ratings
    (both its parts) as the test split."""

    @property
    def has_test(self) -> bool:
        return self.info.n_test > 0

    def _future(self, b: int, times: bool):
        seg = self._segment
        first, end = self.block_range(b)
        n = end - first
        src = []
        for s in SPLITS:
            if seg._has(s) and b < seg.info.n_blocks:
                blk = seg.read_block(b, s)
                ip = np.concatenate([blk.indptr, np.full(n - blk.n_users, blk.indptr[-1], np.int64)])
                t = (seg.block_times(b, s, blk.nnz),) if times else ()
                src.append((0, ip, blk.items, blk.ratings, True) + t)  # one part: both splits merged as one
        if not src:
            src.append((0, np.zeros(n + 1, np.int64), np.empty(0, np.int32), np.empty(0, np.float32), True)
                       + ((np.empty(0, np.int64),) if times else ()))
        return self._merge_one(b, src, times)

    def _merge_one(self, b: int, src: list, times: bool):
        from streamdp.kernels.segments import merge_rows

        first, end = self.block_range(b)
        n = end - first
        indptrs = np.stack([s[1] for s in src]).astype(np.int64)
        sizes = np.array([len(s[2]) for s in src], np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        items = np.concatenate([s[2] for s in src]).astype(np.int32)
        ratings = np.concatenate([s[3] for s in src]).astype(np.float32)
        zeros = np.zeros(len(src), np.int64)
        ip, oi, orr = np.empty(n + 1, np.int64), np.empty(len(items), np.int32), np.empty(len(items), np.float32)
        osrc = np.empty(len(items) if times else 0, np.int64)
        w = merge_rows(n, indptrs, starts, items, ratings, zeros, zeros, 0, self.info.implicit,
                       float(self.attrs.get("count_cap") or 0.0) if self.info.implicit else 0.0, ip, oi, orr, osrc,
                       np.empty(0, np.int32), np.empty(0, np.float32))
        blk = Block(first, ip, oi[:w].copy(), orr[:w].copy())
        return (blk, np.concatenate([s[5] for s in src]).astype(np.int64)[osrc[:w]]) if times else blk

    def read_block(self, b: int, split: str = "train") -> Block:
        return self._future(b, False) if split == "test" else super().read_block(b, split)

    def read_block_times(self, b: int, split: str = "train", since: int | None = None):
        return self._future(b, True) if split == "test" else super().read_block_times(b, split, since)

    def read_block_unchecked(self, b: int, split: str = "train"):
        return self.read_block(b, split), True

    def block_nnz(self, split: str = "train") -> np.ndarray:
        if split != "test":
            return super().block_nnz(split)
        out = np.zeros(self.info.n_blocks, np.int64)
        for s in SPLITS:
            if self._segment._has(s):
                c = self._segment.block_nnz(s)
                out[:len(c)] += c
        return out

    def user_ids(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        return self._whole.user_ids(start, self.info.n_users if stop is None else min(stop, self.info.n_users))

    def item_ids(self) -> np.ndarray:
        return self._whole.item_ids()[:self.info.n_items]

    def check_chunks(self) -> None:
        self._whole.check_chunks()

    def remote_view(self):
        return ViewSpec(segment_future, None, (self._segment_number,))


def data_period(store: RatingStore, *, since=None, until=None, window=None, until_segment=None) -> RatingStore:
    """``store`` as ``train`` reads it: as of segment ``until_segment`` (:func:`store_as_of`), then through the
    window of ``since``/``until``/``window`` (:func:`time_window`); itself when none is given."""
    if until_segment is not None:
        store = store_as_of(store, until_segment)
    return time_window(store, since=since, until=until, window=window)


class _Contributors:
    """``(lo, hi) -> bool array``: which users ``lo .. hi - 1`` contribute a rating to a release reading the period
    view ``store`` (:func:`contributors`); one store block read at a time, the last one kept for the next call."""

    def __init__(self, store: RatingStore):
        self.store, self._last = store, (None, None)

    def _block(self, b: int) -> np.ndarray:
        if self._last[0] != b:
            st = self.store
            first, end = st.block_range(b)
            self._last = (b, st.contributed(b) if hasattr(st, "contributed") else np.ones(end - first, bool))
        return self._last[1]

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        out = np.zeros(hi - lo, bool)
        st = self.store
        top, bu = min(hi, st.n_users), st.info.block_users
        for b in range(lo // bu, -(-top // bu)) if lo < top else ():
            first, end = st.block_range(b)
            a, z = max(lo, first), min(top, end)
            out[a - lo:z - lo] = self._block(b)[a - first:z - first]
        return out


def contributors(store: RatingStore):
    """Who contributes to a release reading ``store`` as :func:`data_period` made it: ``None`` for the whole store
    (every user), else ``(lo, hi) -> bool array``: a user with a training rating in the window
    (:meth:`TimeWindowView.contributed`), or a user of the store as of the segment; one who is not (no rating in
    the period, or not yet a user then) contributes nothing (the per-user filter charges her nothing)."""
    if not isinstance(store, (TimeWindowView, _AsOf, _PlainAsOf)):
        return None
    return _Contributors(store)


def period_users(store: RatingStore) -> int:
    """The exact number of users a release reading ``store`` counts: a time window's contributors
    (:meth:`TimeWindowView.n_contributors`), else the store's users (released only with noise, or checked against a
    declared bound)."""
    return store.n_contributors() if hasattr(store, "n_contributors") else int(store.n_users)


def check_contributions(store) -> None:
    """Refuse a store view whose training split holds no rating (an empty window or prefix), before anything is
    spent: one line."""
    if isinstance(store, TimeWindowView) and store.n_contributors() == 0:
        w = store.data_window
        raise StoreError(f"{store.path}: no training rating in the window {w.get('since_utc') or '(open)'} .. "
                         f"{w.get('until_utc') or '(open)'}; nothing was trained")
