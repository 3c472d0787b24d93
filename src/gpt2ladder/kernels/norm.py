"""A residual add and the layer norm after it as Triton kernels, behind the `norm_kernel` rung.

In GPT-2 every layer norm but the first reads the residual stream right after an add: s = h + branch,
y = LN(s). Compiled, the add and the norm are one fused kernel each way, but the norm's weight and bias
gradients (column sums over all N rows) end, after Inductor's split ("mix-order") reduction, in two aten
sums over the (splits x C) partial sums, each with a memset before it: for GPT-2 124M, 46 sums and 46
memsets per step, each with a launch gap before it.

Here:
  - `_add_norm_fwd_kernel`: a few rows per program; s = h + p rounded to the stream's dtype (stored), then
    y = (s - mean) * rstd * w + b in fp32, stored in the compute dtype; the rows' mean and rstd (fp32) are
    kept for the backward;
  - `_add_norm_bwd_kernel`: a fixed number of programs, each walking row blocks; per row
    dx = rstd (w dy - xhat mean(xhat w dy) - mean(w dy)), plus the residual's own gradient ds, stored
    once; each program keeps its column sums of dy * xhat and dy in registers and writes them as one row
    of a (2, programs, C) fp32 buffer (3 with a branch bias, below);
  - `_colsum_kernel`: that buffer's column sums, the weight and the bias gradient, in one launch.
So a norm's backward is two launches and no memset, where compile's was one kernel, two memsets and two sums.
With a branch bias (the `proj_bias` rung: the attention's or MLP's output projection leaves its bias out of
its matmul) the forward adds it to p, and the backward sums its gradient (the column sums of d(h + p)) as a
third row of the same parts, in the same two launches.
With `fp8` (the `fp8_forward` rung) the forward also writes y in float8 (e4m3) with one fp32 scale per row, the
row's amax mapped to e4m3's largest value, for the next matmul to read instead of y: the kernel has the whole
row in registers, so the scale costs no pass of its own.

The ops are custom ops (opaque to torch.compile and CUDA graphs). Off CUDA, or without Triton,
`add_norm_reference` / `add_norm_grad_reference` run instead: the PyTorch expressions the kernels
must match (tests/kernels/test_norm_kernel.py runs the kernels through Triton's CPU interpreter).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference expressions run instead
    triton = None

# Tile shapes: forward (rows per program, warps); backward (rows per step, warps, programs per SM); the column
# sums (parts per step, columns per program, warps: 96 programs at GPT-2's width, where 12 left the GPU idle).
# The fastest benchmarks/micro/norm_kernel.py found on a Hopper GPU at GPT-2's 16384 x 768.
FWD_TILE = (4, 4)
E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
# The backward's loop loads its next row block ahead (the kernel's PREFETCH), faster alone and in the whole step
# than the loop without it at its own best tile, (8, 4, 2) (benchmarks/micro/norm_kernel.py --variants; the record
# is in benchmarks/RECORDS.md).
BWD_TILE = (4, 4, 2)
BWD_PREFETCH = True
COLSUM_TILE = (256, 16, 4)


def add_norm_reference(h, p, weight, bias, eps: float, out_dtype: torch.dtype, pbias=None):
    """(s, y, mean, rstd): s = h + p (+ pbias, the branch's own bias, broadcast over the rows) in h's dtype,
    y = layer_norm(s) computed in fp32 (or wider) and stored in out_dtype."""
    acc = torch.promote_types(h.dtype, torch.float32)
    branch = p.to(acc) if pbias is None else p.to(acc) + pbias.to(acc)
    s = (h.to(acc) + branch).to(h.dtype)
    sf = s.to(acc)
    mean = sf.mean(-1)
    rstd = torch.rsqrt(sf.var(-1, unbiased=False) + eps)
    y = F.layer_norm(sf, (sf.shape[-1],), weight.to(acc), bias.to(acc), eps)
    return s, y.to(out_dtype), mean, rstd


def rows_to_fp8(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y / scale in e4m3, scale): one fp32 scale per row (the last dimension), the row's amax mapped to e4m3's
    largest value; what the forward kernel writes with `fp8` (up to its division's rounding, which Triton does not
    make exact), from y before its rounding to the output dtype."""
    yf = y.float()
    scale = yf.abs().amax(-1).clamp(min=1e-12) / E4M3_MAX
    return (yf / scale[..., None]).to(E4M3), scale


# The columns of a row that share one float8 scale where scales are block-wise (scaled_mm's 1 x 128 recipe).
FP8_BLOCK = 128


def blocks_to_fp8(y: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(y / scale in e4m3, scale (..., C / block)): one fp32 scale per `block` columns of a row, each block's amax
    mapped to e4m3's largest value; the last dimension a multiple of `block`."""
    yf = y.float()
    blocks = yf.reshape(*yf.shape[:-1], yf.shape[-1] // block, block)
    scale = blocks.abs().amax(-1).clamp(min=1e-12) / E4M3_MAX
    return (blocks / scale[..., None]).reshape(yf.shape).to(E4M3), scale


def add_norm_grad_reference(dy, ds, s, weight, mean, rstd, with_pbias: bool = False):
    """(d(h + p) in s's dtype, weight gradient, bias gradient in the parameters' dtype), fp32 (or wider) inside;
    `with_pbias`: also the branch bias's gradient, the column sums of d(h + p) before its rounding."""
    c = s.shape[-1]
    acc = torch.promote_types(s.dtype, torch.float32)
    xhat = (s.to(acc) - mean[..., None]) * rstd[..., None]
    dyf = dy.to(acc)
    wdy = dyf * weight.to(acc)
    dx = rstd[..., None] * (wdy - xhat * (wdy * xhat).mean(-1, keepdim=True) - wdy.mean(-1, keepdim=True))
    dsum_acc = dx + ds.to(acc)
    dw = (dyf * xhat).reshape(-1, c).sum(0).to(weight.dtype)
    db = dyf.reshape(-1, c).sum(0).to(weight.dtype)
    if with_pbias:
        return dsum_acc.to(s.dtype), dw, db, dsum_acc.reshape(-1, c).sum(0).to(weight.dtype)
    return dsum_acc.to(s.dtype), dw, db


if triton is not None:

    @triton.jit
    def whole_rows(BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, n_rows, n_cols):
        # This program's BLOCK_M rows of an (n_rows, n_cols) tensor, whole (BLOCK_C >= n_cols): the row and column
        # indices, which of them exist, the tile's mask and its element offsets (64-bit).
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_C)
        row_ok, col_ok = rows < n_rows, cols < n_cols
        mask = row_ok[:, None] & col_ok[None, :]
        return rows, cols, row_ok, col_ok, mask, rows.to(tl.int64)[:, None] * n_cols + cols[None, :]

    @triton.jit
    def store_float8_rows(q_ptr, qs_ptr, x, rows, offs, mask, row_ok, Q_MAX: tl.constexpr):
        # x (fp32, whole rows) in float8 with one scale per row, its amax mapped to the format's max
        qscale = tl.maximum(tl.max(tl.where(mask, tl.abs(x), 0.0), 1), 1e-12) / Q_MAX
        tl.store(q_ptr + offs, (x / qscale[:, None]).to(q_ptr.dtype.element_ty), mask=mask)
        tl.store(qs_ptr + rows, qscale, mask=row_ok)

    @triton.jit
    def _add_norm_fwd_kernel(h_ptr, p_ptr, pb_ptr, w_ptr, b_ptr, s_ptr, y_ptr, mean_ptr, rstd_ptr, q_ptr, qs_ptr,
                             n_rows, n_cols, y_stride, eps, HAS_PB: tl.constexpr, HAS_Q: tl.constexpr,
                             Q_MAX: tl.constexpr, ONES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        # y's rows are y_stride apart: n_cols, or n_cols + ONES with ONES columns of 1.0 after the row's values
        rows, cols, row_ok, col_ok, mask, offs = whole_rows(BLOCK_M, BLOCK_C, n_rows, n_cols)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_PB:  # the branch's bias, which its matmul left out
            p += tl.load(pb_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        s = (h + p).to(s_ptr.dtype.element_ty)  # the stream keeps its own dtype; the norm reads it back
        tl.store(s_ptr + offs, s, mask=mask)
        x = s.to(tl.float32)
        mean = tl.sum(x, 1) / n_cols
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = xc * rstd[:, None] * w[None, :] + b[None, :]
        y_rows = y_ptr + rows.to(tl.int64)[:, None] * y_stride
        tl.store(y_rows + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
        if ONES > 0:
            ones = tl.full([BLOCK_M, ONES], 1.0, y_ptr.dtype.element_ty)
            tl.store(y_rows + n_cols + tl.arange(0, ONES)[None, :], ones, mask=row_ok[:, None])
        if HAS_Q:  # y in float8 for the next matmul, one scale per row
            store_float8_rows(q_ptr, qs_ptr, y, rows, offs, mask, row_ok, Q_MAX)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)

    @triton.jit
    def _load_bwd_block(dy_ptr, ds_ptr, s_ptr, mean_ptr, rstd_ptr, rows, cols, n_rows, n_cols):
        # one row block's operands as stored (bf16 stays bf16 until used)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        return (tl.load(dy_ptr + offs, mask=mask, other=0.0), tl.load(s_ptr + offs, mask=mask, other=0.0),
                tl.load(ds_ptr + offs, mask=mask, other=0.0), tl.load(mean_ptr + rows, mask=row_ok, other=0.0),
                tl.load(rstd_ptr + rows, mask=row_ok, other=0.0))

    @triton.jit
    def _add_norm_bwd_kernel(dy_ptr, ds_ptr, s_ptr, w_ptr, mean_ptr, rstd_ptr, dsum_ptr, part_ptr, n_rows, n_cols,
                             programs, HAS_PB: tl.constexpr, STEPS: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_C: tl.constexpr, PREFETCH: tl.constexpr):
        # `programs` programs; program pid takes row blocks pid, pid + programs, ... (STEPS of them at most;
        # a constant, so that the loop has fixed bounds, which Triton's CPU interpreter needs too). With PREFETCH
        # each step loads the next row block before it computes its own.
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        col_ok = cols < n_cols
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_C], tl.float32)
        db = tl.zeros([BLOCK_C], tl.float32)
        dpb = tl.zeros([BLOCK_C], tl.float32)
        if PREFETCH:
            next_dy, next_x, next_ds, next_mean, next_rstd = _load_bwd_block(
                dy_ptr, ds_ptr, s_ptr, mean_ptr, rstd_ptr, pid * BLOCK_M + tl.arange(0, BLOCK_M), cols, n_rows, n_cols)
        for i in tl.range(0, STEPS):
            rows = (pid + i * programs) * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok = rows < n_rows
            mask = row_ok[:, None] & col_ok[None, :]
            offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
            if PREFETCH:
                dy, x, ds, mean, rstd = next_dy, next_x, next_ds, next_mean, next_rstd
                next_dy, next_x, next_ds, next_mean, next_rstd = _load_bwd_block(
                    dy_ptr, ds_ptr, s_ptr, mean_ptr, rstd_ptr, rows + programs * BLOCK_M, cols, n_rows, n_cols)
                dy = dy.to(tl.float32)
                x = x.to(tl.float32)
            else:
                dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                x = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
                rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
            wdy = dy * w[None, :]
            c1 = tl.sum(xhat * wdy, 1) / n_cols
            c2 = tl.sum(wdy, 1) / n_cols
            dx = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
            if not PREFETCH:
                ds = tl.load(ds_ptr + offs, mask=mask, other=0.0)
            dsum = tl.where(mask, dx + ds.to(tl.float32), 0.0)
            tl.store(dsum_ptr + offs, dsum.to(dsum_ptr.dtype.element_ty), mask=mask)
            dw += tl.sum(dy * xhat, 0)
            db += tl.sum(dy, 0)
            if HAS_PB:  # the branch bias's gradient: the column sums of what the branch receives
                dpb += tl.sum(dsum, 0)
        tl.store(part_ptr + pid * n_cols + cols, dw, mask=col_ok)
        tl.store(part_ptr + (programs + pid) * n_cols + cols, db, mask=col_ok)
        if HAS_PB:
            tl.store(part_ptr + (2 * programs + pid) * n_cols + cols, dpb, mask=col_ok)

    @triton.jit
    def _colsum_kernel(part_ptr, dw_ptr, db_ptr, dpb_ptr, n_cols, N_PARTS: tl.constexpr, BLOCK_P: tl.constexpr,
                       BLOCK_N: tl.constexpr):
        # program (j, k): columns j of the weight (k = 0), the bias (k = 1) or the branch bias's (k = 2)
        # gradient, summed over the parts
        which = tl.program_id(1)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < n_cols
        acc = tl.zeros([BLOCK_N], tl.float32)
        base = part_ptr + which * N_PARTS * n_cols
        for p0 in tl.range(0, N_PARTS, BLOCK_P):
            parts = p0 + tl.arange(0, BLOCK_P)
            mask = (parts < N_PARTS)[:, None] & col_ok[None, :]
            acc += tl.sum(tl.load(base + parts[:, None] * n_cols + cols[None, :], mask=mask, other=0.0), 0)
        if which == 0:
            tl.store(dw_ptr + cols, acc.to(dw_ptr.dtype.element_ty), mask=col_ok)
        elif which == 1:
            tl.store(db_ptr + cols, acc.to(db_ptr.dtype.element_ty), mask=col_ok)
        else:
            tl.store(dpb_ptr + cols, acc.to(dpb_ptr.dtype.element_ty), mask=col_ok)

    def launch_fwd(h, p, weight, bias, eps, s, y, mean, rstd, tile=None, pbias=None, q=None, qs=None) -> None:
        """The forward into preallocated outputs; h, p, s are 2-D (N, C) and contiguous, y (N, C) or, for the
        columns of ones, (N, C + ones), contiguous, its last `ones` columns set to 1.0; `pbias` (C,), if given, is
        added to p; `q` (N, C) float8 e4m3 and `qs` (N,) fp32, if given, get y's float8 copy and its row scales (a
        q of another dtype gets y / scale unrounded, as the CPU interpreter's test reads it)."""
        n, c = h.shape
        ones = y.shape[1] - c
        assert ones & (ones - 1) == 0, f"the columns of ones are a power of two wide (tl.arange), not {ones}"
        bm, warps = tile or FWD_TILE
        with_q = q is not None
        _add_norm_fwd_kernel[(triton.cdiv(n, bm),)](h, p, bias if pbias is None else pbias, weight, bias, s, y, mean,
                                                   rstd, q if with_q else y, qs if with_q else mean, n, c,
                                                   y.stride(0), eps, HAS_PB=pbias is not None, HAS_Q=with_q,
                                                   Q_MAX=E4M3_MAX, ONES=ones, BLOCK_M=bm,
                                                   BLOCK_C=triton.next_power_of_2(c), num_warps=warps)

    def launch_bwd(dy, ds, s, weight, mean, rstd, dsum, dw, db, programs: int, tile=None, colsum=None,
                   dpb=None, prefetch: bool = BWD_PREFETCH) -> None:
        """The backward into preallocated outputs, with `programs` programs walking the row blocks
        (`colsum` = (parts per step, columns per program, warps) of the column sums); `dpb`, if given, gets the
        branch bias's gradient; `prefetch` as the kernel's PREFETCH."""
        n, c = s.shape
        bm, warps, _, *stages = tile or BWD_TILE  # stages: Triton's num_stages (its own default when not given)
        cp, cn, cw = colsum or COLSUM_TILE
        blocks = triton.cdiv(n, bm)
        programs = max(1, min(programs, blocks))
        sums = 2 if dpb is None else 3
        part = torch.empty((sums, programs, c), device=s.device, dtype=torch.float32)
        _add_norm_bwd_kernel[(programs,)](dy, ds, s, weight, mean, rstd, dsum, part, n, c, programs,
                                          HAS_PB=dpb is not None, STEPS=triton.cdiv(blocks, programs), BLOCK_M=bm,
                                          BLOCK_C=triton.next_power_of_2(c), PREFETCH=prefetch,
                                          num_warps=warps,
                                          **({"num_stages": stages[0]} if stages else {}))
        _colsum_kernel[(triton.cdiv(c, cn), sums)](part, dw, db, db if dpb is None else dpb, c, N_PARTS=programs,
                                                   BLOCK_P=cp, BLOCK_N=cn, num_warps=cw)

    def _programs(device: torch.device) -> int:
        if device.type != "cuda":
            return 3  # Triton's CPU interpreter: a few programs, each walking several row blocks
        return torch.cuda.get_device_properties(device).multi_processor_count * BWD_TILE[2]

    @torch.library.custom_op("gpt2ladder::add_norm_fwd", mutates_args=())
    def add_norm_fwd(h: torch.Tensor, p: torch.Tensor, pbias: torch.Tensor | None, weight: torch.Tensor,
                     bias: torch.Tensor, eps: float, out_dtype: torch.dtype,
                     fp8: bool, ones: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor, torch.Tensor]:
        """(s, y, mean, rstd, y in float8, its row scales); without `fp8` the last two are empty. With `ones`, y
        has that many more columns, each 1.0."""
        c = h.shape[-1]
        h2, p2 = h.reshape(-1, c).contiguous(), p.reshape(-1, c).contiguous()
        s, y = torch.empty_like(h2), torch.empty((h2.shape[0], c + ones), device=h.device, dtype=out_dtype)
        mean = torch.empty(h2.shape[0], device=h.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        q = torch.empty(h2.shape if fp8 else (0,), device=h.device, dtype=E4M3)
        qs = torch.empty_like(mean) if fp8 else mean.new_empty((0,))
        launch_fwd(h2, p2, weight.contiguous(), bias.contiguous(), eps, s, y, mean, rstd,
                   pbias=None if pbias is None else pbias.contiguous(), q=q if fp8 else None, qs=qs if fp8 else None)
        stats_shape = h.shape[:-1]
        return (s.view(h.shape), y.view(*stats_shape, c + ones), mean.view(stats_shape), rstd.view(stats_shape),
                q.view(h.shape) if fp8 else q, qs.view(stats_shape) if fp8 else qs)

    @add_norm_fwd.register_fake
    def _(h, p, pbias, weight, bias, eps, out_dtype, fp8, ones):  # contiguous, whatever h's strides
        stats = h.new_empty(h.shape[:-1], dtype=torch.float32)
        q = h.new_empty(h.shape if fp8 else (0,), dtype=E4M3)
        qs = torch.empty_like(stats) if fp8 else stats.new_empty((0,))
        y = h.new_empty((*h.shape[:-1], h.shape[-1] + ones), dtype=out_dtype)
        return h.new_empty(h.shape), y, stats, torch.empty_like(stats), q, qs

    @torch.library.custom_op("gpt2ladder::add_norm_bwd", mutates_args=())
    def add_norm_bwd(dy: torch.Tensor, ds: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                     rstd: torch.Tensor, with_pbias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor]:
        c = s.shape[-1]
        s2 = s.reshape(-1, c).contiguous()
        dsum = torch.empty_like(s2)
        dw, db = torch.empty_like(weight), torch.empty_like(weight)
        dpb = torch.empty_like(weight) if with_pbias else weight.new_empty((0,))
        launch_bwd(dy.reshape(-1, c).contiguous(), ds.reshape(-1, c).contiguous(), s2, weight.contiguous(),
                   mean.reshape(-1).contiguous(), rstd.reshape(-1).contiguous(), dsum, dw, db, _programs(s.device),
                   dpb=dpb if with_pbias else None)
        return dsum.view(s.shape), dw, db, dpb

    @add_norm_bwd.register_fake
    def _(dy, ds, s, weight, mean, rstd, with_pbias):
        dpb = weight.new_empty(weight.shape if with_pbias else (0,))
        return s.new_empty(s.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape), dpb


def kernels_available(t: torch.Tensor) -> bool:
    return triton is not None and t.is_cuda


def add_norm(h, p, weight, bias, eps: float, out_dtype: torch.dtype, pbias=None, fp8: bool = False, ones: int = 0):
    """(s, y, mean, rstd, q, qs) of s = h + p (+ pbias), y = layer_norm(s), and with `fp8` y in float8 (q) with its
    row scales (qs), else None for both: the kernel on CUDA with Triton, else the reference. With `ones`, y has that
    many columns of 1.0 after its C (..., C + ones), for a weight-gradient product to sum a bias gradient with."""
    if kernels_available(h):
        s, y, mean, rstd, q, qs = torch.ops.gpt2ladder.add_norm_fwd(h, p, pbias, weight, bias, eps, out_dtype, fp8,
                                                                    ones)
        return (s, y, mean, rstd, q, qs) if fp8 else (s, y, mean, rstd, None, None)
    wide = torch.promote_types(h.dtype, torch.float32)  # y before its rounding, for the float8 copy
    s, y, mean, rstd = add_norm_reference(h, p, weight, bias, eps, wide, pbias)
    q, qs = rows_to_fp8(y) if fp8 else (None, None)
    y = y.to(out_dtype)
    if ones:
        y = torch.cat([y, y.new_ones((*y.shape[:-1], ones))], -1)
    return s, y, mean, rstd, q, qs


def add_norm_grad(dy, ds, s, weight, mean, rstd, with_pbias: bool = False):
    """(d(h + p), weight gradient, bias gradient, branch bias gradient or None): the kernels on CUDA with Triton,
    else the reference."""
    if kernels_available(s):
        dsum, dw, db, dpb = torch.ops.gpt2ladder.add_norm_bwd(dy, ds, s, weight, mean, rstd, with_pbias)
        return dsum, dw, db, dpb if with_pbias else None
    if with_pbias:
        return add_norm_grad_reference(dy, ds, s, weight, mean, rstd, with_pbias=True)
    return (*add_norm_grad_reference(dy, ds, s, weight, mean, rstd), None)
