"""The attention's q, k, v gradients assembled into c_attn's output gradient, with c_attn's bias gradient, by one
kernel (`kernels/qkv.py`): the `qkv_grad` rung.

c_attn still adds its bias in its matmul, but the bias takes no gradient there: `SplitHeads`, which hands the
attention its q, k, v views of c_attn's output, returns in its backward both that output's gradient and the bias
gradient, from the one pass that writes the first. The same function and the same parameters (so the same state
dict); only the bias gradient's summation order changes.

A variant whose backward also wrote the float8 copy of c_attn's output gradient for the `fp8_dgrad` rung made the
step slower and was taken out (its record is in benchmarks/RECORDS.md; its code is at commit 52f1e70).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gpt2ladder.kernels import qkv as qkv_kernels
from gpt2ladder.model.gpt import CausalSelfAttention, split_heads
from gpt2ladder.speedups.common import matmul_bias_without_grad, replace_modules
from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear


class SplitHeads(torch.autograd.Function):
    """(q, k, v) = (B, nh, T, hs) views of qkv (B, T, 3C); the backward gives qkv's gradient and, from the same pass,
    `bias`'s: the bias was added into qkv by a matmul that leaves its gradient here."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, bias: torch.Tensor, n_head: int):
        ctx.bias_dtype = bias.dtype
        return split_heads(qkv, n_head)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        dqkv, dbias = qkv_kernels.qkv_grad(*_present(dq, dk, dv), ctx.bias_dtype)
        return dqkv, dbias, None


def _present(dq, dk, dv):
    """The three gradients, zeros standing in for any autograd left out (an output that took no gradient)."""
    present = next(g for g in (dq, dk, dv) if g is not None)
    return tuple(torch.zeros_like(present) if g is None else g for g in (dq, dk, dv))


class KernelAttention(CausalSelfAttention):
    """The attention it replaces (the same modules, so the same state dict and function), c_attn's bias gradient
    summed by `SplitHeads`."""

    in_bias_grad_apart = True

    def __init__(self, attn: CausalSelfAttention):
        nn.Module.__init__(self)
        self.n_head, self.attention = attn.n_head, attn.attention
        self.c_attn, self.c_proj = attn.c_attn, attn.c_proj
        if "bias" in attn._buffers:  # the manual attention's causal mask
            self.register_buffer("bias", attn.bias, persistent=False)

    def in_product(self, x: torch.Tensor) -> torch.Tensor:
        return matmul_bias_without_grad(self.c_attn, x)

    def split_heads(self, qkv: torch.Tensor):
        if not torch.is_grad_enabled():
            return split_heads(qkv, self.n_head)
        return SplitHeads.apply(qkv, self.c_attn.bias, self.n_head)


def takes_kernel(attn: nn.Module) -> bool:
    """An attention whose c_attn is a plain or fp32_wgrad Linear (any other keeps its own backward) with a bias."""
    linear = getattr(attn, "c_attn", None)
    return (type(attn) is CausalSelfAttention and linear.bias is not None
            and (type(linear) is nn.Linear or isinstance(linear, Fp32WgradLinear)))


def use_qkv_kernel(model: nn.Module) -> list[str]:
    """Replace every Block's attention that `takes_kernel` by a `KernelAttention`; their names."""
    return replace_modules(model, lambda name, m: takes_kernel(m), KernelAttention)
