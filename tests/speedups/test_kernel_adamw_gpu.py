"""KernelAdamW on a GPU at the top of `auto`, told to leave the gradients as they were given (STORES_UNSCALED_GRADS
off): the losses of eight steps are the ones with the divided gradients stored, to the rounding of the step's atomic
sums. Skipped without a GPU."""

import pytest
from gpu_support import GPU, TINY, needs_cuda, needs_triton, random_batches

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect
from gpt2ladder.speedups import kernel_adamw

pytestmark = pytest.mark.gpu


@needs_cuda
@needs_triton
def test_the_top_of_auto_leaving_the_gradients_scaled_keeps_its_losses(monkeypatch):
    names = resolve_rungs("auto", detect(GPU))
    assert "adamw_kernel" in names
    batches = random_batches(8)
    losses = {}
    for stores in (True, False):
        monkeypatch.setattr(kernel_adamw, "STORES_UNSCALED_GRADS", stores)
        engine = Engine(TINY, setup_for(names), GPU, seed=0)
        assert engine.optimizer.unscaled_grads is stores
        losses[stores] = [engine.step(x, y).item() for x, y in batches]
    assert losses[False] == pytest.approx(losses[True], rel=1e-5, abs=0)
    assert losses[False][-1] < losses[False][0]
