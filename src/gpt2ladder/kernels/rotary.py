"""Queries and keys made ready for attention as Triton kernels: the `rope_kernel` rung.

The modern family's attention (`model/modern.py`) takes c_attn's output qkv (B, T, 3C) and, per head, divides the
query and the key by their RMS (the qk_norm part) and turns each (first half, second half) pair of their dimensions
by the position's angle (the rope part). Compiled, that is a reduction kernel and a pointwise kernel that write q and
k head-major, and in the backward pass several more, then a pass that assembles c_attn's output gradient from the
q, k and v gradients.

Here one forward kernel reads a (token, head) row of q or k once, normalises and turns it in registers and writes it
token-major, (B, T, nh, hs), which attention reads through a transposed view; v's rows are copied beside them, so
the three come out of one node and their gradients come back to it. One backward kernel per q, k and v reads
attention's gradient row (any strides), turns it back by the angle, takes it through the norm (recomputed from qkv:
nothing is saved but qkv itself) and writes it straight into its columns of c_attn's output gradient.

All arithmetic is fp32 between one bf16 load and one store; `rotary_reference` is the expression both must match
(tests/kernels/test_rotary_kernel.py through Triton's CPU interpreter, tests/kernels/test_kernels_gpu.py on a GPU).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the attention keeps its PyTorch expressions
    triton = None

ROWS = 16  # (token, head) rows per program: at GPT-2's head size 64, a 2 KB tile of bf16 per half


def norm_eps(dtype: torch.dtype) -> float:
    """The epsilon F.rms_norm takes when given none: the machine epsilon of its input's dtype."""
    return torch.finfo(dtype).eps


