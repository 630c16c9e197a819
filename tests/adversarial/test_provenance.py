"""The provenance test covers what a user can be (issue 40, part 3).

Twin stores D and D' = D + one user, ingested from pandas frames with the rating range declared (1..5):

``lone-item``
    the user alone rates item 777 (and two common items);
``lowest-rating``
    the user alone gives the lowest rating, 1 (every rating of D is 2..5).

On each twin every command that writes files runs with the same options and ``--seed`` (so the noise draws line
up): ``train`` (means, als, ials), ``tune``, ``sweep``, ``recommend --store --out``, ``evaluate --json`` and
``sweep --rehearse``. Every file written (JSON field by field, the zarr.json of every zarr node, the Parquet schema
and key-value metadata) and every stdout JSON is compared between the twins, paths made relative to the twin's
root. A field that differs must trace to a ledgered release:

* in a model (``model.json``, ``privacy.json``, ``factors.zarr``) through :func:`streamdp.manifest.provenance`:
  only ``release`` and ``post`` fields (and the random ids of :data:`RANDOM`) may differ, a ``public`` one never;
* in every other file through the explicit, commented allow-lists below (:data:`OTHER`): the owner's
  evaluation on the test split (``owner`` in :data:`streamdp.manifest.SUMMARY`), timings, random ids, and values
  read off released statistics.

Batch lists (``recommend --store --out``) are each user's own list under joint DP: the file holds every user's
list and is the owner's, never published (``recommend --help``). Their schema and metadata must be equal; the lone
user's list may differ (it is hers); the other users' lists are solved from the released model, whose noisy
values differ between the twins (the neighbour's ratings move every noisy sum a little), so their scores are not
compared. What is meaningful, and checked, is that no list, the lone user's included, names an item outside the
model's released catalogue: item 777 reaches no one.

The model's ``item_ids`` never hold the lone user's item (a single seeded draw here; the stated delta over
unseeded draws is :mod:`tests.privacy.test_catalogue`'s).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import sys
import time

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import streamdp
from streamdp import manifest
from streamdp.cli import main
from tests.conftest import flat

LONE = 99999
TWINS = {
    "lone-item": [(LONE, 777, 4.0), (LONE, 0, 5.0), (LONE, 1, 3.0)],
    "lowest-rating": [(LONE, 0, 1.0), (LONE, 1, 1.0), (LONE, 2, 1.0)],
}


def _frame(extra=(), n_users=400, n_items=30, per_user=8, seed=0) -> pd.DataFrame:
    """Ratings 2..5 of ``n_users`` users on ``n_items`` items (popular ones first), ``extra`` rows appended."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_items + 1) ** 0.7
    rows = [(u, int(i), float(rng.integers(2, 6)))
            for u in range(n_users) for i in rng.choice(n_items, size=per_user, replace=False, p=p / p.sum())]
    return pd.DataFrame(rows + list(extra), columns=["user", "item", "rating"])


def _commands(s, o):
    """Every command that writes files, on store ``s`` into directory ``o`` (epsilon 8: 400 users select most of
    the 30 items privately)."""
    common = ("--seed", "1", "--workers", "1", "--memory-limit", "1GB")  # a default limit follows the free RAM
    return {
        "train-means": ("train", s, "--method", "means", "--epsilon", "8", "--out", o / "means", "--json", *common),
        "train-als": ("train", s, "--method", "als", "--rank", "2", "--iters", "2", "--epsilon", "8",
                      "--out", o / "als", "--json", *common),
        "train-ials": ("train", s, "--method", "ials", "--rank", "2", "--epsilon", "8", "--out", o / "ials",
                       "--json", *common),
        "sweep": ("sweep", s, "--methods", "means", "--epsilons", "8", "--out", o / "sweep", "--json", *common),
        "recommend": ("recommend", o / "als", "--store", s, "--out", o / "all.parquet", *common[2:]),
        "evaluate": ("evaluate", o / "als", s, "--json", *common[2:]),
        # after the models: the rehearsal reads the released statistics (the catalogue of a released model)
        "tune": ("tune", s, "--method", "means", "--epsilon", "8", "--out", o / "tuned", "--json", *common),
        "rehearse": ("sweep", s, "--rehearse", "--methods", "means", "--epsilons", "8", "--out", o / "rehearsal",
                     "--users", "200", "--ratings-per-user", "8", "--json", *common),
    }


