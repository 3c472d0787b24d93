"""bias_in_wgrad on a GPU: the norm kernel writes its output's columns of ones at GPT-2's shape without changing the
output, c_attn's weight-gradient product over them gives the bias gradient cuBLAS's fp32 sums give, and the step at
the top of `auto` with the rung computes the gradients and losses it computes without it. Skipped without a GPU."""

import pytest
import torch
from gpu_support import GPU, LOSS_ROUNDING, TINY, auto_without, grad_gaps, needs_cuda, needs_triton, random_batches

from gpt2ladder.ladder import setup_for
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.speedups.fp32_wgrad import ONES, weight_grad

pytestmark = pytest.mark.gpu


@needs_cuda
@needs_triton
def test_the_norm_kernel_writes_the_ones_beside_an_unchanged_output_at_gpt2_size():
    gen = torch.Generator().manual_seed(0)
    n, c = 16384, 768
    h, p = ((torch.randn(n, c, generator=gen) * k).to(GPU, torch.bfloat16) for k in (2, 1))
    w, b = (1 + 0.1 * torch.randn(c, generator=gen)).to(GPU), (0.1 * torch.randn(c, generator=gen)).to(GPU)
    plain = torch.ops.gpt2ladder.add_norm_fwd(h, p, None, w, b, 1e-5, torch.bfloat16, False, 0)
    ones = torch.ops.gpt2ladder.add_norm_fwd(h, p, None, w, b, 1e-5, torch.bfloat16, False, ONES)
    assert ones[1].shape == (n, c + ONES)
    assert torch.equal(ones[1][:, :c], plain[1]) and torch.equal(ones[0], plain[0])
    assert bool((ones[1][:, c:] == 1).all())


@needs_cuda
def test_the_product_over_the_ones_sums_the_bias_gradient_as_fp32_sums_do():
    gen = torch.Generator(device="cuda").manual_seed(0)
    g = torch.randn(16384, 2304, device=GPU, dtype=torch.bfloat16, generator=gen) * 1e-3
    x = torch.randn(16384, 768, device=GPU, dtype=torch.bfloat16, generator=gen)
    aug = torch.cat([x, x.new_ones(16384, ONES)], 1)
    both = weight_grad(g, aug)
    exact = g.double().sum(0)
    torch.testing.assert_close(both[:, 768:], both[:, 768:769].expand(-1, ONES), rtol=1e-6, atol=0)  # one sum each
    err = ((both[:, 768].double() - exact).abs().max() / exact.abs().max()).item()
    plain = ((g.sum(0, dtype=torch.float32).double() - exact).abs().max() / exact.abs().max()).item()
    print(f"bias gradient's largest error: through the ones {err:.2e}, summed apart {plain:.2e}")
    assert err < 1e-5  # fp32 accumulation, as the separate sum's
    # The weight gradient beside it, against the exact product: the wider product may take another cuBLAS kernel
    # (split-K or not), so it is held to fp32 accumulation's error, as the plain product is, not to the plain
    # product's bits (their largest gap at this size was 8.9e-6 of values up to about 0.6).
    exact_w = g.double().t() @ x.double()
    scale = exact_w.abs().max()
    err_w = ((both[:, :768].double() - exact_w).abs().max() / scale).item()
    plain_w = ((weight_grad(g, x).double() - exact_w).abs().max() / scale).item()
    print(f"weight gradient's largest error: through the ones {err_w:.2e}, plain product {plain_w:.2e}")
    assert err_w < 5e-5 and plain_w < 5e-5  # a wrong column would be off by about 1


@needs_cuda
@needs_triton
def test_the_top_of_auto_with_the_rung_keeps_its_gradients_and_losses():
    names = auto_without("bias_in_wgrad")
    batches = random_batches(8)
    engines = [Engine(TINY, setup_for(rungs), GPU, seed=0) for rungs in (names, names + ["bias_in_wgrad"])]
    blocks = [b for b in engines[1].raw_model.transformer.h]
    assert [b.attn_ones for b in blocks] == [ONES] * len(blocks)  # the rung is in force in every Block
    losses = [[e.step(*batches[0]).item()] for e in engines]
    gaps = grad_gaps(engines[1], engines[0])
    print(f"largest gradient gap {max(gaps.values()):.2e} ({max(gaps, key=gaps.get)})")
    assert max(gaps.values()) < 1e-3, gaps  # fp32 sums in another order; a wrong column is off by ~1
    for engine, run in zip(engines, losses):
        run += [engine.step(x, y).item() for x, y in batches[1:]]
    print("losses", *zip(*losses))
    assert losses[1] == pytest.approx(losses[0], rel=0, abs=LOSS_ROUNDING)
    assert losses[1][-1] < losses[1][0]
