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
        "tune": ("tune", s, "--method", "means", "--epsilon", "8", "--out", o / "tuned", "--json", *common),
        "sweep": ("sweep", s, "--methods", "means", "--epsilons", "8", "--out", o / "sweep", "--json", *common),
        "recommend": ("recommend", o / "als", "--store", s, "--out", o / "all.parquet", *common[2:]),
        "evaluate": ("evaluate", o / "als", s, "--json", *common[2:]),
        # after the models: the rehearsal reads the released statistics (the catalogue of a released model)
        "rehearse": ("sweep", s, "--rehearse", "--methods", "means", "--epsilons", "8", "--out", o / "rehearsal",
                     "--users", "200", "--ratings-per-user", "8", "--json", *common),
    }


@pytest.fixture(scope="module", params=list(TWINS))
def twins(request, tmp_path_factory):
    """``(kind, roots, stdouts)``: the two twins' roots (store and outputs) and each command's stdout."""
    roots, stdouts = [], []
    for i, extra in enumerate(((), TWINS[request.param])):
        root = tmp_path_factory.mktemp(f"{request.param}-{i}")
        streamdp.ingest(_frame(extra), str(root / "store.zarr"), rating_range="1,5", test_fraction=0.2, seed=1)
        (root / "out").mkdir()
        outs = {}
        for name, args in _commands(root / "store.zarr", root / "out").items():
            t = time.perf_counter()
            r = CliRunner().invoke(main, [str(a) for a in args])
            print(f"{request.param} {i} {name}: {time.perf_counter() - t:.1f}s", file=sys.stderr)
            assert r.exit_code == 0, (request.param, i, name, r.output[-2000:], r.exception)
            outs[name] = r.stdout
        roots.append(root)
        stdouts.append(outs)
    return request.param, roots, stdouts


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


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flat(v, path + "."))
        else:
            out[path] = v
    return out


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
    fa = {**_flat(ia, "model.json:"), **_flat(la, "privacy.json:")}
    fb = {**_flat(ib, "model.json:"), **_flat(lb, "privacy.json:")}
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
    assert models == _model_dirs(fb) and len(models) >= 6, models
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
