"""tied_grad on a GPU, at the top of `auto`: the compiled backward's tied-weight add is folded (the pass finds the
pattern in the graph that this PyTorch makes for the GPU), and the losses of eight steps are the ones without it, to
the rounding of the step's atomic sums. Skipped without a GPU."""

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from gpu_support import GPU, TINY, needs_cuda, random_batches

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect

pytestmark = pytest.mark.gpu


@needs_cuda
def test_the_top_of_auto_with_tied_grad_folds_one_add_and_keeps_its_losses():
    names = resolve_rungs("auto", detect(GPU))
    batches = random_batches(8)
    runs = []
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        for rungs in (names, names + ["tied_grad"]):
            engine = Engine(TINY, setup_for(rungs), GPU, seed=0)
            runs.append((engine, [engine.step(x, y).item() for x, y in batches]))
    (_, plain), (folded, with_rung) = runs
    assert folded.tied_grad_pass.folded >= 1  # the backward compiled anew (a recompile would count again)
    assert with_rung == pytest.approx(plain, rel=1e-5, abs=0)
    torch.cuda.synchronize()
