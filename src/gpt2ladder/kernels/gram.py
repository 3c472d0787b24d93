"""Symmetric batched products for Muon's Newton-Schulz iteration as a Triton kernel: the `ns_kernel` rung.

Each of the iteration's steps (`runtime/optim.py`, `orthogonalise`) forms two symmetric matrices from the wide
(n, m, k) bf16 batch X: the gram matrix A = X X^T, and b A + c A A (A is symmetric, so A A = A A^T). cuBLAS computes
every tile of both. Here one program computes one (BLOCK x BLOCK) output tile on or above the diagonal (tile row <=
tile column; the grid enumerates those pairs for each matrix), summing in fp32, and writes it and its transpose below
the diagonal: 21 of 36 tiles at m = 768 with 128-wide tiles, about 58% of the multiply work. On a tile of the
diagonal both halves come from its upper triangle, so the output is exactly symmetric.

Hand-written because neither PyTorch nor cuBLAS offers a batched symmetric product on bfloat16 (cuBLAS's syrk takes
single, double and complex matrices, one at a time). `gram_reference` is the expression the kernel must match
(tests/kernels/test_gram_kernel.py through Triton's CPU interpreter, tests/kernels/test_gram_kernel_gpu.py on a GPU).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: Muon keeps cuBLAS's products
    triton = None

# (output tile, k step, warps, pipeline stages): a usual Hopper bf16 matmul tile, not yet tuned on a GPU. Compiled for
# sm_90 it takes 96 KB of shared memory, for sm_80 and sm_120 64 KB.
TILE = (128, 64, 8, 3)


def gram_reference(x: torch.Tensor, alpha: float = 1.0, addend: torch.Tensor | None = None,
                   beta: float = 0.0) -> torch.Tensor:
    """alpha x x^T + beta addend for each matrix of x (n, m, k), in fp32 from x's values: what the kernel computes
    before its one rounding to x's dtype."""
    xf = x.float()
    out = alpha * (xf @ xf.mT)
    return out if addend is None else out + beta * addend.float()


if triton is not None:

    @triton.jit
    def _gram_kernel(x_ptr, add_ptr, out_ptr, M, alpha, beta, s_xn, s_xm, s_xk, s_an, s_am, s_ak, K: tl.constexpr,
                     HAS_ADD: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):
        # K is a constant, one compilation per Muon shape (two for GPT-2): the loop's bound is then known, and Triton's
        # CPU interpreter cannot loop to a bound given at run time.
        # Program p of a matrix takes the p-th tile (i, j), i <= j, counted column by column: p = j (j + 1) / 2 + i.
        p = tl.program_id(0)
        mat = tl.program_id(1).to(tl.int64)
        j = ((tl.sqrt((8 * p + 1).to(tl.float32)) - 1) * 0.5).to(tl.int32)
        j = tl.where((j + 1) * (j + 2) // 2 <= p, j + 1, j)  # should fp32's square root round across an integer
        j = tl.where(j * (j + 1) // 2 > p, j - 1, j)
        i = p - j * (j + 1) // 2
        r = tl.arange(0, BLOCK)
        rows_i, rows_j = i * BLOCK + r, j * BLOCK + r
        kk = tl.arange(0, BLOCK_K)
        a_ptrs = x_ptr + mat * s_xn + rows_i[:, None] * s_xm + kk[None, :] * s_xk
        b_ptrs = x_ptr + mat * s_xn + rows_j[:, None] * s_xm + kk[None, :] * s_xk
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ok = kk[None, :] < K - k0
            a = tl.load(a_ptrs, mask=(rows_i[:, None] < M) & ok, other=0.0)
            b = tl.load(b_ptrs, mask=(rows_j[:, None] < M) & ok, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc)
            a_ptrs += BLOCK_K * s_xk
            b_ptrs += BLOCK_K * s_xk
        inside = (rows_i[:, None] < M) & (rows_j[None, :] < M)
        acc = alpha * acc
        if HAS_ADD:  # its tile (i, j) alone: the addend is symmetric
            add = add_ptr + mat * s_an + rows_i[:, None] * s_am + rows_j[None, :] * s_ak
            acc += beta * tl.load(add, mask=inside, other=0.0).to(tl.float32)
        y = acc.to(out_ptr.dtype.element_ty)
        out = out_ptr + mat * M * M
        # Off the diagonal the tile and its mirror; on it, the upper triangle and its mirror, so A = A^T exactly.
        off = i < j
        tl.store(out + rows_i[:, None] * M + rows_j[None, :], y, mask=inside & (off | (r[:, None] <= r[None, :])))
        tl.store(out + rows_j[:, None] * M + rows_i[None, :], tl.trans(y),
                 mask=(rows_j[:, None] < M) & (rows_i[None, :] < M) & (off | (r[:, None] > r[None, :])))


def symmetric_gram(x: torch.Tensor, alpha: float = 1.0, addend: torch.Tensor | None = None, beta: float = 0.0,
                   tile: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """alpha x x^T + beta addend, (n, m, m) in x's dtype, for x (n, m, k), any strides; `addend` (n, m, m) must be
    symmetric, since only its tiles on and above the diagonal are read. Summed in fp32 (on a GPU, fp32 inputs
    multiply in TF32, Triton's default; bf16 is what Muon gives it). `tile`: TILE's four numbers, its own by default.
    A fresh output each call: the same shape every step, which the caching allocator (and a CUDA graph's pool)
    serves again."""
    if triton is None:
        raise RuntimeError("the ns_kernel rung's symmetric product is written in Triton, which is not installed")
    n, m, k = x.shape
    block, block_k, warps, stages = tile or TILE
    out = torch.empty((n, m, m), dtype=x.dtype, device=x.device)
    add = out if addend is None else addend  # not read without HAS_ADD
    tiles = triton.cdiv(m, block)
    _gram_kernel[(tiles * (tiles + 1) // 2, n)](
        x, add, out, m, alpha, beta, *x.stride(), *add.stride(), K=k, HAS_ADD=addend is not None, BLOCK=block,
        BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out
