"""The MLP with the GELU kernels of `kernels/gelu.py`: the `gelu_kernel` rung.

c_fc's bias moves out of the matmul into the forward kernel, so the backward kernel can return the
bias gradient from the same pass that writes the GELU's input gradient. With the `fp8_proj` rung the forward
kernel also writes the GELU's output in float8 for c_proj (`after_in_proj_float8`; `speedups/norm_block.py`),
with one scale per row, or with `PROJ_BLOCKS` one per 128 columns of a row (`speedups/fp8_forward.py`).

With `fp8_dgrad` on c_fc (`speedups/fp32_wgrad.py`, `DGRAD_LINEARS`) c_fc's product and the GELU run as one node
(`FcGelu`), so that c_fc's input gradient can read the float8 copy of the GELU's input gradient dh which the backward
kernel writes beside dh, one scale per 128 columns of a row; the weight is cast per 128 x 128 tile. Cast in a pass of
its own, that copy cost more than the float8 product saved (docs/experiments.md).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.kernels import gelu as gelu_kernels
from gpt2ladder.kernels.norm import FP8_BLOCK, tiles_to_fp8
from gpt2ladder.model.gpt import MLP, Branch
from gpt2ladder.speedups.common import compute_dtype, matmul_without_bias, replace_modules
from gpt2ladder.speedups.fp8_forward import Float8Rows, float8_product, in_proj_float8, scaled_matmul_blocks
from gpt2ladder.speedups.fp32_wgrad import weight_grad


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
    """BiasGelu, and with its output the output's float8 copy and its scales (no gradient; `blocked`: one per 128
    columns of a row, block-major, else one per row), for c_proj's forward product in float8 (the `fp8_proj` rung)."""

    @staticmethod
    def forward(ctx, h0: torch.Tensor, bias: torch.Tensor, blocked: bool = False):
        ctx.save_for_backward(h0, bias)
        a, q, qs = (gelu_kernels.gelu_fp8_blocks if blocked else gelu_kernels.gelu_fp8)(h0, bias)
        ctx.mark_non_differentiable(q, qs)
        ctx.set_materialize_grads(False)  # no zero tensors for the float8 outputs, which take no gradient
        return a, q, qs

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *_float8):
        h0, bias = ctx.saved_tensors
        return (*gelu_kernels.gelu_grad(grad, h0, bias), None)


class FcGelu(torch.autograd.Function):
    """a = gelu(x @ weight.T + bias), c_fc's product and the GELU kernel as one node (fp8_dgrad on c_fc): the
    backward kernel writes dh with its float8 copy, one scale per FP8_BLOCK columns of a row, and c_fc's input
    gradient is the float8 product of that copy and the weight cast per FP8_BLOCK x FP8_BLOCK tile; the weight's and
    bias's gradients come from dh in fp32, as fp32_wgrad's do. The forward product reads x's float8 copy `x8`, `sx`
    where given (fp8_fc's, row scales), else x in the compute dtype (`weight_c`: the weight_cast rung's copy, read
    where it is in that dtype). `copy` ("rows" or "blocks"): a's float8 copy and its scales returned too, for
    c_proj's forward product (fp8_proj's; no gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, x8: torch.Tensor | None, sx: torch.Tensor | None, weight: torch.Tensor,
                bias: torch.Tensor, weight_c: torch.Tensor | None = None, copy: str | None = None):
        dtype = x.dtype if x8 is not None else compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            xc = x.to(dtype)
            wc = weight_c if weight_c is not None and weight_c.dtype == dtype else weight.to(dtype)
            if x8 is None:
                h0 = F.linear(xc, wc)
            else:
                h0 = float8_product(x8, sx, weight, None, dtype).view(*x.shape[:-1], weight.shape[0])
        ctx.save_for_backward(xc, wc, h0, bias)
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        if copy is None:
            return gelu_kernels.gelu(h0, bias)
        a, q, qs = (gelu_kernels.gelu_fp8_blocks if copy == "blocks" else gelu_kernels.gelu_fp8)(h0, bias)
        ctx.mark_non_differentiable(q, qs)
        ctx.set_materialize_grads(False)
        return a, q, qs

    @staticmethod
    def backward(ctx, grad_a: torch.Tensor, *_float8):
        xc, wc, h0, bias = ctx.saved_tensors
        dh, grad_b, dh8, sdh = gelu_kernels.gelu_grad_fp8_blocks(grad_a, h0, bias)
        with torch.autocast(grad_a.device.type, enabled=False):
            grad_x = scaled_matmul_blocks(dh8.reshape(-1, dh8.shape[-1]), sdh, *tiles_to_fp8(wc.t(), FP8_BLOCK), None,
                                          xc.dtype)
            grad_w = weight_grad(dh.reshape(-1, dh.shape[-1]), xc.reshape(-1, xc.shape[-1])).to(ctx.w_dtype)
        return grad_x.view(xc.shape).to(ctx.x_dtype), None, None, grad_w, grad_b, None, None


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

    def after_in_proj_float8(self, h0: torch.Tensor, blocked: bool = False) -> Float8Rows:
        """after_in_proj's output with its float8 copy, for c_proj to read (the `fp8_proj` rung; `blocked`: one
        scale per 128 columns of a row, else one per row)."""
        return Float8Rows(*BiasGeluFloat8.apply(h0, self.c_fc.bias, blocked), blocked=blocked)

    def pre_proj(self, x: torch.Tensor) -> torch.Tensor:
        return self.pre_proj_rows(x)

    def pre_proj_rows(self, y, copy: bool = False, blocked: bool = False):
        """c_proj's input from y, a tensor or `Float8Rows` (whose float8 copy c_fc's forward product then reads);
        with `copy`, as `Float8Rows` with the GELU output's float8 copy (`blocked`: block scales) for c_proj's
        forward product in float8. Through `FcGelu` where c_fc's input gradient is a float8 product (`fc_dgrad8`)."""
        if not (self.fc_dgrad8() and torch.is_grad_enabled()):
            h0 = in_proj_float8(self, y) if isinstance(y, Float8Rows) else self.in_product(y)
            return self.after_in_proj_float8(h0, blocked) if copy else self.after_in_proj(h0)
        rows = isinstance(y, Float8Rows)
        x8, sx = (y.x8, y.scale) if rows else (None, None)
        out = FcGelu.apply(y.x if rows else y, x8, sx, self.c_fc.weight, self.c_fc.bias, self.c_fc._fresh_casts()[0],
                           ("blocks" if blocked else "rows") if copy else None)
        return Float8Rows(*out, blocked=blocked) if copy else out

    def fc_dgrad8(self) -> bool:
        """Whether fp8_dgrad marked c_fc (an fp32_wgrad Linear), and its sizes take FP8_BLOCK x FP8_BLOCK tiles."""
        fc = self.c_fc
        return getattr(fc, "dgrad8", False) and fc.in_features % FP8_BLOCK == 0 and fc.out_features % FP8_BLOCK == 0


def use_gelu_kernel(model: nn.Module) -> list[str]:
    """Replace every Block's MLP whose c_fc is a plain Linear by a `KernelMLP`; their names.

    MLPs whose c_fc is a float8 Linear keep their own GELU (float8 casts fuse into compile's GELU).
    """
    return replace_modules(model, lambda name, m: type(m) is MLP and type(m.c_fc) is nn.Linear, KernelMLP)
