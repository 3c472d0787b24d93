"""A weight's float8 copy for a float8 input gradient, one scale per input feature, as one Triton kernel.

The `fp8_dgrad` rung forms a Linear's input gradient g @ w in float8 (speedups/fp32_wgrad.py, `fp8_input_grad`):
the bf16 weight w (out, in) is cast with one scale per input feature (a column of w), transposed to (in, out)
row-major, as `_scaled_mm`'s second operand wants it: `rows_to_fp8(w.t())`. Compiled, that is two kernels per
Linear, a column amax and a transposing cast: 48 launches a step for GPT-2 124M's 24 marked Linears.

Here `_weight8_kernel` does both. A weight is small (3.5-4.7 MB at GPT-2's shapes), so a program owns a block of
input features (BLOCK_C columns of w) and walks all `out` rows twice: first their amax per column (fp32), from which
the scales, as `rows_to_fp8` makes them on a GPU (the amax, at least 1e-12, times float32(1 / 448): CUDA divides a
tensor by a scalar as a multiplication by its reciprocal); then again (the reads now come from L2) each value's
IEEE division by its column's scale, cast to e4m3, and the tile transposed on chip (`tl.trans`), so that the program's
output rows (its columns) are stored as contiguous runs.

The op is a custom op (opaque to torch.compile and CUDA graphs). Off CUDA or without Triton `weight8_reference`
runs, the PyTorch expression the kernel must match byte for byte (tests/kernels/test_weight8_kernel.py runs the
kernel through Triton's CPU interpreter, tests/kernels/test_kernels_gpu.py on a GPU). The step does not call the
kernel: it was within noise of compile's two kernels there (its record: benchmarks/RECORDS.md), and
the step casts with `weight8_reference`; benchmarks/micro/weight_cast8.py times the two.
"""

from __future__ import annotations

import torch

from gpt2ladder.kernels.norm import E4M3, E4M3_MAX, rows_to_fp8

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference expression runs instead
    triton = None

# (columns of w per program, rows per step, warps): the fastest of the 9 tiles benchmarks/micro/weight_cast8.py
# reached at c_attn's weight (2304 x 768) on a Hopper GPU, each call alone from a cold L2, which does not say what
# the step gains (in the step compile's two kernels are short, mostly launch and latency). Each tile, its row
# steps unrolled, takes seconds to compile, so the sweep stopped there.
TILE = (16, 256, 8)


def weight8_reference(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w.t() / scale in e4m3, (in, out) row-major; scale (in,) fp32) of a 2-D weight w (out, in): one scale per
    input feature, its column's amax mapped to e4m3's largest value (`rows_to_fp8` of the transpose)."""
    w8, scale = rows_to_fp8(w.t())
    return w8.contiguous(), scale


if triton is not None:

    @triton.jit
    def _weight8_kernel(w_ptr, out_ptr, scale_ptr, n_rows, n_cols, stride_r, stride_c, INV_Q_MAX: tl.constexpr,
                        BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, STEPS: tl.constexpr):
        # Grid: (column blocks of w,). Program j takes columns [j * BLOCK_C, ...) of w (n_rows, n_cols), i.e. rows
        # of the (n_cols, n_rows) output, BLOCK_R rows of w a step, STEPS steps twice over (a constant number of
        # steps, unrolled, so that the loads of several steps can be in flight at once: a weight has few shapes, each
        # compiled once). The first pass keeps an elementwise running maximum and reduces it across rows once, at
        # the end, so that no step waits on a reduction across the program's threads.
        cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < n_cols
        col_at = w_ptr + cols.to(tl.int64)[None, :] * stride_c
        big = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
        for i in tl.static_range(STEPS):
            rows = i * BLOCK_R + tl.arange(0, BLOCK_R)
            mask = (rows < n_rows)[:, None] & col_ok[None, :]
            w = tl.load(col_at + rows.to(tl.int64)[:, None] * stride_r, mask=mask, other=0.0).to(tl.float32)
            big = tl.maximum(big, tl.abs(w))
        amax = tl.max(big, 0)
        scale = tl.maximum(amax, 1e-12) * INV_Q_MAX  # CUDA's tensor / scalar: times the reciprocal
        tl.store(scale_ptr + cols, scale, mask=col_ok)
        out_at = out_ptr + cols.to(tl.int64)[:, None] * n_rows
        for i in tl.static_range(STEPS):
            rows = i * BLOCK_R + tl.arange(0, BLOCK_R)
            mask = (rows < n_rows)[:, None] & col_ok[None, :]
            w = tl.load(col_at + rows.to(tl.int64)[:, None] * stride_r, mask=mask, other=0.0).to(tl.float32)
            q = tl.div_rn(w, scale[None, :]).to(out_ptr.dtype.element_ty)  # (BLOCK_R, BLOCK_C)
            # transposed in registers: each of the program's output rows a contiguous run of BLOCK_R values
            tl.store(out_at + rows[None, :], tl.trans(q), mask=col_ok[:, None] & (rows < n_rows)[None, :])

    def launch(w, out, scale, tile=None) -> None:
        """The float8 copy of w (out_features, in_features), any strides, into `out` (in_features, out_features)
        row-major (an fp32 `out` takes the values before their rounding, as the CPU interpreter's test reads them)
        and its scales into `scale` (in_features,) fp32."""
        n_rows, n_cols = w.shape
        bc, br, warps = tile or TILE
        _weight8_kernel[(triton.cdiv(n_cols, bc),)](w, out, scale, n_rows, n_cols, *w.stride(),
                                                   INV_Q_MAX=1.0 / E4M3_MAX, BLOCK_C=bc, BLOCK_R=br,
                                                   STEPS=triton.cdiv(n_rows, br), num_warps=warps)

    @torch.library.custom_op("gpt2ladder::weight8", mutates_args=())
    def weight8_op(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n_rows, n_cols = w.shape
        out = torch.empty((n_cols, n_rows), device=w.device, dtype=E4M3)
        scale = torch.empty((n_cols,), device=w.device, dtype=torch.float32)
        launch(w, out, scale)
        return out, scale

    @weight8_op.register_fake
    def _(w):
        n_rows, n_cols = w.shape
        return w.new_empty((n_cols, n_rows), dtype=E4M3), w.new_empty((n_cols,), dtype=torch.float32)


def weight8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w.t() in float8 (in, out) row-major, its row scales (in,)) of a 2-D weight w (out, in): the kernel on CUDA
    with Triton, else the reference."""
    if triton is not None and w.is_cuda:
        return torch.ops.gpt2ladder.weight8(w)
    return weight8_reference(w)
