"""KernelAdamW on a GPU at the top of `auto`, in a clipped step (as `train`'s), told to leave the gradients as they
were given (its `unscaled_grads` off): the first step's update reads the clipped gradients either way (AdamW's first
moment), the losses of eight steps are the ones with the divided gradients stored, to what two runs of the same setup
differ by (`LOSS_ROUNDING`), and the gradients after the step are the clipped ones only when stored. Skipped without a
GPU."""

import pytest
import torch
from gpu_support import GPU, LOSS_ROUNDING, TINY, needs_cuda, needs_triton, random_batches

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.runtime.engine import Engine, OptimConfig
from gpt2ladder.runtime.hardware import detect

pytestmark = pytest.mark.gpu
CLIP = 0.05  # far below the tiny model's gradient norm, so every step divides by clipping's factor


@needs_cuda
@needs_triton
def test_the_top_of_auto_leaving_the_gradients_scaled_keeps_its_losses():
    names = resolve_rungs("auto", detect(GPU))
    assert "adamw_kernel" in names
    batches = random_batches(8)
    losses, norms, moments = {}, {}, {}
    for stores in (True, False):
        engine = Engine(TINY, setup_for(names), GPU, seed=0, optim=OptimConfig(grad_clip=CLIP))
        assert engine.optimizer.unscaled_grads  # as the engine builds it
        engine.optimizer.unscaled_grads = stores
        losses[stores] = [engine.step(*batches[0]).item()]
        # after one step AdamW's first moment is (1 - beta1) times the clipped gradient: divided as the kernel read it
        moments[stores] = [engine.optimizer.state[p]["exp_avg"].clone() for p in engine.raw_model.parameters()]
        losses[stores] += [engine.step(x, y).item() for x, y in batches[1:]]
        grads = [p.grad for p in engine.raw_model.parameters() if p.grad is not None]
        norms[stores] = torch.nn.utils.get_total_norm(grads).item()
    gaps = [((a - b).norm() / b.norm()).item() for a, b in zip(moments[False], moments[True])]
    print(f"largest first-moment gap after one step {max(gaps):.2e}; losses", *zip(losses[True], losses[False]))
    assert max(gaps) < 1e-3  # the same clipped gradients (to the step's atomic sums); unclipped they are far apart
    assert losses[False] == pytest.approx(losses[True], rel=0, abs=LOSS_ROUNDING)
    assert losses[False][-1] < losses[False][0]
    assert norms[True] == pytest.approx(CLIP, rel=1e-3)  # stored divided: the clipped gradients
    assert norms[False] > 2 * CLIP  # left as given: the gradients before clipping
