"""Every id type, end to end, through the command line and the Python API.

Rating files in CSV, TSV and Parquet with integer ids (0, negative, beyond 2^32),
ASCII string ids, unicode ids (accents, CJK, Hangul, emoji, a precomposed and a
combining ``café``, a space, a comma), ids of mixed widths (``a`` to 300 characters)
and numeric-looking ids with leading zeros (``7``, ``07``, ``007``, ``0``, ``00``,
``-0``: six different ids) are ingested; the stores must hold the ids exactly as
written. On stores with integer ids and with every kind of string id at once, every
method is trained, evaluated and recommended from (``recommend --ratings`` with a
unicode id), swept, and used from the Python API; every id that comes back must be
one of the originals, of the original type.

Bugs these tests found (every test function here fails on the code before them; the
integer-id and ASCII parametrizations are the coverage the issue asks for):

* with zarr 3.1 / numpy 2.x, ids come back as ``StringDType``, and ``np.searchsorted``
  between two such arrays misreads strings longer than 15 bytes (numpy issue 31533):
  ``train`` and ``evaluate`` of every method but three failed on unicode and long ids
  with "the store's items are not the model's items", and ``Model.predict`` said a
  300-character item was not an item of the model;
* ``007`` and ``7`` in a text file were one integer id 7 (their users and items merged);
* a ratings file with a byte-order mark lost its first item; one not in UTF-8 ended
  in a traceback;
* ``--user-weights`` read ``007`` and ``7`` as the same user ("listed twice"), and
  ``--public-users`` cut ids at a space or a comma;
* Parquet ids of type uint64 beyond int64 ended in a traceback;
* with zarr 3.0.8 (the lower bound) every ``train`` ended in a traceback saving the model.

The per-method matrix runs by default on integer ids and on a store holding every kind
of string id at once (``mixed``, CSV); every kind x format x method is ``slow``.
"""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import streamdp
from streamdp.cli import RECOMMEND_HEADER, main
from streamdp.storage.store import open_store

N_USERS, N_ITEMS, PER_USER = 150, 30, 8

UNICODE = ["Ünïcødé-α", "映画", "🎬🍿", "café", "cafe\u0301", "Ωμέγα", "한국어", "a b", "x,y", "ß"]
ZEROS = ["7", "07", "007", "0", "00", "-0"]


def _ids(kind: str, n: int, tag: str) -> list:
    """``n`` distinct ids of ``kind`` (ints for ``int``, str otherwise); ``tag`` tells users from items."""
    if kind == "int":
        return [0 if k == 0 else -5 if k == 1 else 10**12 + k if k % 3 == 0 else k for k in range(n)]
    if kind == "ascii":
        return [f"{tag.upper()}{k:07d}N7NQ" for k in range(n)]
    if kind == "unicode":
        return [UNICODE[k] if k < len(UNICODE) else f"{UNICODE[k % len(UNICODE)]}-{tag}{k}" for k in range(n)]
    if kind == "wide":
        return ["a", "a" * 300] + ["a" * (2 + (k * 37) % 280) + tag for k in range(2, n)]
    if kind == "zeros":
        return ZEROS + [str(10 * k + (3 if tag == "u" else 1)) for k in range(len(ZEROS), n)]
    if kind == "mixed":  # every kind of string id in one store, most of them longer than 15 bytes
        base = UNICODE + ZEROS + ["a", "a" * 300, 'q"t']
        return base + [f"{UNICODE[k % len(UNICODE)]}-{tag}{k}" if k % 2 else "a" * (2 + (k * 37) % 280) + tag
                       for k in range(len(base), n)]
    raise ValueError(kind)


def _ratings(kind: str):
    users, items = _ids(kind, N_USERS, "u"), _ids(kind, N_ITEMS, "i")
    rng = np.random.default_rng(19)
    rows = []
    for u in users:
        for j in rng.choice(N_ITEMS, size=PER_USER, replace=False):
            rows.append((u, items[j], float(rng.integers(1, 6))))
    return users, items, rows


