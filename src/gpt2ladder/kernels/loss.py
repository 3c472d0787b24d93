"""The fused loss's pass over the logits as two Triton kernels: the `loss_kernel` rung.

The fused loss (`speedups/fused_loss.py`) needs, from the (N, Vp) bf16 logits, each row's log-sum-exp over the real
vocabulary, the loss lse - logit[target], and the gradient (softmax - onehot) x scale at its final
width: bf16, or e5m2 for float8, where the weight-gradient matmul needs it transposed as well.
Compiled, those expressions become one Triton reduction that reads the logits three times (max, sum,
gradient) and writes the transposed copy with scattered one-byte stores, far below what the memory system
can do.

Here the work is split at the one true dependency, the log-sum-exp:
  1. `_loss_stats_kernel`: a few rows per program, one read of the logits with a running max and a
     rescaled sum (one exp per logit), then lse and the loss per row;
  2. `_loss_grad_kernel`: one (BLOCK_M x BLOCK_V) tile per program reads the logits once more and writes
     the gradient tile;
  3. for float8, `_transpose_kernel` copies the gradient's bytes into the (Vp, N) layout the classifier's
     weight-gradient matmul needs, one square tile per program (`tl.trans`, so loads and stores are both
     contiguous along their rows).
Bytes moved at GPT-2's shape: 1.65 GB + 1.65 GB read, 0.83 GB written in float8 (1.65 GB in bf16), and for
float8 0.83 + 0.83 GB more by the transpose. The gradient kernel can also write the transposed tile itself
(`WRITE_T`): fewer bytes, but its two stores together ran slower than the gradient pass and the transpose
apart, each near the card's copy rate (benchmarks/micro/loss_transpose.py). Offsets are 32-bit below 2^31
elements (as at GPT-2's
shape): fewer integer instructions per element.

`logit_grad` is a custom op, so torch.compile and CUDA graphs treat it as one opaque call. Off CUDA, or
without Triton, the fused loss keeps its PyTorch expressions, which this op must match:
tests/kernels/test_loss_kernel.py checks the kernels through Triton's CPU interpreter,
tests/kernels/test_kernels_gpu.py on a GPU (float8 rounding, both layouts bit for bit).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the fused loss uses its PyTorch expressions
    triton = None

# Tile shapes: statistics pass (rows per program, columns per step, warps, pipeline stages); gradient
# pass (rows, columns, warps, whether neighbouring programs take neighbouring row blocks); the transpose
# (rows, columns, warps). Chosen by benchmarks/micro/loss_kernel.py and benchmarks/micro/loss_transpose.py on a
# Hopper GPU: GRAD for the float8 gradient's row-major pass before the transpose; GRAD_BOTH when the
# kernel writes both layouts itself, and for a bf16 gradient (the tile it ran at before the split; the new one
# was measured for float8 only).
STATS = (1, 2048, 2, 1)
GRAD = (4, 512, 4, True)
GRAD_BOTH = (32, 64, 4, True)
TRANSPOSE = (128, 128, 8)


def available(logits: torch.Tensor) -> bool:
    return triton is not None and logits.is_cuda


if triton is not None:

    @triton.jit
    def _tanh(u):
        # tanh(u) = 1 - 2 / (e^(2u) + 1): one exp2, saturating to +-1 where the exp overflows or vanishes
        return 1.0 - 2.0 / (tl.exp2(u * 2.8853900817779268) + 1.0)  # 2.885... = 2 / ln 2

    @triton.jit
    def _loss_stats_kernel(logits_ptr, targets_ptr, lse_ptr, loss_ptr, n_rows, n_cols, softcap,
                           vocab_size: tl.constexpr, CAPPED: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_V: tl.constexpr, WIDE: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < n_rows
        row_off = rows.to(tl.int64) * n_cols if WIDE else rows * n_cols  # 64-bit only past 2^31 elements
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_M], tl.float32)
        for v0 in range(0, vocab_size, BLOCK_V):  # padded columns take no part in the softmax
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = row_ok[:, None] & (cols[None, :] < vocab_size)
            x = tl.load(logits_ptr + row_off[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            x = x.to(tl.float32)
            if CAPPED:  # s = c tanh(z / c); the padded columns' -inf becomes -c, masked back out below
                x = tl.where(mask, softcap * _tanh(x / softcap), float("-inf"))
            m_new = tl.maximum(m, tl.max(x, 1))
            m_new = tl.where(row_ok, m_new, 0.0)  # rows past the end: keep the arithmetic finite
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), 1)
            m = m_new
        lse = m + tl.log(s)
        target = tl.load(targets_ptr + rows, mask=row_ok, other=0)
        x_target = tl.load(logits_ptr + row_off + target, mask=row_ok, other=0.0).to(tl.float32)
        if CAPPED:
            x_target = softcap * _tanh(x_target / softcap)
        tl.store(lse_ptr + rows, lse, mask=row_ok)
        tl.store(loss_ptr + rows, lse - x_target, mask=row_ok)

    @triton.jit
    def _loss_grad_kernel(logits_ptr, targets_ptr, lse_ptr, g_ptr, gt_ptr, n_rows, n_cols, vocab_size, scale,
                          softcap, CAPPED: tl.constexpr, WRITE_T: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_V: tl.constexpr, ROWS_FAST: tl.constexpr, WIDE: tl.constexpr):
        # ROWS_FAST: neighbouring programs take neighbouring row blocks (and so fill neighbouring
        # stretches of the transposed copy); else neighbouring column blocks of the same rows.
        row_block = tl.program_id(0) if ROWS_FAST else tl.program_id(1)
        col_block = tl.program_id(1) if ROWS_FAST else tl.program_id(0)
        rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = col_block * BLOCK_V + tl.arange(0, BLOCK_V)
        row_ok = rows < n_rows
        col_ok = cols < n_cols
        if WIDE:  # 64-bit offsets only past 2^31 elements: fewer integer instructions per element
            offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
            offs_t = cols.to(tl.int64)[:, None] * n_rows + rows[None, :]
        else:
            offs = rows[:, None] * n_cols + cols[None, :]
            offs_t = cols[:, None] * n_rows + rows[None, :]
        x = tl.load(logits_ptr + offs, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        target = tl.load(targets_ptr + rows, mask=row_ok, other=-1)
        if CAPPED:  # through s = c tanh(z / c): ds/dz = 1 - tanh(z / c)^2
            t = _tanh(x / softcap)
            x = softcap * t
        p = tl.where(cols[None, :] < vocab_size, tl.exp(x - lse[:, None]), 0.0)  # padded columns: exactly 0
        g = (p - tl.where(cols[None, :] == target[:, None], 1.0, 0.0)) * scale
        if CAPPED:
            g = g * (1.0 - t * t)
        g = g.to(g_ptr.dtype.element_ty)
        tl.store(g_ptr + offs, g, mask=row_ok[:, None] & col_ok[None, :])
        if WRITE_T:
            tl.store(gt_ptr + offs_t, tl.trans(g), mask=col_ok[:, None] & row_ok[None, :])

    @triton.jit
    def _transpose_kernel(src_ptr, dst_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                          WIDE: tl.constexpr):
        # dst (n_cols, n_rows) = src (n_rows, n_cols) transposed, one (BLOCK_R x BLOCK_C) tile per program
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        if WIDE:
            rows, cols = rows.to(tl.int64), cols.to(tl.int64)
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        tile = tl.load(src_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask)
        tl.store(dst_ptr + cols[:, None] * n_rows + rows[None, :], tl.trans(tile), mask=tl.trans(mask))

    def launch(logits, targets, vocab_size: int, scale: float, lse, loss, g, g_t, stats=None, grad=None,
               split: bool = True, softcap: float = 0.0) -> None:
        """Run the kernels into preallocated outputs (g_t=None: no transposed copy); `softcap` > 0 soft-caps the
        logits first, c tanh(z / c), as the softcap part does, and takes the gradient through it.

        `stats` = (rows, columns, warps, stages) and `grad` = (rows, columns, warps, rows_fast) override
        the tile shapes (benchmarks/micro/loss_kernel.py compares them); `split=False` has the gradient kernel
        write the transposed copy itself instead of the transpose kernel.
        """
        n, v = logits.shape
        wide = logits.numel() >= 2**31
        sm, sv, sw, ss = stats or STATS
        _loss_stats_kernel[(triton.cdiv(n, sm),)](
            logits, targets, lse, loss, n, v, float(softcap or 1.0), vocab_size=vocab_size, CAPPED=bool(softcap),
            BLOCK_M=sm, BLOCK_V=sv, WIDE=wide,
            num_warps=sw, num_stages=ss)
        write_t = g_t is not None and not split
        gm, gv, gw, rows_fast = grad or (GRAD if g_t is not None and split else GRAD_BOTH)
        blocks = (triton.cdiv(n, gm), triton.cdiv(v, gv))
        _loss_grad_kernel[blocks if rows_fast else blocks[::-1]](
            logits, targets, lse, g, g_t if write_t else g, n, v, vocab_size, scale, float(softcap or 1.0),
            CAPPED=bool(softcap), WRITE_T=write_t,
            BLOCK_M=gm, BLOCK_V=gv, ROWS_FAST=rows_fast, WIDE=wide, num_warps=gw)
        if g_t is not None and split:
            tr, tc, tw = TRANSPOSE
            _transpose_kernel[(triton.cdiv(n, tr), triton.cdiv(v, tc))](g, g_t, n, v, BLOCK_R=tr, BLOCK_C=tc,
                                                                        WIDE=wide, num_warps=tw)


    @torch.library.custom_op("gpt2ladder::logit_grad", mutates_args=())
    def logit_grad(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, scale: float,
                   out_dtype: torch.dtype, transposed: bool,
                   softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(per-row loss (N,) fp32, gradient (N, Vp), gradient transposed (Vp, N) or an empty tensor); logits
        soft-capped first where `softcap` > 0."""
        n, v = logits.shape
        logits, targets = logits.contiguous(), targets.contiguous()
        lse = torch.empty((n,), device=logits.device, dtype=torch.float32)
        loss = torch.empty((n,), device=logits.device, dtype=torch.float32)
        g = torch.empty((n, v), device=logits.device, dtype=out_dtype)
        g_t = torch.empty((v, n) if transposed else (0, 0), device=logits.device, dtype=out_dtype)
        launch(logits, targets, vocab_size, scale, lse, loss, g, g_t if transposed else None, softcap=softcap)
        return loss, g, g_t

    @logit_grad.register_fake
    def _(logits, targets, vocab_size, scale, out_dtype, transposed, softcap=0.0):
        n, v = logits.shape
        return (logits.new_empty((n,), dtype=torch.float32), logits.new_empty((n, v), dtype=out_dtype),
                logits.new_empty((v, n) if transposed else (0, 0), dtype=out_dtype))
