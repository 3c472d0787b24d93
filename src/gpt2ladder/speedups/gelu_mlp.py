"""The MLP with the GELU kernels of `kernels/gelu.py`: the `gelu_kernel` rung.

c_fc's bias moves out of the matmul into the forward kernel, so the backward kernel can return the
bias gradient from the same pass that writes the GELU's input gradient. With the `fp8_proj` rung the forward
kernel also writes the GELU's output in float8 for c_proj (`after_in_proj_float8`; `speedups/norm_block.py`),
with one scale per row (`speedups/fp8_forward.py`).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gpt2ladder.kernels import gelu as gelu_kernels
from gpt2ladder.model.gpt import MLP, Branch
from gpt2ladder.speedups.common import matmul_without_bias, replace_modules
from gpt2ladder.speedups.fp8_forward import Float8Rows


class BiasGelu(torch.autograd.Function):
    """a = gelu(h0 + bias) (tanh form); the backward returns dh and the bias gradient from one pass."""

    @staticmethod
    def forward(ctx, h0: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h0, bias)
        return gelu_kernels.gelu(h0, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h0, bias = ctx.saved_tensors
        return gelu_kernels.gelu_grad(grad, h0, bias)


class BiasGeluFloat8(torch.autograd.Function):
    """BiasGelu, and with its output the output's float8 copy and its scales (no gradient; one per row), for
    c_proj's forward product in float8 (the `fp8_proj` rung)."""

    @staticmethod
    def forward(ctx, h0: torch.Tensor, bias: torch.Tensor):
        ctx.save_for_backward(h0, bias)
        a, q, qs = gelu_kernels.gelu_fp8(h0, bias)
        ctx.mark_non_differentiable(q, qs)
        ctx.set_materialize_grads(False)  # no zero tensors for the float8 outputs, which take no gradient
        return a, q, qs

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *_float8):
        h0, bias = ctx.saved_tensors
        return gelu_kernels.gelu_grad(grad, h0, bias)


class KernelMLP(Branch):
    """The same c_fc and c_proj (so the same state dict and function) as the `MLP` it replaces; c_fc's
    bias is added inside `BiasGelu`."""

    def __init__(self, mlp: MLP):
        super().__init__()
        self.c_fc, self.c_proj = mlp.c_fc, mlp.c_proj

    def in_product(self, x: torch.Tensor) -> torch.Tensor:
        """c_fc's matmul without its bias, which the GELU kernel adds."""
        return matmul_without_bias(self.c_fc, x)

    def in_proj(self) -> tuple[nn.Linear, bool]:
        return self.c_fc, False  # its bias goes into the GELU kernel

    def after_in_proj(self, h0: torch.Tensor) -> torch.Tensor:
        return BiasGelu.apply(h0, self.c_fc.bias)

    def after_in_proj_float8(self, h0: torch.Tensor) -> Float8Rows:
        """after_in_proj's output with its float8 copy (one scale per row), for c_proj to read (the `fp8_proj`
        rung)."""
        return Float8Rows(*BiasGeluFloat8.apply(h0, self.c_fc.bias))


def use_gelu_kernel(model: nn.Module) -> list[str]:
    """Replace every Block's MLP whose c_fc is a plain Linear by a `KernelMLP`; their names.

    MLPs whose c_fc is not a plain Linear keep their own GELU.
    """
    return replace_modules(model, lambda name, m: type(m) is MLP and type(m.c_fc) is nn.Linear, KernelMLP)
