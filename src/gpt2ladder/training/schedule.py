"""The learning-rate schedule every training run uses (`train` and each run of `parity`): linear
warm-up to the peak, then a cosine decay to the floor at the last step."""

from __future__ import annotations

import math


def lr_at(step: int, lr: float, min_lr: float, warmup_steps: int, steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up to lr, then cosine to min_lr."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if step >= steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
