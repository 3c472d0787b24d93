"""The GELU kernel computes what GPT-2's MLP computes: the Triton kernel against the PyTorch expressions
(through Triton's CPU interpreter, in a subprocess since TRITON_INTERPRET is read at import), and the
rewired MLP against the original, values and gradients."""

import importlib.util

import pytest
import torch
import torch.nn as nn

from gpt2ladder.kernels.gelu import gelu_fp8_reference, gelu_grad_reference, gelu_reference
from gpt2ladder.kernels.gelu import gelu_fp8_blocks_reference as gk_blocks_reference
from gpt2ladder.model.config import PRESETS
from gpt2ladder.model.gpt import GPT, MLP, init_weights
from gpt2ladder.speedups.gelu_mlp import KernelMLP, use_gelu_kernel
from rewrite_support import assert_compiled_steps_match, assert_rewires_every_block

SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import gelu as gk
out = []
for n, c, bm, bn, blocks in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(n * 100 + c)
    h0, grad = torch.randn(n, c, generator=gen) * 3, torch.randn(n, c, generator=gen)
    h0[0, : min(c, 4)] = torch.tensor([-60.0, 60.0, -1e4, 0.0])[: min(c, 4)]  # exp2 overflows to inf
    bias = torch.randn(c, generator=gen)
    dh, a = torch.full((n, c), 7.0), torch.full((n, c), 7.0)
    dbias = torch.zeros(c)
    gk.launch(grad, h0, bias, dh, dbias, tile=(bm, bn, 4, blocks))
    gk.launch_fwd(h0, bias, a, tile=(bm, bn, 4))
    ref_dh, ref_db = gk.gelu_grad_reference(grad, h0, bias)
    ref_a = gk.gelu_reference(h0, bias)
    out.append({"dh": (dh - ref_dh).abs().max().item(), "db": (dbias - ref_db).abs().max().item(),
                "db_scale": ref_db.abs().max().item(), "a": (a - ref_a).abs().max().item(),
                "finite": bool(torch.isfinite(a).all() and torch.isfinite(dh).all())})
print(json.dumps(out))
"""

CASES = [  # rows, columns, tile rows, tile columns, row blocks per program (backward)
    (70, 300, 16, 128, 2),  # neither dimension a multiple of its tile; the last program half empty
    (64, 256, 16, 128, 4),  # exact tiles, one program's loop covers every row
    (5, 40, 16, 64, 3),  # fewer rows and columns than one tile
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_kernels_match_the_pytorch_expressions(triton_interpret):
    results = triton_interpret(SCRIPT, CASES)
    for case, r in zip(CASES, results):
        assert r["finite"], (case, r)  # h = -1e4: exp2 overflows to inf and the limit is still 0
        assert r["a"] < 1e-5, (case, r)  # the forward: sigmoid form against F.gelu's tanh, fp32
        assert r["dh"] < 1e-5, (case, r)  # fp32 in and out: equal up to tanh's rounding
        assert r["db"] < 1e-5 * max(1.0, r["db_scale"]), (case, r)  # every row block summed, none twice


FP8_SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import gelu as gk
out = []
for n, c, rows in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(n * 100 + c)
    h0, bias = torch.randn(n, c, generator=gen) * 3, torch.randn(c, generator=gen)
    h0[0, : min(c, 3)] = torch.tensor([-60.0, 60.0, -1e4])[: min(c, 3)]
    h0[-1] = -bias - 40.0  # a row of (negative) zeros: its scale is the floor, not 0
    a, q, qs = torch.full((n, c), 7.0), torch.full((n, c), 7.0), torch.full((n,), 7.0)
    gk.launch_fwd_fp8(h0, bias, a, q, qs, tile=(rows, 4))
    ref_a, _, ref_qs = gk.gelu_fp8_reference(h0, bias)
    err = lambda x, y: (x - y).abs().max().item()
    # q in fp32: the values the kernel rounds to float8 (the interpreter's float8 rounding is not the GPU's)
    out.append({"a": err(a, ref_a), "qs": err(qs / ref_qs, torch.ones(n)), "q": err(q, ref_a / ref_qs[:, None]),
                "q_max": (q.abs().amax(1)[:-1] - 448).abs().max().item(), "zero_row": q[-1].abs().max().item()})
print(json.dumps(out))
"""

