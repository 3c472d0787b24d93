"""The Triton kernels on a GPU, at GPT-2's shapes, against their reference expressions (the AdamW kernel against fused
AdamW, captured in a CUDA graph); skipped without one."""

import pytest
import torch
from gpu_support import GPU, needs_cuda, needs_triton

pytestmark = pytest.mark.gpu


@needs_cuda
@needs_triton
@pytest.mark.parametrize("softcap", [None, 15.0])
def test_loss_kernel_equals_the_expressions_at_gpt2_size(softcap):
    """The Triton loss kernels against the PyTorch expressions they replace, at GPT-2's B=16 x 1024 shapes, with
    the softcap part's soft cap and without."""
    from gpt2ladder.kernels import loss as loss_kernel
    from gpt2ladder.speedups.fused_loss import (
        E5M2,
        GRAD_SCALE,
        _logit_grad,
        _lse_and_loss,
    )

    gen = torch.Generator().manual_seed(0)
    n, v, real = 16384, 50304, 50257
    logits = (torch.randn(n, v, generator=gen) * 3).to(torch.bfloat16).to(GPU)
    targets = torch.randint(0, real, (n,), generator=gen).to(GPU)
    ref_lse, ref_loss = _lse_and_loss(logits, targets, real, softcap)
    # bf16 gradient, as the fused_loss rung uses it
    rows, g, g_t = loss_kernel.logit_grad(logits, targets, real, 1 / n, torch.bfloat16, False, softcap or 0.0)
    ref = _logit_grad(logits, ref_lse, targets[:, None], real, 1 / n, torch.bfloat16, softcap=softcap)
    assert g_t.numel() == 0
    torch.testing.assert_close(rows.mean(), ref_loss, rtol=0, atol=1e-4)
    rel = (g.float() - ref.float()).abs() / ref.float().abs().clamp(min=1e-30)
    assert (rel <= 2**-7).all()  # within one bf16 rounding step everywhere
    assert g[:, real:].abs().max() == 0
    # float8 gradient in both layouts, as the fp8_head rung uses it
    rows8, g8, g8_t = loss_kernel.logit_grad(logits, targets, real, GRAD_SCALE, E5M2, True, softcap or 0.0)
    ref8 = _logit_grad(logits, ref_lse, targets[:, None], real, GRAD_SCALE, E5M2, softcap=softcap)
    assert torch.equal(rows8, rows)
    codes = (g8.view(torch.uint8).int() - ref8.view(torch.uint8).int()).abs()
    assert codes.max() <= 1  # at most one float8 step apart (exp rounding can cross a boundary)
    assert (codes == 0).float().mean() > 0.99
    assert torch.equal(g8_t.view(torch.uint8), g8.t().contiguous().view(torch.uint8))


@needs_cuda
@needs_triton
@pytest.mark.parametrize("norm,rope", [(True, True), (False, True), (True, False)])
def test_rotary_kernels_match_the_reference_at_gpt2_size(norm, rope):
    """The rotary_kernel rung's kernels in bf16 at GPT-2's B=16 x 1024 shapes: q, k within one bf16 rounding of the
    fp32 reference, v copied exactly, and c_attn's output gradient from attention's strided gradients."""
    from gpt2ladder.kernels import rotary
    from gpt2ladder.model.config import ModelConfig
    from gpt2ladder.model.modern import rotary_tables

    B, T, nh, hs = 16, 1024, 12, 64
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, T, 3 * nh * hs, generator=gen).to(torch.bfloat16).to(GPU)
    cos, sin = (t.to(GPU) for t in rotary_tables(ModelConfig(n_head=nh, n_embd=nh * hs, block_size=T)))
    cos, sin = (cos, sin) if rope else (None, None)
    q, k, v = rotary.Rotary.apply(qkv, cos, sin, nh, norm)
    rq, rk, rv = rotary.rotary_reference(qkv, nh, cos, sin, norm)
    assert torch.equal(v, rv)
    for got, ref in ((q, rq), (k, rk)):
        torch.testing.assert_close(got.float(), ref.float(), rtol=2**-7, atol=1e-3)
    grads = [torch.randn(B, nh, T, hs, generator=gen).to(torch.bfloat16).to(GPU).transpose(1, 2) for _ in range(3)]
    dqkv = torch.ops.gpt2ladder.rotary_grad(*grads, qkv, cos if rope else qkv, sin if rope else qkv, nh, norm, rope)
    ref = rotary.rotary_grad_reference(*grads, qkv, nh, cos, sin, norm)
    torch.testing.assert_close(dqkv.float(), ref.float(), rtol=2**-7, atol=1e-3)


