"""`gpt2ladder train`: flags -> `TrainConfig` -> `run_training` (training/trainer.py) -> the run directory."""

from __future__ import annotations

import os

import torch

from gpt2ladder.commands.defaults import defaults
from gpt2ladder.ladder import resolve_rungs, why_unavailable
from gpt2ladder.report.records import output_dir
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.hardware import detect
from gpt2ladder.training.config import TrainConfig, model_config_for
from gpt2ladder.training.trainer import run_training

# Lets CPU tests run the compile rung with backend "eager" (seconds, not minutes). Not a user setting;
# the default is Inductor, the backend the rung is about.
COMPILE_BACKEND_ENV = "GPT2LADDER_COMPILE_BACKEND"


def usable_rungs(spec: str, caps, strategy: str | None = None, notify=print) -> tuple[str, ...]:
    """The requested rungs less those this machine (or the data-parallel strategy) cannot run, each
    named with its reason."""
    usable = []
    for name in resolve_rungs(spec, caps):
        reason = why_unavailable(name, caps, strategy)
        if reason:
            notify(f"notice: leaving out rung {name}: {reason}")
        else:
            usable.append(name)
    return tuple(usable) or ("baseline",)


def config_from_args(args, device: torch.device, caps, world_size: int = 1, notify=print,
                     strategy: str | None = None) -> TrainConfig:
    d = defaults("train", device)
    steps = args.steps or d["steps"]
    batch = args.batch_size or d["batch_size"]
    name = args.preset or d["preset"]
    block = model_config_for(name, args.init_from).block_size
    seq_len = args.seq_len or min(d["seq_len"] or block, block)
    return TrainConfig(
        preset=name, rungs=usable_rungs(args.rungs, caps, strategy, notify), batch_size=batch, seq_len=seq_len,
        tokens_per_step=args.tokens_per_step or batch * seq_len * world_size, steps=steps,
        lr=args.lr, min_lr=args.lr / 10 if args.min_lr is None else args.min_lr,
        warmup_steps=int(0.05 * steps) if args.warmup_steps is None else args.warmup_steps,
        weight_decay=args.weight_decay, grad_clip=args.grad_clip,
        eval_every=max(1, steps // 10) if args.eval_every is None else args.eval_every,
        eval_batches=args.eval_batches,
        ckpt_every=max(1, steps // 5) if args.ckpt_every is None else args.ckpt_every,
        seed=args.seed, data=args.data, init_from=args.init_from,
        compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor",
    )


def train_command(args) -> int:
    with distributed.launched(args.device) as dist:  # a plain single process without torchrun
        return _train_command(args, dist)


def _train_command(args, dist: distributed.Dist) -> int:
    device = distributed.local_device(dist, args.device)
    notify = print if dist.is_main else (lambda *a, **k: None)
    strategy = distributed.resolve_strategy(args.strategy, args.preset or defaults("train", device)["preset"], dist)
    cfg = config_from_args(args, device, detect(device), dist.world_size, notify, strategy)
    with output_dir(args.out) as out:  # removed again if the run fails before writing anything there
        result = run_training(cfg, device, out, resume=args.resume, progress=not args.no_progress, ranks=dist,
                              strategy=strategy, allow_data_change=args.allow_data_change)
    return result.exit_code