#: Commands run on the lone-item twins only: their accounting (subsampled Gaussians, the rehearsal's pilot
#: trainings) takes most of the test's time, and what they publish is read off the same releases as train's.
SLOW = ("tune", "rehearse")
#: The default run's guard: the lone-item twins through train, recommend and evaluate (about 30 s); every command on
#: both kinds of twins runs with ``-m slow`` (about 4 minutes on a busy 2-core machine).
QUICK = ("train-means", "train-als", "train-ials", "recommend", "evaluate")


@pytest.fixture(scope="module", params=[
    pytest.param(("lone-item", QUICK), id="lone-item-quick"),
    pytest.param(("lone-item", None), id="lone-item", marks=pytest.mark.slow),
    pytest.param(("lowest-rating", None), id="lowest-rating", marks=pytest.mark.slow),
])
def twins(request, tmp_path_factory):
    """``(kind, roots, stdouts)``: the two twins' roots (store and outputs) and each command's stdout."""
    kind, only = request.param
    roots, stdouts = [], []
    for i, extra in enumerate(((), TWINS[kind])):
        root = tmp_path_factory.mktemp(f"{kind}-{i}")
        streamdp.ingest(_frame(extra), str(root / "store.zarr"), rating_range="1,5", test_fraction=0.2, seed=1)
        (root / "out").mkdir()
        outs = {}
        for name, args in _commands(root / "store.zarr", root / "out").items():
            if (name in SLOW and kind != "lone-item") or (only is not None and name not in only):
                continue
            t = time.perf_counter()
            r = CliRunner().invoke(main, [str(a) for a in args])
            print(f"{kind} {i} {name}: {time.perf_counter() - t:.1f}s", file=sys.stderr)
            assert r.exit_code == 0, (kind, i, name, r.output[-2000:], r.exception)
            outs[name] = r.stdout
        roots.append(root)
        stdouts.append(outs)
    return kind, roots, stdouts


# --- reading what was written --------------------------------------------------------------------------------


def _rel(v, root):
    """``v`` with the twin's root written ``ROOT`` (the twins live in different directories)."""
    if isinstance(v, str):
        return v.replace(str(root), "ROOT")
    if isinstance(v, list):
        return [_rel(x, root) for x in v]
    if isinstance(v, dict):
        return {k: _rel(x, root) for k, x in v.items()}
    return v



def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _diff(fa: dict, fb: dict) -> list[str]:
    return sorted(k for k in fa.keys() | fb.keys() if not _same(fa.get(k, "<absent>"), fb.get(k, "<absent>")))


def _files(root) -> set[str]:
    out = set()
    for d, _, files in os.walk(root / "out"):
        for f in files:
            out.add(os.path.relpath(os.path.join(d, f), root / "out"))
    return out


def _model_dirs(files) -> list[str]:
    return sorted(os.path.dirname(f) for f in files if os.path.basename(f) == "model.json")


# --- models: the manifest's provenance -------------------------------------------------------------------------

#: Fields declared ``public`` that are random per run whatever the seed (ids), or the keyed fingerprint, random
#: without the store's key (each twin has its own).
RANDOM = ("model.json:run_id", "model.json:budget_entry", "model.json:store_fingerprint",
          "privacy.json:store_fingerprint", "privacy.json:bounds.run_id",
          "privacy.json:model_digest",  # the digest of model.json, ids and releases included
          "model.json:tuning.entry")

#: Which released arrays are per item: their shape is the released catalogue's size (post-processing of it).
PER_ITEM = {"item_factors", "item_bias", "item_ids", "noisy_item_weight", "basis", "public_item_count"}


def _model(root, rel):
    import zarr

    d = root / "out" / rel
    info = _rel(json.loads((d / "model.json").read_text()), root)
    led = _rel(json.loads((d / "privacy.json").read_text()), root)
    g = zarr.open_group(str(d / "factors.zarr"), mode="r")
    arrays = {k: np.asarray(g[k][...]) for k in g.array_keys()}
    attrs = {k: v for k, v in g.attrs.items()}
    return info, led, arrays, attrs


def _releases_without_shapes(led, n_items_differ):
    """``bounds.releases`` with each release's shape left out when the twins' catalogues differ in size: the shape
    of a per-item release is the released catalogue's size (post-processing of the 'item catalogue' release)."""
    rel = led.get("bounds", {}).get("releases")
    if not n_items_differ or rel is None:
        return led
    led = json.loads(json.dumps(led))
    led["bounds"]["releases"] = [{k: v for k, v in e.items() if k != "shape"} for e in rel]
    return led


