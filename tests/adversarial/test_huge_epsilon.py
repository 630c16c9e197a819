"""Huge epsilons: calibration in bounded memory and time, or one line saying it is beyond the accountant.

Before: ``streamdp privacy calibrate --epsilon 1e9`` asked numpy for 135 GiB (a PLD grid
of fixed width 0.1 over losses up to ~2 10^9) and ``streamdp train --epsilon 1e9`` grew
to 24 GB and was killed; ``streamdp privacy epsilon --noise-multiplier 1e-3`` took 14 s
and 1.6 GB, ``1e-5`` died with a ``MemoryError``; a calibration at 500 printed numpy's
overflow warnings. Now targets above ``MAX_EPSILON`` (500) are one ``ParameterError``
line, every method's calibration up to it is within the target and close to it, and the
PLD grid is relative to the epsilon, so an accounting takes a few thousand points.

The subprocesses run under an address-space limit (4 GiB) so that a regression fails
here with a ``MemoryError`` instead of swapping the machine; their peak RSS is measured
with ``wait4``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
import time
import warnings

import pytest

from streamdp.errors import ParameterError
from streamdp.privacy import compose, epsilon_of, gaussian_event, huber_event, laplace_event
from streamdp.privacy.accountant import MAX_EPSILON
from streamdp.privacy.calibration import calibrate_gaussian, calibrate_huber, calibrate_laplace, paper_sigma_jain
from streamdp.privacy.release import Share, calibrate_releases

#: Address-space limit of the subprocesses (a regression fails instead of eating the machine's RAM).
AS_LIMIT = 4 << 30
#: What "bounded" means here: peak RSS and wall time of one command.
MAX_RSS = 1 << 30
MAX_SECONDS = 60.0

TOO_BIG = "--epsilon 1e9: above what the accountant can resolve (max 500)"


def run_measured(args, *, python=None):
    """Run ``streamdp ARGS`` (or ``python -c PYTHON``): ``(returncode, stdout, stderr, peak_rss_bytes, seconds)``,
    under :data:`AS_LIMIT`, killed past five times :data:`MAX_SECONDS` (:func:`tests.conftest.peak_rss`: the peak is
    the command's own, not this test worker's)."""
    from tests.conftest import peak_rss

    cmd = [sys.executable, "-c", python] if python is not None else [sys.executable, "-m", "streamdp.cli", *args]
    t0 = time.monotonic()
    code, out, err, rss = peak_rss(cmd, as_limit=AS_LIMIT, timeout=5 * MAX_SECONDS)
    return code, out, err, rss, time.monotonic() - t0


def assert_bounded(rss, seconds, err):
    assert rss < MAX_RSS, f"peak RSS {rss / 2**20:.0f} MiB: {err[-2000:]}"
    assert seconds < MAX_SECONDS, f"{seconds:.1f} s: {err[-2000:]}"


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, (code, err[-3000:])
    assert out == "" and "Traceback" not in err and "Warning" not in err, err[-3000:]
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: "), err[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from streamdp.storage.generate import generate_store

    p = tmp_path_factory.mktemp("huge") / "s.zarr"
    generate_store(str(p), n_users=300, n_items=50, ratings_per_user=10, rank=3, seed=5, test_fraction=0.2,
                   show_progress=False)
    return p


def _methods():
    from streamdp.methods import METHODS, load_builtin

    load_builtin()
    return sorted(METHODS)


#: Options a method needs to run at all on the test store.
METHOD_OPTIONS = {"public-private": {"public_fraction": 0.2}}


def test_every_method_is_listed():
    """A new method must be added to the checks below (its calibration path is the point)."""
    assert set(_methods()) == {"als", "fw", "ials", "irls", "means", "oja", "public-private", "sgd", "sgld", "svd"}


# --------------------------------------------------------------------------------------
# epsilon 1e9: one line, in bounded memory and time
# --------------------------------------------------------------------------------------


def test_privacy_calibrate_1e9_is_one_line_in_bounded_memory():
    code, out, err, rss, seconds = run_measured(["privacy", "calibrate", "--epsilon", "1e9", "--delta", "1e-6"])
    assert_one_line_error(code, out, err, TOO_BIG, "no noise (multiplier 0)")
    assert_bounded(rss, seconds, err)


#: One subprocess per method (about 3 s of CPU each): als runs by default, the others with -m slow
#: (every method's own calibration path at 1e9 stays in the default run, in process, below).
@pytest.mark.parametrize("method", [m if m == "als" else pytest.param(m, marks=pytest.mark.slow) for m in _methods()])
def test_train_1e9_is_one_line_in_bounded_memory(store, tmp_path, method):
    """Every method: the same line, nothing reserved in the budget, nothing written."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in METHOD_OPTIONS.get(method, {}).items()]
    out_dir = tmp_path / "model"
    code, out, err, rss, seconds = run_measured(["train", str(store), "--method", method, "--epsilon", "1e9",
                                                 "--out", str(out_dir), *flags])
    assert_one_line_error(code, out, err, TOO_BIG, "for a non-private model use --epsilon inf")
    assert_bounded(rss, seconds, err)
    assert not (store / "privacy_budget.json").exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("args,needle", [
    pytest.param(["lowrank", "{store}", "--rank", "2", "--epsilon", "1e9", "--out", "{tmp}/lr"], TOO_BIG,
                 marks=pytest.mark.slow),  # train's own case (default run) takes the same path
    (["sweep", "{store}", "--epsilons", "1,1e9", "--out", "{tmp}/sw", "--dry-run"],
     "--epsilons 1e9: above what the accountant can resolve (max 500)"),
    pytest.param(["demo", "--epsilon", "1e9", "--out", "{tmp}/demo"], TOO_BIG, marks=pytest.mark.slow),  # as train's
], ids=["lowrank", "sweep", "demo"])
def test_other_commands_1e9(store, tmp_path, args, needle):
    args = [a.format(store=store, tmp=tmp_path) for a in args]
    code, out, err, rss, seconds = run_measured(args)
    assert_one_line_error(code, out, err, needle)
    assert_bounded(rss, seconds, err)
    assert os.listdir(tmp_path) == []


