"""The attention's and the MLP's input projections (c_attn, c_fc) read float8 in their forward matmul: the
`fp8_forward` rung.

Each of those matmuls reads a layer norm's output. With the `norm_kernel` rung that output comes from a Triton
kernel which holds each row in registers, so it can also write the row in float8 (e4m3) with one fp32 scale per
row at the cost of one more store (`kernels/norm.py`, `fp8`); the first Block's ln_1, which compile runs, gets
its copy from the same expressions (`rows_to_fp8`). The weight is cast per output feature at every step (a
small reduction compile fuses with its bf16 cast), and `torch._scaled_mm` multiplies the two with the scales and
the bias in its epilogue (benchmarks/micro/fp8_forward.py times it against bf16 at GPT-2's shapes).

Only the forward product is float8. The backward is fp32_wgrad's, from the bf16 input the norm also wrote and
the weight in bf16: the gradients are bf16 matmuls, the weight's and bias's written in fp32. Only training
steps take this path (the norm kernels run only with grad enabled), so evaluation and generation run the model
itself in bf16.

The MLP's output projection (c_proj) can read float8 the same way (the `fp8_proj` rung): its input is the GELU's
output, and the GELU kernel holds whole rows too when asked for the copy (`kernels/gelu.py`, `gelu_fp8`). Block-wise
scales (one per 128 columns of the copy's rows, one per 128 x 128 tile of the weight) did not pay in the step (their
record is in benchmarks/RECORDS.md); benchmarks/micro/fp8_blockwise.py still times the GELU kernel's block-scaled
copy and the products against row scales and bf16.

The step gets faster, and two 300-step parity runs ended within the rule, but its training loss runs above the fp32
baseline's where the other rungs' do not, and to a target validation loss it took as many steps as the top of
`auto` (the records are in benchmarks/RECORDS.md): the rung is opt-in.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn

from gpt2ladder.kernels.norm import rows_to_fp8
from gpt2ladder.speedups.common import scaled_matmul
from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear, cast_read, linear_grads


class Float8Rows(NamedTuple):
    """An activation (..., C) in the compute dtype together with its float8 copy and one scale per row."""

    x: torch.Tensor
    x8: torch.Tensor
    scale: torch.Tensor  # (...,) fp32: x ~ x8 * scale[..., None]


def float8_rows(y: torch.Tensor, dtype: torch.dtype) -> Float8Rows:
    """`y` (any float dtype) as Float8Rows: rounded to `dtype`, and cast to float8 from its own values (a copy that
    takes no gradient: the backward reads the rounded y)."""
    return Float8Rows(y.to(dtype), *rows_to_fp8(y.detach()))


def float8_product(x8, sx, weight, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """(N, out) = x8 @ weight.T (+ bias) from x8 (..., in) with its row scales, the weight cast to float8 here, per
    output feature."""
    x8 = x8.reshape(-1, x8.shape[-1])
    return scaled_matmul(x8, sx.reshape(-1), *rows_to_fp8(weight), bias, out_dtype)


class Fp8InputMatmul(torch.autograd.Function):
    """y = x @ weight.T (+ bias), the forward product from x's float8 copy (x8, scales sx) and the weight cast per
    output feature; the backward from x and the weight in x's dtype, the weight's
    and bias's gradients in fp32."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, x8: torch.Tensor, sx: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, weight_c: torch.Tensor | None = None,
                bias_c: torch.Tensor | None = None, dgrad8: bool = False) -> torch.Tensor:
        """`weight_c`, `bias_c`: the `weight_cast` rung's copies in x's dtype, read instead of casting here;
        `dgrad8`: the input gradient's product in float8 too (the `fp8_dgrad` rung)."""
        with torch.autocast(x.device.type, enabled=False):
            wc = cast_read(weight, weight_c, x.dtype)
            y = float8_product(x8, sx, weight, cast_read(bias, bias_c, x.dtype), x.dtype)
        ctx.save_for_backward(x, wc)
        ctx.w_dtype, ctx.has_bias = weight.dtype, bias is not None and ctx.needs_input_grad[4]
        ctx.dgrad8 = dgrad8
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        x, wc = ctx.saved_tensors
        grad_x, grad_w, grad_b = linear_grads(grad_y, x, wc, x.dtype, ctx.w_dtype, ctx.has_bias, ctx.dgrad8)
        return grad_x, None, None, grad_w, grad_b, None, None, None


def _float8_ready(linear: nn.Module | None) -> bool:
    """A plain or fp32_wgrad Linear (not a float8 one), whose sizes `_scaled_mm` takes (multiples of 16)."""
    plain = type(linear) is nn.Linear or isinstance(linear, Fp32WgradLinear)
    return plain and linear.in_features % 16 == 0 and linear.out_features % 16 == 0


def takes_float8(module: nn.Module) -> bool:
    """Whether an attention or MLP can run its input projection through `Fp8InputMatmul`."""
    return _float8_ready(module.in_proj()[0])


def linear_float8(linear: nn.Module, rows: Float8Rows, bias: torch.Tensor | None) -> torch.Tensor:
    """`linear` (a plain or fp32_wgrad Linear) of `rows`, its forward product in float8, with `bias` (its own, or
    None where the bias is added elsewhere)."""
    casts = isinstance(linear, Fp32WgradLinear)
    weight_c, bias_c = linear._fresh_casts() if casts else (None, None)
    return Fp8InputMatmul.apply(rows.x, rows.x8, rows.scale, linear.weight, bias, weight_c,
                                bias_c if bias is not None else None, getattr(linear, "dgrad8", False))


def in_proj_float8(module: nn.Module, rows: Float8Rows) -> torch.Tensor:
    """The module's input projection of `rows`, its forward product in float8."""
    linear, with_bias = module.in_proj()
    bias = linear.bias if with_bias else None
    if bias is not None and module.in_bias_grad_apart:  # added here, its gradient summed after (qkv_grad)
        bias = bias.detach()
    return linear_float8(linear, rows, bias)


def takes_float8_out(mlp: nn.Module) -> bool:
    """Whether an MLP can feed its output projection (c_proj) in float8: its GELU is the Triton kernel's
    (`speedups/gelu_mlp.py`), which writes the float8 copy, and c_proj a Linear `_scaled_mm` takes."""
    return hasattr(mlp, "after_in_proj_float8") and _float8_ready(getattr(mlp, "c_proj", None))
