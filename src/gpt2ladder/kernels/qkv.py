"""The attention's q, k, v gradients put back side by side, with c_attn's bias gradient, as one Triton kernel,
behind the `qkv_grad` rung.

c_attn writes q, k and v side by side, (B, T, 3C); the attention reads them as three (B, nh, T, hs) views of it.
Backward, SDPA returns three separate gradients, and compiled they became c_attn's output gradient in two passes:
a copy that assembled the three into (B, T, 3C) and a reduction over the same values for c_attn's bias gradient.

Here `_qkv_grad_kernel` does both in one pass: a program takes one head's (rows x hs) tile of one of the three
gradients, stores it in its place in the (B*T, 3C) output, and adds its column sums (fp32) into the bias
gradient, one atomic per column. The three inputs may have any strides with a unit last one (whatever the
attention's backward returned), so none is copied first.

The op is a custom op (opaque to torch.compile and CUDA graphs). Off CUDA or without Triton `qkv_grad_reference`
runs, the PyTorch expressions the kernel must match (tests/kernels/test_qkv_kernel.py runs the kernel through
Triton's CPU interpreter, tests/kernels/test_kernels_gpu.py on a GPU). The bias gradient's atomics add in no fixed
order, so it is not bit-reproducible from run to run.

A variant that also wrote the float8 copy of that gradient for the `fp8_dgrad` rung was slower in the step than the
compiled passes it replaced and was taken out (its record is in benchmarks/RECORDS.md; its code is at commit
52f1e70).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference expressions run instead
    triton = None

# (rows per tile, row tiles per program, warps): a program walks ROW_TILES tiles of one head before its atomics. The
# fastest benchmarks/micro/qkv_grad.py found at GPT-2's shape on a Hopper GPU, faster than compile's copy and sum
# of the same values alone (in the step, compile fuses those with their neighbours).
TILE = (128, 2, 4)


def qkv_grad_reference(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                       bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, 3C) gradient of c_attn's output from the (B, nh, T, hs) gradients of q, k, v, and its column sums
    (c_attn's bias gradient) summed in fp32 and returned in `bias_dtype`."""
    B, nh, T, hs = dq.shape
    parts = [g.transpose(1, 2).reshape(B, T, nh * hs) for g in (dq, dk, dv)]
    dqkv = torch.cat(parts, dim=2)
    wide = torch.promote_types(dq.dtype, torch.float32)
    return dqkv, dqkv.reshape(B * T, -1).sum(0, dtype=wide).to(bias_dtype)


if triton is not None:

    @triton.jit
    def _qkv_grad_kernel(dq_ptr, dk_ptr, dv_ptr, out_ptr, dbias_ptr, T, nh,
                         sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                         HS: tl.constexpr, BLOCK_T: tl.constexpr, ROW_TILES: tl.constexpr):
        # Grid: (row-tile groups of T, B * nh, 3). Program (i, b * nh + h, part) copies rows
        # [i * ROW_TILES * BLOCK_T, ...) of head h of batch b of gradient `part` (0: q, 1: k, 2: v).
        bh = tl.program_id(1)
        part = tl.program_id(2)
        b = bh // nh
        h = bh % nh
        d = tl.arange(0, HS)
        if part == 0:
            src = dq_ptr + b.to(tl.int64) * sq_b + h * sq_h
            st = sq_t
        elif part == 1:
            src = dk_ptr + b.to(tl.int64) * sk_b + h * sk_h
            st = sk_t
        else:
            src = dv_ptr + b.to(tl.int64) * sv_b + h * sv_h
            st = sv_t
        width = 3 * nh * HS  # the output's row
        col = part * nh * HS + h * HS + d
        acc = tl.zeros([HS], tl.float32)
        for i in tl.range(0, ROW_TILES):
            t = (tl.program_id(0) * ROW_TILES + i) * BLOCK_T + tl.arange(0, BLOCK_T)
            ok = (t < T)[:, None]
            g = tl.load(src + t.to(tl.int64)[:, None] * st + d[None, :], mask=ok, other=0.0)
            rows = b.to(tl.int64) * T + t.to(tl.int64)
            tl.store(out_ptr + rows[:, None] * width + col[None, :], g, mask=ok)
            acc += tl.sum(g.to(tl.float32), 0)
        tl.atomic_add(dbias_ptr + col, acc)

    def launch(dq, dk, dv, out, dbias, tile=None) -> None:
        """c_attn's output gradient into `out` (B*T, 3C) and its column sums added into `dbias` (3C, fp32, zeroed by
        the caller), from (B, nh, T, hs) gradients with a unit last stride."""
        B, nh, T, hs = dq.shape
        bt, tiles, warps = tile or TILE
        strides = [s for g in (dq, dk, dv) for s in g.stride()[:3]]
        _qkv_grad_kernel[(triton.cdiv(T, bt * tiles), B * nh, 3)](
            dq, dk, dv, out, dbias, T, nh, *strides, HS=hs, BLOCK_T=bt, ROW_TILES=tiles, num_warps=warps)

    @torch.library.custom_op("gpt2ladder::qkv_grad", mutates_args=())
    def qkv_grad_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                    bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        B, nh, T, hs = dq.shape
        dq, dk, dv = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk, dv))
        out = torch.empty((B, T, 3 * nh * hs), device=dq.device, dtype=dq.dtype)
        dbias = torch.zeros((3 * nh * hs,), device=dq.device, dtype=torch.float32)
        launch(dq, dk, dv, out.view(B * T, -1), dbias)
        return out, dbias.to(bias_dtype)

    @qkv_grad_op.register_fake
    def _(dq, dk, dv, bias_dtype):
        B, nh, T, hs = dq.shape
        return dq.new_empty((B, T, 3 * nh * hs)), dq.new_empty((3 * nh * hs,), dtype=bias_dtype)


def usable(hs: int) -> bool:
    """Whether the kernel takes this head size (a power of two, as a Triton block must be)."""
    return hs >= 16 and hs & (hs - 1) == 0


def qkv_grad(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
             bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_attn's output gradient (B, T, 3C), its bias gradient): the kernel on CUDA with Triton, else the reference."""
    if triton is not None and dq.is_cuda and usable(dq.shape[-1]):
        return torch.ops.gpt2ladder.qkv_grad(dq, dk, dv, bias_dtype)
    return qkv_grad_reference(dq, dk, dv, bias_dtype)

