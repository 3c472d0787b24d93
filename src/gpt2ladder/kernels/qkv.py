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

Where c_attn's input gradient is a float8 product (the `fp8_dgrad` rung), `_qkv_grad8_kernel` also writes that
gradient's float8 copy, one scale per row (a token's 3C values, their largest magnitude mapped to e4m3's largest
value, as `kernels.norm.rows_to_fp8` does on a GPU: the amax times float32(1 / 448), as CUDA divides a tensor by a
scalar, then an IEEE division of each value by its row's scale), which compile made in a second pass that read the
assembled gradient again. A program takes whole rows: BLOCK_T tokens at a time, all
three gradients' heads at once (the heads padded to a power of two), so a row's scale is known before its float8
values are written. Its column sums go to one row of partial sums per program, summed after in a fixed order
(no atomics: this bias gradient is reproducible). Each step loads the next step's tokens before it works on its
own, and the column sums stay per token in registers until the program ends. Measured, it is slower than the
compiled passes it would replace, and the step does not call it (speedups/qkv_grad.py, `FLOAT8_COPY`).
"""

from __future__ import annotations

import torch

from gpt2ladder.kernels.norm import E4M3, E4M3_MAX, rows_to_fp8

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the reference expressions run instead
    triton = None

# (rows per tile, row tiles per program, warps): a program walks ROW_TILES tiles of one head before its atomics. The
# fastest benchmarks/micro/qkv_grad.py found at GPT-2's shape on a Hopper GPU, faster than compile's copy and sum
# of the same values alone (in the step, compile fuses those with their neighbours).
TILE = (128, 2, 4)
# (tokens per step, steps per program, warps) of the kernel with the float8 copy, loading each step's next token
# ahead: the fastest of 14 tiles (benchmarks/micro/qkv_grad.py --fp8) at GPT-2's shape on a Hopper GPU, still slower
# than the step's compiled passes. A variant that read the bf16 gradients as int32 pairs (its code is at commit
# f5d7c0c) left the step slower too, so the step does not call the kernel (speedups/qkv_grad.py, FLOAT8_COPY).
TILE8 = (1, 16, 16)


def qkv_grad_reference(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                       bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, 3C) gradient of c_attn's output from the (B, nh, T, hs) gradients of q, k, v, and its column sums
    (c_attn's bias gradient) summed in fp32 and returned in `bias_dtype`."""
    B, nh, T, hs = dq.shape
    parts = [g.transpose(1, 2).reshape(B, T, nh * hs) for g in (dq, dk, dv)]
    dqkv = torch.cat(parts, dim=2)
    wide = torch.promote_types(dq.dtype, torch.float32)
    return dqkv, dqkv.reshape(B * T, -1).sum(0, dtype=wide).to(bias_dtype)


