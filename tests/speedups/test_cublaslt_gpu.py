"""cublaslt on a GPU: the weight gradient's fp32-output product through cuBLASLt is cuBLAS's sum (to fp32 rounding),
the step at the top of `auto` with it computes the gradients and losses it computes without it (to the rounding of
bf16 products whose algorithm changed), and the library setting does not outlive the step. Skipped without a GPU."""

import types

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from gpu_support import GPU, LOSS_ROUNDING, TINY, auto_without, grad_gaps, needs_cuda, random_batches

from gpt2ladder.ladder import setup_for
from gpt2ladder.runtime.engine import Engine

pytestmark = pytest.mark.gpu


@needs_cuda
@pytest.mark.parametrize("out_features,in_features", [(2304, 768), (768, 768), (3072, 768), (768, 3072)])
def test_the_weight_gradients_product_through_cublaslt_is_cublas_sum(out_features, in_features):
    g = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(4096, out_features, device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(4096, in_features, device="cuda", dtype=torch.bfloat16, generator=g)
    exact = dy.t().double() @ x.double()
    before = torch.backends.cuda.preferred_blas_library()
    try:
        errors = {}
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            out = torch.mm(dy.t(), x, out_dtype=torch.float32)
            assert out.dtype == torch.float32
            errors[lib] = ((out.double() - exact).abs().max() / exact.abs().max()).item()
    finally:
        torch.backends.cuda.preferred_blas_library(before)
    assert errors["cublaslt"] < 1e-5 and errors["cublas"] < 1e-5, errors  # fp32 sums, not bf16's ~4e-3


@needs_cuda
def test_the_top_of_auto_through_cublaslt_keeps_its_gradients_and_losses():
    names = auto_without("cublaslt")
    batches = random_batches(8)
    before = torch.backends.cuda.preferred_blas_library()
    engines = [Engine(TINY, setup_for(rungs), GPU, seed=0) for rungs in (names, names + ["cublaslt"])]
    losses = [[e.step(*batches[0]).item()] for e in engines]
    assert torch.backends.cuda.preferred_blas_library() == before
    gaps = grad_gaps(engines[1], engines[0])
    print(f"largest gradient gap {max(gaps.values()):.2e} ({max(gaps, key=gaps.get)})")
    assert max(gaps.values()) < 1e-3, gaps  # fp32 sums in another order (1.9e-7 on an H200); a wrong product is ~1
    for engine, run in zip(engines, losses):
        run += [engine.step(x, y).item() for x, y in batches[1:]]
    print("losses", *zip(*losses))
    assert losses[1] == pytest.approx(losses[0], rel=0, abs=LOSS_ROUNDING)
    assert losses[1][-1] < losses[1][0]


@needs_cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the kernels cuBLAS and cuBLASLt pick were read on Hopper (an H200)")
def test_with_the_rung_the_step_takes_cublaslts_weight_gradient_without_split_k():
    """The MLP's c_proj weight gradient at GPT-2 124M's batch 16 x 1024: cuBLAS runs split-K with a reduction kernel
    after it on an H200, cuBLASLt one kernel (benchmarks/records/2026-12-03_cublaslt); inside the
    engine's step context the rung's choice is the one that runs."""
    g = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(16384, 3072, device="cuda", dtype=torch.bfloat16, generator=g)
    names = auto_without("cublaslt")
    kernels = {}
    for rungs in (names, names + ["cublaslt"]):
        engine = types.SimpleNamespace(setup=setup_for(rungs), device=GPU)
        with Engine.precision(engine):
            torch.mm(dy.t(), x, out_dtype=torch.float32)  # the library's own first call, off the profile
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.mm(dy.t(), x, out_dtype=torch.float32)
                torch.cuda.synchronize()
        kernels[rungs[-1]] = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(kernels)
    assert any("splitKreduce" in k for k in kernels[names[-1]])
    assert len(kernels["cublaslt"]) == 1 and "splitK" not in kernels["cublaslt"][0]
