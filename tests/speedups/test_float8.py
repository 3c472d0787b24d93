"""The float8 Linears compute what they claim: scaled float8 matmuls, wired into the right layers."""

import pytest
import torch
import torch.nn as nn

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import Classifier
from gpt2ladder.runtime.engine import build_model
from gpt2ladder.speedups.common import linear_like, scaled_mm
from gpt2ladder.speedups.float8 import (
    E4M3,
    GRAD_DTYPE,
    Float8Linear,
    Float8Matmul,
    to_fp8,
    use_float8,
)

CPU = torch.device("cpu")
TINY = PRESETS["tiny"]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_float8_product_is_pytorchs(rows, out_dtype):
    """Off CUDA `scaled_mm` multiplies in fp32 instead of PyTorch's slow reference kernel: the same numbers, per-tensor
    and per-row scales, with and without a bias (to fp32's rounding of the sums)."""
    gen = torch.Generator().manual_seed(1)
    a8 = (torch.randn(32, 48, generator=gen) * 3).to(E4M3)
    b8 = torch.randn(64, 48, generator=gen).to(E4M3).t()
    sa, sb = (torch.rand(32, 1, generator=gen), torch.rand(1, 64, generator=gen)) if rows else \
        (torch.tensor(0.5), torch.tensor(2.0))
    bias = torch.randn(64, generator=gen).to(out_dtype) if out_dtype == torch.bfloat16 else None
    ref = torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype)
    got = scaled_mm(a8, b8, sa, sb, out_dtype, bias)
    assert got.dtype == out_dtype
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)


def _operands(seed=0, n=64, d_in=32, d_out=48):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=gen, requires_grad=True)
    w = (torch.randn(d_out, d_in, generator=gen) * 0.1).requires_grad_()
    b = torch.randn(d_out, generator=gen).requires_grad_()
    dy = torch.randn(n, d_out, generator=gen).to(torch.bfloat16)
    return x, w, b, dy


def _dequant(t, dtype):
    q, scale = to_fp8(t, dtype)
    return q.float() * scale


def test_scaled_cast_maps_amax_to_the_format_max_and_round_trips():
    t = torch.tensor([0.5, -3.0, 1e-3, 2.0])
    q, scale = to_fp8(t, E4M3)
    assert q.float().abs().max() == torch.finfo(E4M3).max  # the largest magnitude uses the whole range
    back = q.float() * scale
    assert back[1] == -3.0
    assert ((back - t).abs() <= 2**-4 * t.abs() + 1e-6).all()  # e4m3: 3 mantissa bits, <= 1/16 off


def test_forward_and_backward_are_the_float8_products_exactly():
    """Each of the three matmuls equals the same product of the dequantised float8 operands."""
    x, w, b, dy = _operands()
    y = Float8Matmul.apply(x, w, b)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), dy)
    xq, wq, gq = _dequant(x, E4M3), _dequant(w, E4M3), _dequant(dy, GRAD_DTYPE)
    torch.testing.assert_close(y.float(), (xq @ wq.t() + b.to(torch.bfloat16).float()).to(torch.bfloat16).float(),
                               rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gx, (gq @ wq).to(torch.bfloat16).float(), rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(gw, gq.t() @ xq, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gb, dy.float().sum(0))
    assert y.dtype == torch.bfloat16 and gx.dtype == x.dtype and gw.dtype == w.dtype


def test_float8_linear_is_close_to_the_fp32_linear():
    x, w, b, dy = _operands(1)
    y = Float8Matmul.apply(x, w, b)
    gx, gw = torch.autograd.grad(y, (x, w), dy)
    ref = x @ w.t() + b
    rx, rw = torch.autograd.grad(ref, (x, w), dy.float())
    assert _rel(y, ref) < 0.03 and _rel(gx, rx) < 0.05 and _rel(gw, rw) < 0.05
    assert _rel(y, ref) > 0  # it really did round


def test_use_float8_swaps_only_the_chosen_block_linears():
    model = build_model(TINY, setup_for(["baseline"]), CPU, seed=0)
    keys = list(model.state_dict())
    mlp = use_float8(model, mlp=True, attn=False)
    assert mlp == [f"transformer.h.{i}.mlp.{n}" for i in range(TINY.n_layer) for n in ("c_fc", "c_proj")]
    attn = use_float8(model, mlp=False, attn=True)
    assert attn == [f"transformer.h.{i}.attn.{n}" for i in range(TINY.n_layer) for n in ("c_attn", "c_proj")]
    assert type(model.lm_head) is Classifier  # the classifier is the fp8_head rung's business
    assert list(model.state_dict()) == keys  # same parameters: checkpoints load either way


def test_without_grad_the_layer_is_the_plain_linear():
    """Evaluation and generation see the model's own function, not float8 rounding."""
    layer = nn.Linear(32, 48)
    x = torch.randn(4, 16, 32)
    ref = layer(x)
    layer = linear_like(Float8Linear, layer)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), ref, rtol=0, atol=0)
    assert layer(x).dtype == torch.bfloat16  # with grad: float8, bf16 out
    odd = torch.randn(3, 5, 32)  # 15 rows: not a multiple of 16, so `_scaled_mm` cannot take it
    torch.testing.assert_close(layer(odd), nn.functional.linear(odd, layer.weight, layer.bias))


def test_fp8_rungs_train_close_to_fp32():
    # 16 tokens: a CPU's `_scaled_mm` is a slow reference kernel; the errors are those of 128 tokens
    # (gradients 0.066 / 0.076 / 0.051 there, 0.068 / 0.076 / 0.054 here).
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, 50257, (1, 16), generator=gen), torch.randint(0, 50257, (1, 16), generator=gen)

    def loss_and_grads(names):
        model = build_model(TINY, setup_for(names), CPU, seed=0)
        _, loss = model(x, y)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    ref_loss, ref = loss_and_grads(["baseline", "vocab"])
    loss, grads = loss_and_grads(["baseline", "vocab", "fp8_mlp", "fp8_attn"])
    assert abs(loss.item() - ref_loss.item()) < 2e-3
    for name in ("transformer.h.0.mlp.c_fc.weight", "transformer.h.1.attn.c_attn.weight", "transformer.wte.weight"):
        assert _rel(grads[name], ref[name]) < 0.1, name


@pytest.mark.slow
def test_float8_matmul_under_inductor_matches_eager():
    """What the GPU runs: the casts and amax reductions through inductor's code generator."""
    x, w, b, dy = _operands(3)
    eager = Float8Matmul.apply(x, w, b)
    ge = torch.autograd.grad(eager, (x, w, b), dy)
    compiled = torch.compile(lambda x, w, b: Float8Matmul.apply(x, w, b), backend="inductor")(x, w, b)
    gc = torch.autograd.grad(compiled, (x, w, b), dy)
    assert _rel(compiled, eager) < 1e-2
    for c, e in zip(gc, ge):
        assert _rel(c, e) < 1e-2
