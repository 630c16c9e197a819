"""The release manifest: every byte a model directory holds, declared once with its provenance.

A released model is ``model.json``, ``privacy.json`` and ``factors.zarr`` (arrays and
attributes). Every field that may appear in them is declared here (:data:`MODEL_JSON`,
:data:`PRIVACY_JSON`, :data:`BOUNDS`, :data:`ARRAYS`, :data:`ATTRS`) with where its value
comes from:

* ``public``: a public parameter (an option or its default, the declared rating range,
  the item catalogue, software versions, random identifiers);
* ``release``: a noisy release named in the ledger, accounted by the accountant;
* ``post``: post-processing of released values and public parameters only;
* ``nonprivate``: an exact statistic of the training data, allowed only in a
  "non-private" model (``--epsilon inf``): a private model holding one is refused.

Non-private evaluation and exact training statistics are ``owner`` fields
(:data:`SUMMARY`): printed for the data owner by ``train``/``evaluate``, never written
into a model.

Decisions a reader must know:

* :func:`check_release` runs inside :func:`streamdp.serving.model.save_model`: an
  undeclared field (or a ``nonprivate`` one in a private model) stops the write, so a new
  field cannot leak silently; ``tests/test_manifest.py`` checks every method's fields;
* the exact number of users is never written and no default is derived from it
  (:mod:`streamdp.privacy.users`): ``n_users`` is the count **released** with Laplace
  noise, or the number the owner **declared** public with ``--users-bound``; it is exact
  only where the guarantee keeps the users fixed (non-private runs, ``lowrank``,
  ``public-private``).

Design notes (each provenance in full, what reads the number of users):
docs/design-notes.md#streamdpmanifestpy.
"""

from __future__ import annotations

import hashlib
import json
import math

PUBLIC, RELEASE, POST, NONPRIVATE, OWNER = "public", "release", "post", "nonprivate", "owner"
#: The prefix of a lists part's arrays (:mod:`streamdp.methods._lists`): each declared as the array it names.
LISTS_PREFIX = "lists_"

