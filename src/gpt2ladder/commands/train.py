"""`gpt2ladder train`: flags -> `TrainConfig` -> `train_claimed` (training/run.py) -> the run directory.

Every decision is made here, once, before the run starts: the run directory is claimed, the
checkpoint that --resume continues is read, each setting comes from its flag when one is given, else
from that checkpoint (a resumed run keeps its own settings), else from this device's defaults; then
the text is read, on a GPU the micro-batch is planned, the sizes are checked against the memory they
need (before anything of that size is allocated), and HellaSwag's data is read for --hellaswag-every.
Every check of the user's input fails before the run prints anything.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder import defaults as rules
from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV, MUON_RATES, defaults
from gpt2ladder.errors import DeviceOutOfMemory, LadderError, UsageError
from gpt2ladder.ladder import (
    left_out_of_auto,
    resolve_rungs,
    setup_for,
    why_unavailable,
)
from gpt2ladder.measure.batch import plan_training
from gpt2ladder.model.config import ModelConfig, preset
from gpt2ladder.model.modern import block_mask_problem
from gpt2ladder.model.recipe import GPT2, WSD_DECAY_FRACTION, Recipe, parse_recipe
from gpt2ladder.model.setup import Setup
from gpt2ladder.report.notices import left_out, recipe_left_out
from gpt2ladder.report.records import output_dir
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.engine import built_model_config
from gpt2ladder.runtime.optim import strategy_problem
from gpt2ladder.runtime.hardware import cap_memory, detect
from gpt2ladder.runtime.memory import check_fits
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.outdirs import check_run_out
from gpt2ladder.training.run import Saved, claimed, other_text_refused, prepared_hellaswag, saved_run, train_claimed

# The settings a resumed run keeps unless their flag is given (the micro-batch is re-planned on a GPU:
# it changes how a step runs, not what it computes).
SETTINGS = ("preset", "rungs", "batch_size", "seq_len", "tokens_per_step", "steps", "lr", "min_lr", "warmup_steps",
            "weight_decay", "grad_clip", "eval_every", "eval_batches", "ckpt_every", "seed", "data", "init_from",
            "val_tokens", "hellaswag_every", "hellaswag_data", "target_val_loss", "recipe", "muon_lr", "embed_lr",
            "head_lr", "decay_fraction", "val_batch", "eval_near")


def train_command(args) -> int:
    with distributed.launched(args.device) as dist:  # a plain single process without torchrun
        return _train_command(args, dist)


@dataclass(frozen=True)
class TrainRequest:
    """Everything `train` decided from its flags: the run's settings (`cfg`, saved with the run) and how this
    invocation runs them. Once it exists, nothing reads the flags again."""

    cfg: TrainConfig
    strategy: str | None  # "ddp" or "fsdp" under torchrun, None for one process
    plan_batch: bool  # no --batch-size: on a GPU the micro-batch is planned (`planned_config`)
    graph_only_too: bool  # auto's rungs that pay only in a CUDA graph may be kept (--rungs auto, a new run)
    val_tokens_given: bool  # --val-tokens, which only a corpus of shards reads
    hellaswag_data_given: bool  # --hellaswag-data, which only --hellaswag-every reads
    progress: bool
    allow_data_change: bool


def train_request(args, device: torch.device, caps, dist=distributed.SINGLE, notify=print,
                  saved: Saved | None = None) -> TrainRequest:
    """The flags, the checkpoint and the defaults decided into one `TrainRequest`."""
    refuse_ignored_on_resume(args, saved)
    cfg, strategy = config_from_args(args, device, caps, dist, notify, saved)
    return TrainRequest(cfg=cfg, strategy=strategy, plan_batch=not args.batch_size,
                        graph_only_too=args.rungs in (None, "auto") and not args.resume,
                        val_tokens_given=args.val_tokens is not None,
                        hellaswag_data_given=args.hellaswag_data is not None, progress=not args.no_progress,
                        allow_data_change=args.allow_data_change)


def _train_command(args, dist: distributed.Dist) -> int:
    device = distributed.local_device(dist, args.device)
    caps = tightest_rank(cap_memory(device, detect(device), args.gpu_memory), dist)
    notices: list[str] = []  # said when the run starts, after the line that names the step
    check_run_out(Path(args.out))  # a folder of the user's own files is never written into
    with output_dir(args.out) as out, claimed(out, dist):  # the folder goes again if nothing was written
        saved = saved_run(out, dist, args.resume)
        request = train_request(args, device, caps, dist, notices.append, saved)
        return _train(request, saved, device, caps, dist, out, notices)


def _train(request: TrainRequest, saved: Saved | None, device: torch.device, caps, dist: distributed.Dist,
           out: Path, notices: list[str]) -> int:
    """The decided run (`saved`: the checkpoint it continues): its text read, its micro-batch planned, its
    size checked, then trained."""
    cfg = request.cfg
    tokens = data_mod.load_tokens(cfg.data, notify=print if dist.is_main else _silent,  # no random stand-in
                                  check=lambda t: check_text(request, saved, t),
                                  identify=other_text_refused(saved, request.allow_data_change))
    refuse_idle_flags(request, tokens)
    cfg, plan = planned_config(request, device, caps, dist, notices.append)
    setup = setup_for(list(cfg.rungs))  # once: the size check and the run take the same
    problem = check_fits(cfg.model, setup, cfg.batch_size, cfg.seq_len, caps,
                         batch_tokens=host_batch_tokens(cfg, tokens, dist))
    if problem:  # before anything of that size is allocated
        raise UsageError(problem)
    hellaswag = prepared_hellaswag(cfg, dist)  # downloaded or refused before the run says anything
    try:
        result = train_claimed(cfg, device, out, saved, tokens=tokens, progress=request.progress, dist=dist,
                               strategy=request.strategy, allow_data_change=request.allow_data_change, caps=caps,
                               setup=setup, batch_plan=plan, notices=notices, hellaswag=hellaswag)
    except torch.OutOfMemoryError as err:  # the one line names what to change at this micro-batch
        raise DeviceOutOfMemory(cfg.batch_size, "micro-batch") from err
    return result.exit_code


def _silent(*args, **kwargs) -> None:
    """The notices of ranks other than 0 (every rank finds the same)."""


def check_text(request: TrainRequest, saved: Saved | None, tokens: data_mod.TokenData) -> None:
    """The text as soon as it is known, before a corpus's tokens are checked (which says so, and may take long): a
    UsageError for another text than the resumed checkpoint's (unless --allow-data-change), or one too short."""
    other_text_refused(saved, request.allow_data_change)(tokens.source, tokens.sha256)
    data_mod.check_splits(tokens, request.cfg.seq_len, bool(request.cfg.eval_every))