def _model_violations(ra, rb, rel) -> list[str]:
    (ia, la, aa, ta), (ib, lb, ab, tb) = _model(ra, rel), _model(rb, rel)
    n_differ = ia.get("n_items") != ib.get("n_items")
    la, lb = _releases_without_shapes(la, n_differ), _releases_without_shapes(lb, n_differ)
    pa = manifest.check_release(ia, la, aa, ta)
    pb = manifest.check_release(ib, lb, ab, tb)
    bad = []
    fa = {**flat(ia, "model.json:"), **flat(la, "privacy.json:")}
    fb = {**flat(ib, "model.json:"), **flat(lb, "privacy.json:")}
    for k in _diff(fa, fb):
        prov = pa.get(k, pb.get(k))
        if prov in (manifest.RELEASE, manifest.POST) or k.startswith(RANDOM):
            continue
        bad.append(f"{rel}/{k} ({prov}): {fa.get(k, '<absent>')!r} != {fb.get(k, '<absent>')!r}")
    if set(aa) != set(ab):
        bad.append(f"{rel}/factors.zarr: arrays {sorted(aa)} != {sorted(ab)}")
    for name in set(aa) & set(ab):
        prov = manifest.ARRAYS[name][0]
        if prov == manifest.PUBLIC and not np.array_equal(aa[name], ab[name]):
            bad.append(f"{rel}/factors.zarr/{name} (public) differs")
        if aa[name].shape != ab[name].shape and not (n_differ and name in PER_ITEM):
            bad.append(f"{rel}/factors.zarr/{name}: shape {aa[name].shape} != {ab[name].shape}")
        if aa[name].dtype != ab[name].dtype:
            bad.append(f"{rel}/factors.zarr/{name}: dtype {aa[name].dtype} != {ab[name].dtype}")
    for k in _diff(ta, tb):
        if manifest.ATTRS.get(k, (None,))[0] not in (manifest.RELEASE, manifest.POST):
            bad.append(f"{rel}/factors.zarr@{k} differs")
    # the zarr.json of every node: format, dtype, codecs, chunking (a per-item array's shape and chunk follow the
    # released catalogue's size)
    for d, _, files in os.walk(ra / "out" / rel / "factors.zarr"):
        for f in files:
            if f != "zarr.json":
                continue
            sub = os.path.relpath(os.path.join(d, f), ra / "out")
            za, zb = (json.loads((r / "out" / sub).read_text()) for r in (ra, rb))
            za.pop("attributes", None), zb.pop("attributes", None)  # compared above, by the manifest
            name = os.path.basename(d)
            if n_differ and name in PER_ITEM:
                for z in (za, zb):
                    z.pop("shape", None), z.pop("chunk_grid", None)
            if za != zb:
                bad.append(f"{sub}: {za} != {zb}")
    return bad


def test_models_differ_only_in_ledgered_releases(twins):
    """Every model the commands wrote (train, tune, the sweep's and the rehearsal's): a field that differs between
    the twins is a ``release`` or ``post`` field of the manifest, or a random id; a ``public`` one is equal."""
    kind, (ra, rb), _ = twins
    fa, fb = _files(ra), _files(rb)
    models = _model_dirs(fa)
    assert models == _model_dirs(fb) and len(models) >= 3, models
    bad = [v for m in models for v in _model_violations(ra, rb, m)]
    assert bad == [], "\n".join(bad)


def test_no_model_releases_the_lone_users_item(twins):
    """The catalogue is declared or selected privately: item 777, one user's, is in no model, and each model's
    ``n_items`` is its released catalogue's size."""
    kind, (ra, rb), _ = twins
    for root in (ra, rb):
        for m in _model_dirs(_files(root)):
            info, led, arrays, _ = _model(root, m)
            ids = arrays["item_ids"].tolist()
            assert 777 not in ids, (kind, m)
            assert info["n_items"] == len(ids) == led["public_parameters"]["n_items"], (kind, m)
            assert led["public_parameters"]["items"]["source"] in ("selected", "declared"), (kind, m)


# --- every other file and every stdout: explicit allow-lists ---------------------------------------------------

