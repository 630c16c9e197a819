"""Same results: every method, with a fixed seed on a tiny generated store, gives the model recorded in a fixture.

``fixtures/bit_identical.json`` holds, for each case below, every array of the fitted
model (``item_factors``, ``item_bias``, ``item_ids``, the global mean and every extra):
its SHA-256 (with dtype and shape) and, for the arrays whose last bits belong to the
machine, the values themselves. A refactoring that only moves code keeps every array;
any change in a computed bit of our own arithmetic, in the order of random draws or in
the calibrated noise fails here, naming the case and the array.

The fixture holds on any x86-64 machine. Two kinds of array are compared:

* **bit for bit** (the digest): what our own deterministic arithmetic computes from our
  own noise draws: the Numba kernels without ``fastmath``, NumPy's element-wise
  arithmetic and sums, the noise (``numpy.random.Generator``), the calibrated noise
  parameters (rounded to ``Z_BITS`` bits so that the accountant's last bits do not
  reach them: :mod:`streamdp.privacy.calibration`), item ids and counts;
* **to a stated tolerance** (:data:`MACHINE_DEPENDENT`, :func:`tolerance`): what LAPACK
  or BLAS computes (an eigen- or singular-value decomposition, a QR, a solve, a BLAS
  product or norm) and everything computed from it, and what a kernel compiled with
  ``fastmath`` computes (``kernels/sgd.py: sgd_block``: fused and reordered float32
  sums, "reproducible on one machine, not bit for bit across CPUs"). OpenBLAS picks
  its kernels by CPU (``OPENBLAS_CORETYPE``: Haswell and Zen, SkylakeX, Sandybridge,
  Nehalem and Prescott cores give results differing in the last bits), and Numba
  fuses multiply-adds only where the CPU has FMA (``NUMBA_CPU_NAME=generic``).
  ``|got - want| <= tol * max|want|`` for every element, with ``tol`` = ``1e-10`` for
  float64 LAPACK results (measured across those cores: at most ``2.1e-15``), ``1e-5``
  for float32 arrays and for the fastmath kernel's results (a float32 rounding of a
  LAPACK result can move by one unit, ``6e-8``; sgd's 2 epochs differ by ``1.1e-7``
  without FMA). A different noise draw or a changed constant moves these arrays by
  far more (``test_the_fixture_catches_a_last_bit_and_a_noise_draw``).

Re-record only for an intended change of results:
``STREAMDP_RECORD_BIT_IDENTICAL=1 python -m pytest -n 0 tests/methods/test_bit_identical.py``
(serial, ``-n 0``: two workers would write the fixture over each other; add ``-m ''`` for the slow cases too).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
    # the factors (conjugate gradients); alpha as recorded (the tiny store's few pairs per user would take
    # default_alpha's 10: tests/methods/test_ials_defaults.py)
    "ials-nonprivate": ("ials", INF, {"iters": 2, "select": "off", "alpha": 3.0}),
    "ials-nonprivate-select": ("ials", INF, {"iters": 2}),  # the exact choice: the chart on this popularity store
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


#: method -> arrays computed from LAPACK/BLAS results or by a ``fastmath`` kernel: compared to :func:`tolerance`.
MACHINE_DEPENDENT = {
    "als": {"item_factors"},  # np.linalg.solve per item (and eigh: the private Gramians made PSD)
    "irls": {"item_factors"},  # the same solves
    "means": set(),
    "oja": {"item_factors", "extras.basis", "extras.singular_values", "extras.signal_share"},  # QR each step, eigh
    "fw": {"item_factors", "extras.fw_lambda"},  # BLAS products and norms for the noisy top eigenvector, local dots
    "svd": {"item_factors", "extras.eigenvalues"},  # scipy eigh of the noisy covariance
    "lowrank": {"item_factors", "extras.basis", "extras.singular_values", "extras.noisy_projection"},  # QR, SVD, eigh
    "public-private": {"item_factors", "extras.sigma_eigenvalues"},  # eigh and QR in every EM step
    "sgd": {"item_factors", "item_bias", "global_mean"},  # kernels/sgd.py: sgd_block, fastmath (contract, reassoc)
    "sgld": set(),
    "ials": {"item_factors"},  # k x k solves, Y^T Y by BLAS, reassociated (fastmath) sums in the user solves and CG
}
#: Tolerances, times the recorded array's largest magnitude (module docstring).
TOL_LAPACK_FLOAT64, TOL_FLOAT32 = 1e-10, 1e-5


def machine_dependent(case) -> set:
    """The arrays of ``case`` compared to a tolerance (non-private als also solves the item bias)."""
    name, epsilon, _ = CASES[case]
    extra = {"item_bias"} if name in ("als", "irls") and epsilon == INF else set()
    return MACHINE_DEPENDENT[name] | extra


def tolerance(case, key, dtype) -> float:
    """``tol`` of ``|got - want| <= tol * max|want|`` for a machine-dependent array."""
    if np.dtype(dtype) == np.float32 or CASES[case][0] == "sgd":
        return TOL_FLOAT32
    return TOL_LAPACK_FLOAT64


def _digest(a) -> str:
    a = np.ascontiguousarray(np.asarray(a))
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _arrays(f) -> dict:
    out = {"item_factors": f.item_factors, "item_bias": f.item_bias, "item_ids": f.item_ids,
           "global_mean": np.float64(f.global_mean)}
    out.update(("extras." + k, f.extras[k]) for k in sorted(f.extras))
    return {k: np.asarray(v) for k, v in out.items()}


def record(case, arrays) -> dict:
    """The fixture's entry: each array's digest, and the values of the machine-dependent ones."""
    out = {}
    for key, a in arrays.items():
        out[key] = {"sha256": _digest(a)}
        if key in machine_dependent(case):
            out[key].update(dtype=a.dtype.str, shape=list(a.shape), values=a.astype(np.float64).ravel().tolist())
    return out


def differences(case, arrays, want) -> list[str]:
    """What differs from the recorded entry ``want`` (empty: the same model)."""
    if sorted(arrays) != sorted(want):
        return [f"arrays {sorted(arrays)} != recorded {sorted(want)}"]
    out = []
    for key, a in arrays.items():
        w = want[key] if isinstance(want[key], dict) else {"sha256": want[key]}  # a digest alone: the old format
        if key not in machine_dependent(case):
            if _digest(a) != w["sha256"]:
                out.append(f"{key}: differs (compared bit for bit)")
            continue
        if "values" not in w:
            out.append(f"{key}: recorded without values (re-record: it is compared to a tolerance now)")
            continue
        if a.dtype.str != w["dtype"] or list(a.shape) != w["shape"]:
            out.append(f"{key}: {a.dtype.str}{list(a.shape)} != recorded {w['dtype']}{w['shape']}")
            continue
        ref = np.asarray(w["values"], np.float64).reshape(w["shape"])
        tol = tolerance(case, key, a.dtype)
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        dev = float(np.max(np.abs(a.astype(np.float64) - ref))) if ref.size else 0.0
        if not dev <= tol * scale:
            out.append(f"{key}: max |difference| {dev:.3g} > {tol:g} x max |recorded| {scale:.3g}")
    return out


def _fit(case, store, seed=SEED) -> dict:
    name, epsilon, options = CASES[case]
    m = _method_class(name)(epsilon=epsilon, delta=DELTA, rank=RANK, seed=seed, **options)
    with Engine(store, workers=1, memory_limit="2GB") as engine:
        return _arrays(m.fit(store, engine))


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    return generate_store(str(tmp_path_factory.mktemp("stores") / "tiny.zarr"), n_users=900, n_items=60,
                          ratings_per_user=12, rank=3, seed=3, test_fraction=0.2, block_users=300)


@pytest.fixture(scope="module")
def recorded():
    data = {} if not FIXTURE.exists() else json.loads(FIXTURE.read_text())
    cases = data.setdefault("cases", {})
    yield cases
    if RECORD:
        import numba
        from threadpoolctl import threadpool_info

        blas = sorted({f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}" for i in threadpool_info()
                       if i.get("user_api") == "blas"})
        data["versions"] = {"numpy": np.__version__, "numba": numba.__version__, "blas": blas}
        text = json.dumps(data, indent=1, sort_keys=True)  # then each list on one line
        FIXTURE.write_text(re.sub(r"\[([^\[\]{}]*)\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n")


#: Variants that mostly repeat a default case's path: run with ``-m slow`` (the default run keeps one case per method).
SLOW = {"als-laplace", "als-huber", "fw-midpoint-decay", "lowrank-rr"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in sorted(CASES)])
def test_model_is_bit_identical_to_the_recorded_one(case, tiny_store, recorded):
    got = _fit(case, tiny_store)
    if RECORD:
        recorded[case] = record(case, got)
        return
    assert case in recorded, f"{case}: nothing recorded in {FIXTURE.name} (record it on the unchanged tree)"
    changed = differences(case, got, recorded[case])
    assert not changed, f"{case}: differs from the recorded model: {'; '.join(changed)}"


def test_the_fixture_catches_a_last_bit_and_a_noise_draw(tiny_store):
    """The comparison's power: one unit in the last place of our own arithmetic fails, and so does another
    noise draw, in the bit-for-bit arrays and in the ones compared to a tolerance alike."""
    case = "svd"
    got = _fit(case, tiny_store)
    want = record(case, got)
    assert differences(case, got, want) == []
    bias = got["item_bias"].copy()
    bias[7] = np.nextafter(bias[7], np.float32(np.inf))
    assert differences(case, {**got, "item_bias": bias}, want) == ["item_bias: differs (compared bit for bit)"]
    mean = np.nextafter(got["global_mean"], np.inf)
    assert differences(case, {**got, "global_mean": mean}, want) == ["global_mean: differs (compared bit for bit)"]
    other = _fit(case, tiny_store, seed=SEED + 1)
    flagged = {d.split(":")[0] for d in differences(case, other, want)}
    assert {"item_bias", "global_mean", "item_factors", "extras.eigenvalues"} <= flagged
    # the tolerance is far below a noise draw: the eigenvalues with the other draw only are flagged
    flagged = {d.split(":")[0] for d in differences(case, {**got, "extras.eigenvalues": other["extras.eigenvalues"]}, want)}
    assert flagged == {"extras.eigenvalues"}
