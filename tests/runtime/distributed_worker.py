"""Run by tests/runtime/test_distributed.py under `torch.distributed.run --nproc_per_node=2` on CPU (gloo).

Every rank takes the same steps as a single process would on the global batch, under DDP and FSDP2,
and rank 0 saves what the test compares: gradients, weights after the update, losses, and how many
gradient reductions each micro-step made. Usage: python -m torch.distributed.run ... distributed_worker.py OUT.pt
"""

import dataclasses
import sys

import torch

from gpt2ladder.data import Batches, random_tokens
from gpt2ladder.ladder import Setup
from gpt2ladder.model.config import preset
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.engine import Engine, OptimConfig

GLOBAL_BATCH, SEQ_LEN, ACCUM = 4, 32, 3
# A clip that bites, so the norm of sharded gradients is exercised too. eps well above the smallest
# gradients: AdamW's first update is lr * g / (|g| + eps), which with the default 1e-8 would turn the
# 1e-9 summation-order noise of a 1e-9 gradient into a visible difference of the update.
OPTIM = OptimConfig(lr=1e-3, grad_clip=0.5, eps=1e-5)
# The tiny preset narrowed to 32 wide: GPT-2's vocabulary makes most of its cost, and no step's agreement with one
# process depends on the width.
MODEL = dataclasses.replace(preset("tiny"), n_embd=32)


def micro_batches(dist, accum):
    tokens = random_tokens(20_000, seed=0).train
    batches = Batches(tokens, GLOBAL_BATCH, SEQ_LEN, seed=0, rank=dist.rank, world_size=dist.world_size)
    xs, ys = zip(*(batches.next() for _ in range(accum)))
    return torch.stack(xs), torch.stack(ys)  # (accum, B/W, T)


def engine_for(dist, strategy, setup=Setup()):
    return Engine(MODEL, setup, torch.device("cpu"), seed=0, optim=OPTIM, compile_backend="eager",
                  parallelize=distributed.parallelize_for(dist, strategy))


def full_grads(engine):
    out = {}
    for name, p in engine.raw_model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name] = g.detach().clone()
    return out


def one_step(dist, strategy, accum=1, setup=Setup()):
    """One optimizer step on `accum` micro-batches, recording after each backward whether grads exist."""
    engine = engine_for(dist, strategy, setup)
    calls, grads_seen = [0], []
    if strategy == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            allreduce_hook,
        )

        def counting_hook(state, bucket):
            calls[0] += 1
            return allreduce_hook(state, bucket)

        engine.model.register_comm_hook(None, counting_hook)
    backward = engine._backward

    def recording_backward(loss):
        backward(loss)
        grads_seen.append(all(p.grad is not None for p in engine.raw_model.parameters()))

    engine._backward = recording_backward
    x, y = micro_batches(dist, accum)
    loss = distributed.all_reduce_mean(engine.step(x, y), dist)
    return {"loss": float(loss), "grads": full_grads(engine), "allreduce_calls": calls[0],
            "bucket_bytes": getattr(engine.model, "bucket_bytes_cap", None),
            "grads_after_each_backward": grads_seen,
            "params": distributed.model_state(engine.raw_model)}


def fsdp_checkpoint_round_trip(dist, path):
    """Gather an FSDP2 engine's full state, load it into a fresh sharded engine, step both the same way."""
    first = engine_for(dist, "fsdp")
    x, y = micro_batches(dist, 1)
    first.step(x, y)
    model = distributed.model_state(first.raw_model)
    optim = distributed.optimizer_state(first.raw_model, first.optimizer)
    if dist.is_main:  # only rank 0 holds the gathered state, as when a checkpoint is written
        torch.save({"model": model, "optimizer": optim}, path)
    torch.distributed.barrier()
    saved = torch.load(path, weights_only=True)
    second = engine_for(dist, "fsdp")
    distributed.load_state(second.raw_model, second.optimizer, saved["model"], saved["optimizer"])
    losses = [float(dist.mean(e.step(x, y))) for e in (first, second)]
    states = [distributed.model_state(e.raw_model) for e in (first, second)]
    return {"saved": saved, "losses": losses, "states": states}


def main(out_path):
    dist = distributed.init_from_env("cpu")
    results = {
        "world_size": dist.world_size,
        "ddp": one_step(dist, "ddp"),
        "ddp_accum": one_step(dist, "ddp", accum=ACCUM),
        "ddp_compiled": one_step(dist, "ddp", setup=Setup(compile=True)),
        "ddp_fused": one_step(dist, "ddp", setup=Setup(fused_adamw=True)),
        "fsdp": one_step(dist, "fsdp"),
        "fsdp_compiled": one_step(dist, "fsdp", setup=Setup(compile=True)),
        "fsdp_accum": one_step(dist, "fsdp", accum=ACCUM),
        "fsdp_round_trip": fsdp_checkpoint_round_trip(dist, out_path + ".ckpt"),
    }
    if dist.is_main:
        torch.save(results, out_path)
    distributed.destroy(dist)


if __name__ == "__main__":
    main(sys.argv[1])