#: ``file:field`` patterns (fnmatch; ``file`` relative to the output directory, ``<command>.stdout`` for a
#: command's JSON) of the fields outside a model that may differ between the twins, and why. Anything else must be
#: equal.
OTHER = {
    # the owner's evaluation on the test split and her non-private baselines (streamdp.manifest.SUMMARY: owner):
    # printed and kept for the data owner, computed on the data, never in a model
    "*:rows.*.test_rmse": "owner", "*:rows.*.test_mae": "owner", "*:rows.*.recall_at_k": "owner",
    "*:rows.*.ndcg_at_k": "owner", "*:rows.*.better_than_baselines": "owner", "*:summary.*.rmse_*": "owner",
    "*:summary.*.ndcg_*": "owner", "*:summary.*.recall_*": "owner", "*:baselines.*": "owner",
    "*:ranking_baselines.*": "owner",
    "*.png": "owner (the plot of the test RMSE)",
    # tune: the candidates' noisy validation losses, as model.json's tuning.candidates (a release: ledger 'tune:
    # validation losses of the N candidate configurations')
    "tune.stdout:tuning.candidates.*": "release",
    # timings: volatile
    "*:seconds": "timing", "*:rows.*.seconds": "timing", "*:train_seconds": "timing", "*:total_seconds": "timing",
    # random per store: the keyed fingerprint (each twin has its own key)
    "*:store_fingerprint": "keyed, random without the store's key", "*:rehearsal.like_fingerprint": "keyed",
    "*zarr.json:attributes.streamdp.params.like.store_fingerprint": "keyed",
}

#: The rehearsal's synthetic store and results are drawn from the statistics the store released (its results
#: name each: the released number of users and histogram, the released catalogue, item counts and means, the
#: spread release): their values differ with the releases' noise. The shape of what they publish is equal.
REHEARSAL = {
    "rehearsal/results.json:rehearsal.*": "read off the releases named in its 'source' fields",
    "rehearsal/synthetic.zarr/zarr.json:attributes.streamdp.*": "a synthetic store drawn from released values",
    "rehearsal/synthetic.zarr/*": "its arrays, budget and key: a store of synthetic ratings drawn from released "
                                  "values (with fresh noise: the shape statistics it releases are not seeded)",
}


def _flat_all(v, p=""):
    """Leaves of a JSON value, lists of objects indexed (``rows.0.test_rmse``)."""
    if isinstance(v, dict) and v:
        out = {}
        for k, x in v.items():
            out.update(_flat_all(x, f"{p}{k}."))
        return out
    if isinstance(v, list) and v and all(isinstance(x, (dict, list)) for x in v):
        out = {}
        for i, x in enumerate(v):
            out.update(_flat_all(x, f"{p}{i}."))
        return out
    return {p[:-1]: v}


def _allowed(where: str, table=None) -> bool:
    table = {**OTHER, **REHEARSAL} if table is None else table
    return any(fnmatch.fnmatch(where, pat) for pat in table)


def test_every_other_file_differs_only_where_it_is_allowed(twins):
    """Sweep results and plots, the rehearsal's results and synthetic store, the batch lists' file: every field
    that differs is on :data:`OTHER` or :data:`REHEARSAL`; both twins wrote the same files."""
    kind, (ra, rb), _ = twins
    fa, fb = _files(ra), _files(rb)
    models = _model_dirs(fa)
    bad = [f"only one twin wrote {f}" for f in sorted(fa ^ fb)
           if not _allowed(f)]  # the synthetic store's chunk count follows its drawn size
    for f in sorted(fa & fb):
        if any(f.startswith(m + "/") for m in models) or f.endswith(".parquet"):
            continue  # models: test_models_differ_only_in_ledgered_releases; Parquet: its own test
        if f.endswith(".json"):
            a, b = (_flat_all(_rel(json.loads((r / "out" / f).read_text()), r)) for r in (ra, rb))
            bad += [f"{f}:{k}: {a.get(k, '<absent>')!r} != {b.get(k, '<absent>')!r}" for k in _diff(a, b)
                    if not _allowed(f"{f}:{k}")]
        elif f.endswith(".csv"):  # results.csv: the rows of results.json, a column a field
            a, b = (pd.read_csv(r / "out" / f).astype(str).map(lambda v, r=r: _rel(v, r)) for r in (ra, rb))
            assert list(a.columns) == list(b.columns) and len(a) == len(b), f
            bad += [f"{f}: column {c} differs" for c in a.columns
                    if not a[c].equals(b[c]) and not _allowed(f"{f.replace('.csv', '.json')}:rows.*.{c}")]
        elif (ra / "out" / f).read_bytes() != (rb / "out" / f).read_bytes() and not _allowed(f) \
                and not _allowed(f"{f}:*"):
            bad.append(f"{f}: bytes differ")
    assert bad == [], "\n".join(bad)


