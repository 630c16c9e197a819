"""The release manifest: every field of every method's model is declared, and nothing exact is released.

Each method (and ``lowrank``) is trained on a small store with string item ids; every
field of ``model.json``, ``privacy.json`` and ``factors.zarr`` must have a declared
provenance (:mod:`streamdp.manifest`), a private model must hold no ``nonprivate``
field, and no file of the model may hold the store's content checksum (a hash of the
data: whoever knows all users but one could test candidates for the last one).
Before the manifest, ``als`` released ``users_clipped_by_iteration`` and ``sgld``
``train_rmse_by_epoch``/``n_train_used``/``per_user_epsilon`` exactly, and every model
the store's checksum.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import zarr

from streamdp import manifest
from streamdp.privacy import GUARANTEE_NONE, Ledger
from streamdp.serving.model import load_model, save_model
from streamdp.workflows.training import lowrank as run_lowrank, train
from tests.conftest import flat

EXACT = {"users_clipped_by_iteration", "train_rmse_by_epoch", "n_train_used", "per_user_epsilon", "epoch_seconds",
         "seconds", "seconds_fit", "responders", "responders_by_round", "store_checksum"}

RUNS = {
    "als": dict(method="als", epsilon=1.0, iters=2),
    "als-inf": dict(method="als", epsilon=math.inf),
    "means": dict(method="means", epsilon=1.0),
    "irls": dict(method="irls", epsilon=1.0, iters=1),
    "fw": dict(method="fw", epsilon=1.0, rank=3),
    "oja": dict(method="oja", epsilon=1.0, rank=3),
    "svd": dict(method="svd", epsilon=1.0, rank=3),
    "sgld": dict(method="sgld", epsilon=1.0, rank=3, epochs=1),
    "sgd": dict(method="sgd", epsilon=math.inf, rank=3, epochs=1),
    "public-private": dict(method="public-private", epsilon=1.0, rank=3, public_fraction=0.1, iters=1,
                           private_mechanism="laplace", private_fraction=0.2, private_rounds=1, round_iters=1),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    path = tmp_path_factory.mktemp("manifest") / "s.zarr"
    return generate_store(str(path), n_users=1500, n_items=80, ratings_per_user=12, rank=3, seed=3,
                          test_fraction=0.2, block_users=500, string_ids=True)


def _fields(path):
    with open(os.path.join(path, "model.json")) as f:
        info = json.load(f)
    with open(os.path.join(path, "privacy.json")) as f:
        led = json.load(f)
    g = zarr.open_group(os.path.join(path, "factors.zarr"), mode="r")
    return info, led, list(g.array_keys()), list(g.attrs)


def _keys(d):
    for k, v in d.items():
        yield k
        if isinstance(v, dict):
            yield from _keys(v)


def _assert_released_by_manifest(path, store, private: bool, count_released: bool | None = None):
    info, led, arrays, attrs = _fields(path)
    prov = manifest.check_release(info, led, arrays, attrs)  # raises on any undeclared field
    users = led["public_parameters"]["n_users"]
    assert prov["model.json:n_users"] == "release" and users["value"] == info["n_users"]
    if count_released is None:
        count_released = private
    # a private run's count is the noisy release listed first in the ledger, never the exact one written as is
    assert users["source"] == ("released" if count_released else "exact"), users
    if count_released:
        assert led["bounds"]["releases"][0]["release"].startswith("number of users")
        assert led["bounds"]["releases"][0]["mechanism"] == "laplace"
    assert not (EXACT & set(_keys(info))) and not (EXACT & set(_keys(led))), EXACT & {*_keys(info), *_keys(led)}
    if private:
        assert not any(p == manifest.NONPRIVATE for p in prov.values())
    digest = store.checksum.split(":")[-1].encode()
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                assert digest not in fh.read(), os.path.join(root, name)
    assert info["store_fingerprint"].startswith("hmac-sha256:") and led["store_fingerprint"] == info[
        "store_fingerprint"]
    return info


@pytest.mark.parametrize("name", list(RUNS))
def test_every_field_of_every_method_is_declared(store, tmp_path, name):
    opts = dict(RUNS[name])
    out = str(tmp_path / name)
    summary = train(store, out=out, delta=1e-5, seed=None, workers=1, **opts)
    private = math.isfinite(opts["epsilon"])
    info = _assert_released_by_manifest(out, store, private=private,
                                        count_released=private and name != "public-private")
    for key in summary:
        assert key in manifest.SUMMARY, f"summary field {key} is not declared"
    assert "seconds" not in info and "train_seconds" in summary
    assert "blocks_in_flight" not in info["engine"]  # sized from the largest block's rating count under a tight limit
    m = load_model(out)  # string ids end to end: saved, loaded, evaluated, recommended
    assert m.item_ids.dtype.kind in "UTO" and np.isfinite(summary["test_rmse"])
    assert len(m.recommend({str(m.item_ids[0]): 4.0}, n=3)) == 3


def test_exact_statistics_go_to_the_owner_not_the_model(store, tmp_path):
    s = train(store, out=str(tmp_path / "a"), method="als", epsilon=1.0, delta=1e-5, iters=2, select="off",
              workers=1)
    assert len(s["owner"]["users_clipped_by_iteration"]) == 2
    s = train(store, out=str(tmp_path / "g"), method="sgld", epsilon=1.0, delta=1e-5, rank=3, epochs=2, workers=1)
    assert len(s["owner"]["train_rmse_by_epoch"]) == 2 and s["owner"]["n_train_used"] > 0


def test_lowrank_fields_are_declared(store, tmp_path):
    out = str(tmp_path / "lr")
    run_lowrank(store, rank=3, epsilon=1.0, delta=1e-5, out=out, workers=1)
    _assert_released_by_manifest(out, store, private=True, count_released=False)  # its relation fixes the users


def test_save_refuses_an_undeclared_field_and_exact_statistics_in_a_private_model(tmp_path):
    led = Ledger(method="demo", guarantee=GUARANTEE_NONE, epsilon=math.inf, delta=1e-6)
    args = dict(item_factors=np.ones((2, 1)), item_bias=np.zeros(2), item_ids=np.array([1, 2]), global_mean=3.0,
                ledger=led)
    with pytest.raises(manifest.UndeclaredField, match="users_clipped_by_iteration"):
        save_model(str(tmp_path / "m"), model_info={"method": "demo", "users_clipped_by_iteration": [3]}, **args)
    save_model(str(tmp_path / "ok"), model_info={"method": "demo", "mu_train": 3.1}, **args)  # non-private: fine
    from streamdp.privacy import GUARANTEE_USER_DP, gaussian_event

    private = Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=1.0, delta=1e-6,
                     events=[gaussian_event(5.0)])
    with pytest.raises(manifest.UndeclaredField, match="exact statistic"):
        save_model(str(tmp_path / "p"), model_info={"method": "demo", "mu_train": 3.1}, **{**args, "ledger": private})
    assert not (tmp_path / "m").exists() and not (tmp_path / "p").exists()


def test_the_docs_table_is_the_manifest():
    page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "privacy.md")).read()
    assert manifest.table_markdown() in page, "regenerate the table in docs/privacy.md: python -m streamdp.manifest"


# -- what a model's public fields may depend on (issue 28, findings 0 and 1) -------------------------------------------
#: Fields that are results computed from released values (or from the public users' public data) with the run's noise:
#: with the same seed on other data they may differ. Everything else the manifest calls public or post must not.
RESULTS = ("model.json:n_users", "model.json:user_profile", "model.json:iterations_run", "model.json:rank",
           "model.json:factors_released", "model.json:n_items_with_factors", "model.json:selection",
           "model.json:tuning.candidates", "model.json:tuning.chosen", "model.json:public", "model.json:private",
           "model.json:lambda_prime", "model.json:reg_chosen", "model.json:by_step",
           "privacy.json:public_parameters.n_users.value", "privacy.json:bounds.public_ratings")
#: Per run: results of released values that only that run has. lowrank's projection noise is set from the released
#: sketch (its largest row norm mu); public-private's ridge is chosen on the public users' ratings (public data).
RUN_RESULTS = {"lowrank": ("privacy.json:bounds.projection_mu", "privacy.json:bounds.releases"),
               "public-private": ("model.json:ridge",)}
#: Fields that are random per run whatever the seed (ids) or name the output directory.
RANDOM = ("model.json:run_id", "model.json:budget_entry", "model.json:store_fingerprint", "model.json:run_directory",
          "privacy.json:store_fingerprint", "privacy.json:bounds.run_id",
          "privacy.json:model_digest")  # the digest of model.json, ids included



def _public_fields(path, results=()) -> dict:
    """Every leaf of ``model.json`` and ``privacy.json`` whose provenance is not ``release``, minus results and ids."""
    info, led, arrays, attrs = _fields(path)
    prov = manifest.check_release(info, led, arrays, attrs)
    leaves = {**flat(info, "model.json:"), **flat(led, "privacy.json:")}
    if "privacy.json:bounds.releases" in results:  # only the entries set from a released value may differ
        leaves["privacy.json:bounds.releases"] = [
            {k: v for k, v in e.items() if k not in ("sensitivity", "scale")} if "realized" in
            e.get("sensitivity_rule", "") else e for e in leaves["privacy.json:bounds.releases"]]
        results = tuple(r for r in results if r != "privacy.json:bounds.releases")
    return {k: v for k, v in leaves.items()
            if prov.get(k) != manifest.RELEASE and not k.startswith(RESULTS + RANDOM + tuple(results))}


def _differing(a: str, b: str, results=()) -> list:
    fa, fb = _public_fields(a, results), _public_fields(b, results)
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, "<absent>") != fb.get(k, "<absent>"))


def _twin_stores(root, *, users=(600, 600), ratings=(20, 22), seeds=(5, 5)):
    """Stores of the same items whose users all rate exactly ``ratings[i]`` items (one bin of the released profile,
    so the released histograms agree under the same seed)."""
    from streamdp.storage.generate import generate_store

    return [generate_store(str(root / f"t{i}.zarr"), n_users=u, n_items=200, ratings_per_user=r, rank=3, seed=s,
                           user_exponent=1e9, block_users=300)
            for i, (u, r, s) in enumerate(zip(users, ratings, seeds))]


#: Every method with the options of RUNS (fast), and what is trained on each twin store.
TWIN_RUNS = {k: v for k, v in RUNS.items() if k not in ("als-inf", "sgd")}


@pytest.fixture(scope="module")
def rating_twins(tmp_path_factory):
    """Same users (600) and items (200), other ratings and rating counts (20 and 22 a user)."""
    return _twin_stores(tmp_path_factory.mktemp("twins"), seeds=(5, 6))


@pytest.mark.parametrize("name", [*TWIN_RUNS, "lowrank", pytest.param("tune", marks=pytest.mark.slow)])
def test_public_fields_do_not_depend_on_the_ratings(rating_twins, tmp_path, name):
    """Finding 1: sgld published step_users = ceil(16 n_items n_users / n_ratings), the exact rating count to 0.5%.

    On two stores of the same users and items with other ratings and rating counts, the same options and seed,
    every field the manifest calls public or post-processing is equal, but the released values and the results
    computed from them (:data:`RESULTS`)."""
    outs = []
    for i, st in enumerate(rating_twins):
        out = str(tmp_path / f"{name}{i}")
        if name == "lowrank":
            run_lowrank(st, rank=3, epsilon=1.0, delta=1e-5, out=out, seed=7, workers=1, memory_limit="4GB")
        elif name == "tune":
            from streamdp.workflows.tune import tune

            tune(st, epsilon=2.0, method="means", out=out, seed=7, workers=1, evaluate_test=False, memory_limit="4GB")
        else:
            train(st, out=out, delta=1e-5, seed=7, workers=1, evaluate_test=False, memory_limit="4GB",
                  **TWIN_RUNS[name])
        outs.append(out)
    assert _differing(*outs, RUN_RESULTS.get(name, ())) == []


@pytest.mark.parametrize("name", ["als", "means", "oja", "fw", "svd", "sgld"])
def test_one_user_more_changes_no_public_field_under_a_declared_bound(tmp_path, name):
    """Finding 0: every model published the exact number of users (2000 against 2001) and settings derived from it.

    Two stores that differ by one user (the last), trained with the same seed: with ``users_bound`` declared, every
    public and post-processing field is identical (n_users is the bound); without it, n_users is the noisy release
    the ledger lists first, Laplace at 1% of epsilon."""
    a, b = _twin_stores(tmp_path, users=(600, 601), ratings=(20, 20))
    opts = dict(TWIN_RUNS[name])
    outs = []
    for i, st in enumerate((a, b)):
        out = str(tmp_path / f"m{i}")
        train(st, out=out, delta=1e-5, seed=7, workers=1, evaluate_test=False, users_bound=1000,
              memory_limit="4GB", **opts)
        outs.append(out)
    assert _differing(*outs) == []
    info, led, _, _ = _fields(outs[0])
    assert info["n_users"] == 1000 and led["public_parameters"]["n_users"]["source"] == "declared"
    assert not any(r["release"].startswith("number of users") for r in led["bounds"]["releases"])

    out = str(tmp_path / "noisy")
    train(b, out=out, seed=7, workers=1, evaluate_test=False, **opts)
    info, led, _, _ = _fields(out)
    first = led["bounds"]["releases"][0]
    eps = opts["epsilon"]
    assert first["release"].startswith("number of users") and first["mechanism"] == "laplace"
    assert first["sensitivity"] == 1.0 and math.isclose(first["scale"], 1.0 / (0.01 * eps))
    assert info["n_users"] == led["public_parameters"]["n_users"]["value"] != 601
    assert led["delta"] == info["delta"] == 1e-6  # the default, from the released count