@needs_cuda
@needs_triton
def test_gelu_kernel_matches_the_expressions_at_gpt2_size():
    from gpt2ladder.kernels.gelu import gelu_grad_reference

    gen = torch.Generator().manual_seed(0)
    h0 = (torch.randn(16384, 3072, generator=gen) * 2).to(GPU, torch.bfloat16)
    grad = (torch.randn(16384, 3072, generator=gen) * 1e-3).to(GPU, torch.bfloat16)
    bias = (torch.randn(3072, generator=gen) * 0.1).to(GPU)
    dh, db = torch.ops.gpt2ladder.gelu_grad(grad, h0, bias)
    ref_dh, ref_db = gelu_grad_reference(grad, h0, bias)
    assert dh.dtype == torch.bfloat16 and db.dtype == torch.float32
    # Within one bf16 rounding step, plus fp32 noise where GELU's slope crosses zero (near h = -0.75 its
    # two terms cancel, so its last bits differ between tanh and the kernel's sigmoid form).
    err = (dh.float() - ref_dh.float()).abs()
    assert (err <= 2**-7 * ref_dh.float().abs() + 1e-6 * grad.float().abs()).all()
    torch.testing.assert_close(db, ref_db, rtol=1e-4, atol=1e-5)


@needs_cuda
@needs_triton
def test_gelu_forward_kernel_matches_the_expressions_at_gpt2_size():
    from gpt2ladder.kernels.gelu import gelu_reference

    gen = torch.Generator().manual_seed(1)
    h0 = (torch.randn(16384, 3072, generator=gen) * 3).to(GPU, torch.bfloat16)
    bias = (torch.randn(3072, generator=gen) * 0.1).to(GPU)
    a = torch.ops.gpt2ladder.gelu_fwd(h0, bias)
    ref = gelu_reference(h0, bias)  # the PyTorch expression in fp32
    from gpt2ladder.kernels.gelu import GELU_CUBIC, SQRT_2_OVER_PI

    h = (h0.float() + bias).double()  # the fp32 input both compute from
    # GPT-2's GELU in fp64, as h sigmoid(2z): in the tanh form 1 + tanh(z) rounds to 0 below h = -7 even
    # in fp64 (the true value there is ~1e-16, which the kernel gets).
    exact = h * torch.sigmoid(2 * SQRT_2_OVER_PI * (h + GELU_CUBIC * h**3))
    assert a.dtype == torch.bfloat16
    # Rounded to bf16 from an fp32 value close to exact: at most half a bf16 step (2^-8 of the value)
    # away, plus the fp32 evaluation's own error, largest far in the negative tail where the exponent's
    # argument is large (relative 1e-5 there), and values below fp32's normal range flushed to zero.
    ratio = (a.double() - exact).abs() / (2**-8 * exact.abs() + 1e-30)
    worst = ratio.argmax()
    assert ratio.max().item() <= 1.01, (ratio.max().item(), h.flatten()[worst].item(), exact.flatten()[worst].item(),
                                        a.flatten()[worst].item())
    # Where the two differ, the kernel is the closer: the tanh form loses bits in GELU's negative tail
    # (1 + tanh(z) cancels), the sigmoid form does not.
    assert (a != ref).any()
    assert ((a.double() != exact.to(torch.bfloat16).double()).sum()
            <= (ref.double() != exact.to(torch.bfloat16).double()).sum())


