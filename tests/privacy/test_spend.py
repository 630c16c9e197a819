"""The store's spend composed incrementally (issue 28, finding 8): every `train` composed the store's whole ledger
again, so its cost grew with the history (a store with 400 releases took seconds per reservation). The composition
now continues from the one kept beside the ledger: the same floats as composing from scratch, a cost that does not
grow with the history (counted in PLD compositions, not wall time)."""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as _pld

from streamdp.privacy import GUARANTEE_USER_DP, Ledger
from streamdp.privacy.accountant import GRID_REL, epsilon_of
from streamdp.privacy.budget import StoreBudget
from streamdp.privacy.events import (
    compose, event_from_dict, event_to_dict, gaussian_event, huber_event, laplace_event,
)
from streamdp.privacy.spend import SPEND_FILE, SpendComposer, full_spend, ledger_grid
from tests.privacy import test_ledger_budget as ledger_tests

store = ledger_tests.store  # a bare store directory (zarr.json only)


def _releases(n, seed=0):
    """``n`` releases' event lists as a ledger records them: Gaussians (a few noise levels), Laplace, Huber."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        z = float(rng.choice([20.0, 35.0, 50.0]))
        events = [gaussian_event(z), gaussian_event(2 * z, 2)]
        if i % 4 == 1:
            events.append(laplace_event(40.0))
        if i % 5 == 2:
            events.append(huber_event(0.01))
        out.append([event_to_dict(e) for e in events])
    return out


@contextlib.contextmanager
def counted_compositions():
    """Count dp-accounting's PLD compositions (``PrivacyLossDistribution.compose``) inside the block."""
    calls = [0]
    original = _pld.PrivacyLossDistribution.compose

    @functools.wraps(original)
    def counting(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    _pld.PrivacyLossDistribution.compose = counting
    try:
        yield calls
    finally:
        _pld.PrivacyLossDistribution.compose = original


def _reference(event_lists, delta):
    """The composition from scratch with the accountant wrapper itself, on the ledger's grid."""
    event = compose([event_from_dict(ev) for events in event_lists for ev in events])
    rdp = epsilon_of(event, delta).epsilon_rdp
    unique = compose([event_from_dict(ev) for ev in {repr(ev): ev for es in event_lists for ev in es}.values()])
    r = epsilon_of(event, delta, value_discretization_interval=ledger_grid(unique, rdp))
    return r.epsilon, r.epsilon_rdp


def test_continued_composition_equals_the_one_from_scratch(tmp_path):
    releases = _releases(14)
    cache = tmp_path / SPEND_FILE
    for n in range(1, len(releases) + 1):
        c = SpendComposer(cache)  # a new process each time: only the file carries the composition over
        got = c.spend(releases[:n], 1e-6)
        c.save()
        assert got == full_spend(releases[:n], 1e-6)  # the same floats, not approximately
    assert got == _reference(releases, 1e-6)
    assert got[0] <= got[1]  # PLD within RDP


def test_a_changed_ledger_does_not_use_the_cache(tmp_path):
    """A refunded release in the middle, an edited epsilon, a damaged file: composed from scratch, never from a
    composition of other releases."""
    releases = _releases(8, seed=1)
    cache = tmp_path / SPEND_FILE
    c = SpendComposer(cache)
    c.spend(releases, 1e-6)
    c.save()
    for changed in (releases[:3] + releases[4:], [releases[0][::-1]] + releases[1:],
                    [[{**releases[0][0], "noise_multiplier": 1.0}]] + releases[1:]):
        with counted_compositions() as calls:
            got = SpendComposer(cache).spend(changed, 1e-6)
        assert got == full_spend(changed, 1e-6)
        assert calls[0] >= sum(map(len, changed))  # from scratch: one composition per event at least
    cache.write_bytes(cache.read_bytes()[:-100])
    assert SpendComposer(cache).spend(releases, 1e-6) == full_spend(releases, 1e-6)


def _small(eps_z=60.0):
    return Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=0.05, delta=1e-6,
                  events=[gaussian_event(eps_z), gaussian_event(2 * eps_z)])


def test_a_reservation_costs_the_same_after_a_long_history(store):
    """PLD compositions of one reservation (before and after) after 5 and after 40 releases: the same. The old
    code composed every release's events twice per reservation (about 4 n)."""
    b = StoreBudget(store)
    b.set(50.0, 1e-6)
    costs = {}
    for i in range(1, 41):
        with counted_compositions() as calls:
            entry = b.reserve(_small())
        b.complete(entry)
        costs[i] = calls[0]
    assert costs[40] == costs[5] <= 4, costs
    spent = b.show()["spent"]
    events = [e["events"] for e in b.show()["entries"]]
    assert (spent["epsilon"], spent["epsilon_rdp"]) == full_spend(events, 1e-6)
    # a failed release (refunded: no longer counted) does not send the next one back to the beginning
    b.fail(b.reserve(_small()), "crashed")
    with counted_compositions() as calls:
        b.complete(b.reserve(_small()))
    assert calls[0] <= 4


def test_the_budget_decision_is_the_composition_from_scratch(store):
    """The spend shown and the one a reservation is checked against equal a composition from scratch, also after
    the cache was deleted or a release was refunded."""
    b = StoreBudget(store)
    b.set(5.0, 1e-6)
    ids = [b.reserve(_small(z)) for z in (20.0, 30.0, 40.0)]
    b.complete(ids[0])
    b.fail(ids[1], "crashed")
    (store / SPEND_FILE).unlink()
    b.complete(ids[2])
    s = b.show()["spent"]
    counted = [e["events"] for e in b.show()["entries"] if e["status"] != "failed"]
    assert (s["epsilon"], s["epsilon_rdp"]) == full_spend(counted, 1e-6) == _reference(counted, 1e-6)
    assert (store / SPEND_FILE).exists()


@pytest.mark.parametrize("rdp, grid", [(0.5, 1e-3), (1.99, 1e-3), (2.0, 2e-3), (7.9, 4e-3), (8.1, 8e-3)])
def test_the_ledger_grid_is_never_coarser_than_the_per_release_rule(rdp, grid):
    e = gaussian_event(1.0)
    assert ledger_grid(e, rdp) == pytest.approx(grid) and ledger_grid(e, rdp) <= GRID_REL * max(rdp, 1.0)
