"""The fp32_wgrad rung's Linear computes what nn.Linear computes, with weight gradients in fp32."""

import dataclasses

import pytest
import torch
import torch.nn as nn

from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, MLP, Classifier, init_weights
from gpt2ladder.speedups.common import linear_like
from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear, use_fp32_wgrad, weight_grad
from gpt2ladder.speedups.gelu_mlp import KernelMLP, use_gelu_kernel


def _pair(bias=True):
    gen = torch.Generator().manual_seed(0)
    plain = nn.Linear(48, 80, bias=bias)
    with torch.no_grad():
        plain.weight.copy_(torch.randn(80, 48, generator=gen) * 0.1)
        if bias:
            plain.bias.copy_(torch.randn(80, generator=gen))
    copy = nn.Linear(48, 80, bias=bias)
    copy.load_state_dict(plain.state_dict())
    swapped = linear_like(Fp32WgradLinear, copy)
    x = torch.randn(3, 21, 48, generator=gen)
    g = torch.randn(3, 21, 80, generator=gen)
    return plain, swapped, x, g


@pytest.mark.parametrize("bias", [True, False])
def test_fp32_same_values_and_gradients(bias):
    plain, swapped, x, g = _pair(bias)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = plain(xa), swapped(xb)
    torch.testing.assert_close(yb, ya)
    ya.backward(g), yb.backward(g)
    torch.testing.assert_close(xb.grad, xa.grad)
    for (name, a), b in zip(plain.named_parameters(), swapped.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
        assert b.grad.dtype == torch.float32


def test_under_bf16_autocast_forward_is_autocasts_and_weight_gradient_is_more_precise():
    plain, swapped, x, g = _pair()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ya, yb = plain(xa), swapped(xb)
    assert yb.dtype == ya.dtype == torch.bfloat16
    assert torch.equal(yb, ya)  # the same bf16 matmul
    gb = g.to(torch.bfloat16)
    ya.backward(gb), yb.backward(gb)
    torch.testing.assert_close(xb.grad, xa.grad)  # the input gradient is autocast's bf16 matmul too
    # The exact weight gradient of the bf16 matmul: fp64 over the bf16 operands.
    exact = gb.double().reshape(-1, 80).t() @ x.to(torch.bfloat16).double().reshape(-1, 48)
    err_plain = (plain.weight.grad.double() - exact).abs().max().item()
    err_fp32 = (swapped.weight.grad.double() - exact).abs().max().item()
    assert swapped.weight.grad.dtype == torch.float32
    assert err_fp32 < 1e-5 * exact.abs().max().item()
    assert err_fp32 < err_plain / 20  # autocast rounds its product to bf16 first
    exact_b = gb.double().reshape(-1, 80).sum(0)
    assert (swapped.bias.grad.double() - exact_b).abs().max().item() < 1e-5 * exact_b.abs().max().item()


def test_weight_grad_off_cuda_is_the_fp32_product():
    gen = torch.Generator().manual_seed(1)
    g, x = torch.randn(64, 8, generator=gen).bfloat16(), torch.randn(64, 5, generator=gen).bfloat16()
    assert torch.equal(weight_grad(g, x), g.float().t() @ x.float())


def test_use_fp32_wgrad_swaps_the_blocks_linears_only_and_keeps_the_state_dict():
    model = init_weights(GPT(PRESETS["tiny"]), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = use_fp32_wgrad(model)
    per_block = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    assert names == [f"transformer.h.{i}.{n}" for i in range(PRESETS["tiny"].n_layer) for n in per_block]
    assert type(model.lm_head) is Classifier  # the classifier is the fused loss's business
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert use_fp32_wgrad(model) == []


def test_other_kinds_of_linear_are_left_alone():
    from gpt2ladder.speedups.common import linear_like

    class OtherLinear(nn.Linear):  # its own forward and backward
        pass

    model = init_weights(GPT(PRESETS["tiny"]), seed=0)
    for block in model.transformer.h:
        block.mlp.c_fc, block.mlp.c_proj = (linear_like(OtherLinear, m) for m in (block.mlp.c_fc, block.mlp.c_proj))
    names = use_fp32_wgrad(model)
    assert names and all(name.endswith(("attn.c_attn", "attn.c_proj")) for name in names)
    assert all(type(b.mlp.c_fc) is OtherLinear for b in model.transformer.h)


def test_gelu_kernel_mlp_with_fp32_wgrad_linears_has_the_same_gradients(same_function):
    model = init_weights(GPT(PRESETS["tiny"]), seed=0)
    mlp = model.transformer.h[0].mlp
    with torch.no_grad():
        mlp.c_fc.bias.normal_()
    plain = MLP(PRESETS["tiny"])
    plain.load_state_dict(mlp.state_dict())
    use_gelu_kernel(model)
    use_fp32_wgrad(model)
    mlp = model.transformer.h[0].mlp
    assert type(mlp) is KernelMLP and type(mlp.c_fc) is Fp32WgradLinear
    x = torch.randn(2, 9, 128, generator=torch.Generator().manual_seed(2))
    same_function(plain, mlp, x, x_grad_tol=(1e-4, 1e-6), param_tol=(1e-4, 1e-5))


def test_compiled_training_steps_match_without_the_rung():
    """Through AOT autograd (compile's tracing of forward and backward) the swapped model trains alike."""
    from gpt2ladder.ladder import setup_for
    from gpt2ladder.runtime.engine import Engine

    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randint(0, 50257, (2, 32), generator=gen), torch.randint(0, 50257, (2, 32), generator=gen))
               for _ in range(3)]
    setup = setup_for(["baseline", "compile", "flash", "vocab", "fused_adamw"])
    losses, params = {}, {}
    for on in (False, True):
        engine = Engine(PRESETS["tiny"], dataclasses.replace(setup, fp32_wgrad=on), torch.device("cpu"),
                        compile_backend="aot_eager")
        assert (type(engine.raw_model.transformer.h[0].attn.c_attn) is Fp32WgradLinear) == on
        start = {k: v.clone() for k, v in engine.raw_model.state_dict().items()}
        losses[on] = [engine.step(x, y).item() for x, y in batches]
        params[on] = engine.raw_model.state_dict()
    assert losses[True][0] == pytest.approx(losses[False][0], abs=1e-6)  # same weights, same forward
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)
    for name, after in params[True].items():  # the same updates: every parameter moved, and alike
        moved = (params[False][name] - start[name]).abs().max().item()
        assert moved > 1e-4, name
        assert (after - params[False][name]).abs().max().item() < 1e-3 * moved, name


