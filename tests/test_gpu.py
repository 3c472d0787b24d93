"""CUDA-only checks of the rungs that exist only there; skipped without a GPU."""

import importlib.util

import pytest
import torch

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine, build_model

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GPU = torch.device("cuda")
TINY = PRESETS["tiny"]


def _batches(n, b=8, t=256):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 50257, (b, t), generator=gen).to(GPU),
             torch.randint(0, 50257, (b, t), generator=gen).to(GPU)) for _ in range(n)]


def _losses(names, batches, **kw):
    engine = Engine(TINY, setup_for(names), GPU, seed=0, **kw)
    return [engine.step(x, y).item() for x, y in batches]


@needs_cuda
def test_cuda_graph_replays_the_same_steps():
    """Capture warms up and then undoes its warm-up updates: the losses equal plain eager steps."""
    batches = _batches(5)
    plain = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"], batches)
    graphed = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph"], batches)
    assert graphed == pytest.approx(plain, rel=2e-3)


@needs_cuda
def test_sdpa_equals_manual_attention_on_gpu_in_bf16():
    x = torch.randint(0, 50257, (4, 256), device=GPU)
    manual = build_model(TINY, setup_for(["baseline"]), GPU, seed=0)
    flash = build_model(TINY, setup_for(["baseline", "flash"]), GPU, seed=0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = manual(x)[0].float(), flash(x)[0].float()
    assert ((a - b).norm() / a.norm()).item() < 1e-2


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_fp8_head_trains_like_bf16():
    batches = _batches(8)
    bf16 = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss"], batches)
    fp8 = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss", "fp8_head"], batches)
    assert fp8[0] == pytest.approx(bf16[0], abs=2e-2)
    assert fp8[-1] == pytest.approx(bf16[-1], rel=2e-2)
    assert fp8[-1] < fp8[0]


@needs_cuda
def test_fused_loss_matches_on_gpu():
    batches = _batches(4)
    plain = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab"], batches)
    fused = _losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss"], batches)
    assert fused == pytest.approx(plain, rel=5e-3)


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_fp8_linears_train_like_bf16():
    """The Blocks' Linears in float8, compiled and graphed: the same losses as bf16 within float8's precision."""
    batches = _batches(8)
    upto = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"]
    bf16 = _losses(upto, batches)
    fp8 = _losses(upto + ["fp8_mlp", "fp8_attn", "cuda_graph"], batches)
    assert fp8[0] == pytest.approx(bf16[0], abs=2e-2)
    assert fp8[-1] == pytest.approx(bf16[-1], rel=2e-2)
    assert fp8[-1] < fp8[0]


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")


@needs_cuda
@needs_triton
def test_loss_kernel_equals_the_expressions_at_gpt2_size():
    """The Triton loss kernels against the PyTorch expressions they replace, at GPT-2's B=16 x 1024 shapes."""
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
    ref_lse, ref_loss = _lse_and_loss(logits, targets, real)
    # bf16 gradient, as the fused_loss rung uses it
    rows, g, g_t = loss_kernel.logit_grad(logits, targets, real, 1 / n, torch.bfloat16, False)
    ref = _logit_grad(logits, ref_lse, targets[:, None], real, 1 / n, torch.bfloat16)
    assert g_t.numel() == 0
    torch.testing.assert_close(rows.mean(), ref_loss, rtol=0, atol=1e-4)
    rel = (g.float() - ref.float()).abs() / ref.float().abs().clamp(min=1e-30)
    assert (rel <= 2**-7).all()  # within one bf16 rounding step everywhere
    assert g[:, real:].abs().max() == 0
    # float8 gradient in both layouts, as the fp8_head rung uses it
    rows8, g8, g8_t = loss_kernel.logit_grad(logits, targets, real, GRAD_SCALE, E5M2, True)
    ref8 = _logit_grad(logits, ref_lse, targets[:, None], real, GRAD_SCALE, E5M2)
    assert torch.equal(rows8, rows)
    codes = (g8.view(torch.uint8).int() - ref8.view(torch.uint8).int()).abs()
    assert codes.max() <= 1  # at most one float8 step apart (exp rounding can cross a boundary)
    assert (codes == 0).float().mean() > 0.99
    assert torch.equal(g8_t.view(torch.uint8), g8.t().contiguous().view(torch.uint8))


@needs_cuda
@needs_triton
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_loss_kernel_trains_like_the_expressions():
    """Whole compiled, graphed float8-head steps with the kernels and with the expressions they replace."""
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "fused_loss", "fp8_head"]
    batches = _batches(8)
    without = _losses(names + ["cuda_graph"], batches)
    with_kernel = _losses(names + ["loss_kernel", "cuda_graph"], batches)
    assert with_kernel == pytest.approx(without, rel=5e-3)
    assert with_kernel[-1] < with_kernel[0]


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and not torch.cuda.is_bf16_supported(), reason="needs bfloat16")
def test_bf16_residual_trains_like_the_fp32_residual():
    """Compiled, graphed steps with the residual stream in bf16 and in fp32 follow the same losses."""
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"]
    batches = _batches(8)
    fp32 = _losses(names + ["cuda_graph"], batches)
    bf16 = _losses(names + ["bf16_residual", "cuda_graph"], batches)
    assert bf16 != fp32  # the residual really changed precision
    assert bf16 == pytest.approx(fp32, rel=5e-3)
    assert bf16[-1] < bf16[0]


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
    assert (a.double() != exact.to(torch.bfloat16).double()).sum() <= (ref.double() != exact.to(torch.bfloat16).double()).sum()


@needs_cuda
def test_fp32_wgrad_gradients_are_the_fp32_product_on_gpu():
    from gpt2ladder.speedups.common import linear_like
    from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear

    gen = torch.Generator().manual_seed(2)
    lin = linear_like(Fp32WgradLinear, torch.nn.Linear(768, 3072).to(GPU))
    x = (torch.randn(4, 1024, 768, generator=gen)).to(GPU).requires_grad_()
    g = torch.randn(4, 1024, 3072, generator=gen).to(GPU, torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(x)
    y.backward(g)
    xb = x.detach().to(torch.bfloat16).double().reshape(-1, 768)
    exact = g.double().reshape(-1, 3072).t() @ xb
    assert lin.weight.grad.dtype == torch.float32
    assert (lin.weight.grad.double() - exact).abs().max() < 1e-5 * exact.abs().max()
    assert x.grad.dtype == torch.float32


@needs_cuda
@pytest.mark.parametrize("rung", ["fp32_wgrad", pytest.param("gelu_kernel", marks=needs_triton)])
def test_rung_trains_like_the_compiled_graphed_step_without_it(rung):
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph"]
    batches = _batches(8)
    without = _losses(names, batches)
    with_rung = _losses(names + [rung], batches)
    assert with_rung == pytest.approx(without, rel=5e-3)
    assert with_rung[-1] < with_rung[0]
