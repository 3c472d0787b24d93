"""Each residual add and the layer norm after it as one node with the Triton kernels of `kernels/norm.py`:
the `norm_kernel` rung.

A Block adds its two branches to the residual stream and normalises the sum for the next branch:
s = h + attn(ln_1(h)) feeds ln_2, and s + mlp(ln_2(s)) feeds the next Block's ln_1. `NormBlock` (the
same ln_1, attn, ln_2, mlp, so the same state dict) passes the stream on as a pair (h, branch) with
the last add still to do, and does each add together with the norm that reads it (`AddNorm`). The
first Block's ln_1 reads the embeddings with no add before it, and the final norm feeds the
classifier, whose float8 cast compile fuses into it; both keep compile's own kernels (`FinalNorm`
makes the last add there).

The kernels run on CUDA with Triton for a stream in bf16 or fp16 (the `bf16_residual` rung, which this
rung turns on); anywhere else `AddNorm` falls back to the PyTorch expressions, the same function.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.kernels import norm as norm_kernels
from gpt2ladder.model.gpt import Block
from gpt2ladder.speedups.common import compute_dtype, replace_modules


class AddNorm(torch.autograd.Function):
    """(s, y) = (h + p, layer_norm(h + p)); y in `out_dtype`. The backward adds the stream's own gradient of
    s to the norm's, and returns that sum for both h and p."""

    @staticmethod
    def forward(ctx, h, p, weight, bias, eps: float, out_dtype: torch.dtype):
        s, y, mean, rstd = norm_kernels.add_norm(h, p, weight, bias, eps, out_dtype)
        ctx.save_for_backward(s, weight, mean, rstd)
        return s, y

    @staticmethod
    def backward(ctx, ds, dy):
        s, weight, mean, rstd = ctx.saved_tensors
        ds = torch.zeros_like(s) if ds is None else ds
        dy = torch.zeros_like(s) if dy is None else dy
        dsum, dw, db = norm_kernels.add_norm_grad(dy, ds, s, weight, mean, rstd)
        return dsum, dsum, dw, db, None, None


def add_then_norm(h: torch.Tensor, p: torch.Tensor | None, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """(h + p, norm(h + p)); with p None, (h, norm(h)) by the norm itself."""
    if p is None:
        return h, norm(h)
    if not (norm_kernels.kernels_available(h) and h.dtype in (torch.bfloat16, torch.float16) and p.dtype == h.dtype
            and torch.is_grad_enabled()):
        s = h + p
        return s, norm(s)
    dtype = compute_dtype(h) if torch.is_autocast_enabled(h.device.type) else h.dtype
    with torch.autocast(h.device.type, enabled=False):
        return AddNorm.apply(h, p, norm.weight, norm.bias, norm.eps, dtype)


class NormBlock(nn.Module):
    """A Block whose input and output may be the pair (h, branch) with the add still to do."""

    def __init__(self, block: Block):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = block.ln_1, block.attn, block.ln_2, block.mlp

    def forward(self, x):
        h, p = x if isinstance(x, tuple) else (x, None)
        h, y = add_then_norm(h, p, self.ln_1)
        h, y = add_then_norm(h, self.attn(y), self.ln_2)
        return h, self.mlp(y)


class FinalNorm(nn.LayerNorm):
    """The final layer norm (same parameters), making the last Block's pending add first."""

    def forward(self, x):
        if isinstance(x, tuple):
            h, p = x
            x = h + p
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def use_norm_kernel(model: nn.Module) -> list[str]:
    """Replace every Block by a `NormBlock` and the final norm by a `FinalNorm`; their names."""
    names = replace_modules(model, lambda name, m: type(m) is Block, NormBlock)
    ln_f = model.transformer.ln_f
    if names and type(ln_f) is nn.LayerNorm:
        final = FinalNorm(ln_f.normalized_shape, eps=ln_f.eps, elementwise_affine=True, device="meta")
        final.weight, final.bias = ln_f.weight, ln_f.bias
        model.transformer.ln_f = final
        names.append("transformer.ln_f")
    return names
