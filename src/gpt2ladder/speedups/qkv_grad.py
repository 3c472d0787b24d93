"""The attention's q, k, v gradients assembled into c_attn's output gradient, with c_attn's bias gradient, by one
kernel (`kernels/qkv.py`): the `qkv_grad` rung.

c_attn still adds its bias in its matmul, but the bias takes no gradient there: `SplitHeads`, which hands the
attention its q, k, v views of c_attn's output, returns in its backward both that output's gradient and the bias
gradient, from the one pass that writes the first. The same function and the same parameters (so the same state
dict); only the bias gradient's summation order changes.

Where c_attn forms its input gradient in float8 (the `fp8_dgrad` rung marks it), c_attn's matmul and the split are
one function, `QkvProduct8`, whose backward takes the three gradients to the kernel that also writes the float8
copy of c_attn's output gradient and its row scales (`kernels/qkv.py`), then forms c_attn's input gradient from
that copy and its weight gradient from the bf16 one: the values fp8_dgrad's own backward multiplies, made in the
pass that assembles them instead of a second pass over the assembled gradient. That path is off (`FLOAT8_COPY`):
its kernel alone is slower than the compiled passes it replaces, and the step was slower with it (its record is in
benchmarks/RECORDS.md).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.kernels import qkv as qkv_kernels
from gpt2ladder.model.gpt import CausalSelfAttention, split_heads
from gpt2ladder.speedups.common import compute_dtype, matmul_bias_without_grad, replace_modules
from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear, cast_read, fp8_input_grad, weight_grad


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

# Whether an attention whose c_attn fp8_dgrad marks takes `QkvProduct8` (measured slower: off). A float8 input from
# the norm kernel (fp8_forward) takes c_attn's float8 forward product and SplitHeads either way.
FLOAT8_COPY = False


def _present(dq, dk, dv):
    """The three gradients, zeros standing in for any autograd left out (an output that took no gradient)."""
    present = next(g for g in (dq, dk, dv) if g is not None)
    return tuple(torch.zeros_like(present) if g is None else g for g in (dq, dk, dv))


class QkvProduct8(torch.autograd.Function):
    """(q, k, v) = (B, nh, T, hs) views of x @ weight.T + bias in autocast's dtype (`weight_c`, `bias_c`: the
    weight_cast rung's copies, read instead of casting); backward: x's gradient a float8 product of the output
    gradient's float8 copy, the weight's and bias's in fp32 (as `Fp32WgradMatmul` with `dgrad8`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, weight_c: torch.Tensor | None,
                bias_c: torch.Tensor | None, n_head: int):
        dtype = compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            xc = x.to(dtype)
            wc = cast_read(weight, weight_c, dtype)
            qkv = F.linear(xc, wc, cast_read(bias, bias_c, dtype))
        ctx.save_for_backward(xc, wc)
        ctx.x_dtype, ctx.w_dtype, ctx.bias_dtype = x.dtype, weight.dtype, bias.dtype
        return split_heads(qkv, n_head)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        xc, wc = ctx.saved_tensors
        dqkv, g8, gs, dbias = qkv_kernels.qkv_grad8(*_present(dq, dk, dv), ctx.bias_dtype)
        with torch.autocast(xc.device.type, enabled=False):
            grad_x = fp8_input_grad(g8, gs, wc, wc.dtype).view(*xc.shape).to(ctx.x_dtype)
            grad_w = weight_grad(dqkv.reshape(-1, dqkv.shape[-1]).to(wc.dtype), xc.reshape(-1, xc.shape[-1]))
        return grad_x, grad_w.to(ctx.w_dtype), dbias, None, None, None


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

    def pre_proj(self, x: torch.Tensor) -> torch.Tensor:
        linear = self.c_attn
        if FLOAT8_COPY and torch.is_grad_enabled() and getattr(linear, "dgrad8", False):  # c_attn's backward here
            return self.attend(*QkvProduct8.apply(x, linear.weight, linear.bias, *linear._fresh_casts(), self.n_head))
        return super().pre_proj(x)

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
