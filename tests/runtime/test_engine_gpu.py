"""The CUDA graph of a whole step on a GPU; skipped without one."""

import pytest
from gpu_support import needs_cuda, random_batches, step_losses

pytestmark = pytest.mark.gpu


@needs_cuda
def test_cuda_graph_replays_the_same_steps():
    """Capture warms up and then undoes its warm-up updates: the losses equal plain eager steps."""
    batches = random_batches(5)
    plain = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw"], batches)
    graphed = step_losses(["baseline", "tf32", "bf16", "compile", "flash", "vocab", "fused_adamw", "cuda_graph"], batches)
    assert graphed == pytest.approx(plain, rel=2e-3)