#: ``model.json``: a key (dotted path into nested objects) -> (provenance, what it is). A key declared
#: at some level covers everything below it.
MODEL_JSON = {
    "format": (PUBLIC, "file format name"),
    "format_version": (PUBLIC, "file format version"),
    "item_order": (PUBLIC, "order of the per-item arrays (ascending item id, never the store's popularity order)"),
    "method": (PUBLIC, "training method"),
    "mechanism": (PUBLIC, "lowrank: the mechanism option"),
    "rank": (POST, "number of factors (option, default from public parameters, or ials: chosen on the released "
                   "counts)"),
    "epsilon": (PUBLIC, "the ledger's epsilon: the privacy target (option), or the claim that replaced it"),
    "epsilon_target": (PUBLIC, "the --epsilon asked for, when the ledger claims another epsilon (option)"),
    "delta": (PUBLIC, "privacy target (option, or default from the released or declared n_users)"),
    "seed": (PUBLIC, "the seed given (a seeded run is not private against whoever knows it)"),
    "n_users": (RELEASE, "number of users: released with Laplace noise (ledger: 'number of users'), or the declared "
                         "--users-bound; exact only in non-private runs and where the relation fixes the users "
                         "(module docstring of streamdp.manifest)"),
    "n_items": (RELEASE, "number of items of the model's catalogue: declared by the data owner (public), or selected "
                         "privately (ledger: 'item catalogue'; streamdp.privacy.catalogue); exact only in non-private "
                         "runs and where the relation fixes the items"),
    "rating_range": (RELEASE, "rating range: declared at ingest (public), or selected privately (source 'selected'; "
                             "ledger: 'rating range', streamdp.privacy.rating_range), or public-private's public "
                             "users' lowest and highest rating (source 'public users': public data); observed only "
                             "in non-private runs"),
    "store_fingerprint": (PUBLIC, "keyed HMAC of the store's checksum (streamdp.storage.fingerprint): random "
                                  "without the store's key"),
    "budget_entry": (PUBLIC, "random id of the store-budget entry that released the model"),
    "run_id": (PUBLIC, "id of the run: a hash of its settings and the store's keyed fingerprint (what a "
                       "--checkpoint resumes), then a random part"),
    "run_directory": (PUBLIC, "the --checkpoint directory given (None: a private run directory)"),
    "resumed_from_iteration": (PUBLIC, "iteration a --checkpoint run resumed from"),
    "data_window": (PUBLIC, "the period of the store trained on, as the user named it: --since/--until/--window (a "
                            "window ends at --until or at the clock of the run, never at a time read off the data), "
                            "--until-segment (streamdp.storage.timeline)"),
    "warm_start": (POST, "--warm-start: the model the run started from (path, method, run id, budget entry: public) and "
                         "how many of its items matched the run's catalogue by id, were new or dropped (of two "
                         "public item lists: the released model's and the run's catalogue)"),
    "resumed_from_epoch": (PUBLIC, "epoch a --checkpoint run resumed from"),
    "parameters": (POST, "settings of the run: options as given, or defaults derived from public parameters and "
                         "released values (e.g. ALS iterations from the noisy user profile)"),
    "engine": (PUBLIC, "workers, scheduler, memory limit of the run"),
    "local": (PUBLIC, "the local solve a user runs on her side"),
    "local_fw": (PUBLIC, "fw: the local solve's settings (k, clip, bound)"),
    "local_huber": (PUBLIC, "irls: the local Huber solve's settings"),
    "popularity_column": (PUBLIC, "ials: whether the item rows' last column is the popularity from the released "
                                  "counts (an option)"),
    "local_implicit": (PUBLIC, "ials: how the local solve turns a user's values into confidences (options, the "
                               "declared range)"),
    "local_user_bias": (PUBLIC, "whether the local solve fits the user's own intercept"),
    "list_scorer": (POST, "how lists rank items (streamdp.serving.local.list_scorer): the predicted rating, plus a weight "
                          "(from the declared rating range and the released share of one-rating users) times the log of "
                          "the released item counts; with chart_first, a private top-K chart's items first"),
    "ridge": (POST, "ridge of the local solve (option, default, or chosen on public ratings)"),
    "ridge_rule": (PUBLIC, "how sgld's local ridge follows from its options"),
    "item_factors": (PUBLIC, "what the released item_factors array is (text)"),
    "released": (PUBLIC, "lowrank: what the released arrays are (text)"),
    "not_released": (PUBLIC, "lowrank: what stays with the users (text)"),
    "iterations_run": (POST, "als/irls: iterations run (fewer than planned when a gated choice dropped the factors)"),
    "factors_released": (POST, "whether the release holds factors (iterations > 0, chosen on released values)"),
    "n_items_with_factors": (POST, "items whose noisy weight total (als) or count (ials) passed the public threshold"),
    "lists": (POST, "the lists part trained in the same release (streamdp.methods._lists): its method, share (of "
                    "the epsilon the releases made first left) and epsilon, whether the lists are its (chosen on "
                    "released values) and why, and, when they are, its model.json fields (each checked against this "
                    "manifest as a model.json of its own) and the names of its released arrays (factors.zarr "
                    "lists_*)"),
    "selection": (POST, "the candidate chosen on the noisy validation losses (streamdp.methods._selection); under "
                        "--warm-start, the warm-start model's released choice reused (`reused_from`: post-processing "
                        "of its model.json, no release)"),
    "selection.noisy_validation_losses": (RELEASE, "noisy validation losses of the candidates (ledger: "
                                                   "'validation losses of the N candidate releases')"),
    "selection.validation_losses": (NONPRIVATE, "exact validation losses (non-private runs only)"),
    "selection.why": (POST, "ials: the choice between the factors and the chart in words (the ledger's note; its sum is the noisy "
                              "release, exact in a non-private run)"),
    "selection.classes": (RELEASE, "ials, private: per class of users by training items (5+, fewer) the noisy sum "
                                   "of held-out hit differences and what it chose for them (ledger: 'validation: "
                                   "sums over users ...')"),
    "chart": (POST, "ials, and als on a thin store: the chart is a private top-K selection's items first, in order, "
                    "then the released counts (als: its lists take them first, then the list score) (streamdp.privacy.topk; ledger: 'the chart: its top K items'); its kind and K"),
    "selection.chart_below": (POST, "ials: users of fewer training items than this list the chart by the released "
                                    "counts from their local solve (chosen on the noisy sums; 0: none)"),
    "selection.item_ridges": (NONPRIVATE, "the item-side ridges tried and their exact validation losses "
                                          "(non-private runs only)"),
    "selection.offset_ridge": (POST, "als/irls biases-only: the user intercept's empirical-Bayes ridge and the "
                                     "variances it was read off (streamdp.methods.als.offset_ridge; from the "
                                     "released offset moments)"),
    "tuning": (POST, "tune: the grid, the split of the budget and the configuration chosen on the candidates' "
                     "noisy validation losses (streamdp.tune)"),
    "tuning.candidates": (RELEASE, "tune: each candidate configuration, its epsilon and noisy validation loss "
                                   "(ledger: 'tune: validation losses of the N candidate configurations')"),
    "user_profile": (RELEASE, "noisy histogram of training ratings per user (ledger: 'histogram of training "
                              "ratings per user'), its public bins and noise scale"),
    "mu_train": (NONPRIVATE, "exact mean training rating (non-private sgd/sgld only)"),
    # public-private: the public users' data is public by declaration; the private side is noisy
    "public": (PUBLIC, "public-private: the public users (rule, counts): public data"),
    "private": (POST, "public-private: the private rounds' mechanism and the weight chosen on public ratings"),
    "lambda_prime": (POST, "public-private: the ridge chosen on held-out public ratings"),
    "lambda_prime_source": (PUBLIC, "public-private: how the ridge was chosen (text)"),
    "reg_chosen": (POST, "public-private: the regularization chosen on held-out public ratings"),
    "user_offset": (POST, "public-private: the user-offset column of the item factors, chosen on held-out public "
                          "ratings"),
    "user_offset.column": (POST, "public-private: whether the last item-factor column is the user offset"),
    "user_offset.ridge": (POST, "public-private: the user offset's ridge in rating units (lambda' / column^2)"),
    "user_offset.source": (PUBLIC, "public-private: how the user offset was chosen (text)"),
    "by_step": (POST, "public-private: per-step traces computed from public data and released statistics"),
}

