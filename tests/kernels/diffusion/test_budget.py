"""Adaptive FreeDave drafts: the cost fit, the chain odds, the pick; and outputs still static decoding's."""

import pytest

from specray.kernels.diffusion.budget import CallCost, ChainOdds, best_num_drafts


def test_call_cost_fits_fixed_and_per_token_parts():
    cost = CallCost()
    assert cost.fit() == (0.0, 1.0)
    cost.record(100, 0.06)
    cost.record(101, 0.06)
    assert not cost.separable()  # one size: no fixed part can be told apart yet
    assert cost.fit() == pytest.approx((0.0, 0.06 / 100.5), rel=1e-3)
    for tokens in (60, 120, 240, 60, 480):
        cost.record(tokens, 0.03 + 0.0003 * tokens)
    assert cost.separable()
    fixed, per_token = cost.fit()
    assert fixed == pytest.approx(0.03, rel=0.2) and per_token == pytest.approx(0.0003, rel=0.1)


def test_chain_odds_count_how_far_chains_reach():
    odds = ChainOdds()
    assert odds.odds == 0.5  # the prior
    odds.record(drafts=4, accepted=4)  # three steps past the first, all reached
    odds.record(drafts=4, accepted=2)  # one reached, then one missed
    odds.record(drafts=1, accepted=1)  # nothing tried
    assert (odds.reached, odds.tried) == (4, 5)


@pytest.mark.parametrize("odds, fixed, canvas, most, want", [
    (0.5, 0.030, 0.022, 4, 2),   # a fixed cost to share: one more draft pays at even odds
    (0.9, 0.030, 0.022, 8, 5),
    (0.99, 0.0, 0.022, 8, 1),    # cost linear in canvases: static steps are never dearer than drafts
    (0.2, 0.030, 0.022, 4, 1),
    (1.0, 1.0, 0.001, 8, 8),     # a flat call (an accelerator): every draft the chain reaches
])
def test_best_num_drafts_maximises_expected_steps_per_second(odds, fixed, canvas, most, want):
    assert best_num_drafts(odds, fixed, canvas, most) == want