def test_every_methods_own_calibration_path_1e9(store):
    """Below the CLI's early check: each method's plan (what lowrank, sweep and the Python API reach) at 1e9
    is a ParameterError (or, for a release that spends nothing on private users, a plan within the target),
    in bounded memory and time."""
    script = textwrap.dedent(f"""
        import json
        from streamdp.errors import ParameterError
        from streamdp.methods import METHODS, load_builtin
        from streamdp.workflows.training import prepare
        load_builtin()
        res = {{}}
        for m in sorted(METHODS):
            try:
                st, inst = prepare({str(store)!r}, method=m, out="/nonexistent/model", epsilon=1e9, delta=1e-6,
                                   **{METHOD_OPTIONS!r}.get(m, {{}}))
                acc = inst.planned_ledger(st).accounting
                res[m] = {{"epsilon": None if acc is None else acc.epsilon}}
            except ParameterError as exc:
                res[m] = {{"error": str(exc)}}
        print(json.dumps(res))
    """)
    code, out, err, rss, seconds = run_measured(None, python=script)
    assert code == 0 and "Warning" not in err, err[-3000:]
    assert_bounded(rss, seconds, err)
    res = json.loads(out)
    assert res.pop("public-private") == {"epsilon": None}  # private users' ratings are not used
    assert "non-private" in res.pop("sgd")["error"]
    assert "beyond what the accountant can evaluate" in res.pop("sgld")["error"]  # its pure-DP event
    for m, r in res.items():
        assert r.get("error", "").startswith(TOO_BIG), (m, r)


# --------------------------------------------------------------------------------------
# epsilon 50 .. 500: calibrated within the target and close to it; 1000: refused
# --------------------------------------------------------------------------------------


DELTA = 1e-6
#: Each mechanism, one and ten releases: ``(name, calibrate, event of the calibrated noise)``.
CASES = [(f"{c.__name__} x{n}", lambda e, c=c, n=n: c(e, DELTA, n), lambda z, ev=ev, n=n: ev(z, n))
         for c, ev in ((calibrate_gaussian, gaussian_event), (calibrate_laplace, laplace_event),
                       (calibrate_huber, lambda z, n: huber_event(1.0 / z, n))) for n in (1, 10)]
SHARES = [Share("a", "gaussian", 1.0, 0.7, count=5), Share("b", "laplace", 2.0, 0.3)]


