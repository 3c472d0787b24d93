"""`gpt2ladder profile`: flags -> `ProfileConfig` -> the profiled climb (`measure.profile`) ->
profile.json, .md, .png."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from gpt2ladder import data as data_mod
from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV, defaults
from gpt2ladder.errors import LadderError
from gpt2ladder.ladder import resolve_rungs, setup_for, why_unavailable
from gpt2ladder.measure.batch import check_sizes, plan_batch
from gpt2ladder.measure.harness import climb, tokens_for
from gpt2ladder.measure.profile import ProfileConfig, run_profile
from gpt2ladder.model.config import preset
from gpt2ladder.model.recipe import parse_recipe, recipe_label
from gpt2ladder.model.setup import Setup
from gpt2ladder.report.notices import nothing_measured, recipe_left_out
from gpt2ladder.report.profile import format_table, write_outputs
from gpt2ladder.report.records import output_dir
from gpt2ladder.runtime.hardware import cap_memory, detect, resolve_device
from gpt2ladder.training.outdirs import check_own_out

OWN_FILES = r"profile\.(json|md|png)|trace-.+\.json"  # what profile writes in --out (traces with --trace)


def _rungs_run(cfg: ProfileConfig, caps) -> list[tuple[str, Setup]]:
    """(name, setup) of every row the climb profiles here; a rung this machine skips holds no memory."""
    return [(r.name, setup_for(list(r.applied)))
            for r in climb(cfg.rungs, lambda n: why_unavailable(n, caps, recipe=parse_recipe(cfg.recipe)),
                           cfg.last_only)
            if r.reason is None]


def _plan(cfg: ProfileConfig, args, device, caps):
    """On a GPU without --batch-size: the one batch that fits every rung profiled, at most the default."""
    if device.type != "cuda" or args.batch_size:
        return cfg, None
    rows = _rungs_run(cfg, caps)
    if not rows:
        return cfg, None
    plan = plan_batch(cfg.model, rows, cfg.seq_len, caps, device, want=cfg.batch_size, seed=cfg.seed)
    return dataclasses.replace(cfg, batch_size=plan.batch), plan


def profile_command(args) -> int:
    check_own_out(Path(args.out), "profile", OWN_FILES)
    device = resolve_device(args.device)
    caps = cap_memory(device, detect(device), args.gpu_memory)
    d = defaults("profile", device)
    name = args.preset or d["preset"]
    with output_dir(args.out) as out:  # removed again if the run fails before writing anything there
        return _run(args, device, caps, d, name, out)


def _run(args, device, caps, d: dict, name: str, out: Path) -> int:
    shape = preset(name)
    spec, recipe = args.rungs or d["rungs"], parse_recipe(args.recipe)
    notices = recipe_left_out(spec, caps, recipe)  # said after the line that names the rungs
    cfg = ProfileConfig(preset=name, model=shape, rungs=tuple(resolve_rungs(spec, caps, recipe=recipe)),
                        recipe=args.recipe,
                        batch_size=args.batch_size or d["batch_size"],
                        seq_len=args.seq_len or d["seq_len"] or shape.block_size, steps=args.steps,
                        warmup=args.warmup, seed=args.seed, data=args.data,
                        compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor",
                        trace_dir=str(out) if args.trace else None, last_only=args.last_only)
    # off CUDA a step too large for this machine fails here in one line, before anything is allocated
    check_sizes(cfg.model, _rungs_run(cfg, caps), cfg.batch_size, cfg.seq_len, caps,
                batch_tokens=cfg.batch_size * cfg.seq_len, fewer_tokens="--batch-size or --seq-len")
    tokens = tokens_for(cfg.data, cfg.seed)  # a bad --data fails here, before anything is printed
    data_mod.check_splits(tokens, cfg.seq_len, validate=False)
    cfg, plan = _plan(cfg, args, device, caps)
    if plan:
        print(f"gpt2ladder profile: {plan.reason()}", flush=True)
    print(f"{'' if plan else 'gpt2ladder profile: '}{cfg.preset} on {caps.name}, recipe {recipe_label(cfg.recipe)}, "
          f"batch {cfg.batch_size} x {cfg.seq_len}, {cfg.steps} profiled step{'s' if cfg.steps != 1 else ''} after "
          f"{cfg.warmup} warm-up, rungs: {', '.join(cfg.rungs)}", flush=True)
    for line in notices:
        print(line, flush=True)
    record = run_profile(cfg, device, progress=not args.no_progress, caps=caps, tokens=tokens)
    if plan:
        record["batch_plan"] = {**plan.to_dict(), "reason": plan.reason()}
    paths = write_outputs(record, out)
    print(format_table(record))
    print(f"wrote {', '.join(str(p) for p in paths)}")
    failure = nothing_measured(record, out / "profile.json")
    if failure:  # like bench: the files are written, but a profile of nothing is not a success
        raise LadderError(failure)
    return 0