def _write(path: str, fmt: str, rows, kind: str) -> None:
    if fmt == "parquet":
        typ = pa.int64() if kind == "int" else pa.string()
        pq.write_table(pa.table({"user": pa.array([r[0] for r in rows], typ),
                                 "item": pa.array([r[1] for r in rows], typ),
                                 "rating": [r[2] for r in rows]}), path)
        return
    with open(path, "w", newline="", encoding="utf-8") as f:  # CSV quotes "x,y" and q"t; TSV has neither
        w = csv.writer(f, delimiter="," if fmt == "csv" else "\t", lineterminator="\n")
        w.writerow(["userId", "itemId", "rating"])
        w.writerows(rows)


def _cli(*args, ok: bool = True):
    r = CliRunner().invoke(main, [str(a) for a in args])
    if ok:
        assert r.exit_code == 0, (args, r.output, r.exception)
        assert r.exception is None or isinstance(r.exception, SystemExit)
    return r


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """``get(kind, fmt)``: ``(store path, users, items)``, ingested through the CLI once per module."""
    root = tmp_path_factory.mktemp("ids")
    made = {}

    def get(kind: str, fmt: str):
        if (kind, fmt) not in made:
            users, items, rows = _ratings(kind)
            d = root / f"{kind}-{fmt}"
            d.mkdir()
            src = str(d / f"ratings.{fmt}")
            _write(src, fmt, rows, kind)
            # the catalogue declared (one id per line, as written): 150 users are too few to select items privately
            (d / "items.txt").write_text("\n".join(str(i) for i in items) + "\n", encoding="utf-8")
            _cli("ingest", src, "--out", d / "s.zarr", "--test-fraction", "0.2", "--rating-range", "1,5",
                 "--items", d / "items.txt")
            made[kind, fmt] = (str(d / "s.zarr"), users, items)
        return made[kind, fmt]

    return get


def _same_ids(got, want) -> bool:
    """Exactly the same ids, of the same Python type (no 7 for '007', no '7' for 7)."""
    got = list(got.tolist() if hasattr(got, "tolist") else got)
    return sorted(got, key=repr) == sorted(want, key=repr) and {type(x) for x in got} == {type(x) for x in want}


# ---------------------------------------------------------------------------------------
# ingest and info: every kind x every format
# ---------------------------------------------------------------------------------------

KINDS = ["int", "ascii", "unicode", "wide", "zeros"]
FORMATS = ["csv", "tsv", "parquet"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_ingest_keeps_every_id_as_written(stores, kind, fmt):
    path, users, items = stores(kind, fmt)
    s = open_store(path)
    assert (s.n_users, s.n_items) == (N_USERS, N_ITEMS)  # 007, 07 and 7 are three users, three items
    assert _same_ids(s.user_ids(), users) and _same_ids(s.item_ids(), items)


@pytest.mark.parametrize("kind", ["int", "zeros"])
def test_info_says_how_ids_are_kept(stores, kind):
    path, _, _ = stores(kind, "csv")
    info = json.loads(_cli("info", path, "--json").stdout)
    want = "integer" if kind == "int" else "string"
    assert info["id_kinds"] == {"user": want, "item": want}
    assert f"users: {want}, items: {want}" in _cli("info", path).stdout


def test_parquet_uint64_ids_beyond_int64_become_text(tmp_path):
    big = [2**64 - 1, 2**63, 5]
    pq.write_table(pa.table({"user": pa.array(big * 2, pa.uint64()), "item": pa.array([1, 1, 1, 2, 2, 2], pa.uint64()),
                             "rating": [1.0, 2, 3, 4, 5, 1]}), tmp_path / "r.parquet")
    _cli("ingest", tmp_path / "r.parquet", "--out", tmp_path / "s.zarr")
    s = open_store(str(tmp_path / "s.zarr"))
    assert _same_ids(s.user_ids(), [str(x) for x in big]) and _same_ids(s.item_ids(), [1, 2])


# ---------------------------------------------------------------------------------------
# every method: train, save, load_model, evaluate, recommend (CLI) and the Python API
# ---------------------------------------------------------------------------------------

#: Tiny runs: laplace noise and one pass keep the calibration and the passes short.
METHODS = {
    "als": ["--epsilon", "1", "--iters", "1", "--mechanism", "laplace"],
    "irls": ["--epsilon", "1", "--iters", "1", "--mechanism", "laplace"],
    "means": ["--epsilon", "1", "--mechanism", "laplace"],
    "fw": ["--epsilon", "1", "--rank", "2", "--passes", "1"],
    "oja": ["--epsilon", "1", "--rank", "2", "--passes", "1"],
    "svd": ["--epsilon", "1", "--rank", "2"],
    "sgld": ["--epsilon", "1", "--rank", "2", "--epochs", "1"],
    "sgd": ["--epsilon", "inf", "--yes", "--rank", "2", "--epochs", "1"],
    "public-private": ["--epsilon", "1", "--rank", "2", "--public-fraction", "0.3", "--iters", "1"],
}


def _user_file(path, items, rated) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["item", "rating"])
        for j, r in zip(rated, [5, 1, 4, 2]):
            w.writerow([items[j], r])
    return str(path)


