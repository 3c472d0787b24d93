"""The MLP's GELU backward and its bias gradient in one Triton pass: the `gelu_kernel` rung.

Backward through `c_proj(gelu(c_fc(x)))` needs, from the gradient `g` arriving at the GELU and the
pre-activation `h`, the gradient `dh = g * gelu'(h)` (N x 4C, which both of c_fc's gradient matmuls
read) and c_fc's bias gradient, the column sums of `dh`. Compiled, those are two kernels: a pointwise
one that writes `dh` and a column reduction that passes over the (N, 4C) data again. At GPT-2 124M's
B=16 x 1024 that second pass is 0.033 ms per layer, 0.4 ms per step on an H200 (profile of the
`cuda_graph` rung, benchmarks/results/2026-11-29-h200-loss-kernel/profile-auto).

Here one kernel does both: each program takes a (BLOCK_M x BLOCK_N) tile, writes its `dh` and the
tile's column sums (fp32) into a small (N / BLOCK_M, 4C) table, which a last `sum` folds into the bias
gradient. For that the bias add moves from c_fc's matmul into the GELU's forward kernel (where compile
fuses it) and the forward saves `c_fc(x)` without the bias; the forward then rounds the matmul to
bf16 once and adds the bias in fp32, and the bias gradient is summed from the unrounded `dh`.

Measured on the H200 (benchmarks/results/2026-11-30-h200-residual-gelu): the kernel takes 0.100 ms per
layer at its best tile (3.0 TB/s), where compile's two kernels took 0.079 + 0.033 ms; the forward GELU
kernel, now with the bias add, went from 0.063 to 0.069 ms, and the table's sum adds a small kernel.
The step does not get faster (28.1 and 28.0 ms against 28.2 without it), so the rung is opt-in.

`gelu_grad` is a custom op (opaque to torch.compile and CUDA graphs). Off CUDA or without Triton the
backward uses `gelu_grad_reference`, the PyTorch expressions the kernel must match:
tests/test_gelu_kernel.py runs the kernel through Triton's CPU interpreter, tests/test_gpu.py on a GPU.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2ladder.model import MLP

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference expressions run instead
    triton = None

SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715  # GPT-2's tanh approximation: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
# Rows, columns, warps per program: the fastest of benchmarks/scripts/gelu_kernel_micro.py's sweep on
# the H200 (0.100 ms at 16384 x 3072, 3.0 TB/s; the first choice, 64 x 128, took 0.114 ms).
TILE = (64, 64, 4)


def gelu_grad_reference(grad: torch.Tensor, h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh in h0's dtype, bias gradient in the bias's dtype) for a = gelu(h0 + bias), in fp32 inside."""
    h = h0.float() + bias.float()
    t = torch.tanh(SQRT_2_OVER_PI * (h + GELU_CUBIC * h * h * h))
    slope = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_CUBIC * h * h)
    dh = grad.float() * slope
    return dh.to(h0.dtype), dh.reshape(-1, dh.shape[-1]).sum(0).to(bias.dtype)


if triton is not None:
    _C0 = tl.constexpr(SQRT_2_OVER_PI)  # a kernel reads module globals only as constexpr
    _C1 = tl.constexpr(GELU_CUBIC)

    @triton.jit
    def _gelu_grad_kernel(grad_ptr, h0_ptr, bias_ptr, dh_ptr, partial_ptr, n_rows, n_cols,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        mask = (rows < n_rows)[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        h = tl.load(h0_ptr + offs, mask=mask, other=0.0).to(tl.float32) + bias[None, :]
        g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        t = 2.0 * tl.sigmoid(2.0 * _C0 * (h + _C1 * h * h * h)) - 1.0  # tanh
        slope = 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * _C0 * (1.0 + 3.0 * _C1 * h * h)
        dh = g * slope  # 0 outside the tensor, since g loads as 0 there
        tl.store(dh_ptr + offs, dh.to(dh_ptr.dtype.element_ty), mask=mask)
        tl.store(partial_ptr + tl.program_id(1) * n_cols + cols, tl.sum(dh, 0), mask=col_ok)

    def launch(grad, h0, bias, dh, partial, tile=None) -> None:
        """Run the kernel on 2-D contiguous (N, C) tensors; `partial` is (cdiv(N, rows), C) fp32."""
        n, c = h0.shape
        bm, bn, warps = tile or TILE
        _gelu_grad_kernel[(triton.cdiv(c, bn), triton.cdiv(n, bm))](
            grad, h0, bias, dh, partial, n, c, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)

    @torch.library.custom_op("gpt2ladder::gelu_grad", mutates_args=())
    def gelu_grad(grad: torch.Tensor, h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = h0.shape[-1]
        grad2, h02 = grad.reshape(-1, c).contiguous(), h0.reshape(-1, c).contiguous()
        dh = torch.empty_like(h02)
        partial = torch.empty((triton.cdiv(h02.shape[0], TILE[0]), c), device=h0.device, dtype=torch.float32)
        launch(grad2, h02, bias.contiguous(), dh, partial)
        return dh.view(h0.shape), partial.sum(0).to(bias.dtype)

    @gelu_grad.register_fake
    def _(grad, h0, bias):
        return torch.empty_like(h0), torch.empty_like(bias)


def _gelu_grad(grad: torch.Tensor, h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if triton is not None and grad.is_cuda:
        return torch.ops.gpt2ladder.gelu_grad(grad, h0, bias)
    return gelu_grad_reference(grad, h0, bias)


class BiasGelu(torch.autograd.Function):
    """a = gelu(h0 + bias) (tanh form); the backward returns dh and the bias gradient from one pass."""

    @staticmethod
    def forward(ctx, h0: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h0, bias)
        return F.gelu(h0.float() + bias.float(), approximate="tanh").to(h0.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h0, bias = ctx.saved_tensors
        return _gelu_grad(grad, h0, bias)


class KernelMLP(MLP):
    """Same parameters and function as `MLP`; c_fc's bias is added inside `BiasGelu`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(BiasGelu.apply(F.linear(x, self.c_fc.weight), self.c_fc.bias))


def use_gelu_kernel(model: nn.Module) -> list[str]:
    """Turn every Block's MLP into a `KernelMLP` in place (the same state dict); returns their names.

    MLPs whose c_fc is not a plain Linear (the float8 rung's) are left alone.
    """
    changed = []
    for name, module in model.named_modules():
        if type(module) is MLP and type(module.c_fc) is nn.Linear:
            module.__class__ = KernelMLP
            changed.append(name)
    return changed
