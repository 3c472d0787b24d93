"""Float8 linear layers for training: the `fp8_mlp` and `fp8_attn` rungs.

A `Linear` whose three matmuls (forward, input gradient, weight gradient) run as `torch._scaled_mm`
in float8 (e4m3) with one scale per tensor, computed at every step. The forward pass saves the input
already cast and transposed (1 byte per element instead of bf16's 2), in the layout the
weight-gradient matmul wants, so backward reads no bf16 activation.

Off-the-shelf float8 training was slower than bf16 at GPT-2 124M's size because its scaling passes
cost more than the matmuls save. Here each amax is a reduction that compile fuses into the kernel that
produces the tensor (the layer norm, the GELU, the GELU's backward), and the cast is one more pass
that writes both layouts at once. Only training steps use float8; without grad (evaluation,
generation) the layer is the ordinary bf16/fp32 `Linear`, so what is validated is the model itself.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.speedups.common import in_blocks, linear_like, replace_modules, scaled_mm

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
# Gradients are scaled per tensor at every step, so they need e4m3's precision more than e5m2's
# range: on the tiny model the weight gradients come out 5-7% from fp32 with e4m3, 8-10% with e5m2.
GRAD_DTYPE = E4M3


def to_fp8(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaled cast: (t / scale in float8, scale), the amax mapped to the format's max."""
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = amax / torch.finfo(dtype).max
    return (t.float() / scale).to(dtype), scale


def col_major(t: torch.Tensor) -> torch.Tensor:
    """Same values, column-major storage: the layout `_scaled_mm` wants for its second operand."""
    return t.t().contiguous().t()


def fp8_shapes_ok(*sizes: int) -> bool:
    """`_scaled_mm` needs every matmul dimension to be a multiple of 16."""
    return all(n % 16 == 0 for n in sizes)


class Float8Matmul(torch.autograd.Function):
    """y = x @ w.T + b with float8 operands; x (N, in), w (out, in) fp32 master, b (out,) or None."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        with torch.autocast(x.device.type, enabled=False):
            x8, sx = to_fp8(x, E4M3)
            w8, sw = to_fp8(weight, E4M3)
            y = scaled_mm(x8, w8.t(), sx, sw, torch.bfloat16, None if bias is None else bias.to(torch.bfloat16),
                          fast_accum=True)
        # Saved transposed, (in, N): the weight gradient contracts over N, and `_scaled_mm` takes
        # both operands contracted along their contiguous dimension.
        ctx.save_for_backward(x8.t().contiguous(), sx, w8, sw)
        ctx.x_dtype, ctx.has_bias = x.dtype, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x8_t, sx, w8, sw = ctx.saved_tensors
        with torch.autocast(grad_y.device.type, enabled=False):
            g8, sg = to_fp8(grad_y, GRAD_DTYPE)  # (N, out)
            grad_x = scaled_mm(g8, col_major(w8), sg, sw, torch.bfloat16)  # (N, in)
            grad_w = scaled_mm(g8.t().contiguous(), x8_t.t(), sg, sx, torch.float32)  # (out, in)
            grad_b = grad_y.float().sum(0) if ctx.has_bias else None
        return grad_x.to(ctx.x_dtype), grad_w, grad_b


class Float8Linear(nn.Linear):
    """An `nn.Linear` (same parameters, same state dict) that trains through `Float8Matmul`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not torch.is_grad_enabled() or not fp8_shapes_ok(rows, self.in_features, self.out_features):
            return F.linear(x, self.weight, self.bias)
        y = Float8Matmul.apply(x.reshape(rows, x.shape[-1]), self.weight, self.bias)
        return y.view(*x.shape[:-1], self.out_features)


def use_float8(model: nn.Module, mlp: bool, attn: bool) -> list[str]:
    """Replace the chosen Linears of every Block by `Float8Linear`s (same parameters); their names.

    The classifier is left alone: the `fp8_head` rung handles it inside the fused loss.
    """
    wanted = (("mlp.c_fc", "mlp.c_proj") if mlp else ()) + (("attn.c_attn", "attn.c_proj") if attn else ())
    return replace_modules(model, lambda name, m: type(m) is nn.Linear and in_blocks(name) and name.endswith(wanted),
                           lambda m: linear_like(Float8Linear, m))
