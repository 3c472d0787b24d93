"""The rotary_kernel rung's Triton kernels compute what their reference expressions compute, and the reference is
the modern attention's own QK-norm and rotary turn.

The kernels run through Triton's CPU interpreter (TRITON_INTERPRET=1, in a subprocess since the flag is read at
import), in fp32 so the comparison is tight; the bf16 path at GPT-2's size is tests/kernels/test_kernels_gpu.py's.
"""

import importlib.util

import pytest
import torch

from gpt2ladder.kernels.rotary import rotary_grad_reference, rotary_reference
from gpt2ladder.model.config import ModelConfig
from gpt2ladder.model.gpt import split_heads
from gpt2ladder.model.modern import qk_norm, rotary_tables, rotate

SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import rotary as rk
out = []
for B, T, nh, hs, norm, rope, rows, permuted in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(B * 100 + T)
    qkv = torch.randn(B, T, 3 * nh * hs, generator=gen) * 2
    half = hs // 2
    angles = torch.outer(torch.arange(T).float(), 10000.0 ** (-torch.arange(half).float() / half))
    cos, sin = (angles.cos(), angles.sin()) if rope else (None, None)
    q, k, v = (torch.full((B, T, nh, hs), 7.0) for _ in range(3))
    rk.launch_fwd(qkv, cos, sin, q, k, v, nh, norm, block_rows=rows)
    rq, rk_, rv = rk.rotary_reference(qkv, nh, cos, sin, norm)
    grads = [torch.randn(B, T, nh, hs, generator=gen) for _ in range(3)]
    if permuted:  # as attention's backward gives them: (B, nh, T, hs) memory seen through a transpose
        grads = [g.transpose(1, 2).contiguous().transpose(1, 2) for g in grads]
    dqkv = torch.full_like(qkv, 7.0)
    rk.launch_grad(grads, qkv, cos, sin, dqkv, nh, norm, block_rows=rows)
    ref = rk.rotary_grad_reference(*grads, qkv, nh, cos, sin, norm)
    out.append({"q": (q - rq).abs().max().item(), "k": (k - rk_).abs().max().item(), "v": (v - rv).abs().max().item(),
                "grad": (dqkv - ref).abs().max().item(), "scale": ref.abs().max().item()})
print(json.dumps(out))
"""

CASES = [  # B, T, heads, head size, qk_norm, rope, rows per program, gradients strided as attention gives them
    (2, 5, 3, 8, True, True, 16, True),  # rows (30) not a multiple of the program's
    (1, 7, 2, 16, True, False, 4, False),  # the norm alone
    (2, 3, 4, 8, False, True, 8, True),  # the turn alone
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package's CPU interpreter")
def test_kernels_match_the_reference_expressions(triton_interpret):
    for case, r in zip(CASES, triton_interpret(SCRIPT, CASES)):
        assert r["v"] == 0.0, case  # v is copied
        assert r["q"] < 1e-5 and r["k"] < 1e-5, (case, r)
        assert r["grad"] < 1e-5 * max(1.0, r["scale"]), (case, r)


@pytest.mark.parametrize("norm,rope", [(True, True), (True, False), (False, True)])
def test_the_reference_is_the_modern_attentions_own_expression(norm, rope):
    """rotary_reference in fp32 equals qk_norm then rotate on split_heads' views, as ModernAttention computes them;
    and its gradient is autograd's of that expression."""
    cfg = ModelConfig(n_layer=1, n_head=4, n_embd=32, block_size=16, parts=("rope", "qk_norm"))
    cos, sin = rotary_tables(cfg)
    qkv = torch.randn(2, 11, 96, dtype=torch.float64, requires_grad=True)

    def modern(x):
        q, k, v = split_heads(x, 4)
        if norm:
            q, k = qk_norm(q), qk_norm(k)
        if rope:
            q, k = rotate(q, cos.double(), sin.double()), rotate(k, cos.double(), sin.double())
        return tuple(t.transpose(1, 2) for t in (q, k, v))  # (B, T, nh, hs), as the reference gives them

    expected = modern(qkv)
    got = rotary_reference(qkv.detach(), 4, cos.double() if rope else None, sin.double() if rope else None, norm)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.double(), e.detach(), rtol=1e-5, atol=1e-6)
    grads = [torch.randn_like(e) for e in expected]
    torch.autograd.backward(expected, grads)
    ref = rotary_grad_reference(*grads, qkv.detach(), 4, cos.double() if rope else None, sin.double() if rope else None,
                                norm)
    torch.testing.assert_close(ref.double(), qkv.grad, rtol=1e-5, atol=1e-6)


def test_the_references_take_the_models_epsilon_in_bfloat16():
    """In bf16 (as under autocast) the norm's epsilon is bf16's, in the forward reference and in the gradient's,
    which computes in fp32: both must follow the model's qk_norm, not the dtype they compute in."""
    qkv = (torch.randn(1, 3, 24, generator=torch.Generator().manual_seed(2)) * 0.05).bfloat16()
    x = qkv.float().requires_grad_()
    q, k, v = split_heads(x.view(1, 3, 24), 2)
    eps = torch.finfo(torch.bfloat16).eps
    expected = [F_rms(t.transpose(1, 2), eps) for t in (q, k)]  # the model's expression at bf16's epsilon
    got = rotary_reference(qkv, 2, None, None, True)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.float(), e.detach().bfloat16().float())
    grads = [torch.randn(1, 3, 2, 4) for _ in range(3)]
    torch.autograd.backward([*expected, v.transpose(1, 2)], grads)
    torch.testing.assert_close(rotary_grad_reference(*grads, qkv, 2, None, None, True).float(),
                               x.grad.bfloat16().float())


def F_rms(t: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.rms_norm(t, (t.shape[-1],), eps=eps)


@pytest.mark.parametrize("more", [(), ("value_embeds", "unet_skips", "doc_windows")])
def test_the_rung_keeps_the_modern_models_function(more):
    """With the rotary_kernel rewrite a modern model (CPU: the reference path) gives the same loss and gradients,
    with the value embeddings and document windows after the kernel's q, k and v too."""
    from gpt2ladder.model.family import built
    from gpt2ladder.model.setup import Setup
    from gpt2ladder.speedups import apply

    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64,
                      parts=("rope", "qk_norm", "relu2", "rmsnorm", *more))
    plain = built(cfg, seed=0)
    fast = built(cfg, seed=0)
    replaced = apply(fast, Setup(rotary_kernel=True))["rotary_kernel"]
    assert replaced == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert fast.state_dict().keys() == plain.state_dict().keys()
    idx = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    idx[:, 7] = 63  # <|endoftext|>: a second document (doc_windows)
    losses = []
    for model in (plain, fast):
        _, loss = model(idx, idx)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
