"""What each method is for: its guarantee, what it releases, when to use it (``streamdp methods``, per-method help).

The options, their defaults and the default rank come from the methods themselves
(``OPTIONS``, :meth:`~streamdp.methods.base.Method.default_rank`), and so does the kind
of guarantee (:func:`guarantee_kind`). This module adds only what a class does not
say: the guarantee in words with the options that change it, what the model directory
holds, when a user should pick the method, and what ``--rank`` means for it. A method
registered without an entry here is still listed (its ``SUMMARY`` only), and fails
``tests/methods/test_method_help.py``.

Guarantee kinds
---------------
``exact``
    a proven (epsilon, delta)-DP guarantee of the release, accounted by dp-accounting.
``approximate``
    proven only for an idealized run (SGLD: an exact posterior sample); the ledger's
    guarantee starts with ``approximate:``.
``non-private``
    no noise at all (``--epsilon inf`` only).

A method whose guarantee depends on an option says so in its ``guarantee`` text.

Examples
--------
>>> method_info("als").command
'streamdp train --method als'
>>> from streamdp.methods import get_method
>>> guarantee_kind(get_method("sgld")), guarantee_kind(get_method("sgd")), guarantee_kind(get_method("als"))
('approximate', 'non-private', 'exact')
>>> method_info("lowrank").command
'streamdp lowrank'
"""

from __future__ import annotations

from dataclasses import dataclass

from streamdp.errors import ParameterError
from streamdp.methods import METHODS, load_builtin
from streamdp.methods.lowrank import LowRank
from streamdp.privacy.ledger import GUARANTEE_APPROX_PREFIX

__all__ = ["MethodInfo", "CATALOG", "method_info", "guarantee_kind", "default_rank", "methods_listing", "format_methods",
           "GUARANTEE_KINDS"]

GUARANTEE_KINDS = ("exact", "approximate", "non-private")


#: What ``--rank`` means for a method that fits no factors (``means``: ``train`` refuses it).
NO_RANK = "does not apply: it fits no factors"


@dataclass(frozen=True)
class MethodInfo:
    """One method as a user chooses it (the parts its class does not declare).

    Parameters
    ----------
    name : str
        ``--method`` name (or the command name for ``lowrank``).
    guarantee : str
        The guarantee in words, with the options that change it.
    releases : str
        What the model directory holds (the released item side).
    when : str
        When to use it.
    rank : str
        What ``--rank`` means for it.
    command : str
        How it is run.
    """

    name: str
    guarantee: str
    releases: str
    when: str
    rank: str = "number of factors k"
    command: str = ""

    def __post_init__(self):
        if not self.command:
            object.__setattr__(self, "command", f"streamdp train --method {self.name}")


CATALOG: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo(
        "als",
        "user-level (epsilon, delta)-DP (PLD accountant); every release also pure epsilon-DP with "
        "--mechanism laplace|huber",
        "item factors, item biases and the global mean (DP-ALS, Chien et al. 2021); users solve their own "
        "factor locally",
        "the default: the private model that beats the item mean when items have enough raters"),
    MethodInfo(
        "ials",
        "joint user-level (epsilon, delta)-DP (PLD accountant): users solve their own rows locally",
        "implicit-ALS item rows with a popularity column from noisy item counts, and the noisy counts (Hu et al. "
        "2008 with DP-ALS noise); users solve their own row locally from the items they chose",
        "lists (top-N recommendations), from ratings or from implicit data (clicks, plays, purchases)",
        rank="number of factors k (16; private runs 8 where the released counts are low against the noise)"),
    MethodInfo(
        "irls",
        "as als",
        "as als (the users' local solve uses the Huber loss)",
        "heavy-tailed or outlying ratings"),
    MethodInfo(
        "means",
        "user-level (epsilon, delta)-DP",
        "item biases and the global mean",
        "the private item-mean baseline",
        rank=NO_RANK),
    MethodInfo(
        "oja",
        "user-level (epsilon, delta)-DP (PLD accountant)",
        "the top-k item subspace, its singular values, item biases and the global mean",
        "a private item subspace (for retrieval or as features), not a completer"),
    MethodInfo(
        "fw",
        "joint user-level (epsilon, delta)-DP: users rebuild their own rows locally",
        "T noisy item vectors and their Frank-Wolfe weights",
        "nuclear-norm completion as in Jain et al. on large stores; with fewer users than about the number of "
        "items to the power 5/4 (n_items^(5/4)) its directions are mostly noise",
        rank="number T of Frank-Wolfe iterations (the rank of the release)"),
    MethodInfo(
        "svd",
        "joint user-level (epsilon, delta)-DP: users project their own rows locally",
        "the noisy top-k subspace of the item covariance",
        "the baseline for fw; needs the item-by-item covariance in memory (n_items x n_items)"),
    MethodInfo(
        "public-private",
        "none for public users (their data is public); private users' ratings unused by default (epsilon 0 "
        "for them); --private-mechanism laplace: DP for private users; pmd/pmc: NOT DP (first-order "
        "deniability)",
        "item means and a low-rank W estimated from public users only",
        "some users consent to share their ratings"),
    MethodInfo(
        "sgld",
        "epsilon-DP only for an exact posterior sample (Liu et al. Thm 1); a finite SGLD run is labelled "
        "approximate",
        "item factors and biases of one SGLD posterior sample",
        "comparison: beats the item mean at Netflix scale from epsilon 1 (docs/sgld.md); on small stores only at "
        "large epsilon"),
    MethodInfo(
        "sgd",
        "none (needs --epsilon inf)",
        "item factors and biases",
        "the non-private speed and accuracy reference"),
    MethodInfo(
        "lowrank",
        "(epsilon, delta)-DP under Hardt & Roth's bounded row-change relation: WEAKER than user-level "
        "add/remove (the output says what it covers)",
        "the item basis, singular values and the noisy projection",
        "a private low-rank approximation of the rating matrix itself",
        rank="rank k of the approximation (required)", command="streamdp lowrank"),
)}


