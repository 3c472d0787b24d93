"""Many processes, one model: torchrun's environment, the process group, DDP / FSDP2, and reductions.

Everything here is PyTorch's own engine (torch.distributed with NCCL on GPUs and gloo on CPU, DDP,
FSDP2's `fully_shard`, torch.distributed.checkpoint's state-dict helpers); nothing is hand-rolled.

Launch with torchrun, one process per GPU:

    torchrun --nproc_per_node=4 -m gpt2ladder train --preset gpt2 ...

Without torchrun's variables every function here is a no-op on a single process (`Dist(0, 0, 1, None)`),
so one process runs the same code with no process group at all.

The order the engine applies things in (see `engine.py`): build the model -> device -> the model rewrites
(`speedups.apply`) -> `parallelize` (FSDP2: `fully_shard` every Block, then the root; DDP: the wrapper)
-> compile -> optimizer. FSDP2 must run before the optimizer exists because it replaces every parameter
by a sharded DTensor.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as tdist
from torch import nn

from gpt2ladder.errors import UsageError

STRATEGIES = ("auto", "ddp", "fsdp")
# Models too large for a full replica (weights + AdamW state + gradients) per GPU to be the right
# default: gpt2-large is 774M parameters (12 GB of fp32 state), gpt2-xl 1.56B (25 GB).
FSDP_BY_DEFAULT = ("gpt2-large", "gpt2-xl")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# NVLink multicast (NVLS) can put a shared host's GPUs out of service; it stays off unless the user
# explicitly turns it on in their own environment. setdefault: an existing value is never changed.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# A CUDA graph that holds DDP's all-reduces needs NCCL's async error handling off (PyTorch's CUDA-graph
# notes); set before the process group starts, and only where the user has not set it.
GRAPH_SAFE_NCCL = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}


@dataclass(frozen=True)
class Dist:
    """Where this process stands: its rank among world_size, its GPU (local_rank) and the backend.

    backend is None for a plain single process (no process group).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0 alone prints, writes files and plots."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.backend is not None

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar tensor over all ranks (a collective: every rank calls it)."""
        return all_reduce_mean(value, self)


SINGLE = Dist()


def under_torchrun(env=None) -> bool:
    env = os.environ if env is None else env
    return all(name in env for name in TORCHRUN_VARS)


def _env_ints(env) -> tuple[int, int, int]:
    try:
        rank, local, world = (int(env[name]) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    except ValueError:
        raise UsageError("RANK, LOCAL_RANK and WORLD_SIZE must be integers; launch with torchrun") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise UsageError(f"inconsistent torchrun environment: RANK={rank}, LOCAL_RANK={local}, WORLD_SIZE={world}")
    return rank, local, world


def init_from_env(device_spec: str = "auto") -> Dist:
    """Join torchrun's process group (NCCL on CUDA, gloo otherwise); a single process without torchrun."""
    if not under_torchrun():
        return SINGLE
    rank, local, world = _env_ints(os.environ)
    for name, value in {**MULTICAST_OFF, **GRAPH_SAFE_NCCL}.items():
        os.environ.setdefault(name, value)
    device = _base_device(device_spec)
    if device.type == "cuda":
        # LOCAL_WORLD_SIZE, not LOCAL_RANK: every rank finds the same mistake, so rank 0 can report it.
        per_node, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", local + 1)), torch.cuda.device_count()
        if per_node > gpus:
            raise UsageError(f"--nproc_per_node={per_node} but this node sees {gpus} GPU(s); "
                             f"use at most {gpus} processes per node")
        torch.cuda.set_device(local)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not tdist.is_initialized():
        extra = {"device_id": torch.device("cuda", local)} if backend == "nccl" else {}
        tdist.init_process_group(backend=backend, **extra)
    return Dist(rank=rank, local_rank=local, world_size=world, backend=backend)


def _base_device(device_spec: str, multi: bool = True) -> torch.device:
    from gpt2ladder.runtime.hardware import resolve_device

    device = resolve_device(device_spec)
    if multi and device.type not in ("cuda", "cpu"):
        raise UsageError(f"torchrun runs need CUDA GPUs or the CPU, not {device.type}; pass --device cpu")
    return device


def local_device(dist: Dist, device_spec: str = "auto") -> torch.device:
    """This process's device: its own GPU under NCCL, else what --device names."""
    if dist.backend == "nccl":
        return torch.device("cuda", dist.local_rank)
    return _base_device(device_spec, multi=dist.enabled)


def destroy(dist: Dist, clean: bool = True) -> None:
    """Leave the process group. The barrier first lets gloo peers finish before sockets close."""
    if not (dist.enabled and tdist.is_initialized()):
        return
    if clean:
        tdist.barrier()
    tdist.destroy_process_group()


@contextlib.contextmanager
def launched(device_spec: str = "auto"):
    """`with launched(args.device) as dist:` joins torchrun's group (if any) and always leaves it."""
    dist = init_from_env(device_spec)
    clean = False
    try:
        yield dist
        clean = True
    finally:
        destroy(dist, clean)  # after an error no barrier: the other ranks may never reach it


# --- strategy ---------------------------------------------------------------------------------


def resolve_strategy(strategy: str, preset_name: str, dist: Dist) -> str | None:
    """'ddp' or 'fsdp' under torchrun (auto: FSDP2 for gpt2-large/xl); None for a single process."""
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown --strategy {strategy!r}; choose {', '.join(STRATEGIES)}")
    if not dist.enabled:
        if strategy != "auto":
            raise UsageError(f"--strategy {strategy} needs several processes: launch with "
                             "torchrun --nproc_per_node=N -m gpt2ladder ...")
        return None
    if strategy == "auto":
        return "fsdp" if preset_name in FSDP_BY_DEFAULT else "ddp"
    return strategy


