"""How many timed steps a rung gets: exactly --steps, or more while the p10-p90 range is wide, up to a bound."""

import pytest

from gpt2ladder.measure.timing import BOUND, SPREAD, StepRule, spread


def timed(rule: StepRule, source) -> list[float]:
    """The samples a rung's loop keeps, taking the next from `source` while the rule asks for more."""
    samples = []
    while rule.more(samples):
        samples.append(next(source))
    return samples


def test_spread_is_the_p10_p90_range_over_the_median():
    assert spread([10.0] * 20) == 0
    assert spread([float(x) for x in range(1, 12)]) == pytest.approx((10 - 2) / 6)  # p10 2, p90 10, median 6


def test_steps_given_fix_the_count_however_wide_the_spread():
    wide = iter([10.0, 20.0] * 100)
    samples = timed(StepRule.fixed(20), wide)
    assert len(samples) == 20 and spread(samples) > SPREAD
    assert "20 steps, p10-p90" in StepRule.fixed(20).outcome(samples)


def test_a_narrow_rung_stops_at_the_count_asked_for():
    samples = timed(StepRule.until_narrow(20), iter([10.0, 10.1, 10.2, 10.1] * 50))
    assert len(samples) == 20


def test_a_wide_rung_takes_more_until_the_spread_narrows():
    """A few slow steps first (the allocator, the clocks), then steady ones: more samples push them past p90."""
    source = iter([14.0, 13.0, 12.0] + [10.0] * 500)
    rule = StepRule.until_narrow(20)
    samples = timed(rule, source)
    assert 20 < len(samples) < BOUND
    assert spread(samples) <= SPREAD and spread(samples[:-1]) > SPREAD  # it stopped at the first narrow one
    assert rule.outcome(samples).startswith(f"{len(samples)} steps: the p10-p90 range narrowed to")


def test_a_rung_that_never_narrows_stops_at_the_bound():
    rule = StepRule.until_narrow(20, bound=60)
    samples = timed(rule, iter([10.0, 20.0] * 100))
    assert len(samples) == 60 and "the most it takes" in rule.outcome(samples)
    assert StepRule.until_narrow(200, bound=60).bound == 200  # never fewer than asked for
