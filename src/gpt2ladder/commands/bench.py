"""`gpt2ladder bench`: flags -> `BenchConfig` -> the climb (`measure.bench`) -> ladder.json, .md, .png."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV, defaults
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.ladder import (
    left_out_of_auto,
    resolve_rungs,
    setup_for,
    why_unavailable,
)
from gpt2ladder.measure import batch as batch_search
from gpt2ladder.measure.bench import BenchConfig, run_bench
from gpt2ladder.measure.best import add_best, best_summary
from gpt2ladder.measure.harness import climb, tokens_for
from gpt2ladder.measure.scaling import add_scaling, check_baseline, load_baseline
from gpt2ladder.measure.timing import StepRule
from gpt2ladder.model.config import preset
from gpt2ladder.model.recipe import parse_recipe
from gpt2ladder.model.setup import Setup
from gpt2ladder.report.bench import (
    format_markdown,
    format_scaling,
    spread_note,
    stream_header,
    stream_row,
)
from gpt2ladder.report.notices import cpu_warning, nothing_measured
from gpt2ladder.report.plots import ladder_chart
from gpt2ladder.report.records import prepare_out_dir, write_json, write_record
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.hardware import Capabilities, cap_memory, detect
from gpt2ladder.runtime.optim import strategy_problem
from gpt2ladder.training.outdirs import check_own_out

OWN_FILES = r"ladder\.(json|md|png)"  # what bench writes in --out: a folder of these alone is written again


def bench_command(args) -> int:
    with distributed.launched(args.device) as dist:  # a plain single process without torchrun
        return _bench(args, dist)


@dataclass(frozen=True)
class BenchRequest:
    """Everything `bench` decided from its flags: what is measured (`cfg`, written into ladder.json) and how this
    invocation chooses the batch, counts steps, reports and writes. Once it exists, nothing reads the flags again."""

    cfg: BenchConfig
    batch: int | str | None  # --batch-size: a number (kept as given), "auto", "best", or None (planned on a GPU)
    shorten: bool  # no --seq-len: on a card where not even one default sequence fits, a shorter one
    rule: StepRule  # how many steps each rung times
    rungs: str  # --rungs as given: "best" adds its row, "auto" names the rungs it leaves out
    baseline_json: str | None
    out: str
    progress: bool


def bench_request(args, device: torch.device, caps: Capabilities, dist: distributed.Dist) -> BenchRequest:
    """The flags and this device's defaults decided into one `BenchRequest`."""
    cfg = bench_config(args, device, caps, dist)
    return BenchRequest(cfg=cfg, batch=args.batch_size, shorten=args.seq_len is None,
                        rule=step_rule(args.steps is not None, cfg, device), rungs=args.rungs,
                        baseline_json=args.baseline_json, out=args.out, progress=not args.no_progress)


def _bench(args, dist: distributed.Dist) -> int:
    """Every decision first (config, baseline, text, batch), each once; then the climb; then the files."""
    check_own_out(Path(args.out), "bench", OWN_FILES)
    device = distributed.local_device(dist, args.device)
    caps = cap_memory(device, detect(device), args.gpu_memory)
    return _climb(bench_request(args, device, caps, dist), device, caps, dist)


def _climb(request: BenchRequest, device, caps: Capabilities, dist: distributed.Dist) -> int:
    cfg, rule = request.cfg, request.rule
    # a step too large for this host fails here in one line, not after the kernel has killed the process
    batch_search.check_sizes(cfg.model, _rungs_run(cfg, caps), cfg.batch_size, cfg.seq_len, caps,
                             batch_tokens=cfg.batch_size * cfg.seq_len, fewer_tokens="--batch-size or --seq-len")
    baseline = load_baseline(request.baseline_json) if request.baseline_json else None  # its step: once planned
    say = print if dist.is_main else (lambda *a, **k: None)
    tokens = tokens_for(cfg.data, cfg.seed, notify=say)  # a bad --data fails here, in one line, before any work
    data_mod.check_splits(tokens, cfg.seq_len, validate=False)  # as does a text too short for one sequence
    cfg, plan = _choose_batch(request, device, caps, dist)
    if baseline and request.batch != "best":  # the step as it will run, the batch and length planned
        check_baseline(baseline, cfg.to_dict())
    out = prepare_out_dir(request.out)
    search = winner = None
    if request.batch == "best":
        cfg, search, winner = batch_search.fastest_batch(cfg, device, tokens, request.progress, say, caps, rule=rule)
        if baseline:  # the batch the search found
            check_baseline(baseline, cfg.to_dict())
    request = dataclasses.replace(request, cfg=cfg)
    _announce(request, caps, device, dist, plan, say)
    on_row = _row_writer(out, say) if dist.is_main else None
    if winner and cfg.last_only and cfg.start is None:
        record = winner  # the top rung at the chosen size was just measured
    else:
        record = run_bench(cfg, device, dist, progress=request.progress, notify=say, tokens=tokens, on_row=on_row,
                           caps=caps, rule=rule)
    if plan:
        record["batch_plan"] = {**plan.to_dict(), "reason": plan.reason()}
    if search:
        record["batch_search"] = search
    return _finish(request, record, device, caps, dist, tokens, baseline, out, say)


