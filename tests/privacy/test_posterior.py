"""The posterior-sample release (SGLD's): its event within the claim, its scale, its noise, its ledger entry."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from streamdp.errors import ParameterError
from streamdp.privacy import epsilon_of, make_rng
from streamdp.privacy.posterior import GUARANTEE_SGLD, TABLE_LABEL, PosteriorSample


@settings(max_examples=15, deadline=None)
@given(eps=st.floats(0.05, 20.0), temperature=st.sampled_from([0.25, 0.5, 1.0, 2.0]))
def test_the_accountants_epsilon_never_exceeds_the_claim(eps, temperature):
    """The event is fitted under the claim epsilon / T, and the sampler runs at the event's epsilon."""
    p = PosteriorSample.calibrated("V", eps, 1e-6, bound=100.0, temperature=temperature)
    assert p.epsilon_event <= p.epsilon_claimed == eps / temperature
    assert epsilon_of(p.event(), 1e-6).epsilon <= p.epsilon_claimed
    assert p.scale == pytest.approx(p.epsilon_event * temperature / 100.0)


def test_paper_scale_is_four_times_more_diffuse_and_halves_the_per_user_share():
    tight = PosteriorSample.calibrated("V", 1.0, 1e-6, bound=400.0)
    paper = PosteriorSample.calibrated("V", 1.0, 1e-6, bound=400.0, posterior_scale="paper")
    assert tight.scale == pytest.approx(4 * paper.scale) and tight.scale <= 1.0 / 400.0
    assert (tight.user_share, paper.user_share) == (1.0, 0.5)


def test_non_private_samples_the_unscaled_posterior():
    p = PosteriorSample.calibrated("V", math.inf, 1e-6, bound=400.0)
    assert not p.private and p.scale == 1.0 and p.epsilon_event == math.inf


def test_langevin_time_and_flow_rate_follow_the_scale():
    p = PosteriorSample("V", 2.0, 2.0, bound=400.0)  # s = 2 / 400
    assert p.langevin_time(0.01, 1000) == pytest.approx(0.01 / (2 * 0.005) / 1000)
    assert p.flow_rate(3.0) == pytest.approx(2 * 0.005 * 3.0)


def test_draws_fresh_into_a_buffer_equal_the_plain_draws_and_table_offsets_stay_inside():
    p = PosteriorSample("V", 1.0, 1.0, bound=10.0, noise_table=64)
    plain, off = p.draws(make_rng(5), 7, 4)
    buf = np.empty(28, np.float32)
    into, off2 = p.draws(make_rng(5), 7, 4, out=buf)
    assert into is buf and np.array_equal(plain, buf) and len(off) == len(off2) == 0
    table = p.table(make_rng(1))
    assert table.shape == (64,) and table.dtype == np.float32
    noise, offsets = p.draws(make_rng(2), 1000, 4, table)
    assert noise is table and offsets.dtype == np.int64 and len(offsets) == 1000
    assert offsets.min() >= 0 and offsets.max() + 4 <= len(table)


def test_entry_and_guarantee_say_what_the_release_is():
    p = PosteriorSample.calibrated("V", 2.0, 1e-5, bound=400.0, temperature=0.5, epochs=3, noise_table=100)
    e = p.entry()
    assert e["epsilon_claimed"] == 4.0 and e["sensitivity_of_F"] == 800.0 and e["epochs"] == 3
    assert e["scale_s"] == p.scale and e["epsilon_exact_sample"] == p.epsilon_event and e["noise"] == TABLE_LABEL
    g = p.guarantee()
    assert g.startswith(GUARANTEE_SGLD) and TABLE_LABEL in g and "not the DP target of --epsilon 2" in g
    assert PosteriorSample.calibrated("V", 2.0, 1e-5, bound=400.0).guarantee() == GUARANTEE_SGLD


def test_an_epsilon_beyond_the_accountant_is_one_line():
    with pytest.raises(ParameterError, match="beyond what the accountant can evaluate"):
        PosteriorSample.calibrated("V", 5000.0, 1e-6, bound=1.0)
