"""``streamdp demo``: the main job end to end on synthetic data, in well under a minute.

Generates a low-rank power-law store with a 20% per-user test split, trains
``--method als`` (DP-ALS) at epsilon 1 (user-level, delta below 1/n_users of the released count), evaluates it on
the test split next to the non-private global-mean and item-mean baselines, and
prints the RMSEs, the lists' Recall@10 beside the most-popular chart (the ranking
verdict) and the privacy spent as the ledger records it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time

from streamdp.errors import Interrupted, StoreError
from streamdp.privacy import Ledger
from streamdp.privacy.accountant import check_calibratable, parse_epsilon
from streamdp.serving.evaluate import evaluate_model, format_baselines, format_verdict
from streamdp.serving.local import NOT_PERSONALISED
from streamdp.serving.model import check_model_destination
from streamdp.serving.ranking import format_ranking_short, format_ranking_verdict
from streamdp.storage.generate import generate_store
from streamdp.storage.writer import check_destination
from streamdp.workflows.training import train

#: Shape of the demo store: large enough for epsilon 1 to be useful, small enough to run in seconds.
DEMO_STORE = dict(n_users=100_000, n_items=1_000, ratings_per_user=40, rank=8, noise=0.5, seed=2026,
                  test_fraction=0.2)


def run_demo(out: str | None = None, *, epsilon: float = 1.0, force: bool = False, echo=None) -> dict:
    """Run the demo and return its summary.

    ``out`` keeps the store and the model (``out/ratings.zarr``, ``out/model``);
    without it they go to a temporary directory that is removed at the end, and then
    no path into it is printed or returned (``store`` and ``model`` are ``None``).
    Existing ``out/ratings.zarr`` / ``out/model`` are an error unless ``force``, and
    ``force`` replaces only a streamdp store and model (both checked before anything
    is generated; the store's budget ledger is carried over). Ctrl-C raises
    :class:`~streamdp.errors.Interrupted` saying what was kept and released.
    """
    epsilon = parse_epsilon(epsilon)
    check_calibratable(epsilon)  # before anything is generated
    say = echo or (lambda *a, **k: None)
    kept = out is not None
    if kept:
        if os.path.lexists(out) and not os.path.isdir(out):
            raise StoreError(f"{out}: exists and is not a directory (--out names a directory for the demo)")
        store_path, model_path = os.path.join(out, "ratings.zarr"), os.path.join(out, "model")
        check_destination(store_path, force)
        check_model_destination(model_path, force)
        os.makedirs(out, exist_ok=True)
    else:
        out = tempfile.mkdtemp(prefix="streamdp-demo-")
        store_path, model_path = os.path.join(out, "ratings.zarr"), os.path.join(out, "model")
    store_name = store_path if kept else "a temporary store"
    model_name = model_path if kept else "a temporary model"
    stage = "generate"
    try:
        t0 = time.perf_counter()
        st = generate_store(store_path, force=force, show_progress=False, **DEMO_STORE)
        say(f"1. generated {store_name}: {st.n_users:,} users x {st.n_items:,} items, {st.n_ratings:,} train + "
            f"{st.n_test:,} test ratings (rank-{DEMO_STORE['rank']} truth) in {time.perf_counter() - t0:.1f}s")
        stage = "train"
        summary = train(st, method="als", out=model_path, epsilon=epsilon, delta=None, rank=DEMO_STORE["rank"],
                        seed=None, force=force, evaluate_test=False)
        delta = summary["delta"]  # the default: from the released number of users
        stage = "evaluate"
        say(f"2. trained {model_name}: --method als, rank {summary['rank']}, {summary['train_seconds']:.1f}s")
        ev = evaluate_model(model_path, st)
        led = Ledger.read(model_path)
        acc = led.accounting
        spent = acc.epsilon if acc is not None else math.inf
        b = ev["baselines"]
        say(f"3. test RMSE {ev['rmse']:.4f} on {ev['n_ratings']:,} held-out ratings "
            f"(non-private baselines: {format_baselines(b)})")
        say("   " + format_verdict(ev["verdict"], ev["rmse"]))
        say("   lists: " + format_ranking_short(ev["ranking"]))
        say("   " + format_ranking_verdict(ev["ranking_verdict"]))
        if not ev["ranking"]["personalised"]:
            say("   note: " + NOT_PERSONALISED)
        ledger_at = (f"{model_path}/privacy.json" if kept else
                     "the model's privacy.json (removed with the temporary directory; --out DIR keeps it)")
        say(f"   privacy spent: epsilon {spent:.4g} (target {epsilon:g}), delta {delta:g}, "
            f"guarantee: {led.guarantee}; ledger in {ledger_at}")
        return {"store": store_path if kept else None, "model": model_path if kept else None,
                "rmse": ev["rmse"], "mae": ev["mae"], "n_ratings": ev["n_ratings"],
                "baselines": b, "verdict": ev["verdict"], "ranking": ev["ranking"],
                "ranking_verdict": ev["ranking_verdict"], "epsilon": spent, "epsilon_target": epsilon, "delta": delta,
                "guarantee": led.guarantee, "seconds": round(time.perf_counter() - t0, 2)}
    except KeyboardInterrupt as exc:
        if not kept:
            raise Interrupted("interrupted; the demo's temporary store and model were removed, nothing was kept") \
                from None
        if isinstance(exc, Interrupted):  # from train: it says what was released
            raise
        if stage == "generate":
            raise Interrupted(f"interrupted before the demo store {store_path} was written; nothing was released") \
                from None
        if stage == "train":
            raise Interrupted(f"interrupted before anything was released (the store {store_path} was written)") \
                from None
        raise Interrupted(f"interrupted after the model was written to {model_path} and its budget recorded; "
                          f"evaluation skipped") from None
    finally:
        if not kept:
            shutil.rmtree(out, ignore_errors=True)
