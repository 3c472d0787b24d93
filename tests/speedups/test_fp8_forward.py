"""The fp8_forward rung: float8 row copies, the matmul that reads them, and the wiring through the norm Blocks.

Off CUDA the float8 product is the same arithmetic in fp32 (`scaled_matmul`), and the norm kernels' PyTorch
expressions stand in for the kernels, so what is checked here is what each piece computes and that the rung's
path is the one that runs; tests/kernels/test_kernels_gpu.py and tests/speedups/test_speedups_gpu.py check the
kernels and `torch._scaled_mm` on a GPU."""

import dataclasses

import pytest
import torch

from gpt2ladder.kernels.norm import E4M3_MAX, rows_to_fp8
from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.speedups.fp32_wgrad import Fp32WgradMatmul
from gpt2ladder.speedups.fp8_forward import Fp8InputMatmul, takes_float8


def test_rows_to_fp8_scales_each_row_to_the_format_and_keeps_its_values():
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(6, 64, generator=gen) * torch.tensor([1e-3, 0.1, 1, 10, 300, 1])[:, None]
    y[5] = 0.0  # an all-zero row: a finite scale, zeros out
    q, scale = rows_to_fp8(y)
    assert q.dtype == torch.float8_e4m3fn and q.shape == y.shape and scale.shape == (6,)
    assert torch.equal(q[:5].float().abs().amax(1), torch.full((5,), E4M3_MAX))  # each row's amax at 448
    assert torch.isfinite(scale).all() and (q[5].float() == 0).all()
    back = q.float() * scale[:, None]
    # e4m3 keeps 3 mantissa bits: within half a step (2^-4 relative) for values in its normal range
    normal = q.float().abs() >= 2**-6
    assert ((back - y).abs()[normal] <= 2**-4 * y.abs()[normal] * 1.0001).all()
    assert (back - y).abs().max() > 0  # it is a rounding, not a copy


@pytest.mark.parametrize("with_bias", [False, True])
def test_the_float8_matmul_is_the_scaled_product_and_its_backward_is_fp32_wgrads(with_bias):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 32, generator=gen).bfloat16().requires_grad_()
    w = (torch.randn(48, 32, generator=gen) * 0.05).requires_grad_()
    b = (torch.randn(48, generator=gen) * 0.05).requires_grad_() if with_bias else None
    x8, sx = rows_to_fp8(x.detach())
    y = Fp8InputMatmul.apply(x, x8, sx, w, b)
    assert y.shape == (4, 8, 48) and y.dtype == torch.bfloat16
    exact = x.detach().float() @ w.detach().t() + (0 if b is None else b.detach())
    err = ((y.float() - exact).norm() / exact.norm()).item()
    assert 1e-3 < err < 0.06  # float8's rounding of both operands (bf16 alone: ~3e-3 less), no more
    grad = torch.randn(4, 8, 48, generator=gen).bfloat16()
    y.backward(grad)
    # the same gradients, bit for bit, as fp32_wgrad's matmul given the same input and weight
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    b2 = b.detach().clone().requires_grad_() if with_bias else None
    Fp32WgradMatmul.apply(x2, w2, b2).backward(grad)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad) and w.grad.dtype == torch.float32
    if with_bias:
        assert torch.equal(b.grad, b2.grad)
    # the weight_cast rung's copy, where there is one, is what the backward multiplies by
    x.grad = None
    Fp8InputMatmul.apply(x, x8, sx, w, b, torch.zeros_like(w, dtype=torch.bfloat16)).backward(grad)
    assert (x.grad == 0).all()


def test_only_plain_linears_of_sixteen_multiples_take_float8():
    from gpt2ladder.speedups.common import linear_like

    class OtherLinear(torch.nn.Linear):  # its own forward, which the float8 product would bypass
        pass

    cfg = PRESETS["tiny"]
    model = GPT(cfg)
    block = model.transformer.h[0]
    assert takes_float8(block.attn) and takes_float8(block.mlp)
    block.mlp.c_fc = linear_like(OtherLinear, block.mlp.c_fc)
    assert not takes_float8(block.mlp) and takes_float8(block.attn)
    odd = GPT(dataclasses.replace(cfg, n_embd=72, n_head=4))  # 72 = 4.5 x 16
    assert not takes_float8(odd.transformer.h[0].attn)


