"""`gpt2ladder train`: flags -> `TrainConfig` -> `run_training` (training/trainer.py) -> the run directory."""

from __future__ import annotations

import dataclasses
import os

import torch

from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV, defaults
from gpt2ladder.errors import DeviceOutOfMemory
from gpt2ladder.ladder import (
    left_out_of_auto,
    resolve_rungs,
    why_unavailable,
)
from gpt2ladder.measure.batch import plan_training
from gpt2ladder.report.records import output_dir
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.hardware import cap_memory, detect
from gpt2ladder.training.config import TrainConfig, model_config_for
from gpt2ladder.training.trainer import run_training


def usable_rungs(spec: str, caps, strategy: str | None = None, notify=print) -> tuple[str, ...]:
    """The requested rungs less those this machine (or the data-parallel strategy) cannot run, each
    named with its reason."""
    usable = []
    if spec == "auto":
        for name, why in left_out_of_auto(caps, strategy).items():
            notify(f"notice: auto leaves out rung {name}: {why}")
    for name in resolve_rungs(spec, caps, strategy):
        reason = why_unavailable(name, caps, strategy)
        if reason:
            notify(f"notice: leaving out rung {name}: {reason}")
        else:
            usable.append(name)
    return tuple(usable) or ("baseline",)


def config_from_args(args, device: torch.device, caps, world_size: int = 1, notify=print,
                     strategy: str | None = None) -> TrainConfig:
    """The run's config. Tokens per step: --tokens-per-step, else the default batch (16 x 1024 for
    gpt2 on a GPU) per process. The micro-batch: --batch-size, else on a GPU the largest that fits and
    divides the step (`measure.batch.plan_batch`), accumulation making up the rest."""
    d = defaults("train", device)
    steps = args.steps or d["steps"]
    name = args.preset or d["preset"]
    block = model_config_for(name, args.init_from).block_size
    seq_len = args.seq_len or min(d["seq_len"] or block, block)
    batch = args.batch_size or d["batch_size"]
    tokens_per_step = args.tokens_per_step or batch * seq_len * world_size
    rungs = usable_rungs(args.rungs, caps, strategy, notify)
    cfg = TrainConfig(
        preset=name, rungs=rungs, batch_size=batch, seq_len=seq_len, tokens_per_step=tokens_per_step, steps=steps,
        lr=args.lr, min_lr=args.lr / 10 if args.min_lr is None else args.min_lr,
        warmup_steps=int(0.05 * steps) if args.warmup_steps is None else args.warmup_steps,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip,
        eval_every=max(1, steps // 10) if args.eval_every is None else args.eval_every,
        eval_batches=args.eval_batches,
        ckpt_every=max(1, steps // 5) if args.ckpt_every is None else args.ckpt_every,
        seed=args.seed, data=args.data, init_from=args.init_from,
        compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor",
    )
    return cfg


def planned_config(args, device: torch.device, caps, world_size: int, notify, strategy) -> tuple[TrainConfig, object]:
    """config_from_args, with the micro-batch planned on a GPU when --batch-size is not given, and the
    CUDA graph left out (said in a notice) where only the step without it fits (`plan_training`)."""
    cfg = config_from_args(args, device, caps, world_size, notify, strategy)
    if args.batch_size or device.type != "cuda":
        return cfg, None
    per_rank = cfg.tokens_per_step // (cfg.seq_len * world_size)
    rungs, plan, notice = plan_training(cfg.model_config(), cfg.rungs, cfg.seq_len, caps, device, per_rank,
                                        validates=bool(cfg.eval_every), graph_only_too=args.rungs == "auto",
                                        seed=cfg.seed)
    if notice:
        notify(notice)
    return dataclasses.replace(cfg, rungs=rungs, batch_size=plan.batch), plan


def first_line(cfg: TrainConfig, world_size: int, plan) -> str:
    """micro-batch x accumulation = tokens per step, and why that micro-batch."""
    accum = cfg.grad_accum(world_size)
    text = (f"gpt2ladder train: micro-batch {cfg.batch_size} x {accum} accumulation step{'s' if accum > 1 else ''}"
            f"{f' x {world_size} processes' if world_size > 1 else ''} = {cfg.tokens_per_step:,} tokens per step "
            f"({cfg.tokens_per_step // cfg.seq_len} sequences of {cfg.seq_len})")
    return text + (f"; {plan.reason()}" if plan else "")


def train_command(args) -> int:
    with distributed.launched(args.device) as dist:  # a plain single process without torchrun
        return _train_command(args, dist)


def _train_command(args, dist: distributed.Dist) -> int:
    device = distributed.local_device(dist, args.device)
    say = print if dist.is_main else (lambda *a, **k: None)
    caps = cap_memory(device, detect(device), args.gpu_memory)
    strategy = distributed.resolve_strategy(args.strategy, args.preset or defaults("train", device)["preset"], dist)
    notices: list[str] = []
    cfg, plan = planned_config(args, device, caps, dist.world_size, notices.append, strategy)
    if plan is not None and dist.enabled:  # every rank must run the same micro-batch
        batch = int(distributed.reduce_floats([cfg.batch_size], dist, "min")[0])
        cfg = dataclasses.replace(cfg, batch_size=batch)
    say(first_line(cfg, dist.world_size, plan), flush=True)
    for line in notices:
        say(line, flush=True)
    with output_dir(args.out) as out:  # removed again if the run fails before writing anything there
        try:
            result = run_training(cfg, device, out, resume=args.resume, progress=not args.no_progress, ranks=dist,
                                  strategy=strategy, allow_data_change=args.allow_data_change, caps=caps,
                                  batch_plan=plan)
        except torch.OutOfMemoryError as err:  # the one line names what to change at this micro-batch
            raise DeviceOutOfMemory(cfg.batch_size, "micro-batch") from err
    return result.exit_code
