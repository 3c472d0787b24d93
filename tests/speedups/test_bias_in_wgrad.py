"""bias_in_wgrad on the CPU: columns of ones after the norm's output let c_attn's weight-gradient product sum its bias
gradient. The product over the columns gives fp32_wgrad's gradients; AddNorm hands out the output as a view of the
widened tensor, whose extra columns are ones and take no gradient; the rewired model (AddNorm's PyTorch expressions
standing in for the kernels) takes that path in every Block after the first and trains as without it, eager and
compiled. The kernel writes the ones in tests/kernels/test_norm_kernel.py (Triton's interpreter) and on a GPU in
test_bias_in_wgrad_gpu.py."""

import pytest
import torch

from gpt2ladder.ladder import resolve_rungs, setup_for, why_unavailable
from gpt2ladder.runtime.hardware import Capabilities
from gpt2ladder.speedups.fp32_wgrad import ONES, Fp32WgradMatmul, OnesWgradMatmul
from gpt2ladder.speedups.norm_block import AddNorm

C, OUT = 48, 144


def _widened(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    aug = torch.cat([x, x.new_ones((*x.shape[:-1], ONES))], -1)
    return aug[..., :C], aug


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_product_over_the_ones_gives_fp32_wgrads_gradients(dtype):
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 10, C, generator=gen).to(dtype)
    w0, b0 = torch.randn(OUT, C, generator=gen), torch.randn(OUT, generator=gen)
    dy = torch.randn(3, 10, OUT, generator=gen).to(dtype)
    results = []
    for ones in (False, True):
        x = x0.clone().requires_grad_()
        w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
        wc, bc = w.detach().to(dtype), b.detach().to(dtype)
        if ones:
            view, aug = _widened(x)
            y = OnesWgradMatmul.apply(view, aug.detach(), w, b, wc, bc, False)
        else:
            y = Fp32WgradMatmul.apply(x, w, b, wc, bc, False)
        y.backward(dy)
        results.append((y.detach(), x.grad, w.grad, b.grad))
    (y0, gx0, gw0, gb0), (y1, gx1, gw1, gb1) = results
    # the same forward and input gradient (in bf16 the CPU's product of a strided input can round a last bit apart)
    close = {} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-2}
    torch.testing.assert_close(y1, y0, **close)
    torch.testing.assert_close(gx1, gx0, **close)
    assert gw1.dtype == gb1.dtype == torch.float32 and gw1.shape == (OUT, C) and gb1.shape == (OUT,)
    torch.testing.assert_close(gw1, gw0, rtol=1e-5, atol=1e-5)  # fp32 sums of the same products
    torch.testing.assert_close(gb1, gb0, rtol=1e-5, atol=1e-5)  # the bias gradient: a column sum, through the ones
    exact = dy.double().reshape(-1, OUT).sum(0)
    assert (gb1.double() - exact).abs().max() < 1e-4 * exact.abs().max()


