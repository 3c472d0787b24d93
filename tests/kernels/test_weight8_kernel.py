"""The weight cast kernel writes what `rows_to_fp8(w.t())` writes on a GPU: the Triton kernel against the PyTorch
expressions (through Triton's CPU interpreter, in a subprocess since TRITON_INTERPRET is read at import)."""

import importlib.util

import pytest
import torch

from gpt2ladder.kernels.norm import rows_to_fp8
from gpt2ladder.kernels.weight8 import weight8, weight8_reference

SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import weight8 as w8
out = []
for n_out, n_in, layout, dtype, tile in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(n_out * 1000 + n_in)
    full = torch.randn(n_out, 2 * n_in, generator=gen) * torch.logspace(-3, 3, 2 * n_in)  # columns of unlike size
    full = full.to(getattr(torch, dtype))
    if layout == "rows":  # (out, in) row-major, as the step's weights are
        w = full[:, :n_in].contiguous()
    elif layout == "cols":  # (in, out) memory seen as (out, in)
        w = full[:, :n_in].t().contiguous().t()
    else:  # every other column: a column stride of 2
        w = full[:, ::2]
    w[:, 1] = 0.0  # a column of zeros: its scale is the clamp's
    q = torch.full((n_in, n_out), 7.0)  # fp32: the values before their float8 rounding (see the qkv test)
    scale = torch.full((n_in,), 7.0)
    w8.launch(w, q, scale, tile=tile and tuple(tile))
    wt = w.t().float()
    _, cpu_scale = w8.rows_to_fp8(w.t())  # the CPU divides by 448; CUDA, and the kernel, multiply by float32(1 / 448)
    ref_scale = wt.abs().amax(-1).clamp(min=1e-12) * torch.tensor(1 / 448, dtype=torch.float32)
    out.append({"scale": (scale - ref_scale).abs().max().item(),
                "scale_vs_cpu": ((scale - cpu_scale).abs() / cpu_scale).max().item(),
                "q": (q - wt / ref_scale[:, None]).abs().max().item(), "q_max": q.abs().amax(1).tolist(),
                "strides": w.stride()})
print(json.dumps(out))
"""

CASES = [  # out features, in features, layout, dtype, (columns per program, rows per step, warps) or the default
    (70, 40, "rows", "bfloat16", (16, 32, 4)),  # neither dimension a multiple of the tile
    (64, 48, "cols", "bfloat16", (16, 16, 4)),  # transposed memory
    (5, 3, "rows", "float32", (16, 64, 4)),  # smaller than one tile both ways
    (130, 33, "step", "bfloat16", None),  # a column stride of 2, the module's tile
    (96, 64, "rows", "float32", (32, 32, 4)),  # whole tiles
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs the triton package (its interpreter)")
def test_kernel_matches_the_pytorch_expressions(triton_interpret):
    """Each input feature's scale is its column's amax (at least 1e-12) times float32(1 / 448), as rows_to_fp8 makes
    it on a GPU; each value is divided (IEEE) by its column's scale and stored transposed, (in, out) row-major."""
    results = triton_interpret(SCRIPT, CASES)
    for case, r in zip(CASES, results):
        assert r["scale"] == 0, (case, r)
        assert r["scale_vs_cpu"] <= 2**-23, (case, r)  # the CPU's division: the same scale, or one bit off
        assert r["q"] == 0, (case, r)  # every value in its place, none left at 7
        # every column but the zero one reaches the format's largest value (before float8's rounding)
        assert all(abs(m - 448.0) < 1e-4 for i, m in enumerate(r["q_max"]) if i != 1), (case, r)
        assert r["q_max"][1] == 0.0, (case, r)
    # the layouts are those the cases name: transposed memory, a column stride of 2
    assert results[1]["strides"] == [1, CASES[1][0]] and results[3]["strides"] == [2 * CASES[3][1], 2]


def test_reference_is_rows_to_fp8_of_the_transpose_made_contiguous():
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(48, 32, generator=gen) * 0.02).bfloat16()
    w8, scale = weight8_reference(w)
    want8, want_scale = rows_to_fp8(w.t())
    assert w8.shape == (32, 48) and w8.is_contiguous() and w8.dtype == torch.float8_e4m3fn
    assert torch.equal(w8.view(torch.uint8), want8.contiguous().view(torch.uint8))
    assert torch.equal(scale, want_scale)
    off, off_scale = weight8(w)  # off CUDA the public function is the reference
    assert torch.equal(off.view(torch.uint8), w8.view(torch.uint8)) and torch.equal(off_scale, scale)
