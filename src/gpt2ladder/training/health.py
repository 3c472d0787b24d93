"""When a run has gone wrong: a loss that is not finite or has exploded.

"Exploded" means above EXPLODED_FACTOR x ln(vocab size) nats: twice the loss of guessing uniformly
over the vocabulary (21.6 for GPT-2's 50257 tokens). A run starts near ln(vocab) and falls from there;
one that has overfitted a tiny text stays well below twice it, while a diverged one (`--lr 1e6`: 5.4e12
at the next validation) is far above. Weights whose loss has exploded are never checkpointed, so the
last good checkpoint stays the one `--resume` and `sample` use.
"""

from __future__ import annotations

import math

EXPLODED_FACTOR = 2.0


def loss_limit(vocab_size: int) -> float:
    """The loss above which the model is worse than twice a uniform guess: it has diverged."""
    return EXPLODED_FACTOR * math.log(vocab_size)


def loss_problem(loss: float, limit: float) -> str | None:
    """What is wrong with a loss ("became nan", "exploded to 5.4e+12 ..."), or None when it is usable."""
    if not math.isfinite(loss):
        return f"became {loss}"
    if loss > limit:
        return f"exploded to {loss:.4g} (above {limit:.1f}, twice the loss of a uniform guess)"
    return None