# Compiled, dynamo cuts the backward graph at every DDP bucket so all-reduces overlap it (see engine.py).
# DDP's default 25 MB buckets cut GPT-2 124M's fp32 gradients (~500 MB) into ~20 graphs, losing fusion
# and adding launches: on two GPUs 25 MB buckets scaled far worse than 200 MB or one uncut graph (no
# overlap at all; the record is in benchmarks/RECORDS.md). 200 MB keeps some overlap for the larger presets.
DDP_BUCKET_MB = 200


def wrap_for_data_parallel(model: nn.Module, dist: Dist, strategy: str | None) -> nn.Module:
    """The model as the data-parallel strategy wants it; `Engine(parallelize=...)` calls this.

    DDP returns a wrapper (the engine keeps the raw model for checkpoints). FSDP2 shards in place and
    returns the same module, whose parameters are now DTensors: call it before the optimizer exists.
    """
    if strategy is None:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [dist.local_rank] if dist.backend == "nccl" else None
        # Gradients live in the all-reduce buckets themselves: one copy fewer per step. No buffer
        # broadcast: the only buffer is the constant causal mask, the same on every rank. (For a CUDA
        # graph the engine calls this on its capture stream, as PyTorch's CUDA-graph notes ask.)
        return DDP(model, device_ids=ids, gradient_as_bucket_view=True, bucket_cap_mb=DDP_BUCKET_MB,
                   broadcast_buffers=False)
    if strategy == "fsdp":
        return shard_model(model, dist)
    raise UsageError(f"unknown data-parallel strategy {strategy!r}")


def shard_model(model: nn.Module, dist: Dist) -> nn.Module:
    """FSDP2: each transformer Block is one all-gather / reduce-scatter unit, the root holds the rest.

    Parameters stay fp32 (autocast does the low-precision compute, as on one GPU), so the weights
    train exactly as they would unsharded.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device_type = "cuda" if dist.backend == "nccl" else "cpu"
    mesh = init_device_mesh(device_type, (dist.world_size,))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    # The root (embeddings, tied classifier, final norm) is needed again first in backward, so it is
    # not resharded after forward.
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def parallelize_for(dist: Dist, strategy: str | None) -> Callable[[nn.Module], nn.Module] | None:
    """The `parallelize` argument for `Engine` under a resolved strategy ("ddp", "fsdp"; None: one process)."""
    if strategy is None:
        return None
    return functools.partial(wrap_for_data_parallel, dist=dist, strategy=strategy)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


# --- reductions -------------------------------------------------------------------------------


def _comm_device(dist: Dist) -> torch.device:
    return torch.device("cuda", dist.local_rank) if dist.backend == "nccl" else torch.device("cpu")


def all_reduce_mean(value: torch.Tensor, dist: Dist) -> torch.Tensor:
    """The mean of a scalar tensor over ranks (SUM / world: gloo has no AVG). Every rank calls it."""
    if not dist.enabled:
        return value
    t = value.detach().to(_comm_device(dist), torch.float32).clone()
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return (t / dist.world_size).to(value.device)


def reduce_floats(values: list[float], dist: Dist, op: str = "max") -> list[float]:
    """Element-wise max, min or sum of a list of numbers over ranks; the same list on every rank."""
    if not dist.enabled:
        return list(values)
    ops = {"max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN, "sum": tdist.ReduceOp.SUM}
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device(dist))
    tdist.all_reduce(t, op=ops[op])
    return t.tolist()


# --- checkpoints --------------------------------------------------------------------------------
# A checkpoint always holds the unwrapped, full state in the single-process layout (parameter names
# without "module."; optimizer state keyed by parameter index), so it resumes on any number of ranks.


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Gathered to rank 0's CPU memory: the other ranks get an empty dict and write nothing.
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def model_state(model: nn.Module) -> dict:
    """The raw model's full state dict. Under FSDP2 a collective: every rank calls it, rank 0 gets it."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's full state in `optimizer.state_dict()` layout; a collective under FSDP2."""
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer, options=_full_options())
    return _names_to_indices(full) if full else {}


def load_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, model_sd: dict,
               optim_sd: dict | None) -> None:
    """Load a full (single-process layout) state into a raw, DDP'd or FSDP2-sharded model on every rank."""
    if not is_sharded(model):
        model.load_state_dict(model_sd)
        if optimizer is not None and optim_sd is not None:
            optimizer.load_state_dict(optim_sd)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)  # each rank keeps only its shard of the full tensors
    set_model_state_dict(model, model_sd, options=options)
    if optimizer is not None and optim_sd is not None:
        # The library initialises empty optimizer state with a zero-gradient step; stale grads stop it.
        optimizer.zero_grad(set_to_none=True)
        named = _param_names(model, optimizer)
        set_optimizer_state_dict(model, optimizer, _indices_to_names(optim_sd, named), options=options)


def _names_to_indices(full: dict) -> dict:
    """torch.distributed.checkpoint's name-keyed optimizer state -> optimizer.state_dict()'s index keys.

    Indices count the parameters of all groups in order, as `Optimizer.state_dict` numbers them.
    """
    names = [n for g in full["param_groups"] for n in g["params"]]
    index = {n: i for i, n in enumerate(names)}
    groups, start = [], 0
    for g in full["param_groups"]:
        groups.append({**g, "params": list(range(start, start + len(g["params"])))})
        start += len(g["params"])
    return {"state": {index[n]: s for n, s in full["state"].items()}, "param_groups": groups}


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of every optimizer parameter, in index order (the tied classifier is `transformer.wte`)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _indices_to_names(optim_sd: dict, names: list[str]) -> dict:
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in optim_sd["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in optim_sd["state"].items()}, "param_groups": groups}