FP8_CASES = [(9, 300, 2), (4, 256, 4), (3, 40, 2)]  # rows, columns (a power of two or not), rows per program


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_forward_with_its_float8_copy_matches_the_expressions(triton_interpret):
    """The forward kernel with `fp8`: the same output, one scale per row mapping its amax to e4m3's 448, and the
    copy's values before their rounding those of the reference (`rows_to_fp8` of the fp32 GELU)."""
    for case, r in zip(FP8_CASES, triton_interpret(FP8_SCRIPT, FP8_CASES)):
        assert r["a"] < 1e-5 and r["qs"] < 1e-6, (case, r)
        assert r["q"] < 1e-3 and r["q_max"] < 1e-3, (case, r)  # of values up to 448
        assert r["zero_row"] == 0.0, (case, r)


BLOCKS_SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import gelu as gk
out = []
for n, c, bm, bn in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(n * 100 + c)
    h0, bias = torch.randn(n, c, generator=gen) * 3, torch.randn(c, generator=gen)
    h0[0, :3] = torch.tensor([-60.0, 60.0, -1e4])
    h0[-1, 128:256] = -bias[128:256] - 40.0  # a block of (negative) zeros: its scale is the floor, not 0
    h0[1, :128] *= 100  # one block far wider than its row's others
    a, q, qs = torch.full((n, c), 7.0), torch.full((n, c), 7.0), torch.full((c // 128, n), 7.0)
    gk.launch_fwd_fp8_blocks(h0, bias, a, q, qs, tile=(bm, bn, 4))
    ref_a, _, ref_qs = gk.gelu_fp8_blocks_reference(h0, bias)
    err = lambda x, y: (x - y).abs().max().item()
    scales = ref_qs.repeat_interleave(128, 1)  # each value's block scale
    # q in fp32: the values the kernel rounds to float8 (the interpreter's float8 rounding is not the GPU's)
    out.append({"a": err(a, ref_a), "qs": err(qs.t() / ref_qs, torch.ones_like(ref_qs)),
                "q": err(q, ref_a.float() / scales), "q_max": err(q.abs().reshape(n, -1, 128).amax(-1)[:-1], 448),
                "zero_block": q[-1, 128:256].abs().max().item(), "wide_row_rest": q[1, 128:].abs().max().item()})
print(json.dumps(out))
"""

BLOCKS_CASES = [(9, 384, 4, 256), (4, 256, 8, 128)]  # rows, columns, tile rows, tile columns: partial tiles, exact


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_forward_with_its_block_scaled_float8_copy_matches_the_expressions(triton_interpret):
    """With one scale per 128 columns of a row, stored block-major: each block's amax maps to e4m3's 448, a block far
    wider than its row's others leaves them their own range, and the copy's values before their rounding are the
    reference's."""
    for case, r in zip(BLOCKS_CASES, triton_interpret(BLOCKS_SCRIPT, BLOCKS_CASES)):
        assert r["a"] < 1e-5 and r["qs"] < 1e-6, (case, r)
        assert r["q"] < 1e-3 and r["q_max"] < 1e-3, (case, r)  # of values up to 448
        assert r["zero_block"] == 0.0, (case, r)
        assert r["wide_row_rest"] > 400, (case, r)  # row scales would have put these near 448 / 100


def test_block_scaled_reference_scales_each_128_columns_of_a_row():
    gen = torch.Generator().manual_seed(2)
    h0, bias = torch.randn(3, 256, generator=gen, dtype=torch.bfloat16) * 3, torch.randn(256, generator=gen)
    a, q, qs = gk_blocks_reference(h0, bias)
    assert a.dtype == torch.bfloat16 and q.dtype == torch.float8_e4m3fn and qs.shape == (3, 2)
    exact = nn.functional.gelu(h0.float() + bias, approximate="tanh")
    assert torch.equal(qs, exact.reshape(3, 2, 128).abs().amax(-1) / 448)
    torch.testing.assert_close(q.float() * qs.repeat_interleave(128, 1), exact, rtol=0.07,
                               atol=float(qs.max()) * 2**-9)


def test_float8_reference_is_the_gelu_and_its_row_scaled_copy():
    gen = torch.Generator().manual_seed(1)
    h0, bias = torch.randn(6, 64, generator=gen, dtype=torch.bfloat16) * 3, torch.randn(64, generator=gen)
    a, q, qs = gelu_fp8_reference(h0, bias)
    assert a.dtype == torch.bfloat16 and q.dtype == torch.float8_e4m3fn and qs.shape == (6,)
    torch.testing.assert_close(a, gelu_reference(h0, bias))
    exact = nn.functional.gelu(h0.float() + bias, approximate="tanh")
    assert torch.equal(qs, exact.abs().amax(1) / 448)
    # e4m3: 3 mantissa bits, and below 2^-6 of a scale its subnormals, 2^-9 apart
    torch.testing.assert_close(q.float() * qs[:, None], exact, rtol=0.07, atol=float(qs.max()) * 2**-9)


def test_reference_is_the_derivative_of_gpt2s_gelu():
    gen = torch.Generator().manual_seed(0)
    h0 = torch.randn(33, 20, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(20, generator=gen, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(33, 20, generator=gen, dtype=torch.float64)
    nn.functional.gelu(h0 + bias, approximate="tanh").backward(grad)
    dh, db = gelu_grad_reference(grad, h0.detach(), bias.detach())
    torch.testing.assert_close(dh, h0.grad.to(dh.dtype), rtol=1e-6, atol=1e-6)  # fp32 inside
    torch.testing.assert_close(db, bias.grad, rtol=1e-5, atol=1e-5)


def _pair():
    cfg = PRESETS["tiny"]
    with torch.random.fork_rng():  # nn.Linear's own init draws from the global generator
        torch.manual_seed(0)
        plain = MLP(cfg)
    copy = MLP(cfg)
    copy.load_state_dict(plain.state_dict())
    return plain, KernelMLP(copy)


def test_kernel_mlp_is_the_same_function_with_the_same_gradients(same_function):
    plain, rewired = _pair()
    with torch.no_grad():
        plain.c_fc.bias.normal_()  # a non-zero bias, so moving its add is tested
        rewired.c_fc.bias.copy_(plain.c_fc.bias)
    x = torch.randn(3, 17, 128, generator=torch.Generator().manual_seed(1))
    # fp32 throughout; the GELU's derivative is written differently, so the parameters' sums of 51 rows
    # differ in the last bits (a wrong term or a lost row would be off by orders of magnitude more)
    same_function(plain, rewired, x, out_tol=(1e-5, 1e-6), x_grad_tol=(1e-5, 1e-6), param_tol=(1e-4, 1e-5))


def test_use_gelu_kernel_rewires_every_block_and_keeps_the_state_dict():
    assert_rewires_every_block(use_gelu_kernel, "mlp", KernelMLP)


def test_mlps_whose_c_fc_is_another_kind_of_linear_are_left_alone():
    from gpt2ladder.speedups.common import linear_like

    class OtherLinear(torch.nn.Linear):  # its own forward and backward, which the GELU kernel's MLP would bypass
        pass

    model = init_weights(GPT(PRESETS["tiny"]), seed=0)
    for block in model.transformer.h:
        block.mlp.c_fc = linear_like(OtherLinear, block.mlp.c_fc)
    assert use_gelu_kernel(model) == []


def test_compiled_training_steps_match_the_plain_mlp():
    """Through AOT autograd (compile's tracing of forward and backward) the rewired MLP trains alike."""
    assert_compiled_steps_match(["baseline", "compile", "flash", "vocab", "fused_adamw"], "gelu_kernel", "mlp",
                                KernelMLP)