@needs_cuda
@needs_triton
def test_gelu_forward_with_its_float8_copy_at_gpt2_size():
    """The fp8_proj rung's forward: the same output as the plain forward kernel, and a float8 copy with the
    reference's row scales and, but for rounding ties, its bytes."""
    from gpt2ladder.kernels.gelu import gelu_fp8_reference

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9+")
    gen = torch.Generator().manual_seed(2)
    h0 = (torch.randn(16384, 3072, generator=gen) * 3).to(GPU, torch.bfloat16)
    bias = (torch.randn(3072, generator=gen) * 0.1).to(GPU)
    a, q, qs = torch.ops.gpt2ladder.gelu_fwd_fp8(h0, bias)
    assert torch.equal(a, torch.ops.gpt2ladder.gelu_fwd(h0, bias))
    ra, rq, rqs = gelu_fp8_reference(h0, bias)
    torch.testing.assert_close(qs, rqs, rtol=1e-5, atol=0)
    steps = (q.float() - rq.float()).abs() / (2**-3 * rq.float().abs() + 2**-9)
    assert steps.max().item() <= 1.01 and (q.view(torch.uint8) == rq.view(torch.uint8)).float().mean() > 0.999


@needs_cuda
@needs_triton
def test_gelu_forward_with_its_block_scaled_float8_copy_at_gpt2_size():
    """The forward with one scale per 128 columns of a row: the plain forward's output, the reference's block
    scales (stored block-major) and, but for rounding ties, its float8 bytes."""
    from gpt2ladder.kernels import gelu as gk

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9+")
    gen = torch.Generator().manual_seed(3)
    h0 = (torch.randn(16384, 3072, generator=gen) * 3).to(GPU, torch.bfloat16)
    bias = (torch.randn(3072, generator=gen) * 0.1).to(GPU)
    a, q = torch.empty_like(h0), torch.empty(h0.shape, device=GPU, dtype=torch.float8_e4m3fn)
    qs = torch.empty(3072 // gk.FP8_BLOCK, 16384, device=GPU)
    gk.launch_fwd_fp8_blocks(h0, bias, a, q, qs)
    assert torch.equal(a, torch.ops.gpt2ladder.gelu_fwd(h0, bias))
    _, rq, rqs = gk.gelu_fp8_blocks_reference(h0, bias)
    torch.testing.assert_close(qs.t(), rqs, rtol=1e-5, atol=0)
    steps = (q.float() - rq.float()).abs() / (2**-3 * rq.float().abs() + 2**-9)
    assert steps.max().item() <= 1.01 and (q.view(torch.uint8) == rq.view(torch.uint8)).float().mean() > 0.999


@needs_cuda
@needs_triton
@pytest.mark.parametrize("with_pbias,fp8", [(False, False), (True, False), (True, True)])
def test_norm_kernels_match_the_expressions_at_gpt2_size(with_pbias, fp8):
    """The add + layer norm kernels against their reference at GPT-2's residual shape, bf16 in and out (with the
    branch's bias added in the kernel, and its gradient summed, for the proj_bias rung; with the output's float8
    copy and row scales for the fp8_forward rung)."""
    from gpt2ladder.kernels import norm as nk

    gen = torch.Generator().manual_seed(0)
    n, c = 16384, 768
    h, p, dy, ds = ((torch.randn(n, c, generator=gen) * k).to(GPU, torch.bfloat16) for k in (2, 1, 1e-3, 1e-3))
    w, b = (1 + 0.1 * torch.randn(c, generator=gen)).to(GPU), (0.1 * torch.randn(c, generator=gen)).to(GPU)
    pb = (0.1 * torch.randn(c, generator=gen)).to(GPU) if with_pbias else None
    if fp8 and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9+")
    s, y, mean, rstd, q, qs = torch.ops.gpt2ladder.add_norm_fwd(h, p, pb, w, b, 1e-5, torch.bfloat16, fp8, 0)
    rs, ry, rmean, rrstd = nk.add_norm_reference(h, p, w, b, 1e-5, torch.bfloat16, pb)
    if fp8:  # against the float8 copy of the reference's fp32 output: the same scales, the same bytes but for ties
        rq, rqs = nk.rows_to_fp8(nk.add_norm_reference(h, p, w, b, 1e-5, torch.float32, pb)[1])
        torch.testing.assert_close(qs, rqs, rtol=1e-5, atol=0)
        steps = (q.float() - rq.float()).abs() / (2**-3 * rq.float().abs() + 2**-9)
        assert steps.max().item() <= 1.01 and (q.view(torch.uint8) == rq.view(torch.uint8)).float().mean() > 0.999
    else:
        assert q.numel() == 0 and qs.numel() == 0
    assert torch.equal(s, rs)  # one rounding of the fp32 sum, both ways
    torch.testing.assert_close(mean, rmean, rtol=0, atol=1e-5)
    torch.testing.assert_close(rstd, rrstd, rtol=1e-5, atol=0)
    assert ((y.float() - ry.float()).abs() <= 2**-7 * ry.float().abs() + 1e-6).all()  # within a bf16 step
    dsum, dw, db, dpb = torch.ops.gpt2ladder.add_norm_bwd(dy, ds, s, w, mean, rstd, with_pbias)
    rdsum, rdw, rdb, *rdpb = nk.add_norm_grad_reference(dy, ds, rs, w, rmean, rrstd, with_pbias=with_pbias)
    if with_pbias:
        torch.testing.assert_close(dpb, rdpb[0], rtol=1e-4, atol=1e-5)
    else:
        assert dpb.numel() == 0
    assert ((dsum.float() - rdsum.float()).abs() <= 2**-7 * rdsum.float().abs() + 1e-9).all()
    torch.testing.assert_close(dw, rdw, rtol=1e-4, atol=1e-5)  # fp32 sums over 16384 rows, another order
    torch.testing.assert_close(db, rdb, rtol=1e-4, atol=1e-5)


@needs_cuda
@needs_triton
def test_qkv_grad_kernel_assembles_what_sdpa_returns_at_gpt2_size():
    """The q, k, v gradients of SDPA's own backward (whatever strides it returns them in), put side by side by the
    kernel, against the autograd gradient of c_attn's output through the split; the bias gradient against their
    column sums in fp32."""
    import torch.nn.functional as F

    from gpt2ladder.kernels.qkv import qkv_grad, qkv_grad_reference
    from gpt2ladder.model.gpt import split_heads

    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(16, 1024, 2304, generator=gen).to(GPU, torch.bfloat16).requires_grad_()
    heads = split_heads(qkv, 12)
    q, k, v = (h.detach().requires_grad_() for h in heads)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    gy = torch.randn(y.shape, generator=gen).to(GPU, torch.bfloat16)
    y.backward(gy)
    out, dbias = qkv_grad(q.grad, k.grad, v.grad, torch.float32)
    torch.autograd.backward(heads, [q.grad, k.grad, v.grad])  # the split's own backward: the compiled step's copy
    assert torch.equal(out, qkv.grad)
    _, ref_db = qkv_grad_reference(q.grad, k.grad, v.grad, torch.float32)
    torch.testing.assert_close(dbias, ref_db, rtol=1e-4, atol=1e-4)


@needs_cuda
@needs_triton
@pytest.mark.parametrize("shape", [(2304, 768), (768, 3072)])  # GPT-2's c_attn weight, its MLP's c_proj weight
def test_weight8_kernel_writes_rows_to_fp8s_bytes_at_gpt2_size(shape):
    """fp8_dgrad's weight cast by the kernel against `rows_to_fp8` of the transposed weight on the GPU: the same
    scales (each input feature's amax times float32(1 / 448), as CUDA divides a tensor by a scalar) and float8 bytes
    (each value's IEEE division by its scale, rounded to nearest even), (in, out) row-major; from a weight stored
    transposed (strided loads) too."""
    from gpt2ladder.kernels.norm import rows_to_fp8
    from gpt2ladder.kernels.weight8 import weight8

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9+")
    gen = torch.Generator().manual_seed(6)
    w = (torch.randn(shape, generator=gen) * 0.02).to(GPU, torch.bfloat16)
    ref8, ref_scale = rows_to_fp8(w.t())
    for weight in (w, w.t().contiguous().t()):
        w8, scale = weight8(weight)
        assert w8.shape == shape[::-1] and w8.is_contiguous() and w8.dtype == torch.float8_e4m3fn
        assert torch.equal(scale, ref_scale)
        assert torch.equal(w8.view(torch.uint8), ref8.contiguous().view(torch.uint8))



def _same_adamw_state(ref, ref_opt, params, opt, steps):
    """KernelAdamW's parameters, stored gradients, moments and step counts against fused AdamW's."""
    for j, (p, q) in enumerate(zip(params, ref)):
        assert torch.equal(p.grad, q.grad), j  # divided by the scale, stored
        assert torch.equal(opt.state[p]["step"], ref_opt.state[q]["step"]) and opt.state[p]["step"].item() == steps
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"step {steps}, tensor {j}")
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], ref_opt.state[q][key], rtol=1e-5, atol=1e-6)


