"""GPT-2's GELU (with c_fc's bias add) as two Triton kernels, behind the `gelu_kernel` rung.

GPT-2's GELU is 0.5 h (1 + tanh(z)), z = sqrt(2/pi) (h + 0.044715 h^3). Compiled, its forward kernel
evaluates tanh with a long libdevice sequence, and at GPT-2 124M's 16384 x 3072 (B=16 x 1024) that
arithmetic, not memory, bounds it. Its backward is two kernels: a pointwise one writing the gradient dh
and a column sum over (N, 4C) again for c_fc's bias.

Here 0.5 (1 + tanh z) is written as sigmoid(2z) = 1 / (1 + e), e = exp(-2z): one exp2 and one division,
exact in value (more exact, in fact, in the negative tail, where 1 + tanh z cancels in fp32):
  - `_gelu_fwd_kernel`: a = gelu(h0 + bias), with c_fc's bias add moved here from the matmul; the
    forward saves h0 = c_fc(x) without the bias;
  - `_gelu_grad_kernel`: one (rows x columns) tile per program writes dh = g gelu'(h0 + bias) and adds
    the tile's column sums of dh (fp32) into the bias gradient, one atomic per column.
Both then run near the card's memory bandwidth (benchmarks/micro/gelu_kernel.py times them against compile's).

With `fp8` (the `fp8_proj` rung) the forward also writes its output in float8 (e4m3) with one fp32 scale per row,
each row's amax mapped to e4m3's largest value, for c_proj's forward product to read (`speedups/fp8_forward.py`):
one program then holds whole rows (`FP8_FWD_TILE`), and the copy is made from the values before their rounding to
the output dtype, as the norm kernel's is (`kernels/norm.py`, `rows_to_fp8`). Holding whole rows costs time over
the plain forward. `launch_fwd_fp8_blocks` writes the copy with one scale per block
of `FP8_BLOCK` columns of a row instead (the 1 x 128 blocks of cuBLAS's block-wise scaling), so each program keeps
the plain forward's tile, at a smaller cost; fp8_proj with block scales did not pay in the step (its record is in
benchmarks/RECORDS.md), so only benchmarks/micro/fp8_blockwise.py runs it, beside the block-scaled products.

The ops are custom ops (opaque to torch.compile and CUDA graphs). Off CUDA or without Triton they are
`gelu_reference` / `gelu_grad_reference`, the PyTorch expressions the kernels must match:
tests/kernels/test_gelu_kernel.py runs the kernels through Triton's CPU interpreter,
tests/kernels/test_kernels_gpu.py on a GPU (the forward against fp64). The bias gradient's atomics add in no fixed
order, so it is not bit-reproducible from run to run (compiled steps are not either).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2ladder.kernels.norm import E4M3, E4M3_MAX, FP8_BLOCK, blocks_to_fp8, rows_to_fp8

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference expressions run instead
    triton = None
else:
    from gpt2ladder.kernels.norm import store_float8_rows, whole_rows

SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715  # GPT-2's tanh approximation: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
LOG2_E = 1.4426950408889634
# Tile shapes (rows, columns, warps; the backward also row blocks per program), from
# benchmarks/micro/gelu_kernel.py on a Hopper GPU: the forward took the same time at every tile tried; the
# backward is the fastest tried (looping over more row blocks per program, to make fewer atomics, was slower
# at every setting tried).
FWD_TILE = (8, 256, 4)
BWD_TILE = (32, 64, 2, 1)
# The forward with its float8 copy (rows per program, warps): whole rows, so each program knows its rows' amax.
# The fastest of seven tried on a Hopper GPU; over 12 Blocks its cost above the plain forward is more than c_proj's
# float8 product saves in the step.
FP8_FWD_TILE = (4, 8)
# The float8 copy with one scale per FP8_BLOCK columns of a row (kernels/norm.py): (rows, columns, warps), columns a
# power of two and a multiple of FP8_BLOCK. The fastest of 15 tried, 1 to 8 warps, on a Hopper GPU
# (benchmarks/micro/fp8_blockwise.py).
FP8_BLOCKS_TILE = (32, 128, 4)


def gelu_reference(h0: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(h0 + bias), tanh form, in fp32 inside and h0's dtype out: what the forward kernel computes."""
    return F.gelu(h0.float() + bias.float(), approximate="tanh").to(h0.dtype)


