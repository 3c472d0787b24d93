"""The rewrites that exist only on CUDA train like the model without them; skipped without a GPU."""

import pytest
import torch
from gpu_support import GPU, TINY, losses_without_and_with, needs_cuda, needs_triton, random_batches, step_losses

pytestmark = pytest.mark.gpu


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_fp8_head_trains_like_bf16():
    batches = random_batches(8)
    bf16 = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss"], batches)
    fp8 = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss", "fp8_head"], batches)
    assert fp8[0] == pytest.approx(bf16[0], abs=2e-2)
    assert fp8[-1] == pytest.approx(bf16[-1], rel=2e-2)
    assert fp8[-1] < fp8[0]


@needs_cuda
def test_fused_loss_matches_on_gpu():
    batches = random_batches(4)
    plain = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab"], batches)
    fused = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_loss"], batches)
    assert fused == pytest.approx(plain, rel=5e-3)


@needs_cuda
@needs_triton
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_loss_kernel_trains_like_the_expressions():
    """Whole compiled, graphed float8-head steps with the kernels and with the expressions they replace."""
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "fused_loss", "fp8_head"]
    batches = random_batches(8)
    without = step_losses(names + ["cuda_graph"], batches)
    with_kernel = step_losses(names + ["loss_kernel", "cuda_graph"], batches)
    assert with_kernel == pytest.approx(without, rel=5e-3)
    assert with_kernel[-1] < with_kernel[0]


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and not torch.cuda.is_bf16_supported(), reason="needs bfloat16")
def test_bf16_residual_trains_like_the_fp32_residual():
    """Compiled, graphed steps with the residual stream in bf16 and in fp32 follow the same losses."""
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"]
    batches = random_batches(8)
    fp32 = step_losses(names + ["cuda_graph"], batches)
    bf16 = step_losses(names + ["bf16_residual", "cuda_graph"], batches)
    assert bf16 != fp32  # the residual really changed precision
    assert bf16 == pytest.approx(fp32, rel=5e-3)
    assert bf16[-1] < bf16[0]


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
    without, with_rung = losses_without_and_with(names, rung)
    assert with_rung == pytest.approx(without, rel=5e-3)
    assert with_rung[-1] < with_rung[0]


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and not torch.cuda.is_bf16_supported(), reason="needs bfloat16")
def test_weight_cast_computes_the_same_compiled_graphed_steps():
    """The copies hold autocast's own rounding, so the graphed steps give the same losses as casting beside
    each matmul (to the last bits: only the kernels that round differ), and training moves."""
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph", "fp32_wgrad"]
    without, with_rung = losses_without_and_with(names, "weight_cast")
    assert with_rung == pytest.approx(without, rel=1e-5, abs=1e-6)
    assert with_rung[-1] < with_rung[0]


GRAPHED_BF16 = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph", "bf16_residual"]


@needs_cuda
@needs_triton
@pytest.mark.skipif(torch.cuda.is_available() and not torch.cuda.is_bf16_supported(), reason="needs bfloat16")
@pytest.mark.parametrize("rung, before", [
    # the add + norm kernels against compile's add and norm
    ("norm_kernel", GRAPHED_BF16),
    # the output projections' biases added and summed by the norm kernels, against them in the matmuls
    ("proj_bias", GRAPHED_BF16 + ["gelu_kernel", "fp32_wgrad", "norm_kernel"]),
    # the q, k, v gradients and c_attn's bias gradient from the kernel, against compile's copy and sum
    ("qkv_grad", GRAPHED_BF16 + ["gelu_kernel", "fp32_wgrad", "norm_kernel", "proj_bias"]),
    # AdamW's update as one Triton launch, against fused AdamW's
    ("adamw_kernel", GRAPHED_BF16),
])
def test_kernel_rung_trains_like_the_graphed_bf16_step_without_it(rung, before):
    """Compiled, graphed steps on the bf16 residual stream with the rung's Triton kernels and without them: the same
    losses up to bf16 rounding and summation order, and training moves."""
    without, with_rung = losses_without_and_with(before, rung)
    assert with_rung == pytest.approx(without, rel=5e-3)
    assert with_rung[-1] < with_rung[0]


