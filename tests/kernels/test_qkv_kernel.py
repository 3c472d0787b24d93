"""The q, k, v gradient kernel writes what compile's copy and sum wrote: the Triton kernel against the PyTorch
expressions (through Triton's CPU interpreter, in a subprocess since TRITON_INTERPRET is read at import), and the
rewired attention against the original, values and gradients, eager and through AOT autograd."""

import dataclasses
import importlib.util

import pytest
import torch
import torch.nn as nn

from gpt2ladder.kernels.qkv import qkv_grad_reference
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


def test_compiled_training_steps_match_with_fp8_dgrad():
    """Through AOT autograd, with fp8_dgrad's float8 input gradients below it, the rewired attention trains alike."""
    assert_compiled_steps_match(["baseline", "compile", "flash", "vocab", "fused_adamw", "fp32_wgrad", "fp8_dgrad"],
                                "qkv_grad", "attn", KernelAttention)
