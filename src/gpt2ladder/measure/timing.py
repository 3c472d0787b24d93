"""How many timed steps a rung gets: the count asked for, or more while the steps disagree.

At small batches a step is short and its time varies more (launch gaps, clocks, the allocator), so
the 20 steps that settle a batch of 16 can leave a rung's p10-p90 range too wide to tell it from the
rung before it. Without --steps the bench then keeps timing, a step at a time, until the range is
within SPREAD of the median or BOUND steps are in; with --steps the count is exactly that.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpt2ladder.runtime.metrics import TimingStats

SPREAD = 0.05  # a p10-p90 range wider than this share of the median asks for more steps
BOUND = 100  # at most this many timed steps per rung


@dataclass(frozen=True)
class StepRule:
    """At least `steps` timed steps; then more, up to `bound`, while the spread is over `spread`."""

    steps: int
    bound: int
    spread: float = SPREAD

    @classmethod
    def fixed(cls, steps: int) -> "StepRule":
        """Exactly `steps` (--steps given)."""
        return cls(steps, steps)

    @classmethod
    def until_narrow(cls, steps: int, bound: int = BOUND) -> "StepRule":
        """`steps` first, more while the spread is wide, never more than `bound` (nor fewer than `steps`)."""
        return cls(steps, max(steps, bound))

    @property
    def adaptive(self) -> bool:
        return self.bound > self.steps

    def more(self, samples: list[float]) -> bool:
        """Whether to time another step after these milliseconds."""
        if len(samples) < self.steps:
            return True
        return len(samples) < self.bound and spread(samples) > self.spread

    def outcome(self, samples: list[float]) -> str:
        """Why the timing stopped where it did, for the rung's row."""
        n, width = len(samples), spread(samples)
        if not self.adaptive or (n == self.steps and width <= self.spread):
            return f"{n} steps, p10-p90 {width:.1%} of the median"
        if width <= self.spread:
            return f"{n} steps: the p10-p90 range narrowed to {width:.1%} of the median (at most {self.spread:.0%})"
        return f"{n} steps, the most it takes: the p10-p90 range stayed at {width:.1%} of the median"

    def describe(self) -> str:
        """What the first line says is timed: '20 timed steps', or '20 to 100 timed steps (more while ...)'."""
        if not self.adaptive:
            return f"{self.steps} timed steps"
        return (f"{self.steps} to {self.bound} timed steps (more while the p10-p90 range is over {self.spread:.0%} "
                "of the median)")

    def to_dict(self) -> dict:
        """The record's "step_rule": the numbers and the sentence that states them."""
        return {**dataclasses.asdict(self), "text": self.describe()}


def spread(samples: list[float]) -> float:
    """The p10-p90 range as a share of the median (the bench's noise band, relative)."""
    stats = TimingStats.of(samples)
    return (stats.p90 - stats.p10) / stats.median if stats.median > 0 else 0.0