@pytest.mark.parametrize("before", [(), ("gelu_kernel", "fp32_wgrad"), ("gelu_kernel", "fp32_wgrad", "qkv_grad")])
def test_the_norm_blocks_feed_every_input_projection_in_float8_and_train_the_same(monkeypatch, before):
    """With `fp8_forward` every Block's c_attn and c_fc reads the norm's float8 copy (the first Block's ln_1, which
    compile runs, through the same expressions), also with the GELU kernel's MLP and fp32_wgrad's Linears, as in
    auto. AddNorm's PyTorch expressions stand in for the kernels (on a bf16 stream under CPU autocast): the loss
    and gradients are those without the rung up to float8's rounding, and every gradient is there."""
    import gpt2ladder.speedups.fp8_forward as f8
    from norm_block_support import CFG, one_step_each, rewired_models

    variants = {fp8: {"defer_bias": True, "fp8_forward": fp8} for fp8 in (False, True)}
    models = rewired_models(monkeypatch, before, variants)
    calls = []
    real_apply = f8.Fp8InputMatmul.apply
    monkeypatch.setattr(f8.Fp8InputMatmul, "apply", lambda *a: calls.append(a[3].shape) or real_apply(*a))
    losses, seen = one_step_each(models, calls)
    c = CFG.n_embd
    assert seen == {False: [], True: [(3 * c, c), (4 * c, c)] * CFG.n_layer}
    assert abs(losses[True] - losses[False]) < 2e-2
    plain = dict(models[False].named_parameters())
    for name, param in models[True].named_parameters():
        assert param.grad is not None, name
        rel = (param.grad - plain[name].grad).norm() / plain[name].grad.norm()
        assert rel < 0.1, (name, rel.item())
    with torch.no_grad():  # evaluation runs the model itself: no float8
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            models[True](torch.zeros(2, 16, dtype=torch.long))
        assert calls == []


def test_fp8_fc_feeds_only_the_mlps_input_projection(monkeypatch):
    """With `fp8_fc` each Block's c_fc reads the norm's float8 copy and c_attn its bf16 output: the same training
    up to float8's rounding, every gradient there."""
    import gpt2ladder.speedups.fp8_forward as f8
    from norm_block_support import CFG, one_step_each, rewired_models

    variants = {fp8: {"defer_bias": True, "fp8_fc": fp8} for fp8 in (False, True)}
    models = rewired_models(monkeypatch, ("gelu_kernel", "fp32_wgrad"), variants)
    calls = []
    real_apply = f8.Fp8InputMatmul.apply
    monkeypatch.setattr(f8.Fp8InputMatmul, "apply", lambda *a: calls.append(a[3].shape) or real_apply(*a))
    losses, seen = one_step_each(models, calls)
    assert seen == {False: [], True: [(4 * CFG.n_embd, CFG.n_embd)] * CFG.n_layer}
    assert abs(losses[True] - losses[False]) < 2e-2
    assert all(p.grad is not None for p in models[True].parameters())


@pytest.mark.parametrize("defer_bias,fp8_fc", [(True, False), (False, False), (True, True), (False, True)],
                         ids=["proj_bias", "bias_in_matmul", "proj_bias-fp8_fc", "bias_in_matmul-fp8_fc"])
