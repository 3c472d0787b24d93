"""The ns_kernel rung on a GPU at GPT-2's Muon batches, bf16: 48 matrices of 768 x 768 (each Block's q, k, v and
attention projection) and 24 of 768 x 3072 (its MLP's two, turned wide). The kernel against its fp32 expression and
exactly symmetric; Muon's iteration with it against the plain one, both timed (printed; only correctness is
asserted); the iteration captured in a CUDA graph and replayed; a modern recipe's step with the rung
at the top of `auto`. Skipped without a GPU."""

import dataclasses

import pytest
import torch

from gpu_support import GPU, TINY, needs_cuda, needs_triton, random_batches
from gpt2ladder.kernels import gram
from gpt2ladder.runtime import optim

pytestmark = [pytest.mark.gpu, needs_cuda, needs_triton]
BATCHES = [(48, 768, 768), (24, 768, 3072)]
# The tolerance tests/runtime/test_optim.py allows two bf16 iterations that round in another order (about 3% apart
# there); the two paths here differ only in the order of their fp32 sums (0 to 0.05% on the CPU at small sizes).
BF16_REL = 0.05


def _wide(shape, seed=0):
    """Random updates as Muon iterates on them: bf16, each matrix of Frobenius norm 1."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(GPU, torch.bfloat16)
    return g / g.norm(dim=(-2, -1), keepdim=True)


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _ms(fn) -> float:
    """Median milliseconds per call on the GPU's clock, by Triton's own benchmark (warm-up calls first, the kernel's
    compilation among them; the L2 cache flushed between calls)."""
    import triton.testing

    return triton.testing.do_bench(fn, return_mode="median")


@pytest.mark.parametrize("shape", BATCHES, ids=lambda s: "x".join(map(str, s)))
def test_the_kernel_is_the_expression_and_exactly_symmetric_at_gpt2_size(shape):
    """Both products of a Newton-Schulz step, each within one bf16 rounding of its fp32 expression (from the same
    bf16 inputs), and both exactly symmetric."""
    a, b, c = optim.NS_COEFFICIENTS
    x = _wide(shape)
    A = gram.symmetric_gram(x)
    poly = gram.symmetric_gram(A, alpha=c, addend=A, beta=b)
    for got, ref in ((A, gram.gram_reference(x)), (poly, gram.gram_reference(A, c, A, b))):
        assert got.dtype == torch.bfloat16 and got.shape == (shape[0], shape[1], shape[1])
        torch.testing.assert_close(got.float(), ref, rtol=2**-7, atol=1e-3 * ref.abs().max().item())
        assert torch.equal(got, got.mT)


@pytest.mark.parametrize("polar", [False, True], ids=["newton_schulz", "polar_express"])
@pytest.mark.parametrize("shape", BATCHES, ids=lambda s: "x".join(map(str, s)))
def test_muons_iteration_with_the_kernel_is_the_plain_one_at_gpt2_size(shape, polar):
    g = _wide(shape, seed=1)
    fast, plain = optim.orthogonalise(g, symmetric=True, polar=polar), optim.orthogonalise(g, polar=polar)
    gap = _rel(fast, plain)
    x = _wide(shape, seed=2)
    a, b, c = optim.NS_COEFFICIENTS
    A = x @ x.mT
    times = {
        "orthogonalise, kernel": _ms(lambda: optim.orthogonalise(g, symmetric=True)),
        "orthogonalise, cuBLAS": _ms(lambda: optim.orthogonalise(g)),
        "X X^T, kernel": _ms(lambda: gram.symmetric_gram(x)),
        "X X^T, cuBLAS": _ms(lambda: x @ x.mT),
        "bA + cA^2, kernel": _ms(lambda: gram.symmetric_gram(A, alpha=c, addend=A, beta=b)),
        "bA + cA^2, cuBLAS": _ms(lambda: torch.baddbmm(A, A, A, beta=b, alpha=c)),
    }
    print(f"\n{'x'.join(map(str, shape))}{' (polar_express)' if polar else ''} on {torch.cuda.get_device_name()}: "
          f"the two paths {gap:.2e} apart; "
          + "; ".join(f"{k} {v:.3f} ms" for k, v in times.items()))
    assert gap < BF16_REL


def test_the_iteration_with_the_kernel_replays_in_a_cuda_graph():
    """Captured after warm-up on a side stream (as the engine captures Muon's update) and replayed on new updates,
    it gives what the eager iteration gives them: stale or missing work would be far off (a rounding of its own is
    allowed, should cuBLAS pick another algorithm under capture)."""
    static = _wide(BATCHES[0], seed=3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            optim.orthogonalise(static, symmetric=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = optim.orthogonalise(static, symmetric=True)
    for seed in (4, 5):
        new = _wide(BATCHES[0], seed=seed)
        static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(out, optim.orthogonalise(new, symmetric=True)) < 1e-3


def test_a_modern_recipes_step_with_the_rung_trains_as_without_it():
    """The top of `auto` for a Muon recipe (its update inside the CUDA graph) with ns_kernel and without: one graph
    each, the same losses to bf16 rounding (the tolerance tests/runtime/test_recipes_gpu.py allows a replayed step),
    and the kernel in the optimizer."""
    from gpt2ladder.ladder import resolve_rungs, setup_for
    from gpt2ladder.model.recipe import parse_recipe
    from gpt2ladder.runtime.engine import Engine, OptimConfig
    from gpt2ladder.runtime.hardware import detect

    recipe = parse_recipe("muon,rope,qk_norm,relu2,rmsnorm")
    names = resolve_rungs("auto", detect(GPU), recipe=recipe)
    assert "cuda_graph" in names and "ns_kernel" not in names
    shape = dataclasses.replace(TINY, parts=recipe.model_parts)
    batches = random_batches(1) * 8
    losses = []
    for rungs in (names, names + ["ns_kernel"]):
        engine = Engine(shape, setup_for(rungs), GPU, seed=0, optim=OptimConfig(name="muon", lr=3e-3, muon_lr=0.02))
        losses.append([engine.step(x, y).item() for x, y in batches])
        assert engine.captures == 1 and engine.optimizer.symmetric == ("ns_kernel" in rungs)
    plain, fast = losses
    assert fast[-1] < fast[0] - 0.5  # it learns
    for a, b in zip(fast, plain):
        assert abs(a - b) <= 0.02 * abs(b)
