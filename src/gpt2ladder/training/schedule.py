"""The learning-rate schedules (`train`, each run of `parity`, each rung of the race): linear warm-up to the peak,
then `cosine` decays to the floor over the remaining steps, or `wsd` (the wsd recipe part) stays at the peak and
decays linearly to the floor over the last `decay_fraction` of the steps (WSD_DECAY_FRACTION unless a run sets its
own). And Muon's momentum under the momentum_warmup part."""

from __future__ import annotations

import math

from gpt2ladder.model.recipe import MOMENTUM_WARMUP, MOMENTUM_WARMUP_STEPS, WSD_DECAY_FRACTION


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, steps: int, schedule: str = "cosine",
          decay_fraction: float = WSD_DECAY_FRACTION) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up to lr, then the schedule down to min_lr."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= steps:
        return min_lr
    if schedule == "wsd":
        decay_start = max(warmup_steps, steps - int(decay_fraction * steps + 1e-9))  # 0.57 * 100 is 56.99...
        if step < decay_start:
            return lr
        progress = (step - decay_start) / max(1, steps - decay_start)
        return lr + progress * (min_lr - lr)
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def momentum_at(step: int, start: float = MOMENTUM_WARMUP[0], end: float = MOMENTUM_WARMUP[1],
                warmup_steps: int = MOMENTUM_WARMUP_STEPS) -> float:
    """Muon's momentum for optimizer step `step` (0-based) under the momentum_warmup part: `start` at step 0, then
    linearly up to `end`, reached at step `warmup_steps` and kept after."""
    frac = min(step / warmup_steps, 1.0)
    return (1.0 - frac) * start + frac * end