@needs_cuda
@needs_triton
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
@pytest.mark.parametrize("rung", ["fp8_forward", "fp8_fc", "fp8_proj", "fp8_dgrad"])
def test_float8_forward_products_train_like_the_bf16_forward(rung):
    """Compiled, graphed steps of the top of auto with c_attn's and c_fc's forward products (fp8_forward), c_fc's
    alone (fp8_fc), or the MLP's c_proj's (fp8_proj, from the GELU kernel's copy) in float8, or the input gradients
    of c_attn and the MLP's c_proj (fp8_dgrad), and in bf16: the same losses within float8's precision, and training
    moves."""
    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "fused_loss", "fp8_head",
             "loss_kernel", "cuda_graph", "bf16_residual", "gelu_kernel", "fp32_wgrad", "norm_kernel", "proj_bias"]
    without, with_rung = losses_without_and_with(names, rung)
    assert with_rung != without  # the float8 products really ran
    assert with_rung[0] == pytest.approx(without[0], abs=2e-2)
    assert with_rung == pytest.approx(without, rel=2e-2)
    assert with_rung[-1] < with_rung[0]


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_scaled_matmul_on_the_gpu_is_the_fp32_product_of_its_scaled_operands():
    """`torch._scaled_mm` with one scale per row of each operand computes what the CPU path computes in fp32:
    each scale on the right side (rows of x, output features of w), the bias added, within bf16's rounding."""
    from gpt2ladder.kernels.norm import rows_to_fp8
    from gpt2ladder.speedups.fp8_forward import scaled_matmul

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 768, generator=gen) * torch.linspace(0.01, 10, 512)[:, None]  # rows of unlike sizes
    w = torch.randn(2304, 768, generator=gen) * torch.linspace(0.001, 0.1, 2304)[:, None]
    b = torch.randn(2304, generator=gen).bfloat16()
    x8, sx = rows_to_fp8(x)
    w8, sw = rows_to_fp8(w)
    got = scaled_matmul(x8.to(GPU), sx.to(GPU), w8.to(GPU), sw.to(GPU), b.to(GPU), torch.bfloat16).cpu()
    want = scaled_matmul(x8, sx, w8, sw, b, torch.float32)
    assert ((got.float() - want).abs() <= 2**-7 * want.abs() + 1e-3 * want.abs().amax(1, keepdim=True)).all()


@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 matmuls need compute capability 8.9+")
def test_float8_input_gradient_on_the_gpu_is_the_product_of_its_float8_operands():
    """fp8_dgrad's product on the GPU (the output gradient scaled per row, the weight per input feature, fast
    accumulation) against the exact product of the very float8 operands and scales the GPU cast (the CPU's cast may
    differ: CUDA divides by a scalar as a multiplication by its reciprocal, so a scale may differ in its last bit, and
    a value then round to the neighbouring float8 value): within bf16's rounding of the result and a small part of
    the terms' magnitudes for fast accumulation; and within float8's rounding of the exact bf16 product."""
    from gpt2ladder.kernels.norm import rows_to_fp8
    from gpt2ladder.speedups.fp32_wgrad import input_grad

    gen = torch.Generator().manual_seed(2)
    g = (torch.randn(512, 768, generator=gen) * torch.linspace(0.01, 10, 512)[:, None]).bfloat16()
    w = (torch.randn(768, 3072, generator=gen) * torch.linspace(0.001, 0.1, 3072)).bfloat16()  # (out, in)
    got = input_grad(g.to(GPU), w.to(GPU), float8=True).cpu().double()
    g8, gs = (t.cpu().double() for t in rows_to_fp8(g.to(GPU)))  # what input_grad casts, as the GPU casts it
    wt8, ws = (t.cpu().double() for t in rows_to_fp8(w.to(GPU).t()))
    a, b = g8 * gs[:, None], (wt8 * ws[:, None]).t()
    want, terms = a @ b, a.abs() @ b.abs()
    assert ((got - want).abs() <= 2**-8 * want.abs() + 2**-9 * terms).all()
    assert (got - want).norm() / want.norm() < 2**-7  # bf16's rounding is 2^-9 of each element: no gain error
    exact = g.double() @ w.double()
    err = (got - exact).abs() / (g.double().abs() @ w.double().abs())
    assert err.max() < 2 * 2**-4 + 2**-7  # each operand within e4m3's rounding (2^-4) of itself
    assert (got - exact).norm() / exact.norm() < 0.05


