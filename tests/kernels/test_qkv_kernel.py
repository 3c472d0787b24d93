"""The q, k, v gradient kernel writes what compile's copy and sum wrote: the Triton kernel against the PyTorch
expressions (through Triton's CPU interpreter, in a subprocess since TRITON_INTERPRET is read at import), and the
rewired attention against the original, values and gradients, eager and through AOT autograd."""

import dataclasses
import importlib.util

import pytest
import torch
import torch.nn as nn

from gpt2ladder.kernels.qkv import qkv_grad8_reference, qkv_grad_reference
from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, CausalSelfAttention, init_weights
from gpt2ladder.speedups.qkv_grad import KernelAttention, use_qkv_kernel
from rewrite_support import assert_compiled_steps_match, assert_rewires_every_block

SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import qkv as qk
out = []
for B, nh, T, hs, layout, bt, tiles in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(B * 1000 + T)
    if layout == "heads":  # (B, nh, T, hs) contiguous
        grads = [torch.randn(B, nh, T, hs, generator=gen) for _ in range(3)]
    else:  # (B, T, nh, hs) memory seen as (B, nh, T, hs): another stride order, as a backward may return
        grads = [torch.randn(B, T, nh, hs, generator=gen).transpose(1, 2) for _ in range(3)]
    out_t = torch.full((B * T, 3 * nh * hs), 7.0)
    dbias = torch.zeros(3 * nh * hs)
    qk.launch(*grads, out_t, dbias, tile=(bt, tiles, 4))
    ref, ref_db = qk.qkv_grad_reference(*grads, torch.float32)
    out.append({"out": (out_t - ref.reshape(B * T, -1)).abs().max().item(),
                "db": (dbias - ref_db).abs().max().item(), "db_scale": ref_db.abs().max().item()})
print(json.dumps(out))
"""

CASES = [  # B, heads, T, head size, layout, rows per tile, tiles per program
    (2, 3, 70, 16, "heads", 16, 2),  # T not a multiple of a program's rows: the last program half empty
    (2, 2, 64, 32, "tokens", 16, 4),  # the other stride order; one program covers every row of a head
    (1, 4, 5, 16, "heads", 16, 3),  # fewer rows than one tile
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_kernel_matches_the_pytorch_expressions(triton_interpret):
    results = triton_interpret(SCRIPT, CASES)
    for case, r in zip(CASES, results):
        assert r["out"] == 0, (case, r)  # a copy: every element in its place, none left at 7
        assert r["db"] < 1e-5 * max(1.0, r["db_scale"]), (case, r)  # every row summed, none twice


SCRIPT8 = r"""
import json, sys, torch
from gpt2ladder.kernels import qkv as qk
from gpt2ladder.kernels.norm import rows_to_fp8
out = []
for B, nh, T, hs, layout, bt, steps in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(B * 1000 + T)
    if layout == "heads":
        grads = [torch.randn(B, nh, T, hs, generator=gen) for _ in range(3)]
    else:
        grads = [torch.randn(B, T, nh, hs, generator=gen).transpose(1, 2) for _ in range(3)]
    grads[1] = grads[1] * 100.0  # k's rows set the scale: a row's amax is over q, k and v together
    tile = (bt, steps, 4)
    width = 3 * nh * hs
    out_t = torch.full((B * T, width), 7.0)
    out8 = torch.full((B * T, width), 7.0)  # fp32: the values before their float8 rounding (see the norm test)
    scale = torch.full((B * T,), 7.0)
    part = torch.full((qk.programs8(B * T, tile), width), 7.0)
    qk.launch8(*grads, out_t, out8, scale, part, tile=tile)
    ref, ref_db = qk.qkv_grad_reference(*grads, torch.float32)
    ref = ref.reshape(B * T, -1)
    _, cpu_scale = rows_to_fp8(ref)  # the CPU divides by 448; CUDA, and the kernel, multiply by float32(1 / 448)
    ref_scale = ref.abs().amax(1).clamp(min=1e-12) * torch.tensor(1 / 448, dtype=torch.float32)
    out.append({"out": (out_t - ref).abs().max().item(), "scale": (scale - ref_scale).abs().max().item(),
                "scale_vs_cpu": ((scale - cpu_scale).abs() / cpu_scale).max().item(),
                "out8": (out8 - ref / ref_scale[:, None]).abs().max().item(), "out8_max": out8.abs().amax(1).tolist(),
                "db": (part.sum(0) - ref_db).abs().max().item(), "db_scale": ref_db.abs().max().item()})