#: ``privacy.json`` (the ledger): what was spent and under which bounds.
PRIVACY_JSON = {
    "format": (PUBLIC, "file format name"),
    "format_version": (PUBLIC, "file format version"),
    "method": (PUBLIC, "training method"),
    "guarantee": (PUBLIC, "the guarantee"),
    "epsilon": (PUBLIC, "privacy target"),
    "delta": (PUBLIC, "privacy target"),
    "neighbouring_relation": (PUBLIC, "the neighbouring relation of the guarantee"),
    "unit_of_privacy": (PUBLIC, "the unit of privacy (user)"),
    "accountant": (PUBLIC, "accountant library and version"),
    "accounting": (PUBLIC, "the accountant's composition of the events (a function of public noise scales)"),
    "events": (PUBLIC, "the DP events spent (mechanisms and noise scales)"),
    "seeded": (PUBLIC, "whether a seed was given"),
    "seed_note": (PUBLIC, "what a seed means for the guarantee"),
    "store_fingerprint": (PUBLIC, "keyed HMAC of the store's checksum (see model.json)"),
    "notes": (PUBLIC, "qualifications of the guarantee (text)"),
    "public_parameters": (PUBLIC, "the public parameters and where each comes from (n_users: released, declared or "
                                  "exact; n_items; rating range)"),
    "public_parameters.n_users.value": (RELEASE, "the number of users: as model.json's n_users (released with noise, "
                                                 "declared, or exact)"),
    "public_parameters.n_items": (RELEASE, "the number of items of the model's catalogue: as model.json's n_items"),
    "public_parameters.items.n_items": (RELEASE, "the catalogue's size: as model.json's n_items"),
    "bounds": (PUBLIC, "contribution bounds: options, their defaults from public parameters, released values"),
    "bounds.releases": (PUBLIC, "every noisy release: what, mechanism, sensitivity, noise scale, shape"),
    "model_digest": (PUBLIC, "sha256 of model.json's fields as released (streamdp.manifest.released_digest): a "
                             "model.json edited after release is refused when the model is loaded"),
    "individual_privacy": (PUBLIC, "a store with a per-user budget: its cap, the Renyi filter's order and bound, the "
                                   "per-user guarantee and this release's RDP (functions of public parameters and "
                                   "noise scales; the exact counts of retired users stay in the store's ledger)"),
}

