"""``streamdp info``: a store's public shape and its item-popularity summary."""

from __future__ import annotations

import numpy as np

from streamdp.storage.ids import numeric
from streamdp.storage.store import open_store


def store_summary(path: str) -> dict:
    """Everything ``streamdp info`` shows, as a JSON-ready dict."""
    s = open_store(path)
    i = s.info
    counts = s.item_counts()
    total = int(counts.sum())
    top = max(1, int(np.ceil(0.01 * i.n_items)))
    top_share = float(np.sort(counts)[::-1][:top].sum() / total) if total else 0.0
    a = s.attrs
    return {
        "path": s.path,
        "format_version": a["format_version"],
        "implicit": s.implicit,
        "value": a.get("value", "count") if s.implicit else "rating",
        "count_cap": a.get("count_cap") if s.implicit else None,
        "n_users": i.n_users,
        "n_items": i.n_items,
        "n_ratings": i.n_ratings,
        "n_test": i.n_test,
        "rating_min": i.rating_min,
        "rating_max": i.rating_max,
        "rating_range_source": i.rating_range_source,
        "block_users": i.block_users,
        "n_blocks": i.n_blocks,
        "mean_ratings_per_user": (i.n_ratings + i.n_test) / i.n_users,
        "top1pct_items_share": top_share,
        "items_never_rated": int((counts == 0).sum()),
        "id_kinds": {"user": _id_kind(s.user_ids(0, min(1, i.n_users))), "item": _id_kind(s.item_ids())},
        "checksum": i.checksum,
        "created_by": a.get("created_by"),
        "created_at": a.get("created_at"),
        "created_with": a.get("created_with"),
        "split": store_split(a, i.n_test),
        # the span is read off the data: the owner's metadata, shown here, never put in a model release
        "times": a.get("times") if s.has_times else None,
        "item_names": a.get("item_names"),
        "sources": a.get("sources", []),
        "params": a.get("params", {}),
        "segments": [{k: e.get(k) for k in ("name", "created_at", "n_input_ratings", "n_new_users", "n_new_items",
                                            "n_ratings_added", "n_test_added", "n_pairs_merged")}
                     for e in a.get("segments") or []],
    }


def store_split(attrs: dict, n_test: int) -> dict:
    """The store's ``split`` attribute; for a store written before it was recorded, what its parameters say
    (a held-out split was then always random: ``{"kind": "random", ...}``)."""
    if isinstance(attrs.get("split"), dict):
        return attrs["split"]
    if not n_test:
        return {"kind": "none"}
    params = attrs.get("params") or {}
    return {"kind": "random", "test_fraction": params.get("test_fraction"), "seed": params.get("seed")}


def describe_split(split: dict, n_test: int) -> str:
    """One line on how the test split was made.

    >>> describe_split({"kind": "temporal", "test_fraction": 0.2, "per": "user"}, 10)
    "split: temporal, each user's latest 20% of ratings held out (by timestamp; every user keeps one)"
    """
    kind = split.get("kind")
    if kind == "files":
        extra = [f"{split.get(k, 0):,} {what}" for k, what in (
            ("n_test_only_users", "users only in the test file (kept, with no training ratings)"),
            ("n_test_only_items", "items only in the test file (kept, with no training ratings)"),
            ("n_train_ratings_also_in_test", "training ratings also in the test file (dropped from training)"),
            ("n_test_ratings_clipped", "test ratings outside the training files' observed range (clipped into it)"))
            if split.get(k)]
        return (f"split: your files, train {', '.join(split.get('train', []))}, test {', '.join(split.get('test', []))}"
                + (f"; {'; '.join(extra)}" if extra else ""))
    if kind == "random":
        f = split.get("test_fraction")
        return (f"split: random, {100 * f:g}% of each user's ratings held out (seed {split.get('seed')})"
                if f is not None else f"split: random ({n_test:,} test ratings)")
    if kind == "temporal":
        return (f"split: temporal, each user's latest {100 * split['test_fraction']:g}% of ratings held out "
                f"(by timestamp; every user keeps one)")
    if kind == "last-n":
        return (f"split: last-n, each user's {split['last_n']} latest rating{'s' if split['last_n'] > 1 else ''} held "
                f"out (by timestamp; every user keeps one)")
    return "split: none (no test split)"