def test_fp8_proj_feeds_the_mlps_output_projection(monkeypatch, defer_bias, fp8_fc):
    """With `fp8_proj` each Block's MLP c_proj reads the GELU kernel's float8 copy of its input (and c_fc the norm's
    with `fp8_fc`), one scale per row: the same training up to float8's rounding, every gradient there; c_proj's
    bias added by the norm kernel (proj_bias) or after the float8 matmul."""
    import gpt2ladder.speedups.fp8_forward as f8
    from norm_block_support import CFG, one_step_each, rewired_models

    variants = {fp8: {"defer_bias": defer_bias, "fp8_fc": fp8_fc, "fp8_proj": fp8} for fp8 in (False, True)}
    models = rewired_models(monkeypatch, ("gelu_kernel", "fp32_wgrad"), variants)
    gen = torch.Generator().manual_seed(5)
    biases = {n: torch.randn(p.shape, generator=gen) * 0.5 for n, p in models[False].named_parameters()
              if n.endswith(".bias")}  # init_weights zeroes them: a lost or doubled bias would not show
    with torch.no_grad():
        for model in models.values():
            for name, param in model.named_parameters():
                if name in biases:
                    param.copy_(biases[name])
    calls = []
    real_apply = f8.Fp8InputMatmul.apply
    errors = []

    def checked_apply(*a):  # each float8 product against the same Linear in fp32: within float8's rounding
        calls.append((a[3].shape, a[4] is not None))  # weight, bias
        y = real_apply(*a)
        exact = torch.nn.functional.linear(a[0].float(), a[3].float(), None if a[4] is None else a[4].float())
        errors.append(((y.float() - exact).norm() / exact.norm()).item())
        return y

    monkeypatch.setattr(f8.Fp8InputMatmul, "apply", checked_apply)
    losses, seen = one_step_each(models, calls)
    assert errors and max(errors) < 0.05, errors
    c, fc = CFG.n_embd, [((4 * CFG.n_embd, CFG.n_embd), False)] if fp8_fc else []
    assert seen[True] == (fc + [((c, 4 * c), not defer_bias)]) * CFG.n_layer
    assert seen[False] == fc * CFG.n_layer
    assert losses[True] != losses[False] and abs(losses[True] - losses[False]) < 2e-2
    plain = dict(models[False].named_parameters())
    for name, param in models[True].named_parameters():
        assert param.grad is not None, name
        rel = (param.grad - plain[name].grad).norm() / plain[name].grad.norm()
        assert rel < 0.1, (name, rel.item())
    block = models[True].transformer.h[0]
    assert block.fp8_mlp_out and not block.fp8_attn_in
    with torch.no_grad():  # evaluation runs the model itself: no float8
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            models[True](torch.zeros(2, 16, dtype=torch.long))
        assert calls == []


def test_block_scales_give_each_128_columns_of_a_row_its_own_range():
    """blocks_to_fp8: one scale per 128 columns of a row, a block's amax mapped to e4m3's 448, so a block 10^5 times
    wider than its neighbour leaves the neighbour its own precision (row scales round it away). The GELU kernel's
    block-scaled copy (benchmarks/micro/fp8_blockwise.py) is checked against it."""
    from gpt2ladder.kernels.norm import blocks_to_fp8, rows_to_fp8

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 256, generator=gen)
    x[:, :128] *= 1e5
    q, s = blocks_to_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (6, 2)
    assert torch.equal(s, x.reshape(6, 2, 128).abs().amax(-1) / 448)
    back = q.float() * s.repeat_interleave(128, 1)
    rows = rows_to_fp8(x)
    row_back = rows[0].float() * rows[1][:, None]
    quiet = slice(128, 256)
    assert ((back - x)[:, quiet].norm() / x[:, quiet].norm()) < 0.05
    assert ((row_back - x)[:, quiet].norm() / x[:, quiet].norm()) > 0.3


def test_the_gelu_kernels_block_scales_off_cuda_are_the_references_block_major():
    """gelu_fp8_blocks off CUDA: the reference's output and copy, its scales stored block-major as the kernel stores
    them, (C / 128, rows) with the rows of every leading dimension flattened."""
    from gpt2ladder.kernels import gelu as gk

    gen = torch.Generator().manual_seed(6)
    h0, bias = torch.randn(2, 3, 256, generator=gen) * 3, torch.randn(256, generator=gen)
    a, q, qs = gk.gelu_fp8_blocks(h0, bias)
    ra, rq, rqs = gk.gelu_fp8_blocks_reference(h0, bias)
    assert torch.equal(a, ra) and torch.equal(q.float(), rq.float()) and rqs.shape == (2, 3, 2)
    assert qs.shape == (2, 6) and qs.is_contiguous() and torch.equal(qs, rqs.reshape(6, 2).t())


