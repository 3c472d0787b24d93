"""`gpt2ladder parity`: flags -> `ParityConfig` -> the training runs (`measure.parity`) -> parity.json,
.md, .png; or, with --shard, one shard's raw results; or, with --merge, the report from shards."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import torch

from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV, defaults
from gpt2ladder.errors import LadderError, UsageError, describe_failure
from gpt2ladder.ladder import resolve_rungs, setup_for, why_unavailable
from gpt2ladder.measure.batch import check_sizes, plan_batch
from gpt2ladder.measure.harness import climb
from gpt2ladder.measure.parity import ParityConfig, merge_shards, parity_tokens, run_parity
from gpt2ladder.model.config import preset
from gpt2ladder.model.recipe import parse_recipe, recipe_label
from gpt2ladder.report.notices import recipe_left_out
from gpt2ladder.report.parity import format_table, write_outputs
from gpt2ladder.report.records import output_dir, prepare_out_dir, write_json
from gpt2ladder.runtime.hardware import cap_memory, detect, resolve_device
from gpt2ladder.model.setup import Setup
from gpt2ladder.training.outdirs import check_own_out

OWN_FILES = r"parity\.(json|md|png)|parity-shard-\d+-of-\d+\.json"  # what parity writes in --out (shards too)


def config_from_args(args, device: torch.device, caps, notify=lambda line: None) -> ParityConfig:
    """The flags and this device's defaults decided into the config; `notify` hears the rungs of `auto` that the
    recipe leaves out (said once the command starts)."""
    d = defaults("parity", device)
    name = args.preset or d["preset"]
    shape = preset(name)
    spec, recipe = args.rungs or d["rungs"], parse_recipe(args.recipe)
    for line in recipe_left_out(spec, caps, recipe):
        notify(line)
    return ParityConfig(
        preset=name, model=shape, rungs=tuple(resolve_rungs(spec, caps, recipe=recipe)), recipe=args.recipe,
        batch_size=args.batch_size or d["batch_size"],
        seq_len=args.seq_len or d["seq_len"] or shape.block_size, steps=args.steps or d["steps"],
        seeds=args.seeds, tolerance=args.tolerance, lr=args.lr, eval_every=args.eval_every,
        eval_batches=args.eval_batches, seed=args.seed, data=args.data,
        compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor",
    )


def _runs(cfg: ParityConfig, caps) -> list[tuple[str, Setup]]:
    """(name, setup) of every training run parity makes here: the fp32 baseline and each rung that runs."""
    return [("baseline", Setup())] + [(r.name, setup_for(list(r.applied)))
                                     for r in climb(cfg.rungs,
                                                    lambda n: why_unavailable(n, caps, recipe=parse_recipe(cfg.recipe)))
                                     if r.reason is None]


def check_size(cfg: ParityConfig, caps) -> None:
    """Off CUDA, before anything is allocated: every run's step at its micro-batch, with a step's batch and
    the validation batches made on the host beside it, fits this machine (else one line, exit 2)."""
    tokens = (1 + cfg.eval_batches) * cfg.batch_size * cfg.seq_len
    check_sizes(cfg.model, _runs(cfg, caps), cfg.micro, cfg.seq_len, caps, batch_tokens=tokens,
                fewer_tokens="--batch-size or --eval-batches")


def _plan(cfg: ParityConfig, device, caps):
    """On a GPU, the micro-batch at which every training run fits (the fp32 baseline is one of them):
    the largest divisor of --batch-size that fits, accumulation doing the rest.

    Validation runs at the micro-batch, and beside a CUDA graph's pool it needs room of its own, which
    this plan does not count (train's validation term is one sequence: train cuts its batches to what
    fits). It need not: the fp32 baseline, always one of the runs, holds more per sequence in its eager
    step than a graphed step and its validation together (tests/measure/test_parity.py checks the plan).
    """
    if device.type != "cuda":
        return cfg, None
    plan = plan_batch(cfg.model, _runs(cfg, caps), cfg.seq_len, caps, device, want=cfg.batch_size,
                      divides=cfg.batch_size, seed=cfg.seed)
    return dataclasses.replace(cfg, micro_batch=plan.batch), plan


def parity_command(args) -> int:
    """Exit 0 when every rung that ran passes, 1 when one fails or breaks (skipped rungs do not count)."""
    check_own_out(Path(args.out), "parity", OWN_FILES)
    if args.merge:
        return _merge_command(args)
    device = resolve_device(args.device)
    caps = cap_memory(device, detect(device), args.gpu_memory)
    notices: list[str] = []  # said after the lines that name the runs
    cfg = config_from_args(args, device, caps, notices.append)
    check_size(cfg, caps)
    shard = parse_shard(args.shard)
    with output_dir(args.out) as out:  # removed again if the run fails before writing anything there
        tokens = parity_tokens(cfg)  # a bad --data fails here, before anything is printed
        return _run(args, cfg, caps, device, shard, out, tokens, notices)


def _run(args, cfg: ParityConfig, caps, device: torch.device, shard: tuple[int, int], out: Path, tokens,
         notices: list[str] = ()) -> int:
    cfg, plan = _plan(cfg, device, caps)
    accum = cfg.batch_size // cfg.micro
    print(f"gpt2ladder parity: micro-batch {cfg.micro} x {accum} accumulation step{'s' if accum != 1 else ''} = "
          f"batch {cfg.batch_size}" + (f"; {plan.reason()}" if plan else ""), flush=True)
    print(f"{cfg.preset} on {caps.name}, recipe {recipe_label(cfg.recipe)}, batch {cfg.batch_size} x {cfg.seq_len}, "
          f"{cfg.steps} step{'s' if cfg.steps != 1 else ''} per run, {cfg.seeds} baseline seeds, "
          f"rungs: {', '.join(cfg.rungs)}" + (f", shard {shard[0]} of {shard[1]}" if shard[1] > 1 else ""), flush=True)
    for line in notices:
        print(line, flush=True)
    record = run_parity(cfg, device, progress=not args.no_progress, shard=shard, caps=caps, tokens=tokens)
    if plan:
        record["batch_plan"] = {**plan.to_dict(), "reason": plan.reason()}
    if shard[1] > 1:
        path = out / f"parity-shard-{shard[0]}-of-{shard[1]}.json"
        write_json(path, record)
        print(f"wrote {path}; make the report with: gpt2ladder parity --merge DIR ... --out DIR")
        return 0
    return _finish(record, out)


def _finish(record: dict, out: Path) -> int:
    paths = write_outputs(record, out)
    print(format_table(record))
    print(f"wrote {', '.join(str(p) for p in paths)}")
    diverged = [f"seed {r['seed']}: {r['final_val']}" for r in record["baseline_runs"]
                if not math.isfinite(r["final_val"])]
    if diverged:  # every verdict then fails for a reason the table alone does not say
        raise LadderError(f"the fp32 baseline diverged (final val loss {', '.join(diverged)}), so no rung can be "
                          "judged; try a lower --lr")
    return 0 if record["passed"] else 1


def parse_shard(text: str | None) -> tuple[int, int]:
    """`K/N`: run every N-th training run starting at K (0-based); None: all of them."""
    if not text:
        return (0, 1)
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard takes K/N, e.g. 0/3, got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise UsageError(f"--shard {text}: need 0 <= K < N")
    return (k, n)


def _merge_command(args) -> int:
    # each argument a folder (its shard files) or one shard file
    files = [f for d in args.merge for f in (sorted(Path(d).glob("parity-shard-*.json")) if Path(d).is_dir()
                                             else [Path(d)])]
    if not files or not all(f.is_file() for f in files):
        raise UsageError(f"no parity shard files (parity-shard-K-of-N.json) in {', '.join(args.merge)}")
    try:
        shards = [json.loads(f.read_text()) for f in files]
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read a parity shard: {err}") from None
    for f, shard in zip(files, shards):
        if not isinstance(shard, dict) or shard.get("command") != "parity-shard" or not {
                "shard", "config", "skipped", "results", "device"} <= shard.keys():
            raise UsageError(f"{f} is not a parity shard record (one written by `parity --shard K/N`)")
        _check_shard_config(f, shard["config"])
    try:
        record = merge_shards(shards)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:  # a field missing or of a wrong type
        raise UsageError(f"a parity shard in {', '.join(args.merge)} is damaged or from another gpt2ladder: "
                         f"{describe_failure(err)}") from None
    return _finish(record, prepare_out_dir(args.out))


# Settings added since shards were first written, with the value a shard without them ran with: before
# `micro_batch` existed, parity took every step as one forward pass (what None means).
ADDED_SETTINGS = {"micro_batch": None}


def _check_shard_config(path: Path, config) -> None:
    """The shard's settings must be exactly ParityConfig's (another version's shard says so here); a setting
    added since (ADDED_SETTINGS) is filled in with the value such a shard ran with."""
    fields = set(ParityConfig().to_dict())
    if isinstance(config, dict):
        for key, value in ADDED_SETTINGS.items():
            config.setdefault(key, value)
    keys = set(config) if isinstance(config, dict) else set()
    if not isinstance(config, dict) or keys != fields:
        odd = sorted(keys - fields) + [f"{k} (missing)" for k in sorted(fields - keys)]
        raise UsageError(f"{path} has settings this gpt2ladder does not know ({', '.join(odd) or 'not a dict'}); "
                         "merge shards written by the same version")