def describe_times(times: dict | None) -> str:
    """Whether the store keeps each rating's time, and their span (UTC).

    >>> describe_times({"unit": "s", "min": 0, "max": 86400})
    'kept, 1970-01-01T00:00:00Z .. 1970-01-02T00:00:00Z (seconds since the epoch; read off the data, never released)'
    >>> describe_times(None)
    'none (the input had no timestamp column: train --since/--window refuse this store)'
    """
    if not times:
        return "none (the input had no timestamp column: train --since/--window refuse this store)"
    from streamdp.storage.timeline import format_time

    span = (f"{format_time(times['min'])} .. {format_time(times['max'])}" if times.get("min") is not None
            else "no ratings")
    return f"kept, {span} (seconds since the epoch; read off the data, never released)"


def describe_item_names(names: dict) -> str:
    """One line on the item names a store keeps."""
    return (f"item names: {names.get('n_named', 0):,} items named from {names.get('file')} (public metadata)"
            + (f"; {names['n_unmatched']:,} lines name no item of the store (ignored)" if names.get("n_unmatched")
               else ""))


def _id_kind(ids) -> str:
    """``integer`` or ``string``: how the store keeps the original ids (:mod:`streamdp.storage.ids`)."""
    return "integer" if numeric(ids) else "string"


def format_info(d: dict) -> str:
    """Human-readable form of :func:`store_summary`."""
    if d.get("implicit"):
        cap = f"declared cap {d['count_cap']:g}" if d.get("count_cap") is not None else "no cap declared"
        kind = [f"data             implicit: interactions, the value of a (user, item) pair is its {d['value']} "
                f"({cap})",
                f"pairs (train)    {d['n_ratings']:,}",
                f"pairs (test)     {d['n_test']:,}",
                f"{d['value']} range{' ' * (11 - len(d['value']))}[{d['rating_min']:g}, {d['rating_max']:g}] "
                f"({d['rating_range_source']})",
                f"pairs/user       {d['mean_ratings_per_user']:.1f} (mean)"]
    else:
        kind = [f"ratings (train)  {d['n_ratings']:,}",
                f"ratings (test)   {d['n_test']:,}",
                f"rating range     [{d['rating_min']:g}, {d['rating_max']:g}] ({d['rating_range_source']})",
                f"ratings/user     {d['mean_ratings_per_user']:.1f} (mean)"]
    lines = [
        f"store            {d['path']}  (format {d['format_version']}, {d['created_by']})",
        f"users            {d['n_users']:,}",
        f"items            {d['n_items']:,}  ({d['items_never_rated']:,} never rated)",
        *kind,
        f"ids              users: {d['id_kinds']['user']}, items: {d['id_kinds']['item']}",
        f"blocks           {d['n_blocks']:,} of {d['block_users']:,} users",
        f"top 1% of items  hold {100 * d['top1pct_items_share']:.1f}% of the ratings",
        f"split            {describe_split(d['split'], d['n_test']).split(': ', 1)[1]}",
        f"times            {describe_times(d.get('times'))}",
        *([f"item names       {describe_item_names(d['item_names']).split(': ', 1)[1]}"] if d.get("item_names")
          else []),
        f"checksum         {d['checksum']}",
    ]
    for src in d.get("sources") or []:
        lines.append(f"source           {src.get('name')} ({src.get('size', '?')} bytes)")
    for e in d.get("segments") or []:
        lines.append(f"segment          {e['name']} (appended {e['created_at']}): {e['n_input_ratings']:,} ratings "
                     f"read, +{e['n_ratings_added']:,} train, +{e['n_test_added']:,} test, {e['n_new_users']:,} new users, "
                     f"{e['n_new_items']:,} new items, {e['n_pairs_merged']:,} pairs already in the store merged")
    return "\n".join(lines)


def describe_catalogue(s) -> str:
    """One line on a store's declared item catalogue: its size and, for the owner only, what lies outside it."""
    from streamdp.storage.catalogue import CatalogueView, store_catalogue

    ids, by = store_catalogue(s)
    view = CatalogueView(s, ids)
    counts = s.item_counts()
    inside = view.item_counts()
    outside = int(counts.sum() - inside.sum())
    never = int((inside == 0).sum())
    return (f"item catalogue declared ({by}): {len(ids):,} items, {never:,} of them with no rating; {outside:,} "
            f"ratings of {s.n_items - (len(ids) - never):,} items outside it are left out of every model (this count "
            f"is the owner's: no model publishes it)")
