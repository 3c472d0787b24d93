"""What a CUDA-graph capture leaves on the GPU beside the graph: skipped without one."""

import pytest
import torch
from gpu_support import GPU, TINY, in_fresh_process, needs_cuda, random_batches

from gpt2ladder.ladder import setup_for
from gpt2ladder.runtime.engine import Engine, _snapshot

pytestmark = pytest.mark.gpu


def idle_in_default_pool() -> int:
    """Bytes the allocator's default pool holds but no tensor uses (the graph's own pool left out)."""
    return sum(s["total_size"] - s["allocated_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s["segment_pool_id"]) == (0, 0))


@needs_cuda
def test_the_capture_leaves_no_idle_memory_beside_the_graph():
    """The graph's pool cannot use memory the default pool caches: after the capture of two accumulated
    micro-batches, the default pool holds less idle memory than half a set of gradients (the warm-up's
    gradients and activations went back to the device; no copy of the weights was kept on it). In a
    process of its own: the tests before it leave cached memory in the default pool."""
    in_fresh_process(__file__, "capture_leaves_no_idle_memory")


def capture_leaves_no_idle_memory():
    torch.cuda.empty_cache()
    engine = Engine(TINY, setup_for(["cuda_graph"]), GPU, seed=0)
    (x, y), (x2, y2) = random_batches(2)
    engine.step(torch.stack([x, x2]), torch.stack([y, y2]))
    torch.cuda.synchronize()
    gradients = 4 * sum(p.numel() for p in engine.raw_model.parameters())
    assert idle_in_default_pool() < gradients / 2


@needs_cuda
def test_the_snapshot_waits_in_host_memory():
    engine = Engine(TINY, setup_for(["cuda_graph"]), GPU, seed=0)
    (x, y), = random_batches(1)
    engine.step(x, y)  # AdamW has state now, as after resuming
    snapshot = _snapshot(engine.raw_model, engine.optimizer)
    saved = list(snapshot["params"].values()) + [v for s in snapshot["state"].values() for v in s.values()
                                                 if torch.is_tensor(v)]
    assert len(saved) > len(snapshot["params"]) and all(t.device.type == "cpu" for t in saved)
