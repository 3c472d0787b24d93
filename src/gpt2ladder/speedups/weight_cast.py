"""Every Block's weights cast to the compute dtype by one multi-tensor kernel per step: the `weight_cast` rung.

Under autocast each matmul casts its fp32 weight (and bias) to bf16 right before it runs: for GPT-2
124M, 72 small cast kernels per step (0.26 ms of kernel time on an H200, plus a launch gap after each,
in the profile of 2026-12-02, docs/experiments.md). Here each of the Blocks' Linears (the fp32_wgrad
rung's `Fp32WgradLinear`) gets a bf16 copy of its weight and bias, made once; at the start of every
step the engine refreshes all of them with one `torch._foreach_copy_` (a handful of multi-tensor
launches on CUDA), and the matmuls read the copies. The rounding is the same (fp32 to bf16, to
nearest even), so the step computes the same numbers; the copies take 2 bytes per Block parameter
between steps, which a step holds anyway as the casts its backward saves.

The copies are read only inside `WeightCasts.fresh()`, the engine's step, which first refreshes
them: any other forward (validation, sampling, HellaSwag) casts as before, so a stale copy is never
read. The sources are looked up on the modules at each refresh, so a parameter replaced after the
rewrite is still the one copied.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear


class Slot:
    """One Linear's copies; `fresh()` gives them while the owner's step runs, else (None, None)."""

    def __init__(self, owner: "WeightCasts", weight: torch.Tensor, bias: torch.Tensor | None):
        self.owner, self.weight, self.bias = owner, weight, bias

    def fresh(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (self.weight, self.bias) if self.owner.active else (None, None)


class WeightCasts:
    """The copies of a model's Fp32WgradLinears in `dtype`, and the context that refreshes and uses them."""

    def __init__(self, linears: list[Fp32WgradLinear], dtype: torch.dtype):
        self.linears = linears
        self.active = False
        for m in linears:
            bias = None if m.bias is None else torch.empty_like(m.bias, dtype=dtype)
            m.casts = Slot(self, torch.empty_like(m.weight, dtype=dtype), bias)

    def pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(copies, their sources), read off the modules now."""
        copies, sources = [], []
        for m in self.linears:
            for copy, source in ((m.casts.weight, m.weight), (m.casts.bias, m.bias)):
                if copy is not None:
                    copies.append(copy)
                    sources.append(source)
        return copies, sources

    @contextlib.contextmanager
    def fresh(self):
        """Refresh every copy (one multi-tensor copy), and let the matmuls read them until the block ends."""
        copies, sources = self.pairs()
        with torch.no_grad():
            torch._foreach_copy_(copies, [s.detach() for s in sources])
        self.active = True
        try:
            yield
        finally:
            self.active = False


def use_weight_casts(model: nn.Module, dtype: torch.dtype) -> list[str]:
    """Give every Fp32WgradLinear of `model` a copy in `dtype`; their names. The `WeightCasts` is kept
    on the model as `model.weight_casts`, where the engine finds it."""
    named = [(name, m) for name, m in model.named_modules() if isinstance(m, Fp32WgradLinear)]
    if not named:
        return []
    model.weight_casts = WeightCasts([m for _, m in named], dtype)
    return [name for name, _ in named]


def weight_casts(model: nn.Module) -> WeightCasts | None:
    return getattr(model, "weight_casts", None)