def _end_to_end(store, users, items, method, out_dir):
    out = out_dir / method
    summary = json.loads(_cli("train", store, "--method", method, "--out", out, "--workers", "1", "--seed", "0",
                              "--json", *METHODS[method]).stdout)
    assert math.isfinite(summary["test_rmse"])
    m = streamdp.load_model(str(out))
    assert _same_ids(m.item_ids, items)  # saved and loaded exactly, ascending
    ev = json.loads(_cli("evaluate", out, store, "--workers", "1", "--json").stdout)
    assert math.isfinite(ev["rmse"]) and ev["rmse"] == pytest.approx(summary["test_rmse"], rel=1e-4)

    rated = [0, 1, 2, len(items) - 1]  # the unicode ids, or 0 and -5, and the last
    mine = _user_file(out_dir / f"{method}-me.csv", items, rated)
    lines = _cli("recommend", out, "--ratings", mine, "--top", "50").stdout.splitlines()
    assert lines[0] == RECOMMEND_HEADER
    shown = [ln.rsplit("\t", 1)[0] for ln in lines[1:]]
    assert sorted(shown) == sorted(str(items[j]) for j in range(len(items)) if j not in rated)
    js = json.loads(_cli("recommend", out, "--ratings", mine, "--top", "5", "--json").stdout)
    assert js["unknown_items"] == [] and js["n_ratings_used"] == len(rated)
    assert set(js["items"]) <= set(items) - {items[j] for j in rated}

    # the Python API: original ids in, original ids out
    recs = m.recommend({items[j]: r for j, r in zip(rated, [5, 1, 4, 2])}, n=3)
    assert len(recs) == 3 and all(i in set(items) and type(i) is type(items[0]) for i, _ in recs)
    want = [items[3], items[len(items) // 2]] if not isinstance(items[0], str) else ["a" * 300, items[2]]
    want = [w for w in want if w in set(items)] or items[3:5]
    p = m.predict({items[0]: 5.0}, items=want)
    assert p.shape == (len(want),) and np.all(np.isfinite(p))
    return m


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("kind", ["int", "mixed"])
def test_every_method_end_to_end(stores, tmp_path, kind, method):
    store, users, items = stores(kind, "csv")
    _end_to_end(store, users, items, method, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS + ["mixed"])
def test_every_method_every_kind_every_format(stores, tmp_path, kind, fmt, method):
    if kind == "mixed" and fmt == "tsv":
        pytest.skip("TSV is not quoted: the mixed ids hold a quote character")
    store, users, items = stores(kind, fmt)
    _end_to_end(store, users, items, method, tmp_path)


@pytest.mark.slow  # a sweep calibrates 4x; 30 s on a busy 2-core machine (string-id training stays in the default run)
@pytest.mark.parametrize("kind", ["int", "mixed"])
def test_sweep_and_python_api(stores, tmp_path, kind):
    store, users, items = stores(kind, "csv")
    _cli("sweep", store, "--methods", "means", "--epsilons", "1,2", "--repeats", "1", "--out", tmp_path / "sw",
         "--workers", "1", "--seed", "0")
    with open(tmp_path / "sw" / "results.json") as f:
        rows = json.load(f)["rows"]
    assert len(rows) == 2 and all(math.isfinite(r["test_rmse"]) for r in rows)
    for name in os.listdir(tmp_path / "sw" / "models"):
        assert _same_ids(streamdp.load_model(str(tmp_path / "sw" / "models" / name)).item_ids, items)

    model = streamdp.train(store, method="means", epsilon=1.0, seed=0, workers=1, mechanism="laplace")
    assert _same_ids(model.item_ids, items) and math.isfinite(model.summary["test_rmse"])
    back = streamdp.load_model(model.save(str(tmp_path / "m")))
    assert _same_ids(back.item_ids, items)
    recs = back.recommend([(items[0], 5.0), (items[1], 2.0)], n=4)
    assert all(i in set(items) and i not in (items[0], items[1]) for i, _ in recs)


# ---------------------------------------------------------------------------------------
# user files (recommend --ratings, --user-weights, --public-users): ids as written
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zeros_model(stores, tmp_path_factory):
    store, users, items = stores("zeros", "csv")
    out = tmp_path_factory.mktemp("zm") / "m"
    _cli("train", store, "--method", "means", "--epsilon", "1", "--mechanism", "laplace", "--out", out)
    return str(out), items


def test_recommend_tells_007_from_7(zeros_model, tmp_path):
    out, items = zeros_model
    mine = tmp_path / "me.csv"
    mine.write_text("item,rating\n007,5\n7,1\n07,3\n", encoding="utf-8")
    js = json.loads(_cli("recommend", out, "--ratings", mine, "--top", "50", "--json").stdout)
    assert js["n_ratings_used"] == 3 and js["unknown_items"] == []
    assert sorted(js["items"]) == sorted(set(items) - {"007", "7", "07"})


def test_ratings_file_with_byte_order_mark_or_not_utf8(stores, tmp_path):
    store, users, items = stores("unicode", "csv")
    _cli("train", store, "--method", "means", "--epsilon", "1", "--mechanism", "laplace", "--out", tmp_path / "m")
    bom = tmp_path / "bom.csv"  # no header: the first line is an item whose id follows the mark
    bom.write_bytes("\ufeffÜnïcødé-α,5\n映画,2\n".encode("utf-8"))
    js = json.loads(_cli("recommend", tmp_path / "m", "--ratings", bom, "--json").stdout)
    assert js["n_ratings_used"] == 2 and js["unknown_items"] == []
    latin = tmp_path / "latin1.csv"
    latin.write_bytes("item,rating\ncafé,5\n".encode("latin-1"))
    r = _cli("recommend", tmp_path / "m", "--ratings", latin, ok=False)
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert r.output.strip().count("\n") == 0 and r.output.startswith(f"streamdp: error: {latin}: not UTF-8")


def test_user_weights_tell_007_from_7(stores, tmp_path):
    store, users, items = stores("zeros", "csv")
    w = tmp_path / "w.csv"
    w.write_text("user,weight\n007,0.5\n7,0.25\n-0,1\n", encoding="utf-8")
    _cli("train", store, "--method", "sgld", "--epsilon", "1", "--rank", "2", "--epochs", "1", "--out", tmp_path / "m",
         "--user-weights", w)
    from streamdp.methods.sgld import read_user_weights

    kind, ids, vals = read_user_weights(str(w), numeric=False)
    assert ids.tolist() == ["-0", "007", "7"] and vals.tolist() == [1.0, 0.5, 0.25]


def test_public_users_with_spaces_commas_and_unicode(stores, tmp_path):
    store, users, items = stores("mixed", "csv")
    pub = tmp_path / "public.csv"
    chosen = [u for u in users if u in ("a b", "x,y", "映画", "007", "7", 'q"t', "a" * 300)]
    with open(pub, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows([[u] for u in chosen])
    summary = json.loads(_cli("train", store, "--method", "public-private", "--epsilon", "1", "--rank", "2",
                              "--iters", "1", "--public-users", pub, "--out", tmp_path / "m", "--json").stdout)
    assert math.isfinite(summary["test_rmse"])
    from streamdp.methods.public_private import public_candidates

    cand = public_candidates(open_store(store), str(pub))
    assert _same_ids(cand["ids"], chosen) and np.all(cand["indices"] >= 0)