@needs_cuda
@needs_triton
@pytest.mark.parametrize("tile", [None, (64, 2, 4)])  # the default; and small chunks, so odd tensors straddle several
def test_adamw_kernel_captured_in_a_cuda_graph_steps_as_fused_adamw(tile):
    """KernelAdamW and fused AdamW (capturable, a tensor learning rate, a gradient scale), one eager step each, then
    the step captured in a CUDA graph with gradients at new addresses (the kernel's tables rebuilt and uploaded during
    the capture, as the engine's capture makes them) and replayed with new gradients, learning rates and scales: the
    same parameters, moments, stored gradients and step counts after every step, up to float32 rounding."""
    from gpt2ladder.speedups.kernel_adamw import KernelAdamW

    gen = torch.Generator().manual_seed(0)
    shapes = [(50304, 768), (768,), (3072, 768), (37, 5), (), (1,), (3,)]  # GPT-2's, odd ones, a 0-dim
    start = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen).to(GPU) for s in shapes] for _ in range(6)]
    lrs, scales = [1e-3, 2e-3, 5e-4, 1e-3, 3e-4, 1e-4], [1.0, 2.0, 4.0, 1.0, 8.0, 3.0]
    runs = []
    for cls in (torch.optim.AdamW, KernelAdamW):
        params = [torch.nn.Parameter(t.to(GPU, copy=True)) for t in start]
        lr, scale = torch.tensor(lrs[0], device=GPU), torch.tensor(scales[0], device=GPU)
        extra = {"tile": tile} if cls is KernelAdamW else {}
        opt = cls([{"params": params[::2], "weight_decay": 0.1}, {"params": params[1::2], "weight_decay": 0.0}],
                  lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True, capturable=True, **extra)
        for p, g in zip(params, grads[0]):
            p.grad = g.clone()
        opt.grad_scale = scale  # kept for every step, the captured one too
        opt.step()  # eager: the state is made, the kernel's tables built
        runs.append([params, opt, lr, scale])
    torch.cuda.synchronize()
    _same_adamw_state(*runs[0][:2], *runs[1][:2], steps=1)
    for run in runs:
        params, opt = run[:2]
        for p in params:
            p.grad = torch.empty_like(p)  # what the graph reads: new addresses
        run.append(torch.cuda.CUDAGraph())
        with torch.cuda.graph(run[-1]):
            opt.step()
    assert runs[1][1].tables.captured  # the tables the captured launch reads are kept for the graph
    for i in range(1, 6):
        for params, opt, lr, scale, graph in runs:
            for p, g in zip(params, grads[i]):
                p.grad.copy_(g)
            lr.fill_(lrs[i])
            scale.fill_(scales[i])
            graph.replay()
        torch.cuda.synchronize()
        _same_adamw_state(*runs[0][:2], *runs[1][:2], steps=i + 1)
    assert not runs[1][1].tables.tickets.any()  # every launch left its tickets at 0 for the next
    assert max((p - t.to(GPU)).abs().max().item() for p, t in zip(runs[1][0], start)) > 1e-3  # they moved
