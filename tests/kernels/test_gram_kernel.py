"""The ns_kernel rung's Triton kernel computes alpha x x^T + beta addend, exactly symmetric, and Muon's iteration with
it is the plain iteration.

The kernel runs through Triton's CPU interpreter (TRITON_INTERPRET=1, in a subprocess since the flag is read at
import) at sizes that are not a multiple of its 16-wide tile, in fp32: the interpreter multiplies bf16 tiles as the
integers that hold their bits, so Muon's bf16 iteration reaches it through a wrapper that hands it the same values in
fp32 and rounds its output to bf16, as the kernel's own store does. The bf16 path at GPT-2's size, in a CUDA graph
and timed, is tests/kernels/test_gram_kernel_gpu.py's.
"""

import importlib.util

import pytest

from gpt2ladder.ladder import resolve_rungs, why_unavailable
from gpt2ladder.model.recipe import GPT2, parse_recipe
from gpt2ladder.runtime.hardware import Capabilities

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs the triton package's CPU interpreter")

SCRIPT = r"""
import json, sys, torch
from gpt2ladder.kernels import gram
from gpt2ladder.runtime import optim

TILE = (16, 16, 1, 1)
out = []
for m, k in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(m * 100 + k)
    x = torch.randn(3, m, k, generator=gen)
    s = torch.randn(3, m, m, generator=gen)
    r = {}
    for name, args in (("gram", (1.0, None, 0.0)), ("scaled", (-0.5, s + s.mT, 2.0)),
                       ("poly", (2.0315, x @ x.mT, -4.7750))):  # Newton-Schulz's second product, A from x
        got, ref = gram.symmetric_gram(x, *args, tile=TILE), gram.gram_reference(x, *args)
        r[name], r[name + "_scale"] = (got - ref).abs().max().item(), ref.abs().max().item()
        r[name + "_symmetric"] = torch.equal(got, got.mT)
        r[name + "_mirrored"] = torch.equal(got.tril(-1), got.triu(1).mT)
    strided = torch.randn(3, k, m, generator=gen).mT  # a transposed view, as a tall matrix turned wide
    got, ref = gram.symmetric_gram(strided, tile=TILE), gram.gram_reference(strided)
    r["strided"], r["strided_scale"] = (got - ref).abs().max().item(), ref.abs().max().item()
    out.append(r)

kernel = gram.symmetric_gram
def fp32_inside(x, alpha=1.0, addend=None, beta=0.0):
    return kernel(x.float(), alpha, None if addend is None else addend.float(), beta, tile=TILE).to(x.dtype)
gram.symmetric_gram = fp32_inside

def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()

gaps = {}
for shape in [(3, 16, 32), (3, 40, 70), (3, 70, 40)]:  # the last tall: iterated on its transpose
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    gaps[str(shape)] = rel(optim.orthogonalise(g, symmetric=True), optim.orthogonalise(g))
steps = []
for symmetric in (False, True):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(40, 24)), torch.nn.Parameter(torch.randn(3 * 16, 40))]
    params[1].muon_blocks = 3
    opt = optim.MuonAdamW([{"params": params, "muon": True}], lr=0.05, momentum=0.9, symmetric=symmetric)
    for step in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step))
        opt.step()
    steps.append(params)
gaps["muon_step"] = max(rel(a, b) for a, b in zip(*steps))
out.append(gaps)
print(json.dumps(out))
"""

CASES = [(16, 32), (16, 70), (40, 32), (40, 70)]  # m = 40: three tiles, the last part empty; k = 70: a part K step
# The kernel and cuBLAS (here PyTorch's CPU bmm) both sum in fp32 and round once to bf16, in another order: a sum near
# a bf16 rounding boundary lands one bf16 step (2^-8 relative) apart, and the five steps carry that on. Measured here:
# 0 to 0.05% in norm; this allows one bf16 step in every element, twice over. A wrong coefficient or a step fewer is
# 30% off (tests/runtime/test_optim.py).
ITERATION_REL = 0.01


@needs_triton
def test_the_kernel_is_the_expression_and_exactly_symmetric(triton_interpret):
    *kernel, iteration = triton_interpret(SCRIPT, CASES)
    for case, r in zip(CASES, kernel):
        for name in ("gram", "scaled", "poly", "strided"):
            assert r[name] < 1e-6 * r[name + "_scale"], (case, name, r)  # fp32 sums of k products, in another order
        for name in ("gram", "scaled", "poly"):
            assert r[name + "_symmetric"] and r[name + "_mirrored"], (case, name)
    for shape, gap in iteration.items():
        assert gap < ITERATION_REL, (shape, gap)


def test_the_rung_is_opt_in_for_muon_recipes_and_declines_gpt2s():
    h200 = Capabilities("cuda", "NVIDIA H200", (9, 0), triton_version="3.5.1")
    reason = why_unavailable("ns_kernel", h200, recipe=GPT2)
    assert reason and "muon" in reason and "\n" not in reason and len(reason) < 200
    muon = parse_recipe("muon")
    assert why_unavailable("ns_kernel", h200, recipe=muon) is None
    assert "ns_kernel" not in resolve_rungs("auto", h200, recipe=muon)  # until a GPU measures it
    assert "ns_kernel" in resolve_rungs("best", h200, recipe=muon)
    assert "ns_kernel" not in resolve_rungs("best", h200, recipe=GPT2)
    assert "Triton" in why_unavailable("ns_kernel", Capabilities("cuda", "NVIDIA H200", (9, 0)), recipe=muon)
    assert "CUDA GPU" in why_unavailable("ns_kernel", Capabilities("cpu", "cpu (x86_64)"), recipe=muon)


def test_the_engine_hands_the_rung_to_muon_on_a_gpu():
    """The optimizer is built on a GPU only in name here (no graph: its rates stay numbers, nothing touches CUDA)."""
    import torch

    from gpt2ladder.model import family
    from gpt2ladder.model.config import ModelConfig
    from gpt2ladder.model.setup import Setup
    from gpt2ladder.runtime.engine import OptimConfig, make_optimizer

    model = family.built(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64), seed=0)
    muon = OptimConfig(name="muon")
    assert make_optimizer(model, muon, Setup(ns_kernel=True), torch.device("cuda")).symmetric
    assert not make_optimizer(model, muon, Setup(), torch.device("cuda")).symmetric
    assert not make_optimizer(model, muon, Setup(ns_kernel=True), torch.device("cpu")).symmetric  # cuBLAS's there