@needs_cuda
@needs_triton
def test_adamw_kernel_clips_through_its_grad_scale_in_the_graphed_step(monkeypatch):
    """With clipping (the train command's), the factor goes to the kernel as its grad_scale at every launch, the
    captured one too: the graphed steps' losses are fused AdamW's given the same factor."""
    from gpt2ladder.kernels import adamw as ka
    from gpt2ladder.ladder import setup_for
    from gpt2ladder.runtime.engine import WARMUP_STEPS, Engine, OptimConfig

    scaled = []
    real_launch = ka.Tables.launch
    monkeypatch.setattr(ka.Tables, "launch", lambda self, *a: scaled.append(a[0] is not None) or real_launch(self, *a))
    batches = random_batches(6)
    losses = {}
    for rungs in (GRAPHED_BF16, GRAPHED_BF16 + ["adamw_kernel"]):
        engine = Engine(TINY, setup_for(rungs), GPU, seed=0, optim=OptimConfig(lr=1e-3, grad_clip=0.5))
        losses[len(rungs)] = [engine.step(x, y).item() for x, y in batches]
    fused, kernel = losses.values()
    assert type(engine.optimizer).__name__ == "KernelAdamW" and engine._fused_clip
    # the optimizer state made by a step on zero gradients, unclipped; the eager warm-up steps; the captured step
    assert engine.captures == 1 and scaled == [False] + [True] * (WARMUP_STEPS + 1)
    assert kernel == pytest.approx(fused, rel=5e-3) and kernel[-1] < kernel[0]


@needs_cuda
@needs_triton
@pytest.mark.skipif(torch.cuda.is_available() and not torch.cuda.is_bf16_supported(), reason="needs bfloat16")
def test_adamw_kernel_writing_the_weight_casts_computes_the_same_graphed_steps():
    """Given the copies (as the engine gives them) the kernel writes weight_cast's bf16 copies beside its update,
    and the captured step
    makes none of its own: the same losses as the step that copies them (the same rounding, to nearest even), each
    copy its weight in bf16 after the last replay, and training moves."""
    from gpt2ladder.ladder import setup_for
    from gpt2ladder.runtime.engine import Engine
    from gpt2ladder.speedups.weight_cast import weight_casts

    names = ["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph", "fp32_wgrad",
             "weight_cast", "adamw_kernel"]
    batches = random_batches(8)
    losses = {}
    for writes in (False, True):
        engine = Engine(TINY, setup_for(names), GPU, seed=0)
        if not writes:  # taken away before the first step: the step makes its own copies
            engine.optimizer.casts = None
        losses[writes] = [engine.step(x, y).item() for x, y in batches]
    assert engine.optimizer.casts is weight_casts(engine.raw_model)
    copies, sources = engine.optimizer.casts.pairs()
    assert all(torch.equal(c, s.detach().to(torch.bfloat16)) for c, s in zip(copies, sources))
    assert losses[True] == pytest.approx(losses[False], rel=1e-5, abs=1e-6)
    assert losses[True][-1] < losses[True][0]
