"""Every Block's weights cast to the compute dtype by one multi-tensor kernel per step: the `weight_cast` rung.

Under autocast each matmul casts its fp32 weight (and bias) to bf16 right before it runs: for GPT-2
124M, 72 small cast kernels per step, each with a launch gap after it. Here each of the Blocks' Linears (the fp32_wgrad
rung's `Fp32WgradLinear`) gets a bf16 copy of its weight and bias, made once; at the start of every
step the engine refreshes all of them with one `torch._foreach_copy_` (a handful of multi-tensor
launches on CUDA), and the matmuls read the copies. The rounding is the same (fp32 to bf16, to
nearest even), so the step computes the same numbers. The copies take 2 bytes per Block parameter
between steps; a step's peak rises by less, its backward having saved casts of its own (runtime/memory.py).

The copies are read only inside `WeightCasts.fresh()`, the engine's step, which first refreshes
them: any other forward (validation, sampling, HellaSwag) casts as before, so a stale copy is never
read. The sources are looked up on the modules at each refresh, so a parameter replaced after the
rewrite is still the one copied.

The adamw_kernel rung's optimizer can write the copies itself as it updates the weights
(speedups/kernel_adamw.py, `casts`); it then says so (`written`), with each weight's version
counter, which every in-place change by PyTorch advances and the kernel's own writes do not. `fresh()` skips
its copy only while every source is the same tensor at the same version: a weight loaded, restored or
changed in any other way since is copied again. A captured CUDA graph keeps what `fresh()` decided at the
capture, so the engine refreshes the copies itself where it changes the weights behind a graph's back
(`refresh`: after the capture's warm-up is undone, and when a state is loaded). (A parameter replaced by one of
another shape or device would need the rewrite run again: the copies are made for the shapes it found.)

The copies of Linears of one shape lie side by side in one tensor (a Block's c_attn weights, say), each Linear's
copy a contiguous view of it. (Where the fp8_dgrad rung forms those Linears' input gradients in float8, each
backward casts its weight to float8 itself: casting every weight of one shape at once at the step's start was timed
no faster.)
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
        self._written: dict[torch.Tensor, int] = {}  # {source: its version} as the optimizer last wrote its copy
        groups: dict[tuple, list[Fp32WgradLinear]] = {}
        for m in linears:
            groups.setdefault((tuple(m.weight.shape), m.weight.device), []).append(m)
        self.stacks: list[tuple[torch.Tensor, list[Fp32WgradLinear]]] = []  # (L, out, in) copies, their Linears
        for (shape, device), members in groups.items():
            # each copy 16-byte aligned (the AdamW kernel's vector loads), its weight's elements rounded up to 8
            n = shape[0] * shape[1]
            step = -(-n // 8) * 8
            flat = torch.empty(len(members) * step, dtype=dtype, device=device)
            stack = flat.as_strided((len(members), *shape), (step, shape[1], 1))
            self.stacks.append((stack, members))
            for i, m in enumerate(members):
                bias = None if m.bias is None else torch.empty_like(m.bias, dtype=dtype)
                m.casts = Slot(self, stack[i], bias)

    def pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(copies, their sources), read off the modules now."""
        copies, sources = [], []
        for m in self.linears:
            for copy, source in ((m.casts.weight, m.weight), (m.casts.bias, m.bias)):
                if copy is not None:
                    copies.append(copy)
                    sources.append(source)
        return copies, sources

    def refresh(self) -> None:
        """Every copy made again from its source: one multi-tensor copy."""
        copies, sources = self.pairs()
        with torch.no_grad():
            torch._foreach_copy_(copies, [s.detach() for s in sources])
        self._written = {}

    def written(self, sources: list[torch.Tensor]) -> None:
        """The optimizer has just written the copies of these sources from their new values."""
        self._written = {s: s._version for s in sources}

    def current(self) -> bool:
        """Whether every copy holds its source as it is: each written by the optimizer, and unchanged since."""
        _, sources = self.pairs()
        return all(self._written.get(s) == s._version for s in sources)

    @contextlib.contextmanager
    def fresh(self):
        """Refresh every copy (one multi-tensor copy) unless the optimizer's last step wrote them all, and let the
        matmuls read them until the block ends."""
        if not self.current():
            self.refresh()
        try:
            self.active = True
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