print(json.dumps(out))
"""

CASES8 = [  # B, heads, T, head size, layout, tokens per step, steps per program
    (2, 3, 70, 16, "heads", 4, 4),  # 3 heads padded to 4; a program's 16 tokens cross from one sequence into the next
    (2, 2, 64, 32, "tokens", 8, 2),  # the other stride order
    (2, 2, 9, 32, "tokens", 4, 3),  # the other stride order, a program's 12 tokens crossing into the next sequence
    (1, 4, 5, 16, "heads", 4, 8),  # fewer tokens than one program takes
    (2, 3, 7, 16, "heads", 1, 4),  # one token a step (the committed tile's shape); the last program part empty
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_float8_kernel_matches_the_pytorch_expressions(triton_interpret):
    """The kernel with c_attn's float8 copy: the same assembled gradient, its rows scaled as rows_to_fp8 scales
    them on a GPU (each row's largest magnitude, over q, k and v, times float32(1 / 448)), each value divided by its
    row's scale, and the bias gradient from the partial sums."""
    results = triton_interpret(SCRIPT8, CASES8)
    for case, r in zip(CASES8, results):
        assert r["out"] == 0, (case, r)
        assert r["scale"] == 0, (case, r)
        assert r["scale_vs_cpu"] <= 2**-23, (case, r)  # the CPU's division: the same scale, or one bit off
        assert r["out8"] == 0, (case, r)
        # every row reaches the format's largest value (up to the division's last bit, before float8's rounding)
        assert all(abs(m - 448.0) < 1e-4 for m in r["out8_max"]), (case, r)
        assert r["db"] < 1e-5 * max(1.0, r["db_scale"]), (case, r)


def test_float8_reference_is_the_assembled_gradient_and_its_rows_in_float8():
    from gpt2ladder.kernels.norm import rows_to_fp8

    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(2, 3, 5, 16, generator=gen).bfloat16() for _ in range(3)]
    dqkv, g8, scale, dbias = qkv_grad8_reference(*grads, torch.float32)
    want, want_db = qkv_grad_reference(*grads, torch.float32)
    want8, want_scale = rows_to_fp8(want.reshape(10, -1))
    assert dqkv.dtype == torch.bfloat16 and g8.dtype == torch.float8_e4m3fn
    assert torch.equal(dqkv, want) and torch.equal(dbias, want_db)
    assert torch.equal(g8.view(torch.uint8), want8.view(torch.uint8)) and torch.equal(scale, want_scale)