def test_add_norm_hands_out_its_output_as_a_view_of_the_widened_tensor():
    gen = torch.Generator().manual_seed(1)
    h, p = torch.randn(2, 5, C, generator=gen), torch.randn(2, 5, C, generator=gen)
    weight, bias = torch.randn(C, generator=gen), torch.randn(C, generator=gen)
    dy = torch.randn(2, 5, C, generator=gen)
    grads = []
    for ones in (0, ONES):
        args = [t.clone().requires_grad_() for t in (h, p, weight, bias)]
        out = AddNorm.apply(args[0], args[1], None, args[2], args[3], 1e-5, torch.float32, False, ones)
        if ones:
            s, y, aug = out
            assert aug.shape == (2, 5, C + ONES) and not aug.requires_grad
            assert y.data_ptr() == aug.data_ptr() and y.stride(-2) == C + ONES  # the norm's rows, not a copy
            assert torch.equal(aug[..., C:], torch.ones(2, 5, ONES))
        else:
            s, y = out
        (s.sum() * 0.5 + (y * dy).sum()).backward()
        grads.append([y.detach().clone()] + [a.grad for a in args])
    for plain, widened in zip(*grads):
        assert torch.equal(plain, widened)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_block_after_the_first_sums_c_attns_bias_through_the_ones(monkeypatch, compiled):
    """As in `auto`: the GELU kernel's MLP, fp32_wgrad's Linears, the projections' biases deferred to the norms."""
    import gpt2ladder.speedups.fp32_wgrad as fw
    from norm_block_support import CFG, one_step_each, rewired_models

    variants = {ones: {"defer_bias": True, "bias_ones": ones} for ones in (False, True)}
    models = rewired_models(monkeypatch, ("gelu_kernel", "fp32_wgrad"), variants)
    calls = []
    real = fw.Fp32WgradLinear.with_ones
    monkeypatch.setattr(fw.Fp32WgradLinear, "with_ones", lambda self, cols: calls.append(cols.aug.shape[-1])
                        or real(self, cols))
    raw = dict(models)
    if compiled:  # both, so that upstream of c_attn both round as compiled code does
        torch._dynamo.reset()
        models = {k: torch.compile(m, backend="inductor", fullgraph=True) for k, m in models.items()}
    losses, seen = one_step_each(models, calls)
    models = raw
    assert seen[False] == [] and len(seen[True]) == CFG.n_layer - 1  # the first Block's ln_1 is compile's norm
    assert seen[True] == [CFG.n_embd + ONES] * (CFG.n_layer - 1)
    assert abs(losses[True] - losses[False]) < 1e-3
    plain = dict(models[False].named_parameters())
    for name, param in models[True].named_parameters():
        assert param.grad is not None and param.grad.is_contiguous(), name
        torch.testing.assert_close(param.grad, plain[name].grad, atol=2e-3, rtol=5e-2, msg=name)
    bias = "transformer.h.1.attn.c_attn.bias"
    key = next(n for n in plain if n.endswith(bias))
    torch.testing.assert_close(dict(models[True].named_parameters())[key].grad, plain[key].grad, rtol=1e-3,
                               atol=1e-6)


def test_in_a_ladder_that_climbed_qkv_grad_and_fp8_forward_the_rung_takes_their_place():
    """Both sum c_attn's bias their own way (qkv_grad's kernel, fp8_forward's float8 product), so the rung's row of
    `all` turns them off rather than time a setup where the ones go unused."""
    from gpt2ladder.model.config import PRESETS
    from gpt2ladder.runtime.engine import build_model

    h200 = Capabilities("cuda", "NVIDIA H200", (9, 0), triton_version="3.6.0")
    climbed = resolve_rungs("all", h200)
    below = setup_for(climbed[: climbed.index("bias_in_wgrad")])
    assert below.qkv_grad and below.fp8_forward  # what the ladder has climbed by then
    setup = setup_for(climbed[: climbed.index("bias_in_wgrad") + 1])
    assert setup.bias_in_wgrad and not setup.qkv_grad and not setup.fp8_forward
    model = build_model(PRESETS["tiny"], setup, torch.device("cpu"), 0)
    assert [b.attn_ones for b in model.transformer.h] == [ONES] * PRESETS["tiny"].n_layer


def test_the_rung_needs_the_norm_kernels_and_is_in_auto_where_they_run():
    h200 = Capabilities("cuda", "NVIDIA H200", (9, 0), triton_version="3.6.0")
    assert why_unavailable("bias_in_wgrad", h200) is None
    assert "CUDA" in why_unavailable("bias_in_wgrad", Capabilities("cpu", "cpu", (0, 0)))
    assert "bias_in_wgrad" in resolve_rungs("auto", h200)
    assert "bias_in_wgrad" not in resolve_rungs("auto", Capabilities("cpu", "cpu", (0, 0)))
    setup = setup_for(resolve_rungs("auto", h200))
    assert setup.bias_in_wgrad and setup.norm_kernel and setup.fp32_wgrad
