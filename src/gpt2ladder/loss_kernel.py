"""The fused loss's one memory-bound pass, as a Triton kernel: log-sum-exp, loss and logit gradient.

Given the (N, V) logits, the fused loss needs per row the log-sum-exp over the real vocabulary, the
loss lse - logit[target], and the gradient (softmax - onehot) x scale at its final width (bf16, or
e5m2 for float8, where the weight-gradient matmul also needs it transposed). Inductor's kernel for
the same expressions reads the logits three times (max, sum, gradient) and, for float8, writes the
transposed copy with scattered stores. This kernel reads them twice (an online max-and-sum, then the
gradient) and writes each layout once, in 32-row tiles so the transposed stores stay contiguous.

`logit_grad` is a custom op, so torch.compile and CUDA graphs treat it as one opaque kernel; off CUDA
or without Triton the fused loss keeps its plain PyTorch expressions (`fused.py`), which this kernel
must match (tests/test_loss_kernel.py on CPU through Triton's interpreter, tests/test_gpu.py on a GPU).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the fused loss uses its PyTorch expressions
    triton = None

BLOCK_M = 32  # rows per program: 32 consecutive bytes per column in the transposed float8 layout
BLOCK_V = 128  # vocabulary columns per step


def available(logits: torch.Tensor) -> bool:
    return triton is not None and logits.is_cuda


if triton is not None:

    @triton.jit
    def _logit_grad_kernel(logits_ptr, targets_ptr, lse_ptr, loss_ptr, g_ptr, gt_ptr, n_rows, scale,
                           vocab_size: tl.constexpr, n_cols: tl.constexpr, WRITE_T: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        row_off = rows.to(tl.int64) * n_cols
        # Pass 1: running max and rescaled sum of exp over the real columns (padded ones take no part).
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_M], tl.float32)
        for v0 in range(0, vocab_size, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = row_ok[:, None] & (cols[None, :] < vocab_size)
            x = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            x = x.to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, 1))
            m_new = tl.where(row_ok, m_new, 0.0)  # rows past the end: keep the arithmetic finite
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), 1)
            m = m_new
        lse = tl.where(row_ok, m + tl.log(s), 0.0)
        target = tl.load(targets_ptr + rows, mask=row_ok, other=0)
        x_target = tl.load(logits_ptr + row_off + target, mask=row_ok, other=0.0).to(tl.float32)
        tl.store(lse_ptr + rows, lse, mask=row_ok)
        tl.store(loss_ptr + rows, lse - x_target, mask=row_ok)
        # Pass 2: (softmax - onehot) x scale, stored row-major and, for float8, transposed.
        for v0 in range(0, n_cols, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = row_ok[:, None] & (cols[None, :] < n_cols)
            x = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            p = tl.exp(x.to(tl.float32) - lse[:, None])
            p = tl.where(cols[None, :] < vocab_size, p, 0.0)
            g = (p - tl.where(cols[None, :] == target[:, None], 1.0, 0.0)) * scale
            g = g.to(g_ptr.dtype.element_ty)
            tl.store(g_ptr + row_off[:, None] + cols[None, :], g, mask=mask)
            if WRITE_T:
                tl.store(gt_ptr + cols[None, :].to(tl.int64) * n_rows + rows[:, None], g, mask=mask)


@torch.library.custom_op("gpt2ladder::logit_grad", mutates_args=())
def logit_grad(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float,
               out_dtype: torch.dtype, transposed: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
    """(lse (N, 1) fp32, per-row loss (N,) fp32, gradient (N, V), gradient (V, N) or empty)."""
    n, v = logits.shape
    logits = logits.contiguous()
    lse = torch.empty((n, 1), device=logits.device, dtype=torch.float32)
    loss = torch.empty((n,), device=logits.device, dtype=torch.float32)
    g = torch.empty((n, v), device=logits.device, dtype=out_dtype)
    g_t = torch.empty((v, n) if transposed else (0, 0), device=logits.device, dtype=out_dtype)
    grid = (triton.cdiv(n, BLOCK_M),)
    _logit_grad_kernel[grid](logits, targets.contiguous(), lse, loss, g, g_t if transposed else g, n, scale,
                             vocab_size=vocab_size, n_cols=v, WRITE_T=transposed, BLOCK_M=BLOCK_M,
                             BLOCK_V=BLOCK_V, num_warps=8)
    return lse, loss, g, g_t


@logit_grad.register_fake
def _(logits, targets, vocab_size, scale, out_dtype, transposed):
    n, v = logits.shape
    return (logits.new_empty((n, 1), dtype=torch.float32), logits.new_empty((n,), dtype=torch.float32),
            logits.new_empty((n, v), dtype=out_dtype),
            logits.new_empty((v, n) if transposed else (0, 0), dtype=out_dtype))