def test_reference_is_the_gradient_of_the_split():
    """qkv_grad_reference against autograd through the attention's own split of (B, T, 3C) into heads."""
    gen = torch.Generator().manual_seed(0)
    attn = CausalSelfAttention(PRESETS["tiny"])
    B, T, C = 2, 9, PRESETS["tiny"].n_embd
    qkv = torch.randn(B, T, 3 * C, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3 * C, generator=gen, dtype=torch.float64, requires_grad=True)
    heads = attn.split_heads(qkv + bias)
    grads = [torch.randn(h.shape, generator=gen, dtype=torch.float64) for h in heads]
    torch.autograd.backward(heads, grads)
    dqkv, dbias = qkv_grad_reference(*grads, torch.float64)
    torch.testing.assert_close(dqkv, qkv.grad, rtol=0, atol=0)
    torch.testing.assert_close(dbias, bias.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_kernel_attention_is_the_same_function_with_the_same_gradients(same_function, attention):
    cfg = dataclasses.replace(PRESETS["tiny"], attention=attention)
    with torch.random.fork_rng():  # nn.Linear's own init draws from the global generator
        torch.manual_seed(0)
        plain = CausalSelfAttention(cfg)
    copy = CausalSelfAttention(cfg)
    copy.load_state_dict(plain.state_dict())
    with torch.no_grad():
        plain.c_attn.bias.normal_()  # a non-zero bias, so its gradient's new path is tested
        copy.c_attn.bias.copy_(plain.c_attn.bias)
    x = torch.randn(3, 17, cfg.n_embd, generator=torch.Generator().manual_seed(1))
    # fp32 throughout; only the bias gradient is summed in another order
    same_function(plain, KernelAttention(copy), x, out_tol=(0, 0), x_grad_tol=(1e-6, 1e-7),
                  param_tol=(1e-5, 1e-6))


def test_the_matmul_leaves_the_bias_gradient_to_the_split():
    """c_attn's bias gets its gradient once: from SplitHeads, not from the matmul as well."""
    cfg = PRESETS["tiny"]
    attn = KernelAttention(CausalSelfAttention(cfg))
    x = torch.randn(2, 5, cfg.n_embd)
    attn(x).sum().backward()
    once = attn.c_attn.bias.grad.clone()
    attn.c_attn.bias.grad = None
    plain = CausalSelfAttention(cfg)
    plain.load_state_dict(attn.state_dict())
    plain(x).sum().backward()
    torch.testing.assert_close(once, plain.c_attn.bias.grad, rtol=1e-5, atol=1e-6)


def test_use_qkv_kernel_rewires_every_block_and_keeps_the_state_dict():
    assert_rewires_every_block(use_qkv_kernel, "attn", KernelAttention)


def test_other_kinds_of_linear_and_bias_free_projections_are_left_alone():
    from gpt2ladder.speedups.common import linear_like

    class OtherLinear(torch.nn.Linear):  # its own backward, which the kernel's would bypass
        pass

    model = init_weights(GPT(PRESETS["tiny"]), seed=0)
    for block in model.transformer.h:
        block.attn.c_attn = linear_like(OtherLinear, block.attn.c_attn)
    assert use_qkv_kernel(model) == []
    model = init_weights(GPT(PRESETS["tiny"]), seed=0)
    model.transformer.h[0].attn.c_attn.bias = None
    assert use_qkv_kernel(model) == ["transformer.h.1.attn"]


@pytest.mark.parametrize("rungs", [["fp32_wgrad"], []])
def test_compiled_training_steps_match_the_plain_attention(rungs):
    """Through AOT autograd (compile's tracing of forward and backward) the rewired attention trains alike, with
    c_attn a plain Linear or fp32_wgrad's."""
    assert_compiled_steps_match(["baseline", "compile", "flash", "vocab", "fused_adamw", *rungs], "qkv_grad", "attn",
                                KernelAttention)


def test_generation_runs_without_the_split_function():
    """Without gradients (sampling, evaluation) the attention takes the plain views: nothing to sum."""
    cfg = PRESETS["tiny"]
    attn = KernelAttention(CausalSelfAttention(cfg))
    with torch.no_grad():
        y = attn(torch.randn(1, 4, cfg.n_embd))
    assert y.grad_fn is None and isinstance(attn.c_attn, nn.Linear)


def _dgrad8_pair(cfg):
    """(plain attention, KernelAttention) with the same weights, each c_attn an fp32_wgrad Linear marked by
    fp8_dgrad; a non-zero bias."""
    from gpt2ladder.speedups.common import linear_like
    from gpt2ladder.speedups.fp32_wgrad import Fp32WgradLinear

    with torch.random.fork_rng():
        torch.manual_seed(0)
        plain = CausalSelfAttention(cfg)
    with torch.no_grad():
        plain.c_attn.bias.normal_()
    copy = CausalSelfAttention(cfg)
    copy.load_state_dict(plain.state_dict())
    for attn in (plain, copy):
        attn.c_attn = linear_like(Fp32WgradLinear, attn.c_attn)
        attn.c_attn.dgrad8 = True
    return plain, KernelAttention(copy)


def test_float8_path_is_fp8_dgrads_backward_from_the_one_pass(monkeypatch):
    """With FLOAT8_COPY and c_attn marked by fp8_dgrad, the attention's backward goes through the kernel that writes
    the float8 copy (once per backward), and gives what fp8_dgrad's own backward gives: the output, the input gradient
    (the same float8 bytes multiplied) and the weight gradient bit for bit, the bias gradient up to its summation
    order."""
    import gpt2ladder.kernels.qkv as qk
    import gpt2ladder.speedups.qkv_grad as qg

    monkeypatch.setattr(qg, "FLOAT8_COPY", True)
    calls = []
    real = qk.qkv_grad8
    monkeypatch.setattr(qk, "qkv_grad8", lambda *a: calls.append(1) or real(*a))
    cfg = PRESETS["tiny"]
    plain, kernel = _dgrad8_pair(cfg)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 13, cfg.n_embd, generator=gen)
    g = torch.randn(2, 13, cfg.n_embd, generator=gen)
    xp, xk = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yp, yk = plain(xp), kernel(xk)
    assert torch.equal(yp, yk)
    yp.backward(g), yk.backward(g)
    assert calls == [1]
    assert torch.equal(xp.grad, xk.grad)
    assert torch.equal(plain.c_attn.weight.grad, kernel.c_attn.weight.grad)
    torch.testing.assert_close(plain.c_attn.bias.grad, kernel.c_attn.bias.grad, rtol=1e-5, atol=1e-6)
    # the float8 product ran: the input gradient is not bf16's
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain.c_attn.dgrad8 = False
        xb = x.clone().requires_grad_()
        plain(xb).backward(g)
    assert not torch.equal(xb.grad, xk.grad)