# Settings a resumed run cannot change, and why: taking the flag would announce a change that never
# happens (the checkpoint's weights, random state and batch position continue).
FIXED_ON_RESUME = {"seed": "continues the weights, batch order and random state its seed {kept} drew",
                   "init_from": "continues from its own weights, not from --init-from's"}


def refuse_ignored_on_resume(args, saved: Saved | None) -> None:
    """A UsageError for a flag given with --resume that would change a setting the run cannot change."""
    kept = (saved.state.get("train_config") or {}) if saved else {}
    for name, why in FIXED_ON_RESUME.items():
        given = getattr(args, name, None)
        if saved and given is not None and given != kept.get(name):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {given} with --resume: the run in {saved.path.parent} "
                             f"{why.format(kept=kept.get(name))}; drop {flag}, or start a new run in another --out")


def refuse_idle_flags(request: TrainRequest, tokens: data_mod.TokenData) -> None:
    """A UsageError for a flag given where it would do nothing (a setting kept from the checkpoint is let be)."""
    if request.val_tokens_given and not isinstance(tokens.val, data_mod.ShardedTokens):
        raise UsageError("--val-tokens is for a corpus of token shards; a text validates on --eval-batches "
                         "random windows of its last 10%")
    if request.hellaswag_data_given and not request.cfg.hellaswag_every:
        raise UsageError("--hellaswag-data is read by --hellaswag-every N; give that too")