def qkv_grad8_reference(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, bias_dtype: torch.dtype):
    """qkv_grad_reference's two outputs, and between them the (B*T, 3C) gradient's float8 copy and its row scales
    (`rows_to_fp8`, from the gradient in its own dtype)."""
    dqkv, dbias = qkv_grad_reference(dq, dk, dv, bias_dtype)
    g8, scale = rows_to_fp8(dqkv.reshape(-1, dqkv.shape[-1]))
    return dqkv, g8, scale, dbias


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

    @triton.jit
    def _load_tokens(q_at, k_at, v_at, tok, T, sq_b, sq_t, sk_b, sk_t, sv_b, sv_t, mask):
        """The three gradients' (BLOCK_T, NH, HS) tiles of tokens `tok` (indices into B * T)."""
        b = (tok // T).to(tl.int64)[:, None, None]
        t = (tok % T).to(tl.int64)[:, None, None]
        q = tl.load(q_at + b * sq_b + t * sq_t, mask=mask, other=0.0)
        k = tl.load(k_at + b * sk_b + t * sk_t, mask=mask, other=0.0)
        v = tl.load(v_at + b * sv_b + t * sv_t, mask=mask, other=0.0)
        return q, k, v

    @triton.jit
    def _qkv_grad8_kernel(dq_ptr, dk_ptr, dv_ptr, out_ptr, out8_ptr, scale_ptr, part_ptr, n_tokens, T, nh,
                          sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, INV_Q_MAX: tl.constexpr,
                          HS: tl.constexpr, NH: tl.constexpr, BLOCK_T: tl.constexpr, STEPS: tl.constexpr):
        # Grid: (programs,). Program i takes tokens [i * STEPS * BLOCK_T, ...) of the B * T, BLOCK_T at a time: each
        # gradient's (BLOCK_T, NH, HS) tile (heads past nh masked), the tokens' rows of the output, their float8 copy
        # and scales. Each step loads the next step's tiles before it works on its own, so that a program's loads
        # are in flight while it reduces and stores. Its column sums stay per token in registers until the end,
        # then one row of the partial sums (row i).
        i = tl.program_id(0)
        h = tl.arange(0, NH)
        d = tl.arange(0, HS)
        C = nh * HS
        width = 3 * C
        head_ok = (h < nh)[None, :, None] & (d < HS)[None, None, :]
        col = h[None, :, None] * HS + d[None, None, :]  # within one of q, k, v
        q_at = dq_ptr + h[None, :, None] * sq_h + d[None, None, :]
        k_at = dk_ptr + h[None, :, None] * sk_h + d[None, None, :]
        v_at = dv_ptr + h[None, :, None] * sv_h + d[None, None, :]
        tok = i * STEPS * BLOCK_T + tl.arange(0, BLOCK_T)
        q, k, v = _load_tokens(q_at, k_at, v_at, tok, T, sq_b, sq_t, sk_b, sk_t, sv_b, sv_t,
                               (tok < n_tokens)[:, None, None] & head_ok)
        sum_q = tl.zeros([BLOCK_T, NH, HS], tl.float32)
        sum_k = tl.zeros([BLOCK_T, NH, HS], tl.float32)
        sum_v = tl.zeros([BLOCK_T, NH, HS], tl.float32)
        for step in tl.range(0, STEPS):
            nxt = tok + BLOCK_T
            more = (nxt < n_tokens) & (step + 1 < STEPS)
            nq, nk, nv = _load_tokens(q_at, k_at, v_at, nxt, T, sq_b, sq_t, sk_b, sk_t, sv_b, sv_t,
                                      more[:, None, None] & head_ok)
            t_ok = tok < n_tokens
            mask = t_ok[:, None, None] & head_ok
            at = tok.to(tl.int64)[:, None, None] * width + col
            tl.store(out_ptr + at, q, mask=mask)
            tl.store(out_ptr + at + C, k, mask=mask)
            tl.store(out_ptr + at + 2 * C, v, mask=mask)
            qf, kf, vf = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
            # the token's largest magnitude over q, k and v: one reduction across the program's warps, not three
            amax = tl.max(tl.max(tl.maximum(tl.maximum(tl.abs(qf), tl.abs(kf)), tl.abs(vf)), 2), 1)
            scale = tl.maximum(amax, 1e-12) * INV_Q_MAX  # CUDA's tensor / scalar: times the reciprocal
            s3 = scale[:, None, None]
            tl.store(out8_ptr + at, tl.div_rn(qf, s3).to(out8_ptr.dtype.element_ty), mask=mask)
            tl.store(out8_ptr + at + C, tl.div_rn(kf, s3).to(out8_ptr.dtype.element_ty), mask=mask)
            tl.store(out8_ptr + at + 2 * C, tl.div_rn(vf, s3).to(out8_ptr.dtype.element_ty), mask=mask)
            tl.store(scale_ptr + tok, scale, mask=t_ok)
            sum_q += qf
            sum_k += kf
            sum_v += vf
            q, k, v, tok = nq, nk, nv, nxt
        part = part_ptr + i.to(tl.int64) * width + col
        tl.store(part, tl.sum(sum_q, 0)[None, :, :], mask=head_ok)
        tl.store(part + C, tl.sum(sum_k, 0)[None, :, :], mask=head_ok)
        tl.store(part + 2 * C, tl.sum(sum_v, 0)[None, :, :], mask=head_ok)

    def programs8(n_tokens: int, tile=None) -> int:
        """How many programs the float8 kernel runs over `n_tokens` (B * T) tokens: rows of its partial sums."""
        bt, steps, _ = tile or TILE8
        return triton.cdiv(n_tokens, bt * steps)

    def launch8(dq, dk, dv, out, out8, scale, part, tile=None) -> None:
        """c_attn's output gradient into `out` (B*T, 3C), its float8 copy into `out8` (the same shape; an fp32 one
        takes the values before their rounding) and its row scales into `scale` (B*T,), and each program's column
        sums into `part` (programs8(B * T), 3C) fp32; from (B, nh, T, hs) gradients with a unit last stride."""
        B, nh, T, hs = dq.shape
        bt, steps, warps = tile or TILE8
        strides = [s for g in (dq, dk, dv) for s in g.stride()[:3]]
        _qkv_grad8_kernel[(programs8(B * T, tile),)](
            dq, dk, dv, out, out8, scale, part, B * T, T, nh, *strides, INV_Q_MAX=1.0 / E4M3_MAX, HS=hs,
            NH=triton.next_power_of_2(nh), BLOCK_T=bt, STEPS=steps, num_warps=warps)

    @torch.library.custom_op("gpt2ladder::qkv_grad8", mutates_args=())
    def qkv_grad8_op(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                     bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        B, nh, T, hs = dq.shape
        dq, dk, dv = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk, dv))
        out = torch.empty((B, T, 3 * nh * hs), device=dq.device, dtype=dq.dtype)
        out8 = torch.empty((B * T, 3 * nh * hs), device=dq.device, dtype=E4M3)
        scale = torch.empty((B * T,), device=dq.device, dtype=torch.float32)
        part = torch.empty((programs8(B * T), 3 * nh * hs), device=dq.device, dtype=torch.float32)
        launch8(dq, dk, dv, out.view(B * T, -1), out8, scale, part)
        return out, out8, scale, part.sum(0).to(bias_dtype)

    @qkv_grad8_op.register_fake
    def _(dq, dk, dv, bias_dtype):
        B, nh, T, hs = dq.shape
        return (dq.new_empty((B, T, 3 * nh * hs)), dq.new_empty((B * T, 3 * nh * hs), dtype=E4M3),
                dq.new_empty((B * T,), dtype=torch.float32), dq.new_empty((3 * nh * hs,), dtype=bias_dtype))


def usable(hs: int) -> bool:
    """Whether the kernel takes this head size (a power of two, as a Triton block must be)."""
    return hs >= 16 and hs & (hs - 1) == 0


def qkv_grad(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
             bias_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(c_attn's output gradient (B, T, 3C), its bias gradient): the kernel on CUDA with Triton, else the reference."""
    if triton is not None and dq.is_cuda and usable(dq.shape[-1]):
        return torch.ops.gpt2ladder.qkv_grad(dq, dk, dv, bias_dtype)
    return qkv_grad_reference(dq, dk, dv, bias_dtype)


def qkv_grad8(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, bias_dtype: torch.dtype):
    """(c_attn's output gradient (B, T, 3C), its float8 copy (B*T, 3C) and row scales (B*T,), its bias gradient):
    the kernel on CUDA with Triton, else the reference."""
    if triton is not None and dq.is_cuda and usable(dq.shape[-1]):
        return torch.ops.gpt2ladder.qkv_grad8(dq, dk, dv, bias_dtype)
    return qkv_grad8_reference(dq, dk, dv, bias_dtype)
