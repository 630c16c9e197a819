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
        "sources": a.get("sources", []),
        "params": a.get("params", {}),
    }


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
        f"checksum         {d['checksum']}",
    ]
    for src in d.get("sources") or []:
        lines.append(f"source           {src.get('name')} ({src.get('size', '?')} bytes)")
    return "\n".join(lines)