def gelu_fp8_reference(h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gelu(h0 + bias) in h0's dtype, its float8 copy, the copy's row scales): the forward kernel with `fp8`, the
    copy made from the fp32 values before their rounding."""
    a = F.gelu(h0.float() + bias.float(), approximate="tanh")
    return (a.to(h0.dtype), *rows_to_fp8(a))


def gelu_fp8_blocks_reference(h0: torch.Tensor, bias: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gelu(h0 + bias) in h0's dtype, its float8 copy, the copy's scales (N, C / FP8_BLOCK)): one fp32 scale per
    block of FP8_BLOCK columns of a row, the block's amax mapped to e4m3's largest value, from the fp32 values."""
    a = F.gelu(h0.float() + bias.float(), approximate="tanh")
    return (a.to(h0.dtype), *blocks_to_fp8(a, FP8_BLOCK))


def gelu_grad_reference(grad: torch.Tensor, h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh in h0's dtype, bias gradient in the bias's dtype) for a = gelu(h0 + bias), in fp32 inside."""
    h = h0.float() + bias.float()
    t = torch.tanh(SQRT_2_OVER_PI * (h + GELU_CUBIC * h * h * h))
    slope = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_CUBIC * h * h)
    dh = grad.float() * slope
    return dh.to(h0.dtype), dh.reshape(-1, dh.shape[-1]).sum(0).to(bias.dtype)


if triton is not None:
    # A kernel reads module globals only as constexpr. 0.5 (1 + tanh(z)) = sigmoid(2z) = 1 / (1 + e) with
    # e = exp(-2z): one exp2 and one division instead of a tanh, which the compiled expressions evaluate
    # with a long libdevice sequence; that arithmetic, not memory, was what bounded them.
    _NEG_2Z = tl.constexpr(-2.0 * SQRT_2_OVER_PI * LOG2_E)  # exp2(_NEG_2Z * (h + c h^3)) = exp(-2z)
    _C1 = tl.constexpr(GELU_CUBIC)
    _DZ = tl.constexpr(2.0 * SQRT_2_OVER_PI)

    @triton.jit
    def _tile(rows, cols, n_rows, n_cols, WIDE: tl.constexpr):
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        if WIDE:  # more than 2^31 elements: 64-bit offsets
            return rows.to(tl.int64)[:, None] * n_cols + cols[None, :], mask
        return rows[:, None] * n_cols + cols[None, :], mask

    @triton.jit
    def _gelu_of(h):
        # h sigmoid(2z) = h / (1 + exp(-2z)); exp2 is +inf far left: h / inf = -0, gelu's limit
        return h / (1.0 + tl.exp2(_NEG_2Z * (h + _C1 * h * h * h)))

    @triton.jit
    def _gelu_tile(h0_ptr, bias_ptr, out_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   WIDE: tl.constexpr):
        # This program's (BLOCK_M x BLOCK_N) tile of a = gelu(h0 + bias), stored; a in fp32, its rows and offsets
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs, mask = _tile(rows, cols, n_rows, n_cols, WIDE)
        bias = tl.load(bias_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        a = _gelu_of(tl.load(h0_ptr + offs, mask=mask, other=0.0).to(tl.float32) + bias[None, :])
        tl.store(out_ptr + offs, a.to(out_ptr.dtype.element_ty), mask=mask)
        return a, rows, offs, mask

    @triton.jit
    def _gelu_fwd_kernel(h0_ptr, bias_ptr, out_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         WIDE: tl.constexpr):
        _gelu_tile(h0_ptr, bias_ptr, out_ptr, n_rows, n_cols, BLOCK_M, BLOCK_N, WIDE)

    @triton.jit
    def _gelu_fwd_fp8_kernel(h0_ptr, bias_ptr, out_ptr, q_ptr, qs_ptr, n_rows, n_cols, Q_MAX: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        # BLOCK_M whole rows a program: the output, then its float8 copy with one scale per row (the row's amax
        # mapped to the format's max), both from the fp32 values.
        rows, cols, row_ok, col_ok, mask, offs = whole_rows(BLOCK_M, BLOCK_C, n_rows, n_cols)
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        a = _gelu_of(tl.load(h0_ptr + offs, mask=mask, other=0.0).to(tl.float32) + bias[None, :])
        tl.store(out_ptr + offs, a.to(out_ptr.dtype.element_ty), mask=mask)
        store_float8_rows(q_ptr, qs_ptr, a, rows, offs, mask, row_ok, Q_MAX)

    @triton.jit
    def _gelu_fwd_fp8_blocks_kernel(h0_ptr, bias_ptr, out_ptr, q_ptr, qs_ptr, n_rows, n_cols, Q_MAX: tl.constexpr,
                                    QB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                    WIDE: tl.constexpr):
        # The plain forward's tile, plus its float8 copy with one scale per QB columns of a row (n_cols a multiple
        # of QB, BLOCK_N too); the scales stored block-major, scale (row, block) at block * n_rows + row.
        a, rows, offs, mask = _gelu_tile(h0_ptr, bias_ptr, out_ptr, n_rows, n_cols, BLOCK_M, BLOCK_N, WIDE)
        a3 = tl.reshape(a, (BLOCK_M, BLOCK_N // QB, QB))
        qscale = tl.maximum(tl.max(tl.abs(a3), 2), 1e-12) / Q_MAX  # (BLOCK_M, BLOCK_N // QB)
        q = tl.reshape(a3 / qscale[:, :, None], (BLOCK_M, BLOCK_N))
        tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
        blocks = tl.program_id(0) * (BLOCK_N // QB) + tl.arange(0, BLOCK_N // QB)
        tl.store(qs_ptr + blocks[None, :] * n_rows + rows[:, None], qscale,
                 mask=(rows < n_rows)[:, None] & (blocks < n_cols // QB)[None, :])

    @triton.jit
    def _gelu_grad_kernel(grad_ptr, h0_ptr, bias_ptr, dh_ptr, dbias_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, ROW_BLOCKS: tl.constexpr, WIDE: tl.constexpr):
        # One program: BLOCK_N columns over ROW_BLOCKS x BLOCK_M rows, then its column sums added into
        # the (zeroed) fp32 bias gradient, one atomic per column.
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        bias = tl.load(bias_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for i in tl.range(0, ROW_BLOCKS):
            rows = (tl.program_id(1) * ROW_BLOCKS + i) * BLOCK_M + tl.arange(0, BLOCK_M)
            offs, mask = _tile(rows, cols, n_rows, n_cols, WIDE)
            h = tl.load(h0_ptr + offs, mask=mask, other=0.0).to(tl.float32) + bias[None, :]
            g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            s = 1.0 / (1.0 + tl.exp2(_NEG_2Z * (h + _C1 * h * h * h)))  # sigmoid(2z) = 0.5 (1 + tanh z)
            # d/dh [h sigmoid(2z)] = s + h s (1 - s) 2 dz/dh, and (1 - tanh^2) / 2 = 2 s (1 - s)
            dh = g * (s + h * s * (1.0 - s) * _DZ * (1.0 + 3.0 * _C1 * h * h))  # 0 off the tensor: g is 0
            tl.store(dh_ptr + offs, dh.to(dh_ptr.dtype.element_ty), mask=mask)
            acc += tl.sum(dh, 0)
        tl.atomic_add(dbias_ptr + cols, acc, mask=cols < n_cols)

    def _wide(t: torch.Tensor) -> bool:
        return t.numel() >= 2**31

    def launch_fwd(h0, bias, out, tile=None) -> None:
        """gelu(h0 + bias) into `out`; 2-D contiguous (N, C) tensors."""
        n, c = h0.shape
        bm, bn, warps = tile or FWD_TILE
        _gelu_fwd_kernel[(triton.cdiv(c, bn), triton.cdiv(n, bm))](
            h0, bias, out, n, c, BLOCK_M=bm, BLOCK_N=bn, WIDE=_wide(h0), num_warps=warps)

    def launch_fwd_fp8(h0, bias, out, q, qs, tile=None) -> None:
        """gelu(h0 + bias) into `out`, its float8 copy into `q` and the row scales into `qs`; (N, C) tensors."""
        n, c = h0.shape
        bm, warps = tile or FP8_FWD_TILE
        _gelu_fwd_fp8_kernel[(triton.cdiv(n, bm),)](h0, bias, out, q, qs, n, c, Q_MAX=E4M3_MAX, BLOCK_M=bm,
                                                    BLOCK_C=triton.next_power_of_2(c), num_warps=warps)

    def launch_fwd_fp8_blocks(h0, bias, out, q, qs, tile=None) -> None:
        """gelu(h0 + bias) into `out`, its float8 copy into `q` and its block scales into `qs`: (N, C) tensors but
        `qs`, (C / FP8_BLOCK, N) contiguous (its transpose is the (N, C / FP8_BLOCK) scale tensor, rows adjacent)."""
        n, c = h0.shape
        bm, bn, warps = tile or FP8_BLOCKS_TILE
        if c % FP8_BLOCK or bn % FP8_BLOCK or bn & (bn - 1):
            raise ValueError(f"the columns ({c}) must be a multiple of {FP8_BLOCK}, the tile's ({bn}) a power of two "
                             f"and a multiple of it")
        _gelu_fwd_fp8_blocks_kernel[(triton.cdiv(c, bn), triton.cdiv(n, bm))](
            h0, bias, out, q, qs, n, c, Q_MAX=E4M3_MAX, QB=FP8_BLOCK, BLOCK_M=bm, BLOCK_N=bn, WIDE=_wide(h0),
            num_warps=warps)

    def launch(grad, h0, bias, dh, dbias, tile=None) -> None:
        """dh and the bias gradient (added into `dbias`, fp32, zeroed by the caller); (N, C) tensors."""
        n, c = h0.shape
        bm, bn, warps, blocks = tile or BWD_TILE
        _gelu_grad_kernel[(triton.cdiv(c, bn), triton.cdiv(n, bm * blocks))](
            grad, h0, bias, dh, dbias, n, c, BLOCK_M=bm, BLOCK_N=bn, ROW_BLOCKS=blocks, WIDE=_wide(h0),
            num_warps=warps)

    @torch.library.custom_op("gpt2ladder::gelu_fwd", mutates_args=())
    def gelu_fwd(h0: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        c = h0.shape[-1]
        h02 = h0.reshape(-1, c).contiguous()
        out = torch.empty_like(h02)
        launch_fwd(h02, bias.contiguous(), out)
        return out.view(h0.shape)

    @gelu_fwd.register_fake
    def _(h0, bias):
        return torch.empty_like(h0)

    def _with_copy(h0, bias, launcher, scales_shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output, float8 copy) shaped as h0 and the scales (fp32, `scales_shape`), written by `launcher`."""
        h02 = h0.reshape(-1, h0.shape[-1]).contiguous()
        out, q = torch.empty_like(h02), torch.empty(h02.shape, device=h0.device, dtype=E4M3)
        qs = torch.empty(scales_shape, device=h0.device, dtype=torch.float32)
        launcher(h02, bias.contiguous(), out, q, qs)
        return out.view(h0.shape), q.view(h0.shape), qs

    @torch.library.custom_op("gpt2ladder::gelu_fwd_fp8", mutates_args=())
    def gelu_fwd_fp8(h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, q, qs = _with_copy(h0, bias, launch_fwd_fp8, (h0.numel() // h0.shape[-1],))
        return a, q, qs.view(h0.shape[:-1])

    @gelu_fwd_fp8.register_fake
    def _(h0, bias):
        return (h0.new_empty(h0.shape), h0.new_empty(h0.shape, dtype=E4M3),
                h0.new_empty(h0.shape[:-1], dtype=torch.float32))

    @torch.library.custom_op("gpt2ladder::gelu_fwd_fp8_blocks", mutates_args=())
    def gelu_fwd_fp8_blocks(h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _with_copy(h0, bias, launch_fwd_fp8_blocks, (h0.shape[-1] // FP8_BLOCK, h0.numel() // h0.shape[-1]))

    @gelu_fwd_fp8_blocks.register_fake
    def _(h0, bias):
        rows = h0.numel() // h0.shape[-1]
        return (h0.new_empty(h0.shape), h0.new_empty(h0.shape, dtype=E4M3),
                h0.new_empty((h0.shape[-1] // FP8_BLOCK, rows), dtype=torch.float32))

    @torch.library.custom_op("gpt2ladder::gelu_grad", mutates_args=())
    def gelu_grad(grad: torch.Tensor, h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = h0.shape[-1]
        grad2, h02 = grad.reshape(-1, c).contiguous(), h0.reshape(-1, c).contiguous()
        dh = torch.empty_like(h02)
        dbias = torch.zeros((c,), device=h0.device, dtype=torch.float32)
        launch(grad2, h02, bias.contiguous(), dh, dbias)
        return dh.view(h0.shape), dbias.to(bias.dtype)

    @gelu_grad.register_fake
    def _(grad, h0, bias):
        return torch.empty_like(h0), torch.empty_like(bias)


def gelu(h0: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(h0 + bias): the forward kernel on CUDA with Triton, else the reference expression."""
    if triton is not None and h0.is_cuda:
        return torch.ops.gpt2ladder.gelu_fwd(h0, bias)
    return gelu_reference(h0, bias)


def gelu_fp8(h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gelu(h0 + bias), its float8 copy, the copy's row scales): the forward kernel on CUDA with Triton, else the
    reference expressions."""
    if triton is not None and h0.is_cuda:
        return torch.ops.gpt2ladder.gelu_fwd_fp8(h0, bias)
    return gelu_fp8_reference(h0, bias)


def gelu_fp8_blocks(h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gelu(h0 + bias), its float8 copy, the copy's scales block-major: (C / FP8_BLOCK, rows), rows adjacent): the
    forward kernel on CUDA with Triton, else the reference expressions."""
    if triton is not None and h0.is_cuda:
        return torch.ops.gpt2ladder.gelu_fwd_fp8_blocks(h0, bias)
    a, q, qs = gelu_fp8_blocks_reference(h0, bias)
    return a, q, qs.reshape(-1, qs.shape[-1]).t().contiguous()


def gelu_grad(grad: torch.Tensor, h0: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, bias gradient) of gelu(h0 + bias): the backward kernel on CUDA with Triton, else the reference."""
    if triton is not None and grad.is_cuda:
        return torch.ops.gpt2ladder.gelu_grad(grad, h0, bias)
    return gelu_grad_reference(grad, h0, bias)