def rotary_reference(qkv: torch.Tensor, n_head: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                     qk_norm: bool, eps: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (B, T, nh, hs) in qkv's dtype: q and k RMS-normalised per head (if qk_norm; `eps` by default
    qkv's dtype's, as the model's), then each pair (x1, x2) of a head's halves turned by its position's angle,
    (x1 cos - x2 sin, x1 sin + x2 cos) (if cos is given), in fp32 from qkv's values; v as it is."""
    eps = norm_eps(qkv.dtype) if eps is None else eps
    B, T, three_c = qkv.shape
    hs = three_c // (3 * n_head)
    q, k, v = qkv.view(B, T, 3, n_head, hs).unbind(2)
    out = []
    for x in (q, k):
        xf = x.float()
        if qk_norm:
            xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        if cos is not None:
            c, s = cos[:T, None, :].float(), sin[:T, None, :].float()  # (T, 1, hs/2): over batch and heads
            x1, x2 = xf.chunk(2, dim=-1)
            xf = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
        out.append(xf.to(qkv.dtype))
    return out[0], out[1], v.contiguous()


def rotary_grad_reference(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor, n_head: int,
                          cos: torch.Tensor | None, sin: torch.Tensor | None, qk_norm: bool) -> torch.Tensor:
    """The gradient of `rotary_reference` with respect to qkv, (B, T, 3C), from those of q, k, v (B, T, nh, hs),
    computed in fp32 with qkv's dtype's epsilon."""
    with torch.enable_grad():
        x = qkv.detach().float().requires_grad_()
        q, k, v = rotary_reference(x, n_head, cos, sin, qk_norm, norm_eps(qkv.dtype))
        torch.autograd.backward((q, k, v), (dq.float(), dk.float(), dv.float()))
    return x.grad.to(qkv.dtype)


if triton is not None:

    @triton.jit
    def _rotary_fwd_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, n_rows, T, eps, N_HEAD: tl.constexpr,
                           HALF: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr):
        # One row = one (token, head); rows of q, k and v go to their own outputs, (B*T*nh, hs) each.
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = rows < n_rows
        token = rows // N_HEAD
        head = rows % N_HEAD
        d = tl.arange(0, HALF)
        src = qkv_ptr + (token * (3 * N_HEAD) + head)[:, None] * (2 * HALF) + d[None, :]
        dst = rows[:, None] * (2 * HALF) + d[None, :]
        mask = ok[:, None]
        for which in tl.static_range(2):  # q, then k
            x1 = tl.load(src + which * N_HEAD * 2 * HALF, mask=mask, other=0.0).to(tl.float32)
            x2 = tl.load(src + which * N_HEAD * 2 * HALF + HALF, mask=mask, other=0.0).to(tl.float32)
            if NORM:
                r = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
                x1, x2 = x1 * r[:, None], x2 * r[:, None]
            if ROPE:
                angle = (token % T)[:, None] * HALF + d[None, :]
                c = tl.load(cos_ptr + angle, mask=mask, other=0.0)
                s = tl.load(sin_ptr + angle, mask=mask, other=0.0)
                x1, x2 = x1 * c - x2 * s, x1 * s + x2 * c
            if which == 0:
                tl.store(q_ptr + dst, x1.to(q_ptr.dtype.element_ty), mask=mask)
                tl.store(q_ptr + dst + HALF, x2.to(q_ptr.dtype.element_ty), mask=mask)
            else:
                tl.store(k_ptr + dst, x1.to(k_ptr.dtype.element_ty), mask=mask)
                tl.store(k_ptr + dst + HALF, x2.to(k_ptr.dtype.element_ty), mask=mask)
        v1 = tl.load(src + 2 * N_HEAD * 2 * HALF, mask=mask)
        v2 = tl.load(src + 2 * N_HEAD * 2 * HALF + HALF, mask=mask)
        tl.store(v_ptr + dst, v1, mask=mask)
        tl.store(v_ptr + dst + HALF, v2, mask=mask)

    @triton.jit
    def _rotary_grad_kernel(grad_ptr, g_sb, g_st, g_sh, qkv_ptr, cos_ptr, sin_ptr, dqkv_ptr, n_rows, T, eps,
                            WHICH: tl.constexpr, N_HEAD: tl.constexpr, HALF: tl.constexpr, NORM: tl.constexpr,
                            ROPE: tl.constexpr, BLOCK_R: tl.constexpr):
        # The gradient of q (WHICH 0), k (1) or v (2) at (b, t, h, :), any strides, into its columns of dqkv.
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = rows < n_rows
        token = rows // N_HEAD
        head = rows % N_HEAD
        d = tl.arange(0, HALF)
        mask = ok[:, None]
        g_off = ((token // T) * g_sb + (token % T) * g_st + head * g_sh)[:, None] + d[None, :]
        g1 = tl.load(grad_ptr + g_off, mask=mask, other=0.0).to(tl.float32)
        g2 = tl.load(grad_ptr + g_off + HALF, mask=mask, other=0.0).to(tl.float32)
        col = (token * (3 * N_HEAD) + WHICH * N_HEAD + head)[:, None] * (2 * HALF) + d[None, :]
        if WHICH < 2:
            if ROPE:  # the turn back: the angle's transpose
                angle = (token % T)[:, None] * HALF + d[None, :]
                c = tl.load(cos_ptr + angle, mask=mask, other=0.0)
                s = tl.load(sin_ptr + angle, mask=mask, other=0.0)
                g1, g2 = g1 * c + g2 * s, g2 * c - g1 * s
            if NORM:  # y = x r, r = (mean x^2 + eps)^-1/2: dx = r (dy - y mean(dy y))
                x1 = tl.load(qkv_ptr + col, mask=mask, other=0.0).to(tl.float32)
                x2 = tl.load(qkv_ptr + col + HALF, mask=mask, other=0.0).to(tl.float32)
                r = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
                y1, y2 = x1 * r[:, None], x2 * r[:, None]
                m = (tl.sum(g1 * y1, 1) + tl.sum(g2 * y2, 1)) / (2 * HALF)
                g1 = r[:, None] * (g1 - y1 * m[:, None])
                g2 = r[:, None] * (g2 - y2 * m[:, None])
        tl.store(dqkv_ptr + col, g1.to(dqkv_ptr.dtype.element_ty), mask=mask)
        tl.store(dqkv_ptr + col + HALF, g2.to(dqkv_ptr.dtype.element_ty), mask=mask)

    def launch_fwd(qkv, cos, sin, q, k, v, n_head: int, qk_norm: bool, block_rows: int = ROWS) -> None:
        """q, k, v (B, T, nh, hs), contiguous, from qkv (B, T, 3C), contiguous; cos None: no turn."""
        B, T, three_c = qkv.shape
        hs = three_c // (3 * n_head)
        n = B * T * n_head
        rope = cos is not None
        _rotary_fwd_kernel[(triton.cdiv(n, block_rows),)](
            qkv, cos if rope else qkv, sin if rope else qkv, q, k, v, n, T, norm_eps(qkv.dtype), N_HEAD=n_head,
            HALF=hs // 2, NORM=qk_norm, ROPE=rope, BLOCK_R=block_rows)

    def launch_grad(grads, qkv, cos, sin, dqkv, n_head: int, qk_norm: bool, block_rows: int = ROWS) -> None:
        """dqkv (B, T, 3C), contiguous, from the gradients of q, k and v, (B, T, nh, hs) each with any strides."""
        B, T, three_c = qkv.shape
        hs = three_c // (3 * n_head)
        n = B * T * n_head
        rope = cos is not None
        for which, g in enumerate(grads):
            sb, st, sh, sd = g.stride()
            if sd != 1:
                g = g.contiguous()
                sb, st, sh, sd = g.stride()
            _rotary_grad_kernel[(triton.cdiv(n, block_rows),)](
                g, sb, st, sh, qkv, cos if rope else qkv, sin if rope else qkv, dqkv, n, T, norm_eps(qkv.dtype),
                WHICH=which, N_HEAD=n_head, HALF=hs // 2, NORM=qk_norm, ROPE=rope, BLOCK_R=block_rows)

    @torch.library.custom_op("gpt2ladder::rotary_fwd", mutates_args=())
    def rotary_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_head: int, qk_norm: bool,
                   rope: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, three_c = qkv.shape
        shape = (B, T, n_head, three_c // (3 * n_head))
        q, k, v = (qkv.new_empty(shape) for _ in range(3))
        launch_fwd(qkv.contiguous(), cos if rope else None, sin if rope else None, q, k, v, n_head, qk_norm)
        return q, k, v

    @rotary_fwd.register_fake
    def _(qkv, cos, sin, n_head, qk_norm, rope):
        B, T, three_c = qkv.shape
        shape = (B, T, n_head, three_c // (3 * n_head))
        return qkv.new_empty(shape), qkv.new_empty(shape), qkv.new_empty(shape)

    @torch.library.custom_op("gpt2ladder::rotary_grad", mutates_args=())
    def rotary_grad(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor, n_head: int, qk_norm: bool, rope: bool) -> torch.Tensor:
        dqkv = torch.empty_like(qkv, memory_format=torch.contiguous_format)
        launch_grad((dq, dk, dv), qkv.contiguous(), cos if rope else None, sin if rope else None, dqkv, n_head,
                    qk_norm)
        return dqkv

    @rotary_grad.register_fake
    def _(dq, dk, dv, qkv, cos, sin, n_head, qk_norm, rope):
        return torch.empty_like(qkv, memory_format=torch.contiguous_format)


def available(qkv: torch.Tensor) -> bool:
    return triton is not None and qkv.is_cuda


class Rotary(torch.autograd.Function):
    """(q, k, v) as (B, T, nh, hs) from qkv (B, T, 3C): the kernels on CUDA with Triton, else the reference.
    cos and sin: the (T, hs/2) fp32 angles' tables, or None for no turn."""

    @staticmethod
    def forward(ctx, qkv, cos, sin, n_head: int, qk_norm: bool):
        rope = cos is not None
        ctx.save_for_backward(qkv, cos, sin)
        ctx.n_head, ctx.qk_norm, ctx.rope = n_head, qk_norm, rope
        if available(qkv):
            return torch.ops.gpt2ladder.rotary_fwd(qkv, cos if rope else qkv, sin if rope else qkv, n_head, qk_norm,
                                                   rope)
        return rotary_reference(qkv, n_head, cos, sin, qk_norm)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        qkv, cos, sin = ctx.saved_tensors
        if available(qkv):
            dqkv = torch.ops.gpt2ladder.rotary_grad(dq, dk, dv, qkv, cos if ctx.rope else qkv,
                                                    sin if ctx.rope else qkv, ctx.n_head, ctx.qk_norm, ctx.rope)
        else:
            dqkv = rotary_grad_reference(dq, dk, dv, qkv, ctx.n_head, cos, sin, ctx.qk_norm)
        return dqkv, None, None, None, None
