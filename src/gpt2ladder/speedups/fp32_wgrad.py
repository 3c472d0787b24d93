"""Weight gradients straight out of the matmul in fp32: the `fp32_wgrad` rung.

Under bf16 autocast a Linear's weight gradient is a bf16 matmul (the (N, out) gradient transposed
times the (N, in) input), rounded to bf16 on the way out, then cast to fp32 by a separate kernel,
because the parameter and its `.grad` are fp32. For GPT-2 124M that is 48 such casts per step.

Here the matmul writes fp32 itself (`torch.mm(..., out_dtype=torch.float32)`, cuBLAS accumulating in
fp32 as always): no cast kernel, no rounding to bf16 in between. The gradient is the same sum, only
more precise: against an fp64 reference its error goes from bf16's ~3e-3 to ~1e-5 (measured at GPT-2's
shapes, benchmarks/micro/mm_out_dtype.py). The bias gradient is summed in fp32 as well. Forward
and input gradient are the ordinary autocast matmuls.

`torch.mm(..., out_dtype=)` exists for CUDA only; elsewhere the fp32 product of the (exactly
representable) upcast inputs stands in, which is the same number up to summation order.

The `fp8_dgrad` rung (`use_fp8_dgrad`) marks some of these Linears to form their input gradient in float8: the
output gradient cast to e4m3 with one scale per row (a token's gradient), the weight with one per input feature,
multiplied by `torch._scaled_mm` with fast accumulation, as the float8 forward products are
(`speedups/fp8_forward.py`). Its weight and bias gradients stay as above. The weight's cast is compile's two kernels
(`weight8_reference`); the one Triton kernel of `kernels/weight8.py` was within noise of them in the step
(its record is in benchmarks/RECORDS.md), so only its micro-benchmark calls it.

The `bias_in_wgrad` rung (`OnesColumns`, `OnesWgradMatmul`) has the norm kernel before c_attn write its output with
`ONES` columns of 1.0 after each row; c_attn's forward reads the first C columns, and its backward multiplies the
output gradient by all C + ONES, so that column C of the fp32 product is the bias gradient (the output gradient's
column sums, accumulated in fp32 by the same tensor-core product), and the separate pass that summed it, over
c_attn's whole output gradient, goes. The product is 1% wider; the weight gradient is its first
C columns, which autograd copies into a contiguous tensor (7 MB for c_attn).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.kernels.weight8 import weight8_reference
from gpt2ladder.kernels.norm import rows_to_fp8
from gpt2ladder.speedups.common import (
    compute_dtype,
    in_blocks,
    linear_like,
    replace_modules,
    scaled_matmul,
)

# The Linears (by name within a Block) whose input gradient `fp8_dgrad` forms in float8.
DGRAD_LINEARS = ("attn.c_attn", "mlp.c_proj")
# The columns of ones after a norm's output for `bias_in_wgrad`: 8 keep a bf16 row a multiple of 16 bytes long, as
# the matmuls' leading dimensions want.
ONES = 8


class OnesColumns(NamedTuple):
    """An activation `x` (..., C) and `aug` (..., C + ONES): x is aug's first C columns (a view of it), and aug's
    last ONES columns are 1.0. Only x takes a gradient."""

    x: torch.Tensor
    aug: torch.Tensor


def weight_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad.T @ x in fp32 for 2-D (N, out) and (N, in) bf16/fp16/fp32 tensors: (out, in)."""
    if grad.dtype == torch.float32 and x.dtype == torch.float32:
        return grad.t() @ x
    if grad.is_cuda:
        return torch.mm(grad.t(), x, out_dtype=torch.float32)
    return grad.t().float() @ x.float()


