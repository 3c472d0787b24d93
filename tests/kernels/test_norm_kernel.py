"""The add + layer norm kernels compute what GPT-2's residual add and layer norm compute: the Triton kernels
against the PyTorch expressions (through Triton's CPU interpreter), the expressions against autograd, and
the rewired model against the original. The interpreter's float8 conversion is not the GPU's (it rounds a
value just under a power of two down to the power below), so the float8 copy is read here before its rounding,
in fp32; tests/kernels/test_kernels_gpu.py checks the rounded copy on a GPU."""

import dataclasses
import importlib.util

import pytest
import torch
import torch.nn as nn

from gpt2ladder.kernels.norm import add_norm_grad_reference, add_norm_reference
from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, Block, init_weights
from gpt2ladder.speedups.norm_block import AddNorm, FinalNorm, NormBlock, use_norm_kernel

SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import norm as nk
out = []
err = lambda a, r: (a - r).abs().max().item() / max(1.0, r.abs().max().item())
for n, c, fwd_rows, bwd_rows, programs, with_pbias, fp8, prefetch, ones in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(n * 100 + c)
    h, p = torch.randn(n, c, generator=gen) * 2 + 1, torch.randn(n, c, generator=gen)
    w, b = torch.randn(c, generator=gen), torch.randn(c, generator=gen)
    dy, ds = torch.randn(n, c, generator=gen), torch.randn(n, c, generator=gen)
    pb = torch.randn(c, generator=gen) if with_pbias else None
    s, y = torch.full((n, c), 7.0), torch.full((n, c + ones), 7.0)
    mean, rstd = torch.full((n,), 7.0), torch.full((n,), 7.0)
    q = torch.full((n, c), 7.0) if fp8 else None  # fp32: the values before their float8 rounding (see below)
    qs = torch.full((n,), 7.0) if fp8 else None
    nk.launch_fwd(h, p, w, b, 1e-5, s, y, mean, rstd, tile=(fwd_rows, 4), pbias=pb, q=q, qs=qs)
    dsum, dw, db = torch.full((n, c), 7.0), torch.full((c,), 7.0), torch.full((c,), 7.0)
    dpb = torch.full((c,), 7.0) if with_pbias else None
    nk.launch_bwd(dy, ds, s, w, mean, rstd, dsum, dw, db, programs, tile=(bwd_rows, 4, 1), dpb=dpb, prefetch=prefetch)
    rs, ry, rmean, rrstd = nk.add_norm_reference(h, p, w, b, 1e-5, torch.float32, pb)
    if fp8:  # the float8 copy's scales, and the values it rounds (y / scale)
        rq, rqs = nk.rows_to_fp8(ry)
        fp8_err = {"qs": err(qs, rqs), "q": err(q, ry / rqs[:, None]), "q_max": abs(q.abs().amax(1) - 448).max().item()}
    else:
        fp8_err = {}
    ref = nk.add_norm_grad_reference(dy, ds, rs, w, rmean, rrstd, with_pbias=with_pbias)
    ones_err = {"ones": (y[:, c:] - 1).abs().max().item()} if ones else {}
    out.append({"s": err(s, rs), "y": err(y[:, :c], ry), "mean": err(mean, rmean), "rstd": err(rstd, rrstd), **ones_err,
                "dsum": err(dsum, ref[0]), "dw": err(dw, ref[1]), "db": err(db, ref[2]),
                "dpb": err(dpb, ref[3]) if with_pbias else 0.0, **fp8_err})
