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

With `defer_bias` (the `proj_bias` rung) the pending branch is (p, bias): the attention's and the MLP's
output projection run without their bias (the branch up to it, then the matmul alone), and the norm kernel adds the
bias with the residual and sums its gradient with the norm's own column sums. Compile summed each of those
24 bias gradients a step in two reductions of its own. The bias is added in fp32 before the one rounding of
h + p, where the matmul's epilogue rounded p with it first; the same function, rounded differently.

With `fp8_forward` (the `fp8_forward` rung) each norm that feeds an input projection (c_attn, c_fc) also writes
its output in float8 with one scale per row, and the projection's forward product reads that
(`speedups/fp8_forward.py`); with `fp8_fc` (the `fp8_fc` rung) only the MLP's norm does, for c_fc. With `fp8_proj`
(the `fp8_proj` rung) the MLP's GELU kernel writes its output in float8 too, for c_proj's forward product.

With `bias_ones` (the `bias_in_wgrad` rung) the norm before the attention writes its output with columns of 1.0
after each row (`OnesColumns`), and c_attn's weight-gradient product sums its bias gradient through them
(`speedups/fp32_wgrad.py`); where that norm is compile's (the first Block's) or c_attn reads float8, c_attn sums its
bias as before.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.kernels import norm as norm_kernels
from gpt2ladder.model.gpt import Block
from gpt2ladder.speedups.common import compute_dtype, matmul_without_bias, replace_modules
from gpt2ladder.speedups.fp32_wgrad import ONES, Fp32WgradLinear, OnesColumns
from gpt2ladder.speedups.fp8_forward import (Float8Rows, float8_rows, in_proj_float8, linear_float8, takes_float8,
                                             takes_float8_out)


class AddNorm(torch.autograd.Function):
    """(s, y) = (h + p + pbias, layer_norm(s)); y in `out_dtype`, pbias (the branch's own bias, broadcast over
    the rows) optional. The backward adds the stream's own gradient of s to the norm's, returns that sum for
    both h and p, and its column sums for pbias. With `fp8`, (s, y, y in float8, its row scales): the last two
    take no gradient. With `ones` (not with `fp8`), (s, y, aug): aug is (..., C + ones), y its first C columns (a
    view of it), its last columns 1.0; aug takes no gradient."""

    @staticmethod
    def forward(ctx, h, p, pbias, weight, bias, eps: float, out_dtype: torch.dtype, fp8: bool = False, ones: int = 0):
        assert not (fp8 and ones), "a float8 copy and columns of ones are not made together"
        ctx.set_materialize_grads(False)  # no gradient arrives for aug (nor q, qs): no zeros made for them
        s, y, mean, rstd, q, qs = norm_kernels.add_norm(h, p, weight, bias, eps, out_dtype, pbias, fp8, ones)
        ctx.save_for_backward(s, weight, mean, rstd)
        ctx.has_pbias = pbias is not None and ctx.needs_input_grad[2]
        if ones:
            ctx.mark_non_differentiable(y)
            return s, y[..., : h.shape[-1]], y
        if not fp8:
            return s, y
        ctx.mark_non_differentiable(q, qs)
        return s, y, q, qs

    @staticmethod
    def backward(ctx, ds, dy, *_no_gradient):
        s, weight, mean, rstd = ctx.saved_tensors
        ds = torch.zeros_like(s) if ds is None else ds
        dy = torch.zeros_like(s) if dy is None else dy
        dsum, dw, db, dpbias = norm_kernels.add_norm_grad(dy, ds, s, weight, mean, rstd, ctx.has_pbias)
        return dsum, dsum, dpbias, dw, db, None, None, None, None


def kernels_run(h: torch.Tensor) -> bool:
    """Whether the add and norm on this stream go through the kernels (else PyTorch's expressions)."""
    return (norm_kernels.kernels_available(h) and h.dtype in (torch.bfloat16, torch.float16)
            and torch.is_grad_enabled())


def add_then_norm(h: torch.Tensor, pending, norm: nn.LayerNorm, fp8: bool = False, ones: int = 0):
    """(s, norm(s)) for s = h + the pending branch, a pair (p, its bias or None); with no branch, (h, norm(h))
    by the norm itself. `fp8` (only where the kernels run): norm(s) as `Float8Rows`, with its float8 copy; `ones`
    (where the kernels run, without `fp8`): norm(s) as `OnesColumns`, with that many columns of ones after it."""
    dtype = compute_dtype(h) if torch.is_autocast_enabled(h.device.type) else h.dtype
    if pending is None:
        y = norm(h)
        return h, float8_rows(y, dtype) if fp8 else y
    p, pbias = pending
    if not (kernels_run(h) and p.dtype == h.dtype):
        s = h + with_bias(pending)
        return s, norm(s)
    with torch.autocast(h.device.type, enabled=False):
        if ones and not fp8:
            s, y, aug = AddNorm.apply(h, p, pbias, norm.weight, norm.bias, norm.eps, dtype, False, ones)
            return s, OnesColumns(y, aug)
        if not fp8:
            return AddNorm.apply(h, p, pbias, norm.weight, norm.bias, norm.eps, dtype)
        s, y, q, qs = AddNorm.apply(h, p, pbias, norm.weight, norm.bias, norm.eps, dtype, True)
        return s, Float8Rows(y, q, qs)


def with_bias(pending) -> torch.Tensor:
    """A pending branch (p, bias or None) as one tensor in p's dtype, for the PyTorch expressions."""
    p, pbias = pending
    return p if pbias is None else (p + pbias).to(p.dtype)