def cast_read(param: torch.Tensor | None, copy: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A weight or bias (or None) as a matmul reads it in `dtype`: the weight_cast rung's `copy` where it is in
    `dtype`, else a cast of its own."""
    if param is None:
        return None
    return copy if copy is not None and copy.dtype == dtype else param.to(dtype)


def input_grad(g2: torch.Tensor, wc: torch.Tensor, float8: bool = False) -> torch.Tensor:
    """g2 @ wc for the (N, out) output gradient and the (out, in) weight, in their dtype. With `float8` the product
    is float8's: g2 with one scale per row and the weight with one per input feature (a column of wc), each cast to
    e4m3 from its largest magnitude."""
    if not float8:
        return g2 @ wc
    # _scaled_mm's first operand row-major
    return fp8_input_grad(*rows_to_fp8(g2.contiguous()), wc, g2.dtype)


def fp8_input_grad(g8: torch.Tensor, gs: torch.Tensor, wc: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """input_grad's float8 product from the output gradient's float8 copy g8 (N, out), row-major, and its row scales
    gs: the weight cast with one scale per input feature, its transpose (in, out) contiguous; (N, in) in
    `out_dtype`."""
    wt8, ws = weight8_reference(wc)
    return scaled_matmul(g8, gs, wt8, ws, None, out_dtype)


def linear_grads(grad_y: torch.Tensor, xc: torch.Tensor, wc: torch.Tensor, x_dtype: torch.dtype, w_dtype: torch.dtype,
                 has_bias: bool, dgrad8: bool = False,
                 ones: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(input, weight, bias or None) gradients of y = x @ w.T (+ b) from the input and weight as the matmul read
    them (`xc`, `wc`, in the compute dtype): the input gradient in that dtype (`dgrad8`: its product in float8), the
    weight's and bias's in fp32. With `ones`, xc is the input widened by columns of ones (`OnesColumns.aug`): the
    weight-gradient product runs over all of them, and its column C is the bias gradient."""
    c = wc.shape[1]
    g2 = grad_y.reshape(-1, grad_y.shape[-1]).to(wc.dtype)
    with torch.autocast(grad_y.device.type, enabled=False):
        grad_x = input_grad(g2, wc, dgrad8).view(*grad_y.shape[:-1], c).to(x_dtype)
        grad_w = weight_grad(g2, xc.reshape(-1, xc.shape[-1]))  # (out, C), or (out, C + ONES) with `ones`
        if ones:
            return grad_x, grad_w[:, :c].to(w_dtype), grad_w[:, c].to(w_dtype)
        grad_b = g2.sum(0, dtype=torch.float32).to(w_dtype) if has_bias else None
    return grad_x, grad_w.to(w_dtype), grad_b


class Fp32WgradMatmul(torch.autograd.Function):
    """y = x @ weight.T (+ bias) in autocast's dtype; backward gives the weight and bias gradients in fp32.

    `weight_c`, `bias_c`: the weight and bias already in that dtype (the `weight_cast` rung's copies, made
    at the start of the step), used instead of casting here; the gradients still go to `weight` and `bias`.
    `dgrad8`: the input gradient's product in float8 (`input_grad`).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                weight_c: torch.Tensor | None = None, bias_c: torch.Tensor | None = None,
                dgrad8: bool = False) -> torch.Tensor:
        dtype = compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            xc = x.to(dtype)
            wc = cast_read(weight, weight_c, dtype)
            y = F.linear(xc, wc, cast_read(bias, bias_c, dtype))
        ctx.save_for_backward(xc, wc)
        # a bias that takes no gradient here (the qkv_grad rung sums it elsewhere) is not summed
        ctx.x_dtype, ctx.w_dtype, ctx.has_bias = x.dtype, weight.dtype, bias is not None and ctx.needs_input_grad[2]
        ctx.dgrad8 = dgrad8
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        xc, wc = ctx.saved_tensors
        grads = linear_grads(grad_y, xc, wc, ctx.x_dtype, ctx.w_dtype, ctx.has_bias, ctx.dgrad8)
        return (*grads, None, None, None)


class OnesWgradMatmul(torch.autograd.Function):
    """Fp32WgradMatmul's y = x @ weight.T + bias for an `OnesColumns` input (x, aug): the forward reads aug's first C
    columns, the backward's weight-gradient product is over all of aug, and its column C is the bias gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aug: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                weight_c: torch.Tensor | None = None, bias_c: torch.Tensor | None = None,
                dgrad8: bool = False) -> torch.Tensor:
        c = x.shape[-1]
        with torch.autocast(x.device.type, enabled=False):
            # x itself, read where the norm wrote it: 2-D, so that the product is one matmul with the bias in its
            # epilogue (a 3-D view with rows C + ONES apart would go to a batched matmul and a separate bias add)
            xc = aug.reshape(-1, aug.shape[-1])[:, :c]
            wc = cast_read(weight, weight_c, aug.dtype)
            y = F.linear(xc, wc, cast_read(bias, bias_c, aug.dtype)).view(*x.shape[:-1], wc.shape[0])
        ctx.save_for_backward(aug, wc)
        ctx.x_dtype, ctx.w_dtype, ctx.dgrad8 = x.dtype, weight.dtype, dgrad8
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        aug, wc = ctx.saved_tensors
        grad_x, grad_w, grad_b = linear_grads(grad_y, aug, wc, ctx.x_dtype, ctx.w_dtype, True, ctx.dgrad8, ones=True)
        return grad_x, None, grad_w, grad_b, None, None, None


