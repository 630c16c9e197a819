"""``streamdp demo``: the main job end to end on synthetic data, in well under a minute.

Generates a low-rank power-law store with a 20% per-user test split, trains
``--method oja`` at epsilon 1 (user-level, delta below 1/n_users), evaluates it on
the test split next to the non-private global-mean and item-mean baselines, and
prints the RMSEs and the privacy spent as the ledger records it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time

#: Shape of the demo store: large enough for epsilon 1 to be useful, small enough to run in seconds.
DEMO_STORE = dict(n_users=100_000, n_items=1_000, ratings_per_user=40, rank=8, noise=0.5, seed=2026,
                  test_fraction=0.2)


def run_demo(out: str | None = None, *, epsilon: float = 1.0, echo=None) -> dict:
    """Run the demo; ``out`` keeps the store and model (default: a temporary directory, removed after)."""
    from streamdp.evaluate import evaluate_model
    from streamdp.methods import train
    from streamdp.privacy import Ledger
    from streamdp.storage.generate import generate_store

    say = echo or (lambda *a, **k: None)
    tmp = None
    if out is None:
        tmp = out = tempfile.mkdtemp(prefix="streamdp-demo-")
    os.makedirs(out, exist_ok=True)
    store_path = os.path.join(out, "ratings.zarr")
    model_path = os.path.join(out, "model")
    try:
        t0 = time.perf_counter()
        st = generate_store(store_path, force=True, show_progress=False, **DEMO_STORE)
        say(f"1. generated {store_path}: {st.n_users:,} users x {st.n_items:,} items, {st.n_ratings:,} train + "
            f"{st.n_test:,} test ratings (rank-{DEMO_STORE['rank']} truth) in {time.perf_counter() - t0:.1f}s")
        delta = 10.0 ** math.floor(math.log10(min(1e-6, 1.0 / (10 * st.n_users))))
        summary = train(st, method="oja", out=model_path, epsilon=epsilon, delta=delta, rank=DEMO_STORE["rank"],
                        seed=None, force=True, evaluate_test=False)
        say(f"2. trained {model_path}: --method oja, rank {summary['rank']}, {summary['seconds']:.1f}s")
        ev = evaluate_model(model_path, st)
        led = Ledger.read(model_path)
        acc = led.accounting
        spent = acc.epsilon if acc is not None else math.inf
        b = ev["baselines"]
        say(f"3. test RMSE {ev['rmse']:.4f} on {ev['n_ratings']:,} held-out ratings "
            f"(non-private baselines: item mean {b['item_mean']['rmse']:.4f}, "
            f"global mean {b['global_mean']['rmse']:.4f})")
        say(f"   privacy spent: epsilon {spent:.4g} (target {epsilon:g}), delta {delta:g}, "
            f"guarantee: {led.guarantee}; ledger in {model_path}/privacy.json")
        return {"store": store_path if tmp is None else None, "model": model_path if tmp is None else None,
                "rmse": ev["rmse"], "mae": ev["mae"], "n_ratings": ev["n_ratings"],
                "baselines": b, "epsilon": spent, "epsilon_target": epsilon, "delta": delta,
                "guarantee": led.guarantee, "seconds": round(time.perf_counter() - t0, 2)}
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
