"""The CUDA graph of a whole step on a GPU; skipped without one."""

import pytest
from gpu_support import GPU, TINY, needs_cuda, random_batches, step_losses

pytestmark = pytest.mark.gpu


@needs_cuda
def test_cuda_graph_replays_the_same_steps():
    """Capture warms up and then undoes its warm-up updates: the losses equal plain eager steps."""
    batches = random_batches(5)
    plain = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"], batches)
    graphed = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph"],
                          batches)
    assert graphed == pytest.approx(plain, rel=2e-3)


@needs_cuda
def test_a_graphed_engine_resumed_from_its_state_keeps_its_device_learning_rate():
    """Engine.load_state_dict writes the saved learning rate into the tensor the captured graph reads: a
    graphed run stopped after 3 steps and loaded into a fresh engine steps on as the one never stopped."""
    from gpt2ladder.ladder import setup_for
    from gpt2ladder.runtime.engine import Engine

    names = ["baseline", "tf32", "bf16", "flash", "vocab", "fused_adamw", "cuda_graph"]
    batches, lrs = random_batches(6), [1e-3, 8e-4, 6e-4, 4e-4, 2e-4, 1e-4]

    def steps(engine, part):
        out = []
        for (x, y), lr in part:
            engine.set_lr(lr)
            out.append(engine.step(x, y).item())
        return out

    pairs = list(zip(batches, lrs))
    whole = steps(Engine(TINY, setup_for(names), GPU, seed=0), pairs)
    first = Engine(TINY, setup_for(names), GPU, seed=0)
    steps(first, pairs[:3])
    resumed = Engine(TINY, setup_for(names), GPU, seed=1)  # other weights: all of them come from the state
    lr_tensor = resumed.optimizer.param_groups[0]["lr"]
    resumed.load_state_dict(first.state_dict())
    assert resumed.optimizer.param_groups[0]["lr"] is lr_tensor and lr_tensor.device.type == "cuda"
    assert steps(resumed, pairs[3:]) == pytest.approx(whole[3:], rel=2e-3)