def test_fp8_dgrad_forms_the_input_gradient_in_float8_and_leaves_the_rest():
    """With `dgrad8` the input gradient is float8's product (row scales on the output gradient, one per input feature
    on the weight): off the bf16 product by e4m3's rounding, not more, and not equal to it (the float8 path ran); the
    output and the weight's and bias's gradients stay bit for bit those of the Linear without it."""
    plain, swapped, x, g = _pair()
    marked = linear_like(Fp32WgradLinear, plain)
    marked.dgrad8 = True
    xs, xm = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ys, ym = swapped(xs), marked(xm)
    assert torch.equal(ym, ys)
    gb = g.to(torch.bfloat16)
    ys.backward(gb), ym.backward(gb)
    assert torch.equal(marked.weight.grad, swapped.weight.grad) and torch.equal(marked.bias.grad, swapped.bias.grad)
    exact = (gb.double() @ plain.weight.to(torch.bfloat16).double()).float()
    err = (xm.grad.float() - exact).norm() / exact.norm()
    assert xm.grad.dtype == xs.grad.dtype == torch.float32
    assert 0.003 < err < 0.05  # e4m3 keeps 3 mantissa bits: about 2% per element, less over the sum
    assert (xs.grad.float() - exact).norm() / exact.norm() < 0.006  # bf16's product, for scale


def test_input_grad_float8_scales_per_token_and_per_input_feature():
    """One token's gradient 1e5 times larger than the others', one input feature's weights 1e5 times smaller: past
    e4m3's range (2^17 from its largest value to its smallest step), so one scale for the whole tensor would flush the
    rest to zero, while one per row and per input feature keeps every element's error within e4m3's rounding of its
    terms (each operand off by at most 2^-4 of itself)."""
    from gpt2ladder.speedups.fp32_wgrad import input_grad

    gen = torch.Generator().manual_seed(1)
    g2 = torch.randn(64, 96, generator=gen)
    g2[5] *= 1e5
    w = torch.randn(96, 32, generator=gen) * 0.02  # (out, in)
    w[:, 7] /= 1e5
    got, exact = input_grad(g2, w, float8=True), g2 @ w
    terms = g2.abs() @ w.abs()  # what the rounding of each term can move an element by, summed
    err = (got - exact).abs() / terms
    assert err.max() < 2 * 2**-4 + 2**-8
    assert err[5].max() < 0.13 and err[:, 7].max() < 0.13 and err.mean() < 0.03
    assert torch.equal(input_grad(g2, w), g2 @ w)


def test_use_fp8_dgrad_marks_c_attn_and_the_mlps_c_proj_in_the_blocks():
    from gpt2ladder.speedups.fp32_wgrad import use_fp8_dgrad

    model = GPT(PRESETS["tiny"])
    use_fp32_wgrad(model)
    marked = use_fp8_dgrad(model)
    n_layer = PRESETS["tiny"].n_layer
    assert sorted(marked) == sorted([f"transformer.h.{i}.attn.c_attn" for i in range(n_layer)]
                                    + [f"transformer.h.{i}.mlp.c_proj" for i in range(n_layer)])
    flags = {name: m.dgrad8 for name, m in model.named_modules() if isinstance(m, Fp32WgradLinear)}
    assert sum(flags.values()) == 2 * n_layer and not flags["transformer.h.0.attn.c_proj"]
