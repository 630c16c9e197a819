"""Same results: every method, with a fixed seed on a tiny generated store, gives the model recorded in a fixture.

``fixtures/bit_identical.json`` holds, for each case below, the SHA-256 of the fitted
model's arrays (``item_factors``, ``item_bias``, ``item_ids``, the global mean and every
extra, each with its dtype and shape), recorded on the tree before the structural
refactoring of issue 20. A refactoring that only moves code keeps every digest; any
change in a computed bit, the order of random draws or the calibrated noise fails
here, naming the case and the array. (Numerical results depend on the machine's
NumPy/Numba builds: the fixture records the versions it was made with.)

Re-record only for an intended change of results:
``STREAMDP_RECORD_BIT_IDENTICAL=1 python -m pytest tests/methods/test_bit_identical.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from streamdp.stream.engine import Engine

FIXTURE = Path(__file__).parent / "fixtures" / "bit_identical.json"
RECORD = os.environ.get("STREAMDP_RECORD_BIT_IDENTICAL") == "1"
INF = float("inf")

#: case -> (method, epsilon, options): every registered method, the centring/mechanism variants that run shared
#: code (biases, centring, power iteration, reducers), and lowrank (the ``streamdp lowrank`` command).
CASES = {
    "als": ("als", 2.0, {"iters": 2}),
    "als-laplace": ("als", 2.0, {"iters": 1, "mechanism": "laplace"}),
    "als-huber": ("als", 2.0, {"iters": 1, "mechanism": "huber", "select": "off"}),
    "als-nonprivate": ("als", INF, {"iters": 2}),
    "ials": ("ials", 2.0, {"iters": 2}),
    "ials-nonprivate": ("ials", INF, {"iters": 2}),
    "irls": ("irls", 2.0, {"iters": 2, "sampling": "uniform", "tau": 5}),
    "means": ("means", 2.0, {}),
    "oja": ("oja", 2.0, {"passes": 2}),
    "oja-warm-midpoint": ("oja", 2.0, {"passes": 2, "schedule": "warm", "step_users": 100, "center": "midpoint"}),
    "fw": ("fw", 2.0, {"passes": 1}),
    "fw-midpoint-decay": ("fw", 2.0, {"passes": 1, "center": "midpoint", "step": "decay"}),
    "svd": ("svd", 2.0, {}),
    "svd-midpoint": ("svd", 2.0, {"center": "midpoint"}),
    "sgd": ("sgd", INF, {"epochs": 2, "step_users": 100}),
    "sgld": ("sgld", 2.0, {"epochs": 2, "step_users": 100}),
    "public-private-pmd": ("public-private", INF, {"public_fraction": 0.3, "iters": 2, "private_mechanism": "pmd",
                                                   "private_rounds": 1, "round_iters": 1, "pmd_sweeps": 1}),
    "public-private-laplace": ("public-private", 2.0, {"public_fraction": 0.3, "iters": 2,
                                                       "private_mechanism": "laplace", "private_rounds": 1,
                                                       "round_iters": 1}),
    "lowrank-measurements": ("lowrank", 2.0, {}),
    "lowrank-rr": ("lowrank", 2.0, {"mechanism": "randomized-response", "power_iters": 2}),
}
RANK, SEED, DELTA = 3, 5, 1e-5


def _method_class(name):
    if name == "lowrank":
        from streamdp.methods.lowrank import LowRank

        return LowRank
    from streamdp.methods import get_method

    return get_method(name)


def _digest(a) -> str:
    a = np.ascontiguousarray(np.asarray(a))
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _digests(f) -> dict:
    out = {"item_factors": _digest(f.item_factors), "item_bias": _digest(f.item_bias),
           "item_ids": _digest(f.item_ids), "global_mean": _digest(np.float64(f.global_mean))}
    for k in sorted(f.extras):
        out["extras." + k] = _digest(f.extras[k])
    return out


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    return generate_store(str(tmp_path_factory.mktemp("stores") / "tiny.zarr"), n_users=900, n_items=60,
                          ratings_per_user=12, rank=3, seed=3, test_fraction=0.2, block_users=300)


@pytest.fixture(scope="module")
def recorded():
    data = {} if RECORD or not FIXTURE.exists() else json.loads(FIXTURE.read_text())
    yield data.setdefault("cases", {})
    if RECORD:
        import numba

        data["versions"] = {"numpy": np.__version__, "numba": numba.__version__}
        FIXTURE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


#: Variants that mostly repeat a default case's path: run with ``-m slow`` (the default run keeps one case per method).
SLOW = {"als-laplace", "als-huber", "fw-midpoint-decay", "lowrank-rr"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in sorted(CASES)])
def test_model_is_bit_identical_to_the_recorded_one(case, tiny_store, recorded):
    name, epsilon, options = CASES[case]
    m = _method_class(name)(epsilon=epsilon, delta=DELTA, rank=RANK, seed=SEED, **options)
    with Engine(tiny_store, workers=1, memory_limit="2GB") as engine:
        fitted = m.fit(tiny_store, engine)
    got = _digests(fitted)
    if RECORD:
        recorded[case] = got
        return
    assert case in recorded, f"{case}: no recorded digest in {FIXTURE.name} (record it on the unchanged tree)"
    want = recorded[case]
    assert sorted(got) == sorted(want), f"{case}: arrays {sorted(got)} != recorded {sorted(want)}"
    changed = [k for k in want if got[k] != want[k]]
    assert not changed, f"{case}: arrays differ from the recorded model: {changed}"