def _deferrable(proj: nn.Module) -> bool:
    """A plain or fp32_wgrad Linear with a bias: its matmul can leave the bias to the norm kernel."""
    return proj.bias is not None and (type(proj) is nn.Linear or isinstance(proj, Fp32WgradLinear))


def takes_ones(module: nn.Module) -> bool:
    """Whether a branch's input projection can sum its bias gradient through columns of ones (`OnesColumns`): an
    fp32_wgrad Linear whose matmul adds the bias and takes its gradient."""
    if not hasattr(module, "in_proj"):
        return False
    linear, with_bias = module.in_proj()
    return (isinstance(linear, Fp32WgradLinear) and with_bias and linear.bias is not None
            and not module.in_bias_grad_apart)


def branch(module: nn.Module, y, defer_bias: bool, fp8_out: bool = False):
    """The pending branch (p, bias or None) of an attention or MLP on y. With `defer_bias` (only where the norm
    kernels run) its output projection's bias is left out of the matmul and handed to the norm kernel, which
    adds it with the residual and sums its gradient with the norm's own. A `Float8Rows` y: the input
    projection's forward product in float8; an `OnesColumns` y: its bias gradient summed through the columns of
    ones. `fp8_out` (an MLP that `takes_float8_out`): the output projection's
    forward product in float8 too, from the GELU kernel's float8 copy of its input.
    Otherwise everything before the output projection is the module's `pre_proj` (a module may run it as one
    function, as `speedups/qkv_grad.py`'s attention does)."""
    proj = module.c_proj
    defer = defer_bias and _deferrable(proj)
    if fp8_out:
        h = in_proj_float8(module, y) if isinstance(y, Float8Rows) else module.in_product(y)
        p = linear_float8(proj, module.after_in_proj_float8(h), None if defer else proj.bias)
    else:
        if isinstance(y, OnesColumns):
            pre = module.after_in_proj(module.in_proj()[0].with_ones(y))
        elif isinstance(y, Float8Rows):
            pre = module.after_in_proj(in_proj_float8(module, y))
        else:
            pre = module.pre_proj(y)
        p = matmul_without_bias(proj, pre) if defer else proj(pre)
    return p, proj.bias if defer else None


class NormBlock(nn.Module):
    """A Block whose input and output may be the pair (h, pending branch) with the add still to do.

    `defer_bias` (the `proj_bias` rung): the pending branch carries its output projection's bias apart.
    `fp8_forward` (the `fp8_forward` rung): the attention's and MLP's input projections multiply in float8; `fp8_fc`
    (the `fp8_fc` rung): the MLP's alone; `fp8_proj` (the `fp8_proj` rung): the MLP's output projection too.
    `bias_ones` (the `bias_in_wgrad` rung): c_attn's bias gradient summed through columns of ones after ln_1's output.
    """

    def __init__(self, block: Block, defer_bias: bool = False, fp8_forward: bool = False, fp8_fc: bool = False,
                 fp8_proj: bool = False, bias_ones: bool = False):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = block.ln_1, block.attn, block.ln_2, block.mlp
        self.defer_bias = defer_bias
        self.fp8_attn_in = fp8_forward and takes_float8(self.attn)
        self.fp8_mlp_in = (fp8_forward or fp8_fc) and takes_float8(self.mlp)
        self.fp8_mlp_out = fp8_proj and takes_float8_out(self.mlp)
        self.attn_ones = ONES if bias_ones and not self.fp8_attn_in and takes_ones(self.attn) else 0

    def forward(self, x):
        h, pending = x if isinstance(x, tuple) else (x, None)
        kernels = kernels_run(h)
        defer = self.defer_bias and kernels
        h, y = add_then_norm(h, pending, self.ln_1, self.fp8_attn_in and kernels, self.attn_ones if kernels else 0)
        h, y = add_then_norm(h, branch(self.attn, y, defer), self.ln_2, self.fp8_mlp_in and kernels)
        return h, branch(self.mlp, y, defer, self.fp8_mlp_out and kernels)


class FinalNorm(nn.LayerNorm):
    """The final layer norm (same parameters), making the last Block's pending add first."""

    def forward(self, x):
        if isinstance(x, tuple):
            h, pending = x
            x = h + with_bias(pending)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def use_norm_kernel(model: nn.Module, defer_bias: bool = False, fp8_forward: bool = False,
                    fp8_fc: bool = False, fp8_proj: bool = False, bias_ones: bool = False) -> list[str]:
    """Replace every Block by a `NormBlock` and the final norm by a `FinalNorm`; their names. `defer_bias`: the
    Blocks' output projections leave their biases to the norm kernels (the `proj_bias` rung); `fp8_forward`: their
    input projections multiply in float8, from the norms' float8 copies (the `fp8_forward` rung); `fp8_fc`: the
    MLP's alone (the `fp8_fc` rung); `fp8_proj`: the MLP's output projection too (the `fp8_proj` rung); `bias_ones`:
    c_attn's bias gradient summed through columns of ones (the `bias_in_wgrad` rung)."""
    names = replace_modules(model, lambda name, m: type(m) is Block,
                            lambda b: NormBlock(b, defer_bias, fp8_forward, fp8_fc, fp8_proj, bias_ones))
    ln_f = model.transformer.ln_f
    if names and type(ln_f) is nn.LayerNorm:
        final = FinalNorm(ln_f.normalized_shape, eps=ln_f.eps, elementwise_affine=True, device="meta")
        final.weight, final.bias = ln_f.weight, ln_f.bias
        model.transformer.ln_f = final
        names.append("transformer.ln_f")
    return names