def test_every_stdout_json_differs_only_in_owner_fields_and_releases(twins):
    """``train``/``tune``/``evaluate``/``sweep --json``: a top-level field of :data:`streamdp.manifest.SUMMARY`
    may differ when its provenance is owner, release or post; any other field must be on :data:`OTHER` (or the
    rehearsal's :data:`REHEARSAL`, its results printed)."""
    kind, (ra, rb), (sa, sb) = twins
    assert sa.keys() == sb.keys()
    bad = []
    for name in sa:
        if name == "recommend":
            continue  # the batch form prints its summary in text (no --json)
        a, b = (_flat_all(_rel(json.loads(out), r)) for out, r in ((sa[name], ra), (sb[name], rb)))
        for k in _diff(a, b):
            prov = manifest.SUMMARY.get(k.split(".")[0])
            if prov in (manifest.OWNER, manifest.RELEASE, manifest.POST):
                continue
            file = "rehearsal/results.json" if name == "rehearse" else f"{name}.stdout"
            if not _allowed(f"{file}:{k}"):
                bad.append(f"{name} --json: {k} ({prov}): {a.get(k, '<absent>')!r} != {b.get(k, '<absent>')!r}")
    assert bad == [], "\n".join(bad)


def test_batch_lists_name_only_released_items(twins):
    """The batch file (every user's list, the owner's): same schema and metadata; the lone user is the only user
    one twin has more; every list, hers included, names only items of the model's released catalogue."""
    import pyarrow.parquet as pq

    kind, (ra, rb), _ = twins
    pa_, pb_ = (pq.read_table(r / "out" / "all.parquet") for r in (ra, rb))
    assert pa_.schema == pb_.schema and pa_.schema.metadata == pb_.schema.metadata
    ua, ub = (set(t.column("user_id").to_pylist()) for t in (pa_, pb_))
    assert ub - ua <= {LONE} and ua <= ub
    for root, t in ((ra, pa_), (rb, pb_)):
        catalogue = set(_model(root, "als")[2]["item_ids"].tolist())
        items = set(t.column("item_id").to_pylist())
        assert items <= catalogue and 777 not in items, (kind, sorted(items - catalogue))


def test_tune_candidates_see_the_catalogues_items(tmp_path):
    """``tune`` on a store with a private catalogue stopped with "item_ids: has 31 entries, not 29 (the store is
    damaged)": its candidates' held-out view took the store's items, not the catalogue view's it wraps."""
    from streamdp.storage.catalogue import CatalogueView
    from streamdp.workflows.tune import _Sampled

    st = streamdp.ingest(_frame(TWINS["lone-item"], n_users=60), str(tmp_path / "s.zarr"), rating_range="1,5")
    view = CatalogueView(st, np.arange(0, 30, 2))
    cand = _Sampled(view, key=3, q=0.5, n_users=60)
    assert cand.n_items == 15 and cand.item_ids().tolist() == view.item_ids().tolist()
    assert len(cand.item_counts()) == 15 and len(cand.block_user_counts(0)) == cand.read_block(0).n_users
    assert all(int(b.items.max(initial=0)) < 15 for b in map(cand.read_block, range(cand.n_blocks)))
    assert cand.read_block_unchecked(0)[0].items.max() < 15


def test_the_catalogue_release_publishes_no_item_count(tmp_path):
    """The catalogue's ledger entry gave its noisy counts' shape, the store's item count: 30 on D, 31 on D plus a
    user alone on item 777, in every model's ``privacy.json`` (``bounds.releases``)."""
    from streamdp.privacy.catalogue import select_catalogue

    entries = []
    for i, extra in enumerate(((), TWINS["lone-item"])):
        st = streamdp.ingest(_frame(extra, n_users=60), str(tmp_path / f"s{i}.zarr"), rating_range="1,5")
        assert st.n_items == 30 + i
        entries.append(select_catalogue(st, epsilon=8.0, delta=1e-6, seed=1).release.entry())
    assert entries[0] == entries[1] and entries[0]["shape"] == []