def host_batch_tokens(cfg: TrainConfig, tokens: data_mod.TokenData, dist=distributed.SINGLE) -> int:
    """The tokens of batches a run holds in host memory: this rank's share of a step's batch and, when it
    validates, every validation batch (made once, kept for the run)."""
    held = cfg.tokens_per_step // dist.world_size
    if not cfg.eval_every:
        return held
    if cfg.val_tokens is not None and isinstance(tokens.val, data_mod.ShardedTokens):
        return held + min(cfg.val_tokens, len(tokens.val))
    return held + cfg.eval_batches * (cfg.val_batch * cfg.seq_len if cfg.val_batch else cfg.tokens_per_step)


def config_from_args(args, device: torch.device, caps, dist=distributed.SINGLE, notify=print,
                     saved: Saved | None = None) -> tuple[TrainConfig, str | None]:
    """The run's config and data-parallel strategy. Each setting: its flag, else the checkpoint's (with
    --resume), else this device's default. Tokens per step default to the micro-batch (16 x 1024 for gpt2
    on a GPU) per process; the micro-batch on a GPU is planned afterwards (`planned_config`)."""
    given = {name: getattr(args, name) for name in SETTINGS if getattr(args, name, None) is not None}
    kept = {k: v for k, v in (saved.state.get("train_config") or {}).items() if k in SETTINGS} if saved else {}
    d = defaults("train", device)
    value = {**kept, **given}.get
    name = value("preset") or d["preset"]
    strategy = distributed.resolve_strategy(args.strategy, name, dist)
    recipe = parse_recipe(value("recipe"))
    if recipe.family != "gpt2" and value("init_from"):
        raise UsageError(f"--init-from loads GPT-2's weights, and recipe {recipe.name} changes the model: start it "
                         "from its seed, or train the gpt2 recipe")
    idle = [f"--{name.replace('_', '-')}" for name in MUON_RATES if name in given]
    if idle and recipe.optimizer != "muon":  # taken, it would be recorded and do nothing
        raise UsageError(f"{', '.join(idle)} set the muon recipe part's rates; recipe {recipe.name} has no muon part")
    if "decay_fraction" in given and recipe.schedule != "wsd":
        raise UsageError(f"--decay-fraction sets the wsd recipe part's decay; recipe {recipe.name} has no wsd part")
    if given.get("eval_near") and value("target_val_loss") is None:  # taken, it would be recorded and do nothing
        raise UsageError("--eval-near validates more often near the target: give --target-val-loss too")
    if recipe.has("doc_windows") and (problem := block_mask_problem()):
        raise UsageError(problem)
    if problem := strategy_problem(recipe.optimizer, strategy, recipe.parts):
        raise UsageError(problem)
    if saved and not {"preset", "init_from"} & given.keys():
        shape = _saved_shape(saved)
    else:
        shape = model_shape(name, value("init_from"))
    steps, lr = value("steps") or d["steps"], value("lr", d["lr"])
    seq_len = value("seq_len") or min(d["seq_len"] or shape.block_size, shape.block_size)
    batch = value("batch_size") or d["batch_size"]
    rungs = given.get("rungs") or (",".join(kept["rungs"]) if kept.get("rungs") else d["rungs"])
    cfg = TrainConfig(
        preset=name, rungs=usable_rungs(rungs, caps, strategy, notify, recipe), batch_size=batch, seq_len=seq_len,
        tokens_per_step=value("tokens_per_step") or batch * seq_len * dist.world_size, steps=steps, lr=lr,
        min_lr=value("min_lr", rules.min_lr(lr)), warmup_steps=value("warmup_steps", rules.warmup_steps(steps)),
        weight_decay=value("weight_decay", d["weight_decay"]), grad_clip=value("grad_clip", d["grad_clip"]),
        eval_every=(every := value("eval_every", rules.eval_every(steps))),
        eval_batches=value("eval_batches", rules.eval_batches(steps, every, d["eval_batches"])),
        ckpt_every=value("ckpt_every", rules.ckpt_every(steps)), seed=value("seed", d["seed"]), data=value("data"),
        init_from=value("init_from"), compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor", model=shape,
        val_tokens=value("val_tokens"), val_batch=value("val_batch"),
        hellaswag_every=value("hellaswag_every", d["hellaswag_every"]), hellaswag_data=value("hellaswag_data"),
        target_val_loss=value("target_val_loss"), eval_near=value("eval_near", rules.EVAL_NEAR), recipe=recipe.name,
        **{name: value(name, rate if recipe.optimizer == "muon" else None) for name, rate in MUON_RATES.items()},
        decay_fraction=value("decay_fraction", WSD_DECAY_FRACTION),
    )
    return cfg, strategy


