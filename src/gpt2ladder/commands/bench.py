"""`gpt2ladder bench`: flags -> `BenchConfig` -> the climb (`measure.bench`) -> ladder.json, .md, .png."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.commands.defaults import defaults
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.ladder import resolve_rungs
from gpt2ladder.measure import batch as batch_search
from gpt2ladder.measure.bench import BenchConfig, run_bench
from gpt2ladder.measure.best import add_best
from gpt2ladder.measure.harness import nothing_measured, tokens_for
from gpt2ladder.measure.scaling import add_scaling, load_baseline
from gpt2ladder.model.config import preset
from gpt2ladder.report.bench import (
    format_markdown,
    format_scaling,
    format_table,
    ladder_rows,
)
from gpt2ladder.report.plots import ladder_chart
from gpt2ladder.report.records import prepare_out_dir, write_json, write_record
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.hardware import Capabilities, detect


def bench_command(args) -> int:
    with distributed.launched(args.device) as dist:  # a plain single process without torchrun
        return _bench(args, dist)


def _bench(args, dist: distributed.Dist) -> int:
    device = distributed.local_device(dist, args.device)
    caps = detect(device)
    cfg = bench_config(args, device, caps, dist)
    baseline = load_baseline(args.baseline_json, dataclasses.asdict(cfg)) if args.baseline_json else None
    say = print if dist.is_main else (lambda *a, **k: None)
    progress = not args.no_progress
    tokens = tokens_for(cfg.data, cfg.seed, notify=say)  # a bad --data fails here, in one line, before any work
    data_mod.check_splits(tokens, cfg.seq_len, validate=False)  # as does a text too short for one sequence
    out = prepare_out_dir(args.out)
    search = winner = None
    if args.batch_size in ("auto", "best"):
        cfg = dataclasses.replace(cfg, batch_size=batch_search.largest_batch(cfg, device, caps))
    if args.batch_size == "best":
        cfg, search, winner = batch_search.fastest_batch(cfg, device, tokens, progress, say)
    _announce(cfg, caps, dist, say)
    on_row = _partial_writer(out) if dist.is_main else None
    if winner and cfg.last_only:
        record = winner  # the top rung at the chosen size was just measured
    else:
        record = run_bench(cfg, device, dist, progress=progress, notify=say, tokens=tokens, on_row=on_row)
    if args.batch_size == "auto":
        record = batch_search.back_off_if_oom(record, cfg, device, tokens, progress, say, on_row)
    if search:
        record["batch_search"] = search
    failure = nothing_measured(record, out / "ladder.json")
    if args.rungs == "best" and failure is None:
        add_best(record, cfg, device, caps, dist, progress=progress)
    scaled = dist.enabled or baseline is not None
    if scaled:
        add_scaling(record, baseline)
    if not dist.is_main:
        return 0
    write_outputs(record, out, scaled)
    if failure:
        raise LadderError(failure)
    return 0


def _announce(cfg: BenchConfig, caps: Capabilities, dist: distributed.Dist, say) -> None:
    say(f"gpt2ladder bench: {cfg.preset} on {caps.name}, batch {cfg.batch_size} x {cfg.seq_len}, "
        f"{cfg.steps} timed steps after {cfg.warmup} warm-up, rungs: {', '.join(cfg.rungs)}", flush=True)
    if dist.enabled:
        strategy = distributed.resolve_strategy(cfg.strategy, cfg.preset, dist)
        say(f"{dist.world_size} processes ({dist.backend}, {strategy}):"
            f" --batch-size {cfg.batch_size} per GPU, global batch {cfg.batch_size * dist.world_size}", flush=True)


def _partial_writer(out: Path):
    """After each rung: its one-line result on stdout and the rows so far in ladder.json (partial: true).

    A ladder.md or ladder.png already in `out` belongs to an earlier run and goes, so a run cut off
    before its end never leaves a table or chart that disagrees with its ladder.json.
    """
    def on_row(record: dict) -> None:
        for stale in ("ladder.md", "ladder.png"):
            (out / stale).unlink(missing_ok=True)
        write_json(out / "ladder.json", record)
        print("  " + "  ".join(ladder_rows({"rungs": record["rungs"][-1:]})[0]), flush=True)

    return on_row


def write_outputs(record: dict, out: Path, scaled: bool) -> list[Path]:
    """ladder.json, ladder.md and ladder.png, and the table on stdout (rank 0 only)."""
    def markdown(r: dict) -> str:
        return format_markdown(r) + ("\n" + format_scaling(r) if scaled else "")

    paths = write_record(out, "ladder", record, markdown, ladder_chart)
    print(format_table(record))
    if scaled:
        print("\n" + format_scaling(record), end="")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return paths


def bench_config(args, device: torch.device, caps: Capabilities, dist: distributed.Dist) -> BenchConfig:
    d = defaults("bench", device)
    name = args.preset or d["preset"]
    distributed.resolve_strategy(args.strategy, name, dist)  # a bad --strategy fails before any work
    if args.batch_size in ("auto", "best") and dist.enabled:
        raise UsageError(f"--batch-size {args.batch_size} probes memory on one GPU; under torchrun pass a number "
                         f"(find it with a one-GPU `gpt2ladder bench --batch-size {args.batch_size}`)")
    return BenchConfig(
        preset=name, rungs=tuple(resolve_rungs(args.rungs, caps)),
        batch_size=1 if args.batch_size in ("auto", "best") else (args.batch_size or d["batch_size"]),
        seq_len=args.seq_len or d["seq_len"] or preset(name).block_size,
        steps=args.steps or d["steps"], warmup=d["warmup"] if args.warmup is None else args.warmup,
        seed=args.seed, data=args.data, strategy=args.strategy, last_only=args.last_only,
    )