print(json.dumps(out))
"""

CASES = [  # rows, columns, forward rows per program, backward rows per step, backward programs, branch bias, float8,
    # the backward's loop loading its next row block ahead, and the columns of ones after the output's
    (64, 256, 8, 2, 5, False, True, False, 0),  # with the output's float8 copy and its row scales
    (70, 300, 4, 4, 3, False, False, False, 0),  # columns not a power of two; the last row block half empty; 6 each
    (64, 256, 8, 2, 5, False, False, False, 0),  # exact tiles; programs get unequal numbers of row blocks
    (3, 40, 4, 4, 8, False, False, False, 0),  # fewer rows than one block; more programs asked for than blocks
    (70, 300, 4, 4, 3, True, False, False, 0),  # the branch's bias added in the kernel and its gradient summed
    (3, 40, 4, 4, 8, True, False, False, 0),
    (70, 300, 4, 4, 3, True, True, False, 0),  # both
    (70, 300, 4, 4, 3, True, False, True, 0),  # loading ahead, where the blocks run out unevenly
    (64, 256, 8, 2, 5, False, False, True, 0),
    (3, 40, 4, 4, 8, True, False, True, 0),
    (70, 300, 4, 4, 3, True, False, True, 8),  # the output's rows 308 apart, 8 columns of ones after each
    (3, 40, 4, 4, 8, False, False, False, 8),
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_kernels_match_the_pytorch_expressions(triton_interpret):
    results = triton_interpret(SCRIPT, CASES)
    for case, r in zip(CASES, results):
        q_max = r.pop("q_max", 0.0)
        assert all(v < 1e-5 for v in r.values()), (case, r)  # every row and column written, none twice
        assert q_max < 1e-3, (case, q_max)  # each row's largest value lands on e4m3's largest, 448


def test_reference_gradients_are_autograds():
    """The expressions the backward kernel must match are the gradients of s = h + p + pbias and layer_norm(s)."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(5, 7, 48, generator=gen, dtype=torch.float64, requires_grad=True)
    p = torch.randn(5, 7, 48, generator=gen, dtype=torch.float64, requires_grad=True)
    pbias = torch.randn(48, generator=gen, dtype=torch.float64, requires_grad=True)
    norm = nn.LayerNorm(48, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.normal_(generator=gen), norm.bias.normal_(generator=gen)
    ds, dy = torch.randn(5, 7, 48, generator=gen, dtype=torch.float64), torch.randn(5, 7, 48, generator=gen,
                                                                                    dtype=torch.float64)
    s = h + p + pbias
    y = norm(s)
    torch.autograd.backward((s, y), (ds, dy))
    rs, ry, mean, rstd = add_norm_reference(h.detach(), p.detach(), norm.weight.detach(), norm.bias.detach(),
                                            norm.eps, torch.float64, pbias.detach())
    torch.testing.assert_close(rs, s.detach())
    torch.testing.assert_close(ry, y.detach())
    dsum, dw, db, dpbias = add_norm_grad_reference(dy, ds, rs, norm.weight.detach(), mean, rstd, with_pbias=True)
    torch.testing.assert_close(dsum, h.grad)
    torch.testing.assert_close(dsum, p.grad)
    torch.testing.assert_close(dpbias, pbias.grad)
    torch.testing.assert_close(dw, norm.weight.grad)
    torch.testing.assert_close(db, norm.bias.grad)


@pytest.mark.parametrize("with_pbias", [False, True])
def test_add_norm_node_gives_both_inputs_the_summed_gradient(with_pbias):
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(4, 32, generator=gen, requires_grad=True)
    p = torch.randn(4, 32, generator=gen, requires_grad=True)
    w, b = torch.randn(32, generator=gen, requires_grad=True), torch.randn(32, generator=gen, requires_grad=True)
    pb = torch.randn(32, generator=gen, requires_grad=True) if with_pbias else None
    s, y = AddNorm.apply(h, p, pb, w, b, 1e-5, torch.float32)
    (s.sum() * 2 + (y * y).sum()).backward()
    hh, pp = h.detach().clone().requires_grad_(), p.detach().clone().requires_grad_()
    ww, bb = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    pbb = pb.detach().clone().requires_grad_() if with_pbias else None
    s2 = hh + (pp + pbb if with_pbias else pp)
    y2 = nn.functional.layer_norm(s2, (32,), ww, bb, 1e-5)
    (s2.sum() * 2 + (y2 * y2).sum()).backward()
    pairs = [(h.grad, hh.grad), (p.grad, pp.grad), (w.grad, ww.grad), (b.grad, bb.grad)]
    for got, want in pairs + ([(pb.grad, pbb.grad)] if with_pbias else []):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("defer_bias", [False, True])
def test_the_rewrite_keeps_the_parameters_and_the_function(defer_bias):
    """Every Block becomes a NormBlock and ln_f a FinalNorm with the same Parameters; off CUDA they run the
    PyTorch expressions (and keep the projections' biases in their matmuls), so the loss and every gradient
    are the original model's, bit for bit."""
    cfg = dataclasses.replace(PRESETS["tiny"], attention="sdpa")
    plain, rewired = init_weights(GPT(cfg), 0), init_weights(GPT(cfg), 0)
    before = dict(rewired.named_parameters())
    names = use_norm_kernel(rewired, defer_bias=defer_bias)
    assert names == [f"transformer.h.{i}" for i in range(cfg.n_layer)] + ["transformer.ln_f"]
    assert dict(rewired.named_parameters()) == before and rewired.state_dict().keys() == plain.state_dict().keys()
    assert all(type(b) is NormBlock for b in rewired.transformer.h) and type(rewired.transformer.ln_f) is FinalNorm
    assert not any(type(m) is Block for m in rewired.modules())
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, cfg.vocab_size, (2, 16), generator=gen), torch.randint(0, cfg.vocab_size, (2, 16),
                                                                                   generator=gen)
    losses = []
    for model in (plain, rewired):
        _, loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == losses[1]
    grads = dict(plain.named_parameters())
    for name, param in rewired.named_parameters():
        assert torch.equal(param.grad, grads[name].grad), name
    assert use_norm_kernel(rewired) == []


@pytest.mark.parametrize("before", [(), ("gelu_kernel", "fp32_wgrad")])
def test_deferred_projection_biases_reach_the_norm_and_train_the_same(monkeypatch, before):
    """With `defer_bias` (the proj_bias rung) every Block's attention and MLP output projection runs without its
    bias and AddNorm adds it and returns its gradient; also with the GELU kernel's MLP and fp32_wgrad's Linears,
    as in `auto`. The norm kernels need a GPU, so here AddNorm's PyTorch expressions stand in for them (on a
    bf16 residual stream under CPU autocast): the loss and every gradient are the plain rewrite's up to bf16
    rounding, and the deferred path is the one that ran."""
    import gpt2ladder.speedups.norm_block as nb
    from norm_block_support import CFG, one_step_each, rewired_models

    models = rewired_models(monkeypatch, before, {defer: {"defer_bias": defer} for defer in (False, True)})
    calls = []
    real_apply = nb.AddNorm.apply
    monkeypatch.setattr(nb.AddNorm, "apply", lambda *a: calls.append(a[2] is not None) or real_apply(*a))
    losses, seen = one_step_each(models, calls)
    for defer in (False, True):  # ln_1 of Blocks 1.. and every ln_2 run AddNorm; with defer_bias each gets its bias
        assert seen[defer] == [defer] * (2 * CFG.n_layer - 1)
    assert abs(losses[True] - losses[False]) < 1e-2
    plain = dict(models[False].named_parameters())
    for name, param in models[True].named_parameters():
        assert param.grad is not None, name
        torch.testing.assert_close(param.grad, plain[name].grad, atol=2e-3, rtol=5e-2, msg=name)
