"""The tied_grad rung: the pass that adds the embedding's gradient rows into the classifier's gradient instead of into
zeros rewrites exactly that pattern, computes the same sums, and in the compiled step of the tiny model rewrites the
tied weight's one add and changes no loss."""

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch.fx.experimental.proxy_tensor import make_fx

from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.speedups.tied_grad import fold

aten = torch.ops.aten
ROWS, COLS = 40, 8


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(ROWS, COLS, generator=gen)
    idx = torch.randint(0, ROWS, (30,), generator=gen)  # repeats: the scatter must accumulate
    vals = torch.randn(30, COLS, generator=gen)
    return dense, idx, vals


def tied(dense, idx, vals):
    return dense + torch.zeros(ROWS, COLS).index_put((idx,), vals, accumulate=True)


def tied_masked(dense, idx, vals):  # the form an embedding's backward decomposes into; some rows masked out
    mask = (idx % 3 != 0).unsqueeze(-1)
    return aten._unsafe_masked_index_put_accumulate(torch.zeros(ROWS, COLS), mask, [idx], vals) + dense


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("fn", [tied, tied_masked])
def test_the_scatter_takes_the_dense_gradient_as_its_base_and_sums_the_same(fn):
    args = _inputs()
    gm = make_fx(fn)(*args)
    expected = gm(*args)
    assert aten.add.Tensor in _targets(gm)
    assert fold(gm.graph) == 1
    gm.recompile()
    targets = _targets(gm)
    assert aten.add.Tensor not in targets and aten.full.default not in targets and aten.zeros.default not in targets
    torch.testing.assert_close(gm(*args), expected)  # the same terms, summed in another order
    assert not torch.equal(expected, args[0])  # the rows did land


def keeps_its_scatter(dense, idx, vals):  # the scatter is read twice: it must stay
    scattered = torch.zeros(ROWS, COLS).index_put((idx,), vals, accumulate=True)
    return dense + scattered, scattered


def ones_base(dense, idx, vals):  # not zeros
    return dense + torch.ones(ROWS, COLS).index_put((idx,), vals, accumulate=True)


def overwrites(dense, idx, vals):  # accumulate=False: the last row wins, not a sum
    return dense + torch.zeros(ROWS, COLS).index_put((idx,), vals)


def broadcasts(dense, idx, vals):  # the add broadcasts a row over the scatter: another shape
    return dense[:1] + torch.zeros(ROWS, COLS).index_put((idx,), vals, accumulate=True)


def promotes(dense, idx, vals):  # a float64 sum of a float32 scatter: another dtype
    return dense.double() + torch.zeros(ROWS, COLS).index_put((idx,), vals, accumulate=True)


def scaled(dense, idx, vals):  # add's alpha scales the scatter
    return torch.add(dense, torch.zeros(ROWS, COLS).index_put((idx,), vals, accumulate=True), alpha=2)


def doubled(dense, idx, vals):  # the scatter added to itself: no other operand to take as its base
    scattered = torch.zeros(ROWS, COLS).index_put((idx,), vals, accumulate=True)
    return scattered + scattered


@pytest.mark.parametrize("fn", [keeps_its_scatter, ones_base, overwrites, broadcasts, promotes, scaled, doubled])
def test_anything_else_is_left_alone(fn):
    gm = make_fx(fn)(*_inputs())
    before = [str(n.format_node()) for n in gm.graph.nodes]
    assert fold(gm.graph) == 0
    assert [str(n.format_node()) for n in gm.graph.nodes] == before


@pytest.mark.slow
def test_the_compiled_step_folds_the_tied_weights_add_and_keeps_its_losses():
    """Inductor on the CPU, its caches off so that the pass runs: one add folded (the tied weight's; the position
    embedding's scatter is its gradient as it is), and three steps give the same losses and weights. The tokens come
    from a small range, so that rows repeat and the scatter sums several into one."""
    names = ["baseline", "compile", "flash", "vocab", "fused_adamw", "fused_loss"]
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 40, (2, 64), generator=gen), torch.randint(0, 50257, (2, 64), generator=gen))
               for _ in range(3)]
    results = []
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        for rungs in (names, names + ["tied_grad"]):
            engine = Engine(PRESETS["tiny"], setup_for(rungs), torch.device("cpu"))
            losses = [engine.step(x, y).item() for x, y in batches]
            results.append((engine, losses, engine.raw_model.lm_head.weight.detach().clone()))
    (plain, plain_losses, plain_w), (folded, folded_losses, folded_w) = results
    assert plain.tied_grad_pass is None and folded.tied_grad_pass.folded == 1
    assert folded_losses == pytest.approx(plain_losses, rel=1e-6, abs=0)
    # Adam turns last-bit differences of near-zero gradients (the sums' order) into steps of up to lr's size
    torch.testing.assert_close(folded_w, plain_w, rtol=1e-5, atol=1e-6)
    assert folded.raw_model.transformer.wte.weight is folded.raw_model.lm_head.weight  # still tied