@pytest.mark.parametrize("copy_on", [True, False])
def test_float8_path_without_gradients_the_mark_or_the_switch_is_the_plain_path(monkeypatch, copy_on):
    """Sampling (no gradients), an unmarked c_attn, and FLOAT8_COPY off take the SplitHeads path: no float8 copy."""
    import gpt2ladder.speedups.qkv_grad as qg

    monkeypatch.setattr(qg, "FLOAT8_COPY", copy_on)
    cfg = PRESETS["tiny"]
    plain, kernel = _dgrad8_pair(cfg)
    x = torch.randn(1, 4, cfg.n_embd)
    with torch.no_grad():
        assert torch.equal(plain(x), kernel(x))
    kernel.c_attn.dgrad8 = not copy_on  # marked but switched off, or switched on but unmarked
    y = kernel(x.clone().requires_grad_())
    seen, stack = {}, [y.grad_fn]
    while stack:  # every node of the backward graph
        fn = stack.pop()
        if fn is not None and id(fn) not in seen:
            seen[id(fn)] = type(fn).__name__
            stack.extend(f for f, _ in fn.next_functions)
    names = set(seen.values())
    assert "SplitHeadsBackward" in names and "QkvProduct8Backward" not in names


@pytest.mark.parametrize("copy_on", [True, False])
def test_compiled_training_steps_match_with_fp8_dgrad(monkeypatch, copy_on):
    """Through AOT autograd, with fp8_dgrad's float8 input gradients, the rewired attention trains alike, through
    QkvProduct8 (FLOAT8_COPY) or SplitHeads."""
    import gpt2ladder.kernels.qkv as qk
    import gpt2ladder.speedups.qkv_grad as qg

    monkeypatch.setattr(qg, "FLOAT8_COPY", copy_on)
    calls = []
    real = qk.qkv_grad8
    monkeypatch.setattr(qk, "qkv_grad8", lambda *a: calls.append(1) or real(*a))
    assert_compiled_steps_match(["baseline", "compile", "flash", "vocab", "fused_adamw", "fp32_wgrad", "fp8_dgrad"],
                                "qkv_grad", "attn", KernelAttention)
    assert bool(calls) == copy_on  # the backward (traced once per layer) took the float8 kernel's path, or did not