def method_info(name: str) -> MethodInfo:
    """The catalogue entry of ``name`` (``ParameterError`` listing the names otherwise)."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ParameterError(f"unknown method {name!r} (choose from {', '.join(sorted(CATALOG))})") from None


def _classes() -> dict:
    """Every method class by name: the registered ``train`` methods and ``lowrank``."""
    load_builtin()
    return {**METHODS, LowRank.name: LowRank}


def default_rank(cls) -> int:
    """``cls``'s rank when ``--rank`` is not given, asked of the class itself (it needs no store)."""
    return int(cls.default_rank(object.__new__(cls)))


def guarantee_kind(cls) -> str:
    """``cls``'s kind of guarantee, one of :data:`GUARANTEE_KINDS`, from its class attributes."""
    if getattr(cls, "NON_PRIVATE", False):
        return "non-private"
    if str(cls.guarantee).startswith(GUARANTEE_APPROX_PREFIX):
        return "approximate"
    return "exact"


def methods_listing() -> list[dict]:
    """One dict per method: the catalogue's order, then any method it does not describe yet.

    Keys: ``name, command, kind, guarantee, releases, when, summary, rank, default_rank,
    options`` (the method's own flags). ``kind``, ``summary``, ``default_rank`` and
    ``options`` come from the class.
    """
    classes = _classes()
    out = []
    for name in [n for n in CATALOG if n in classes] + sorted(n for n in classes if n not in CATALOG):
        cls = classes[name]
        info = CATALOG.get(name) or MethodInfo(name, guarantee=str(cls.guarantee), releases="(not described)",
                                               when="(not described)")
        out.append({"name": name, "command": info.command, "kind": guarantee_kind(cls),
                    "guarantee": info.guarantee, "releases": info.releases, "when": info.when,
                    "summary": cls.SUMMARY, "rank": info.rank,
                    "default_rank": None if name == "lowrank" else default_rank(cls),
                    "options": [o.flag for o in cls.OPTIONS]})
    return out


def format_methods(rows: list[dict]) -> str:
    """The text ``streamdp methods`` prints: one paragraph per method."""
    lines = []
    for r in rows:
        lines.append(f"{r['name']}: {r['summary']}")
        lines.append(f"  guarantee: {r['kind']}: {r['guarantee']}")
        lines.append(f"  releases:  {r['releases']}")
        lines.append(f"  use it:    {r['when']}")
        shows_default = r["default_rank"] is not None and r["rank"] != NO_RANK
        rank = f"{r['rank']}" + (f", default {r['default_rank']}" if shows_default else "")
        lines.append(f"  --rank:    {rank}")
        lines.append(f"  options:   {r['command']} --help")
        lines.append("")
    return "\n".join(lines).rstrip()