#: The contribution bounds a ledger may carry (``privacy.json: bounds.<key>``): each an option, a default
#: from public parameters, or post-processing of a released value (e.g. ALS iterations from the profile).
BOUNDS = {
    "B", "kappa", "loss", "loss_bound_c", "posterior_scale", "prior_lambda", "prior_lambda_bias", "rho", "scale_s",
    "temperature", "tau", "weights", "run_id", "bias_clip_c", "clip_Delta", "residual_clip_R", "mechanism",
    "sampling", "sensitivity_norm", "centering", "clip_L", "nuclear_norm_k", "projection_rms_bound",
    "projection_mu", "stats_weight", "private_users", "public_users", "public_users_count", "public_ratings",
    "rating_min", "rating_max", "rating_range_source", "releases", "contribution", "clip", "sketch_clip",
    "sketch_quantile", "sketch_share", "oversampling", "columns", "prune", "prune_bound", "power_iters",
    "midpoint", "range", "pure_epsilon", "sensitivity", "epsilon_replace_one", "relation_covers", "centre",
    "sketch_clip_C", "target", "clip_popularity", "values", "mean_weight_cap_c",
    "lists",  # the lists part's own bounds (streamdp.methods._lists), each of them one of these
}

#: ``factors.zarr`` arrays and attributes.
ARRAYS = {
    "item_factors": (POST, "item factors fitted on released statistics"),
    "item_bias": (POST, "item biases from released statistics"),
    "item_ids": (RELEASE, "the model's item catalogue, ascending: declared (public) or selected privately (ledger: "
                          "'item catalogue')"),
    "noisy_item_weight": (RELEASE, "als: noisy item weight totals C_j (ledger: 'item weight totals'); ials: noisy "
                                   "item counts N_j (ledger: 'item counts'); with model.json's chart (both), the "
                                   "top-K selection's items lifted above the rest in its order (post-processing of "
                                   "both)"),
    "singular_values": (POST, "oja/lowrank: singular values of the noisy iteration or sketch"),
    "signal_share": (POST, "oja: share of each released direction above its noise"),
    "basis": (POST, "oja/lowrank: the item basis"),
    "eigenvalues": (POST, "svd: eigenvalues of the noisy covariance"),
    "fw_eta": (PUBLIC, "fw: the step sizes (public schedule)"),
    "fw_lambda": (POST, "fw: the released Frank-Wolfe weights"),
    "sigma_eigenvalues": (POST, "public-private: eigenvalues from public data and released statistics"),
    "public_item_count": (PUBLIC, "public-private: the public users' item counts (public data)"),
    "noisy_projection": (RELEASE, "lowrank (measurements): the noisy projection"),
}
ATTRS = {"global_mean": (POST, "the global mean from released statistics (or the public midpoint)")}

#: Fields of ``train --json`` / ``evaluate --json`` summaries: printed for the data owner, never in a model.
SUMMARY = {
    "method": PUBLIC, "epsilon": PUBLIC, "delta": PUBLIC, "rank": POST, "guarantee": PUBLIC, "out": PUBLIC,
    "epsilon_spent": PUBLIC, "seeded": PUBLIC, "privacy_warnings": PUBLIC, "stale_runs_removed": PUBLIC,
    "train_seconds": OWNER, "total_seconds": OWNER, "seconds": OWNER, "factors_released": POST, "effective_rank": POST,
    "test_rmse": OWNER, "test_mae": OWNER, "test_ratings": OWNER, "baselines": OWNER, "verdict": OWNER,
    "owner": OWNER, "model": PUBLIC, "store": PUBLIC, "rmse": OWNER, "mae": OWNER, "n_ratings": OWNER,
    "n_users": OWNER, "store_match": OWNER, "note": OWNER, "local": PUBLIC, "ridge": POST,
    "ranking": OWNER, "ranking_verdict": OWNER, "n_test_users": OWNER, "n_unknown_items": OWNER, "unknown_item_ratings": OWNER,
    "release_choice": POST,  # ials: whether the factors or the chart was released, and on what
    "items": RELEASE,  # the catalogue: declared, selected privately (a ledgered release) or exact (non-private)
    "rating_range": RELEASE,  # the rating range selected privately (a ledgered release), when it was
    "item_statistics": PUBLIC,  # where evaluate took its baselines' item sums from: the store, or a pass
    "warm_start": POST, "iterations_run": POST,  # train --warm-start: model.json's warm_start, the iterations run
    "segment": OWNER,  # evaluate --segment: the segment scored on and its number of ratings
    "data_window": PUBLIC,  # train --since/--until/--window/--until-segment: the period trained on (options)
    "user_filter": OWNER,  # a per-user budget: the exact counts of users taking part and retired (privacy/filter.py)
    "method_default": PUBLIC,  # train without --method on an interaction log: ials (the store's kind is public)
    "lists_part": POST,  # train --lists: model.json's lists without the part's fields (streamdp.methods._lists)
}