def step_rule(steps_given: bool, cfg: BenchConfig, device) -> StepRule:
    """How many steps each rung times: exactly --steps when given; else, on a GPU, the default count and
    more while the rung's p10-p90 range is wide (small batches make short, uneven steps). A CPU keeps the
    count: its steps are long, and a CPU shared with other work rarely steadies however long it runs."""
    if not steps_given and device.type == "cuda":
        return StepRule.until_narrow(cfg.steps)
    return StepRule.fixed(cfg.steps)


def _finish(request: BenchRequest, record: dict, device, caps, dist: distributed.Dist, tokens, baseline,
            out: Path, say) -> int:
    """--rungs best's extra row, the scaling against --baseline-json, then the files (rank 0)."""
    cfg, rule = request.cfg, request.rule
    failure = nothing_measured(record, out / "ladder.json", auto_batch=True)
    if request.rungs == "best" and failure is None:
        add_best(record, cfg, device, caps, tokens, dist, progress=request.progress, rule=rule)
        say(best_summary(record), flush=True)
    scaled = dist.enabled or baseline is not None
    if scaled:
        add_scaling(record, baseline)
    if not dist.is_main:
        return 0
    write_outputs(record, out, scaled)
    if failure:
        raise LadderError(failure)
    return 0


def _choose_batch(request: BenchRequest, device, caps: Capabilities, dist: distributed.Dist):
    """On a GPU, one batch that fits every rung measured (`measure.batch.plan_bench_batch`): at most the
    size asked for (16 by default), as large as fits with --batch-size auto, the top rung's largest with
    best; where not even one sequence of the default length fits every rung, every rung runs at the
    longest power of two that does (a --seq-len given is kept, and fails in one line if nothing fits).
    A number given is kept as it is; on a CPU the default stays."""
    cfg = request.cfg
    if device.type != "cuda" or isinstance(request.batch, int):
        return cfg, None
    rows = _rungs_run(cfg, caps)
    if request.batch == "best":
        rows = rows[-1:]
    want = cfg.batch_size if request.batch is None else None
    plan = batch_search.plan_bench_batch(cfg.model, rows, cfg.seq_len, caps, device, want=want, seed=cfg.seed,
                                         shorten=request.shorten)
    # Every rank runs the same step: the smaller of each (a shorter sequence only leaves more room).
    batch, seq_len = (int(v) for v in distributed.reduce_floats([plan.batch, plan.seq_len], dist, "min"))
    return dataclasses.replace(cfg, batch_size=batch, seq_len=seq_len), plan


def _rungs_run(cfg: BenchConfig, caps: Capabilities) -> list[tuple[str, Setup]]:
    """(name, setup) of every row the climb times here; a rung this machine skips holds no memory."""
    return [(r.name, setup_for(list(r.applied)))
            for r in climb(cfg.rungs, lambda n: why_unavailable(n, caps, cfg.strategy, parse_recipe(cfg.recipe)),
                           cfg.last_only, cfg.start)
            if r.reason is None]