def validation_share(steps: int, eval_every: int, eval_batches: int) -> float:
    """The share of a run's time its validations take, at the table's cost of a validation batch
    (`rules.eval_batches` keeps it within VALIDATION_SHARE)."""
    spent = -(-steps // eval_every) * eval_batches * rules.EVAL_BATCH_COST if eval_every else 0
    return spent / (steps + spent)


def _saved_shape(saved: Saved) -> ModelConfig:
    """The shape a checkpoint was trained at, before its rungs padded or rewired it: a resumed run needs
    neither its preset nor the --init-from folder it started from (which may be gone)."""
    try:
        return built_model_config(ModelConfig(**saved.state["model_config"]), Setup())
    except (TypeError, ValueError, LadderError) as err:  # a valid hash, odd contents
        raise LadderError(f"checkpoint {saved.path} cannot be resumed (damaged, or not written by this gpt2ladder): "
                          f"its model_config: {err}") from None


def model_shape(preset_name: str, init_from: str | None) -> ModelConfig:
    """The shape, read once here: from the config.json beside --init-from's weights when there is one,
    else the preset's."""
    if init_from:
        from gpt2ladder.model.hf import hf_model_config

        shape = hf_model_config(init_from)
        if shape is not None:
            return shape
    return preset(preset_name)


def usable_rungs(spec: str, caps, strategy: str | None = None, notify=print, recipe: Recipe = GPT2) -> tuple[str, ...]:
    """The requested rungs less those this machine (or the data-parallel strategy, or the recipe) cannot run, each
    named with its reason; under `auto`, also those of the gpt2 recipe's `auto` that the recipe leaves out."""
    usable = []
    if spec == "auto":
        for name, why in left_out_of_auto(caps, strategy, recipe).items():
            notify(f"notice: auto leaves out rung {name}: {why}")
    for line in recipe_left_out(spec, caps, recipe, strategy):
        notify(line)
    for name in resolve_rungs(spec, caps, strategy, recipe):
        reason = why_unavailable(name, caps, strategy, recipe)
        if reason:
            notify(left_out(name, reason))
        else:
            usable.append(name)
    return tuple(usable) or ("baseline",)


def tightest_rank(caps, dist=distributed.SINGLE):
    """These capabilities with the free memory of the rank that has least (under torchrun; a collective).

    Each rank reads its own GPU's free memory, and another process on one GPU leaves it less: planned
    apart, one rank could keep the CUDA graph and its rungs where another leaves them out, and the ranks
    would then run different steps. Planned against the tightest rank, every rank decides the same.
    """
    if not dist.enabled:
        return caps
    least = int(distributed.reduce_floats([caps.free_memory], dist, "min")[0])
    return dataclasses.replace(caps, free_memory=least)  # 0 where one rank cannot tell: the card's size then


def planned_config(request: TrainRequest, device: torch.device, caps, dist=distributed.SINGLE, notify=print):
    """The config with, on a GPU when --batch-size is not given, the largest micro-batch that fits and
    divides the step, the same on every rank, and the CUDA graph left out (said in a notice) where only
    the step without it fits (`measure.batch.plan_training`); and that plan (or None)."""
    cfg = request.cfg
    if not request.plan_batch or device.type != "cuda":
        return cfg, None
    per_rank = cfg.tokens_per_step // (cfg.seq_len * dist.world_size)
    rungs, plan, notice = plan_training(cfg.model, cfg.rungs, cfg.seq_len, caps, device, per_rank,
                                        validates=bool(cfg.eval_every), graph_only_too=request.graph_only_too,
                                        seed=cfg.seed)
    if notice:
        notify(notice)
    batch = int(distributed.reduce_floats([plan.batch], dist, "min")[0])  # every rank runs the same micro-batch
    return dataclasses.replace(cfg, rungs=rungs, batch_size=batch), plan
