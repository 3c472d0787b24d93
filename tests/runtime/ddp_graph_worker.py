"""Run by test_ddp_graph_gpu.py under torchrun with NCCL: the same DDP steps eager and replayed from a
CUDA graph that holds the all-reduces, with gradient accumulation, and that graph with its memsets rewritten as fill
kernels (memset_fill, where graphs can be edited); rank 0 saves each run's loss curve and final weights.
Usage: torchrun --nproc_per_node=N ddp_graph_worker.py OUT.pt"""

import sys

import torch

from gpt2ladder.data import Batches, random_tokens
from gpt2ladder.ladder import setup_for
from gpt2ladder.model.config import preset
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import graph_edit_problem

RUNGS = ["baseline", "tf32", "bf16", "flash", "vocab", "fused_adamw"]  # eager: the same kernels either way
ACCUM, MICRO, SEQ, STEPS = 2, 4, 128, 5


def run(dist, graph: tuple[str, ...]):
    device = torch.device("cuda", dist.local_rank)
    setup = setup_for(RUNGS + list(graph))
    engine = Engine(preset("tiny"), setup, device, seed=0,
                    parallelize=distributed.parallelize_for(dist, "ddp"))
    batches = Batches(random_tokens(50_000, seed=0).train, ACCUM * MICRO * dist.world_size, SEQ, seed=0,
                      rank=dist.rank, world_size=dist.world_size)
    losses = []
    for _ in range(STEPS):
        x, y = (t.view(ACCUM, MICRO, SEQ).to(device) for t in batches.next())
        losses.append(float(distributed.all_reduce_mean(engine.step(x, y), dist)))
    weights = {n: p.detach().float().cpu() for n, p in engine.raw_model.named_parameters()}
    return losses, weights


if __name__ == "__main__":
    with distributed.launched("cuda") as dist:
        eager, graphed = run(dist, ()), run(dist, ("cuda_graph",))
        # the memsets cuBLAS (and NCCL, if it makes any) leaves in the graph, rewritten as auto runs them
        filled = None if graph_edit_problem() else run(dist, ("cuda_graph", "memset_fill"))
        if dist.is_main:
            torch.save({"eager": eager, "graphed": graphed, "filled": filled, "world_size": dist.world_size},
                       sys.argv[1])