@pytest.mark.slow  # 18 calibrations at 50-500 (about 10 s of CPU); test_calibration's properties run by default
def test_calibration_at_large_epsilons_is_within_the_target_and_close():
    """At 50, 100 and 500: each mechanism, and a split of Gaussian and Laplace shares: the accountant's epsilon
    of the calibrated noise is <= the target and within 1e-3 of it, without warnings (numpy's overflow warnings
    from dp-accounting were printed at 500)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epsilon in (50.0, 100.0, MAX_EPSILON):
            for name, calibrate, event in CASES:
                z = calibrate(epsilon)
                got = epsilon_of(event(z), DELTA).epsilon
                assert epsilon * (1 - 1e-3) <= got <= epsilon, (epsilon, name, z, got)
            rs = calibrate_releases(SHARES, epsilon, DELTA)
            got = epsilon_of(compose([r.event() for r in rs]), DELTA).epsilon
            assert epsilon * (1 - 1e-3) <= got <= epsilon, (epsilon, got)


def test_calibration_above_max_epsilon_is_refused():
    """1000 (and just above 500): a ParameterError naming the flag as typed, the maximum and the way out."""
    for name, calibrate, _ in CASES:
        with pytest.raises(ParameterError, match=r"^--epsilon 1000: above what the accountant can resolve "
                                                 r"\(max 500\); for a non-private model use --epsilon inf$"):
            calibrate(1000.0)
    with pytest.raises(ParameterError, match=r"^--epsilon 500.0001: above"):
        calibrate_gaussian(500.0001, DELTA)
    with pytest.raises(ParameterError, match="above what the accountant can resolve"):
        calibrate_releases(SHARES, 1000.0, DELTA)
    with pytest.raises(ParameterError, match="above what the accountant can resolve"):
        paper_sigma_jain(1000.0, DELTA, 10)  # --calibration paper: its noise would be beyond the accountant too
    assert calibrate_gaussian(math.inf, DELTA) == 0.0  # non-private: no noise, nothing to resolve


@pytest.mark.parametrize("method", [m for m in _methods() if m not in ("sgd", "public-private")])
def test_every_methods_plan_at_max_epsilon(store, method):
    """At 500, the ledger a method reserves (its calibration path end to end) spends <= the target and close to
    it, without numpy's overflow warnings (printed before; sgld's pure-DP path was already right)."""
    from streamdp.workflows.training import prepare

    epsilon = MAX_EPSILON
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        st, m = prepare(str(store), method=method, out=str(store.parent / "none"), epsilon=epsilon, delta=1e-6)
        acc = m.planned_ledger(st).accounting
    assert epsilon * (1 - 1e-3) <= acc.epsilon <= epsilon, acc


# --------------------------------------------------------------------------------------
# the other direction: the epsilon of tiny noise is bounded too
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("z,expect", [pytest.param("1e-3", 504752.0, marks=pytest.mark.slow),
                                      pytest.param("1e-5", math.inf, marks=pytest.mark.slow)])  # issue 41: below
def test_privacy_epsilon_of_tiny_noise_in_bounded_memory(z, expect):
    """A Gaussian of noise multiplier 1e-3 has epsilon ~5.05e5 at delta 1e-6 (analytic Gaussian); the PLD's
    upper bound is reported. At 1e-5 (epsilon ~5e9) dp-accounting overflows: inf, an upper bound."""
    code, out, err, rss, seconds = run_measured(["privacy", "epsilon", "--noise-multiplier", z, "--delta", "1e-6",
                                                 "--json"])
    assert code == 0 and err == "", err[-3000:]
    assert_bounded(rss, seconds, err)
    r = json.loads(out)
    if math.isinf(expect):
        assert r["epsilon"] in ("inf", "Infinity") or r["epsilon"] == math.inf, r
    else:
        assert expect <= r["epsilon"] <= expect * (1 + 1e-3) and r["epsilon"] <= r["epsilon_rdp"], r


def test_privacy_epsilon_of_tiny_noise_in_process_is_inf_in_bounded_memory(capsys):
    """The default run's guard of the subprocess case above (-m slow): ``privacy epsilon`` of a noise multiplier of
    1e-5 reports inf (dp-accounting overflows: an upper bound), quickly and without a large allocation."""
    import time
    import tracemalloc

    from click.testing import CliRunner

    from streamdp.cli import main

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        r = CliRunner().invoke(main, ["privacy", "epsilon", "--noise-multiplier", "1e-5", "--delta", "1e-6", "--json"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["epsilon"] in ("inf", "Infinity", math.inf)
    assert peak < 512 * 2**20 and time.perf_counter() - t0 < 60, (peak, time.perf_counter() - t0)