class Fp32WgradLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same state dict) whose gradients come from `Fp32WgradMatmul`.

    `casts` is set by the `weight_cast` rung (`speedups/weight_cast.py`): where it holds fresh copies of
    the weight and bias in the compute dtype, the matmul reads those instead of casting. `dgrad8` is set by the
    `fp8_dgrad` rung: the input gradient's product in float8.
    """

    casts = None  # a weight_cast.Slot, or None
    dgrad8 = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        weight_c, bias_c = self._fresh_casts()
        return Fp32WgradMatmul.apply(x, self.weight, self.bias, weight_c, bias_c, self.dgrad8)

    def matmul(self, x: torch.Tensor, bias_without_grad: bool = False) -> torch.Tensor:
        """x @ weight.T without the bias (the GELU kernel's MLP adds it in its own kernel); with `bias_without_grad`,
        + bias, but the bias takes no gradient here (the qkv_grad rung's kernel sums it)."""
        bias = self.bias.detach() if bias_without_grad else None
        if not torch.is_grad_enabled():
            return F.linear(x, self.weight, bias)
        weight_c, bias_c = self._fresh_casts()
        return Fp32WgradMatmul.apply(x, self.weight, bias, weight_c, bias_c if bias_without_grad else None,
                                     self.dgrad8)

    def with_ones(self, cols: OnesColumns) -> torch.Tensor:
        """x @ weight.T + bias for x = cols.x, its bias gradient summed by the weight-gradient product over cols.aug
        (`OnesWgradMatmul`); the plain forward where no gradient is taken or there is no bias."""
        if not torch.is_grad_enabled() or self.bias is None:
            return self(cols.x)
        weight_c, bias_c = self._fresh_casts()
        return OnesWgradMatmul.apply(cols.x, cols.aug, self.weight, self.bias, weight_c, bias_c, self.dgrad8)

    def _fresh_casts(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (None, None) if self.casts is None else self.casts.fresh()


def use_fp32_wgrad(model: nn.Module) -> list[str]:
    """Replace every plain `nn.Linear` inside the Blocks by an `Fp32WgradLinear` (same parameters); their names.

    The classifier (inside the fused loss, or tied to the embedding) is left alone.
    """
    return replace_modules(model, lambda name, m: type(m) is nn.Linear and in_blocks(name),
                           lambda m: linear_like(Fp32WgradLinear, m))


def use_fp8_dgrad(model: nn.Module, names: tuple[str, ...] | None = None) -> list[str]:
    """Have the fp32_wgrad Linears named `names` (default DGRAD_LINEARS) within each Block form their input gradient
    in float8; their names."""
    names = DGRAD_LINEARS if names is None else names
    marked = []
    for name, m in model.named_modules():
        if isinstance(m, Fp32WgradLinear) and in_blocks(name) and name.endswith(names):
            m.dgrad8 = True
            marked.append(name)
    return marked