def test_fp8_proj_needs_the_gelu_kernel():
    """Without the GELU kernel (compile's GELU) nothing writes c_proj's float8 copy: the MLP stays bf16."""
    from gpt2ladder.speedups.norm_block import NormBlock

    model = init_weights(GPT(dataclasses.replace(PRESETS["tiny"], attention="sdpa")), 0)
    assert not NormBlock(model.transformer.h[0], fp8_proj=True).fp8_mlp_out


def test_the_rung_reaches_the_norm_blocks():
    """Every NormBlock feeds its input projections in float8."""
    from gpt2ladder.ladder import setup_for
    from gpt2ladder.runtime.engine import Engine

    names = ["baseline", "compile", "norm_kernel", "fp8_forward"]
    engine = Engine(PRESETS["tiny"], setup_for(names), torch.device("cpu"), compile_backend="eager")
    blocks = [m for m in engine.raw_model.modules() if type(m).__name__ == "NormBlock"]
    assert blocks and all(b.fp8_attn_in and b.fp8_mlp_in for b in blocks)


@pytest.mark.parametrize("forward", [{}, {"fp8_fc": True}, {"fp8_forward": True}, {"fp8_fc": True, "fp8_proj": True}],
                         ids=["bf16_forward", "fp8_fc", "fp8_forward", "fp8_fc-fp8_proj"])
def test_fp8_dgrad_reaches_the_marked_linears_in_the_norm_blocks(monkeypatch, forward):
    """fp8_dgrad on the top of auto's Blocks (GELU kernel's MLP, norm kernels, proj_bias; the forward products in bf16,
    c_fc's in float8, or c_attn's too, so that c_attn runs through Fp8InputMatmul, or c_fc's and the MLP c_proj's,
    so that it does): the input gradients of c_attn and the MLP's c_proj, and only those, are float8
    products, through whichever autograd Function runs the Linear; the loss is the same (the forward did not change)
    and every gradient stays within float8's rounding of the model's without it."""
    import gpt2ladder.speedups.fp32_wgrad as fw
    from norm_block_support import CFG, one_step_each, rewired_models

    variants = {dgrad: {"defer_bias": True, **forward} for dgrad in (False, True)}
    models = rewired_models(monkeypatch, ("gelu_kernel", "fp32_wgrad"), variants)
    fw.use_fp8_dgrad(models[True])
    calls = []
    real = fw.input_grad
    monkeypatch.setattr(fw, "input_grad", lambda g2, wc, float8=False, *casts: calls.append((tuple(wc.shape), float8))
                        or real(g2, wc, float8, *casts))
    losses, seen = one_step_each(models, calls)
    c = CFG.n_embd
    per_block = {False: [((c, c), False), ((4 * c, c), False), ((3 * c, c), False)],  # attn c_proj, c_fc, c_attn
                 True: [((c, 4 * c), True), ((3 * c, c), True)]}  # the MLP's c_proj, c_attn
    assert sorted(set(seen[True])) == sorted(set(per_block[False][:2] + per_block[True]))
    assert [f for _, f in seen[True]].count(True) == 2 * CFG.n_layer
    assert not any(f for _, f in seen[False]) and len(seen[False]) == len(seen[True])
    assert losses[True] == losses[False]
    plain = dict(models[False].named_parameters())
    for name, param in models[True].named_parameters():
        ref = plain[name].grad
        assert param.grad is not None and (param.grad - ref).norm() <= 0.08 * ref.norm() + 1e-6, name  # max 0.051
    moved = [n for n, p in models[True].named_parameters() if not torch.equal(p.grad, plain[n].grad)]
    assert "transformer.wte.weight" in moved  # the float8 input gradients reached the embedding