def _announce(request: BenchRequest, caps: Capabilities, device, dist: distributed.Dist, plan, say) -> None:
    """The first lines: the batch and why, what is timed, the processes, and what --rungs auto leaves out."""
    cfg, rule = request.cfg, request.rule
    if plan:
        say(f"gpt2ladder bench: {plan.reason()}", flush=True)
    say(f"{'' if plan else 'gpt2ladder bench: '}{cfg.preset} on {caps.name}, batch {cfg.batch_size} x {cfg.seq_len}, "
        f"{rule.describe()} after {cfg.warmup} warm-up, rungs: {', '.join(cfg.rungs)}", flush=True)
    if dist.enabled:
        say(f"{dist.world_size} processes ({dist.backend}, {cfg.strategy}):"
            f" --batch-size {cfg.batch_size} per GPU, global batch {cfg.batch_size * dist.world_size}", flush=True)
    if request.rungs == "auto":
        for name, why in left_out_of_auto(caps, cfg.strategy, parse_recipe(cfg.recipe)).items():
            say(f"notice: auto leaves out rung {name}: {why}", flush=True)
    if device.type == "cpu" and cfg.preset != "tiny":
        say(cpu_warning(cfg.model, cfg, len(cfg.rungs)), flush=True)


def _row_writer(out: Path, say=print):
    """After each rung: its row of the table on stdout (the table is printed once, a row at a time) and
    the rows so far in ladder.json (partial: true).

    A ladder.md or ladder.png already in `out` belongs to an earlier run and goes, so a run cut off
    before its end never leaves a table or chart that disagrees with its ladder.json.
    """
    def on_row(record: dict) -> None:
        for stale in ("ladder.md", "ladder.png"):
            (out / stale).unlink(missing_ok=True)
        write_json(out / "ladder.json", record)
        if len(record["rungs"]) == 1:
            say(stream_header(), flush=True)
        say(stream_row(record["rungs"][-1]), flush=True)

    return on_row


def write_outputs(record: dict, out: Path, scaled: bool) -> list[Path]:
    """ladder.json, ladder.md and ladder.png, and the table on stdout (rank 0 only)."""
    def markdown(r: dict) -> str:
        return format_markdown(r) + ("\n" + format_scaling(r) if scaled else "")

    paths = write_record(out, "ladder", record, markdown, ladder_chart)
    noisy = spread_note(record["rungs"])
    if noisy:
        print(f"note: {noisy}")
    if scaled:
        print("\n" + format_scaling(record), end="")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return paths


def bench_config(args, device: torch.device, caps: Capabilities, dist: distributed.Dist) -> BenchConfig:
    """The flags and this device's defaults as one config; the preset's shape, the data-parallel strategy
    and the rungs are resolved here, and nowhere below."""
    d = defaults("bench", device)
    name = args.preset or d["preset"]
    shape = preset(name)
    strategy = distributed.resolve_strategy(args.strategy, name, dist)  # a bad --strategy fails before any work
    recipe = parse_recipe(args.recipe)
    if problem := strategy_problem(recipe.optimizer, strategy, recipe.parts):  # timed, it would time a wrong step
        raise UsageError(problem)
    if args.batch_size == "best" and dist.enabled:
        raise UsageError("--batch-size best times sizes on one GPU; under torchrun pass a number "
                         "(find it with a one-GPU `gpt2ladder bench --batch-size best`)")
    if args.rungs == "best" and (args.start is not None or args.last_only):
        raise UsageError(f"--rungs best keeps the rungs that pay over the rung before each, so it times every "
                         f"rung: drop {'--from' if args.start is not None else '--last-only'}")
    rungs = tuple(resolve_rungs(args.rungs, caps, strategy, parse_recipe(args.recipe)))
    if args.start is not None and args.start not in rungs:
        raise UsageError(f"--from {args.start}: not one of the rungs climbed ({', '.join(rungs)})")
    return BenchConfig(
        preset=name, model=shape, rungs=rungs, recipe=args.recipe,
        batch_size=args.batch_size if isinstance(args.batch_size, int) else d["batch_size"],
        seq_len=args.seq_len or d["seq_len"] or shape.block_size,
        steps=args.steps or d["steps"], warmup=d["warmup"] if args.warmup is None else args.warmup,
        seed=args.seed, data=args.data, strategy=strategy, last_only=args.last_only, start=args.start,
        compile_backend=os.environ.get(COMPILE_BACKEND_ENV) or "inductor",
    )