def released_digest(model_json: dict) -> str:
    """The digest of ``model.json``'s fields as written, which the ledger keeps (``privacy.json``: ``model_digest``).

    Every field of ``model.json`` may change what a user is shown (the local solve's settings, the list scorer,
    the chart threshold of ``selection.chart_below``, ``factors_released``...), and the file is written once, with
    the ledger, and never rewritten: so all of it is covered, and :func:`streamdp.serving.model.check_agrees` refuses a
    ``model.json`` that does not match. A digest of the released fields, public themselves, says nothing more.

    >>> released_digest({"b": 1, "a": [1.5, "inf"]}) == released_digest({"a": [1.5, "inf"], "b": 1})
    True
    """
    text = json.dumps(model_json, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class UndeclaredField(ValueError):
    """A model field without a declared provenance (a programming error: declare it or do not write it)."""


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from _leaves(v, path + ".")
        else:
            yield path


def _declared(path: str, table: dict):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        hit = table.get(".".join(parts[:i]))
        if hit is not None:
            return hit
    return None


def provenance(model_json: dict, privacy_json: dict, arrays, attrs) -> dict:
    """Every field of a model (``file:path`` -> provenance); raises :class:`UndeclaredField` on any unknown one.

    >>> provenance({"method": "als", "n_users": 3}, {"epsilon": 1.0, "bounds": {"tau": 5}}, ["item_ids"],
    ...            ["global_mean"])["model.json:n_users"]
    'release'
    >>> provenance({"users_clipped_by_iteration": [3]}, {}, [], [])
    Traceback (most recent call last):
    ...
    streamdp.manifest.UndeclaredField: model.json: users_clipped_by_iteration is not declared in streamdp.manifest
    """
    out = {}
    for path in _leaves(model_json):
        hit = _declared(path, MODEL_JSON)
        if hit is None:
            raise UndeclaredField(f"model.json: {path} is not declared in streamdp.manifest")
        out[f"model.json:{path}"] = hit[0]
    for path in _leaves(privacy_json):
        top = path.split(".")
        if top[0] == "bounds" and len(top) > 1 and top[1] != "releases":
            if top[1] not in BOUNDS:
                raise UndeclaredField(f"privacy.json: {path} is not a declared contribution bound "
                                      f"(streamdp.manifest.BOUNDS)")
            out[f"privacy.json:{path}"] = PUBLIC
            continue
        hit = _declared(path, PRIVACY_JSON)
        if hit is None:
            raise UndeclaredField(f"privacy.json: {path} is not declared in streamdp.manifest")
        out[f"privacy.json:{path}"] = hit[0]
    for name in arrays:
        own = name[len(LISTS_PREFIX):] if name.startswith(LISTS_PREFIX) else name  # a lists part's array: its own
        if own not in ARRAYS or (own != name and own == "item_ids"):  # the part shares the model's items
            raise UndeclaredField(f"factors.zarr: array {name} is not declared in streamdp.manifest")
        out[f"factors.zarr/{name}"] = ARRAYS[own][0]
    for name in attrs:
        if name not in ATTRS:
            raise UndeclaredField(f"factors.zarr: attribute {name} is not declared in streamdp.manifest")
        out[f"factors.zarr@{name}"] = ATTRS[name][0]
    return out


def check_release(model_json: dict, privacy_json: dict, arrays, attrs) -> dict:
    """:func:`provenance`, refusing ``nonprivate`` fields in a private model (one with finite epsilon)."""
    prov = provenance(model_json, privacy_json, arrays, attrs)
    eps = privacy_json.get("epsilon", model_json.get("epsilon"))
    private = isinstance(eps, (int, float)) and math.isfinite(eps)
    if private:
        bad = [k for k, p in prov.items() if p == NONPRIVATE]
        if bad:
            raise UndeclaredField(f"{bad[0]}: an exact statistic of the training data in a private model")
    return prov


def public_parameters(store, users, catalogue=None, rating_range=None) -> dict:
    """The ledger's ``public_parameters``: the run's number of users (a
    :class:`~streamdp.privacy.users.UserCount`: released, declared or exact), its items (a
    :class:`~streamdp.privacy.catalogue.Catalogue`: declared, selected privately or exact) and what a model
    publishes exactly. ``rating_range``: the model's (``model.json``'s), which is the run's range when its source is
    ``public users`` (``public-private`` on a store that declares none: the public users' lowest and highest rating).

    Of an implicit store (interaction counts) the count range is published only when
    declared (``--count-cap``): its observed maximum is an exact statistic of one user's
    interactions, so it is left out, and ``data`` says what the values are.
    """
    users_note = ("the number of users is released with noise (its release is the ledger's first event) or "
                  "declared with --users-bound, and the default delta and every default derived from a number of "
                  "users read that value, never the exact count (exact only in a non-private run or where the "
                  "method's relation keeps the users fixed); the items are a catalogue the owner declared or one selected "
                  "privately (items), never the store's items read off the data (exact only in a non-private run or "
                  "where the method's relation keeps the items fixed); ")
    items = {"items": catalogue.public_parameter()} if catalogue is not None else {}
    if getattr(store, "implicit", False):
        declared = getattr(store, "rating_range_source", "unknown") == "declared"
        return {
            "n_users": users.public_parameter(),
            "n_items": int(store.n_items),
            **items,
            "data": {"implicit": True, "value": store.attrs.get("value", "count"),
                     "count_cap": store.attrs.get("count_cap")},
            **({"rating_range": {"min": float(store.rating_min), "max": float(store.rating_max),
                                 "source": "declared"}} if declared else {}),
            "note": users_note + ("an implicit store's values are counts, whose range is published only as the "
                                  "declared --count-cap (the observed maximum is an exact statistic and is not "
                                  "published)"),
        }
    selected = getattr(catalogue, "range", None)
    if selected is not None:
        rr = selected.public_parameter()
    elif (rating_range or {}).get("source") == "public users":
        rr = {"min": float(rating_range["min"]), "max": float(rating_range["max"]), "source": "public users",
              "release": "the public users' lowest and highest training rating (public data, nothing spent); the "
                         "private users' ratings never set it and are clipped into it"}
    else:
        rr = {"min": float(store.rating_min), "max": float(store.rating_max),
              "source": getattr(store, "rating_range_source", "unknown")}
    return {
        "n_users": users.public_parameter(),
        "n_items": int(store.n_items),
        **items,
        "rating_range": rr,
        "note": users_note + ("the rating range is the one declared at ingest, or, with source 'selected', one "
                              "selected privately (its release is in the ledger; training ratings outside it are "
                              "clipped into it), or, with source 'public users' (public-private), the public users' "
                              "lowest and highest rating (public data); 'observed' (the data's own minimum and "
                              "maximum, exact statistics) only in a non-private run or a method fitted directly, "
                              "not through train or tune (its ledger notes it)"),
    }


def table_markdown() -> str:
    """The manifest as a Markdown table (docs/privacy.md, "What a model holds")."""
    rows = [("model.json", k, *v) for k, v in MODEL_JSON.items()]
    rows += [("privacy.json", k, *v) for k, v in PRIVACY_JSON.items()]
    rows += [("factors.zarr", k, *v) for k, v in ARRAYS.items()]
    rows += [("factors.zarr attrs", k, *v) for k, v in ATTRS.items()]
    lines = ["| file | field | provenance | what |", "|---|---|---|---|"]
    lines += [f"| {f} | `{k}` | {p} | {w} |" for f, k, p, w in rows]
    return "\n".join(lines)


if __name__ == "__main__":  # the table of docs/privacy.md: python -m streamdp.manifest
    print(table_markdown())
