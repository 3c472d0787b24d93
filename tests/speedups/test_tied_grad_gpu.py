"""tied_grad on a GPU, at the top of `auto`: the compiled backward's tied-weight add is folded (the pass finds the
pattern in the graph that this PyTorch makes for the GPU), one step's gradients are the ones without it to the
rounding of the step's atomic sums (the tied weight's rows of the batch's tokens, where the embedding's rows land,
included), and eight steps' losses stay within what two runs of the same setup differ by. Skipped without a GPU."""

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from gpu_support import GPU, LOSS_ROUNDING, TINY, auto_without, grad_gaps, needs_cuda, random_batches

from gpt2ladder.ladder import setup_for
from gpt2ladder.runtime.engine import Engine

pytestmark = pytest.mark.gpu


@needs_cuda
def test_the_top_of_auto_with_tied_grad_folds_one_add_and_keeps_its_gradients_and_losses():
    names = auto_without("tied_grad")
    batches = random_batches(8)
    engines, losses = [], []
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        for rungs in (names, names + ["tied_grad"]):
            engine = Engine(TINY, setup_for(rungs), GPU, seed=0)
            losses.append([engine.step(*batches[0]).item()])
            engines.append(engine)
    plain, folded = engines
    assert folded.tied_grad_pass.folded >= 1  # the backward compiled anew (a recompile would count again)
    gaps = grad_gaps(folded, plain)
    rows = batches[0][0].unique()
    tied = [e.raw_model.transformer.wte.weight.grad[rows].float() for e in engines]
    rows_gap = ((tied[1] - tied[0]).norm() / tied[0].norm()).item()
    print(f"largest gradient gap {max(gaps.values()):.2e}, tied weight's batch rows {rows_gap:.2e}")
    assert max(gaps.values()) < 1e-3 and rows_gap < 1e-3, (gaps, rows_gap)
    for engine, run in zip(engines, losses):
        run += [engine.step(x, y).item() for x, y in batches[1:]]
    print("losses", *zip(*losses))
    assert losses[1] == pytest.approx(losses[0], rel=0, abs=LOSS_ROUNDING)
    assert losses[1][-1] < losses[1][0]
    torch.cuda.synchronize()
