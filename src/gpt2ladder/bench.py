"""`gpt2ladder bench`: climb the ladder on this machine and time every rung the same way.

Each rung gets a fresh model from the same seed and the same batches. A step is timed as the seed
does, made strict: synchronize, read the clock, zero_grad + forward + backward + optimizer step,
synchronize, read the clock. Warm-up steps (compile, autotuning, graph capture, allocator growth) are
left out; the median and the spread of the timed steps are reported.

Under torchrun (`torchrun --nproc_per_node=N -m gpt2ladder bench ...`) every rank runs every rung
under DDP (FSDP2 for gpt2-large/xl, or as --strategy says). --batch-size is then per GPU, so the
global batch is N times larger and each GPU does the work of a one-GPU run: tokens/s total and per
GPU compare directly with a one-GPU ladder.json, passed as --baseline-json for a scaling efficiency.
A step's time is the slowest rank's; rank 0 alone prints and writes.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2ladder import data as data_mod
from gpt2ladder import distributed
from gpt2ladder.config import ModelConfig, check_run_shape, preset
from gpt2ladder.engine import Engine
from gpt2ladder.errors import LadderError, UsageError, describe_failure
from gpt2ladder.hardware import Capabilities, detect
from gpt2ladder.metrics import TimingStats, flops_per_token, mfu, peak_flops
from gpt2ladder.rungs import RUNGS_BY_NAME, setup_for, why_unavailable
from gpt2ladder.hardware import free_memory, synchronize
from gpt2ladder.report import progress_bar


@dataclass(frozen=True)
class BenchConfig:
    preset: str = "tiny"
    rungs: tuple[str, ...] = ()
    batch_size: int = 4
    seq_len: int = 128
    steps: int = 10
    warmup: int = 3
    seed: int = 0
    data: str | None = None  # a text file; None = Tiny Shakespeare (random tokens if unavailable)
    compile_backend: str = "inductor"
    strategy: str = "auto"  # under torchrun: ddp, fsdp or auto (fsdp for gpt2-large/xl); else unused
    last_only: bool = False  # time only the top of the ladder: every named rung applied together

    def __post_init__(self) -> None:
        check_run_shape(self.preset, batch_size=self.batch_size, seq_len=self.seq_len, steps=self.steps,
                        warmup=self.warmup)


def load_bench_tokens(cfg: BenchConfig, notify=print) -> data_mod.TokenData:
    """The text to train on; step time does not depend on it, so random tokens stand in if needed."""
    if cfg.data is not None:
        return data_mod.load_tokens(Path(cfg.data))
    try:
        return data_mod.load_tokens(None)
    except data_mod.DataUnavailable as err:
        notify(f"notice: {err} -- timing on random tokens instead; the loss column is not meaningful.")
        return data_mod.random_tokens(400_000, seed=cfg.seed)


def run_bench(cfg: BenchConfig, device: torch.device, *, progress: bool = True, notify=print,
              tokens: data_mod.TokenData | None = None, on_row=None) -> dict:
    """Measure every rung in `cfg.rungs` (cumulatively) and return the self-describing record.

    `on_row(record)`, if given, sees the record so far after each rung: a long run that is cut off
    still leaves the rungs it measured.
    """
    caps = detect(device)
    tokens = load_bench_tokens(cfg, notify) if tokens is None else tokens
    model_cfg = preset(cfg.preset)
    rows = []
    applied = []  # rung k = every rung up to k that this machine can run ("go straight to compile")
    for k, name in enumerate(cfg.rungs):
        if _why_not(name, caps, cfg) is None:
            applied.append(name)
        if cfg.last_only and k < len(cfg.rungs) - 1:
            continue
        if cfg.last_only and applied:  # the top of what can run here, under its own name
            name = applied[-1]
        rows.append(measure_rung(name, list(applied), model_cfg, cfg, tokens, device, caps, progress))
        add_speedups(rows)
        if on_row is not None:
            on_row(_record(cfg, caps, device, model_cfg, tokens, rows, partial=True))
    return _record(cfg, caps, device, model_cfg, tokens, rows, partial=False)


def _record(cfg: BenchConfig, caps, device, model_cfg, tokens, rows, partial: bool) -> dict:
    from gpt2ladder.report import record_header

    dist = distributed.current()
    parallel = {"world_size": dist.world_size, "backend": dist.backend,
                "strategy": distributed.resolve_strategy(cfg.strategy, cfg.preset, dist),
                "global_batch_size": cfg.batch_size * dist.world_size}
    return {**record_header(caps, device), "command": "bench", "config": dataclasses.asdict(cfg), **parallel,
            "model": model_cfg.to_dict(), "data": {"source": tokens.source, "n_tokens": tokens.n_tokens},
            "peak_flops": peak_flops(caps.name), "partial": partial, "rungs": list(rows)}


def measure_rung(name, applied, model_cfg: ModelConfig, cfg: BenchConfig, tokens, device,
                 caps: Capabilities, progress: bool) -> dict:
    rung = RUNGS_BY_NAME[name]
    row = {"name": name, "summary": rung.summary, "kind": rung.kind}
    reason = _why_not(name, caps, cfg)
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    setup = setup_for(applied)
    try:
        result = _time_setup(setup, model_cfg, cfg, tokens, device, progress, label=name)
    except torch.OutOfMemoryError:
        free_memory(device)
        return {**row, "status": "oom", "reason": f"out of memory at batch size {cfg.batch_size}; "
                "try a smaller --batch-size or --batch-size auto"}
    except LadderError:
        raise
    except Exception as err:  # a rung that breaks is a finding, not a reason to lose the others
        free_memory(device)
        return {**row, "status": "failed", "reason": describe_failure(err)}
    flops = flops_per_token(result.pop("model_config"), cfg.seq_len, result.pop("n_params"))
    # Utilisation of each GPU against one GPU's peak: the per-GPU share of the tokens, not the total.
    tok_s = result["tokens_per_s_per_gpu"]
    return {**row, "status": "ok", "setup": setup.to_dict(), **result, "flops_per_token": flops,
            "mfu": mfu(tok_s, flops, peak_flops(caps.name))}


def _why_not(name: str, caps: Capabilities, cfg: BenchConfig) -> str | None:
    """Why a rung cannot run on this machine, or (under torchrun) with this data-parallel strategy."""
    dist = distributed.current()
    return why_unavailable(name, caps) or distributed.rung_problem(
        name, distributed.resolve_strategy(cfg.strategy, cfg.preset, dist))


def _time_setup(setup, model_cfg, cfg: BenchConfig, tokens, device, progress: bool, label: str) -> dict:
    dist = distributed.current()  # a single process unless bench_command joined torchrun's group
    engine = Engine(model_cfg, setup, device, seed=cfg.seed, compile_backend=cfg.compile_backend,
                    parallelize=distributed.parallelize_for(dist, cfg.strategy, cfg.preset))
    # --batch-size is per GPU: this rank reads its share of a global batch W times larger.
    batches = data_mod.Batches(tokens.train, cfg.batch_size * dist.world_size, cfg.seq_len, seed=cfg.seed,
                               rank=dist.rank, world_size=dist.world_size)
    samples, losses, x = _timed_steps(engine, batches, cfg, device, progress_bar(
        cfg.warmup + cfg.steps, label, progress and dist.is_main))
    # The group steps together, so a step lasts as long as its slowest rank; every rank gets the same
    # numbers, and so makes the same decisions (--rungs best) afterwards.
    samples = distributed.reduce_floats(samples, dist, "max")
    stats = TimingStats.of(samples)
    logits_dtype, weight_dtype = _dtypes(engine, x)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    if peak is not None:
        peak = int(distributed.reduce_floats([peak], dist, "max")[0])  # per GPU: the fullest one
    tokens_per_s = cfg.batch_size * dist.world_size * cfg.seq_len / (stats.median / 1000)
    result = {
        "ms_per_step": stats.median, "ms_p10": stats.p10, "ms_p90": stats.p90, "ms_min": stats.min,
        "ms_max": stats.max, "n_timed": stats.n, "samples_ms": [round(s, 4) for s in samples],
        "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / dist.world_size,
        "peak_mem_bytes": peak, "loss": float(distributed.all_reduce_mean(losses[-1], dist)),
        "logits_dtype": logits_dtype,
        "weight_dtype": weight_dtype, "model_config": engine.raw_model.config,
        "n_params": engine.raw_model.num_params(),
    }
    del engine
    free_memory(device)
    return result


def _timed_steps(engine: Engine, batches, cfg: BenchConfig, device, bar) -> tuple[list, list, torch.Tensor]:
    """Run warm-up + timed steps; the timed steps' ms (sync, clock, step, sync, clock) and losses."""
    samples, losses = [], []
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(cfg.warmup + cfg.steps):
        x, y = data_mod.to_device(*batches.next(), device)  # the copy is outside the clock
        synchronize(device)
        t0 = time.perf_counter()
        loss = engine.step(x, y)
        synchronize(device)
        dt = time.perf_counter() - t0
        if i >= cfg.warmup:
            samples.append(dt * 1000)
            losses.append(loss)
        bar.update(1)
        bar.set_postfix_str(f"{dt * 1000:.1f} ms")
    bar.close()
    return samples, losses, x


@torch.no_grad()
def _dtypes(engine: Engine, x: torch.Tensor) -> tuple[str, str]:
    """What the seed prints: the logits' dtype inside the step, and the weights' dtype."""
    with engine.precision(), engine.autocast():
        # The whole forward (not hidden + lm_head): under FSDP2 only it gathers the sharded weights.
        logits, _ = engine.raw_model(x[:1, :16])
    weight = engine.raw_model.transformer.wte.weight.dtype
    head = "float8_e4m3fn" if engine.setup.fp8_head else str(logits.dtype).replace("torch.", "")
    return head, str(weight).replace("torch.", "")


def add_speedups(rows: list[dict]) -> None:
    """Speed-up against the baseline (first measured rung) and against the previous measured rung."""
    measured = [r for r in rows if r["status"] == "ok"]
    if not measured:
        return
    base = measured[0]["ms_per_step"]
    prev = None
    for r in measured:
        r["speedup_vs_baseline"] = base / r["ms_per_step"]
        r["speedup_vs_prev"] = prev / r["ms_per_step"] if prev else None
        prev = r["ms_per_step"]





def defaults_for(device: torch.device) -> dict:
    """GPU: the seed's GPT-2 124M at B=16, T=1024. CPU: the tiny preset, done in about a minute."""
    if device.type == "cuda":
        return {"preset": "gpt2", "batch_size": 16, "seq_len": None, "steps": 20, "warmup": 5}
    return {"preset": "tiny", "batch_size": 4, "seq_len": 128, "steps": 10, "warmup": 3}


def resolve_rungs(spec: str, caps: Capabilities) -> list[str]:
    """`auto` = every rung this machine supports but the opt-in ones; `best` = all it supports (to be
    measured and decided); the others are parsed by `rungs.parse_rungs`."""
    from gpt2ladder.rungs import available_rungs, parse_rungs

    if spec == "auto":
        return available_rungs(caps)  # the same list `gpt2ladder doctor` recommends
    if spec == "best":
        return available_rungs(caps, opt_in=True)  # the candidates; `best.py` keeps those that pay
    return parse_rungs(spec)


def bench_command(args) -> int:
    with distributed.launched(args.device) as dist:  # a plain single process without torchrun
        return _bench(args, dist)


def _bench(args, dist: distributed.Dist) -> int:
    from gpt2ladder.report import prepare_out_dir
    from gpt2ladder.scaling import add_scaling, load_baseline

    device = distributed.local_device(dist, args.device)
    caps = detect(device)
    cfg = _bench_config(args, device, caps, dist)
    baseline = load_baseline(args.baseline_json, dataclasses.asdict(cfg)) if args.baseline_json else None
    say = print if dist.is_main else (lambda *a, **k: None)
    tokens = load_bench_tokens(cfg, notify=say)  # a bad --data fails here, in one line, before any work
    data_mod.Batches(tokens.train, cfg.batch_size, cfg.seq_len)  # as does a text too short for one sequence
    out = prepare_out_dir(args.out)
    search = winner = None
    if args.batch_size in ("auto", "best"):
        from gpt2ladder.autobatch import largest_batch

        cfg = dataclasses.replace(cfg, batch_size=largest_batch(cfg, device, caps))
    if args.batch_size == "best":
        cfg, search, winner = _fastest_batch(cfg, device, tokens, not args.no_progress, say)
    say(f"gpt2ladder bench: {cfg.preset} on {caps.name}, batch {cfg.batch_size} x {cfg.seq_len}, "
        f"{cfg.steps} timed steps after {cfg.warmup} warm-up, rungs: {', '.join(cfg.rungs)}", flush=True)
    if dist.enabled:
        strategy = distributed.resolve_strategy(cfg.strategy, cfg.preset, dist)
        say(f"{dist.world_size} processes ({dist.backend}, {strategy}):"
            f" --batch-size {cfg.batch_size} per GPU, global batch {cfg.batch_size * dist.world_size}", flush=True)
    on_row = _partial_writer(out) if dist.is_main else None
    if winner and cfg.last_only:
        record = winner  # the top rung at the chosen size was just measured
    else:
        record = run_bench(cfg, device, progress=not args.no_progress, notify=say, tokens=tokens, on_row=on_row)
    if args.batch_size == "auto":
        record = _back_off_if_oom(record, cfg, device, tokens, not args.no_progress, say, on_row)
    if search:
        record["batch_search"] = search
    failure = nothing_measured(record, out / "ladder.json")
    if args.rungs == "best" and failure is None:
        from gpt2ladder.best import add_best

        add_best(record, cfg, device, caps, progress=not args.no_progress)
    scaled = dist.enabled or baseline is not None
    if scaled:
        add_scaling(record, baseline)
    if not dist.is_main:
        return 0
    _write(record, out, scaled)
    if failure:
        raise LadderError(failure)
    return 0


AUTO_BACKOFF = 7 / 8  # when the measured step does not fit the probed batch: try this fraction of it
AUTO_RETRIES = 4


def _back_off_if_oom(record: dict, cfg: BenchConfig, device, tokens, progress: bool, say, on_row) -> dict:
    """--batch-size auto: the probe's eager steps stand in for the real ones; if a measured rung still
    runs out of memory at the probed size, measure again at 7/8 of it (a few times at most)."""
    probed = cfg.batch_size
    for _ in range(AUTO_RETRIES):
        if not any(r["status"] == "oom" for r in record["rungs"]) or cfg.batch_size == 1:
            break
        cfg = dataclasses.replace(cfg, batch_size=max(1, int(cfg.batch_size * AUTO_BACKOFF)))
        say(f"--batch-size auto: out of memory at {record['config']['batch_size']} when measured; "
            f"trying {cfg.batch_size}", flush=True)
        record = run_bench(cfg, device, progress=progress, notify=say, tokens=tokens, on_row=on_row)
    record["auto_batch"] = {"probed": probed, "measured": cfg.batch_size}
    return record


def _fastest_batch(cfg: BenchConfig, device, tokens, progress: bool, say) -> tuple[BenchConfig, dict, dict]:
    """--batch-size best: the top rung timed at each candidate size up to the largest that fits; the
    config at the size with the most tokens/s, the search (every size tried) and the winner's record.

    The largest size is not always the fastest: near the memory limit the allocator and the caches do
    worse, while small sizes pay the per-step costs (optimizer, launches) on fewer tokens.
    """
    from gpt2ladder.autobatch import batch_candidates

    largest, tried, best = cfg.batch_size, [], None
    for b in batch_candidates(largest):
        say(f"--batch-size best: timing {b} sequences", flush=True)
        rec = run_bench(dataclasses.replace(cfg, batch_size=b, last_only=True), device, progress=progress,
                        notify=lambda *a, **k: None, tokens=tokens)
        row = rec["rungs"][-1]
        tried.append({"batch_size": b, "status": row["status"], "ms_per_step": row.get("ms_per_step"),
                      "tokens_per_s": row.get("tokens_per_s")})
        say(f"  {b}: " + (f"{row['ms_per_step']:.1f} ms/step, {row['tokens_per_s']:,.0f} tokens/s"
                          if row["status"] == "ok" else row["status"]), flush=True)
        if row["status"] == "ok" and (best is None or row["tokens_per_s"] > best[1]["tokens_per_s"]):
            best = (b, row, rec)
    if best is None:
        raise LadderError(f"--batch-size best: no size up to {largest} could be measured "
                          f"({', '.join(str(t['batch_size']) + ' ' + t['status'] for t in tried)})")
    say(f"--batch-size best: {best[0]} sequences ({best[1]['tokens_per_s']:,.0f} tokens/s)", flush=True)
    search = {"largest_fit": largest, "tried": tried, "chosen": best[0], "rung": best[1]["name"],
              "rule": "the most tokens/s at the top rung"}
    return dataclasses.replace(cfg, batch_size=best[0]), search, best[2]


def _partial_writer(out: Path):
    """After each rung: its one-line result on stdout and the rows so far in ladder.json (partial: true).

    A ladder.md or ladder.png already in `out` belongs to an earlier run and goes, so a run cut off
    before its end never leaves a table or chart that disagrees with its ladder.json.
    """
    from gpt2ladder.report import ladder_rows, write_json

    def on_row(record: dict) -> None:
        for stale in ("ladder.md", "ladder.png"):
            (out / stale).unlink(missing_ok=True)
        write_json(out / "ladder.json", record)
        print("  " + "  ".join(ladder_rows({"rungs": record["rungs"][-1:]})[0]), flush=True)

    return on_row


def _write(record: dict, out: Path, scaled: bool) -> None:
    """ladder.json, ladder.md and ladder.png, and the table on stdout (rank 0 only)."""
    from gpt2ladder.plots import ladder_chart
    from gpt2ladder.report import format_markdown, format_table, write_json
    from gpt2ladder.scaling import format_scaling

    write_json(out / "ladder.json", record)
    (out / "ladder.md").write_text(format_markdown(record) + ("\n" + format_scaling(record) if scaled else ""))
    ladder_chart(record, out / "ladder.png")
    print(format_table(record))
    if scaled:
        print("\n" + format_scaling(record), end="")
    print(f"wrote {out / 'ladder.json'}, {out / 'ladder.md'}, {out / 'ladder.png'}")


def _bench_config(args, device: torch.device, caps: Capabilities, dist: distributed.Dist) -> BenchConfig:
    d = defaults_for(device)
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


def nothing_measured(record: dict, where: Path) -> str | None:
    """Why a bench or profile ran no rung at all (exit 1, its files still written), or None when one ran."""
    rows = record["rungs"]
    if any(r["status"] == "ok" for r in rows):
        return None
    tried = [r for r in rows if r["status"] != "skipped"]
    if tried and all(r["status"] == "oom" for r in tried):
        return (f"every rung ran out of memory at batch size {record['config']['batch_size']}; use a smaller "
                f"--batch-size or --batch-size auto (rows in {where})")
    first = (tried or rows)[0]
    return f"no rung could be measured: {first['name']} {first['status']}: {first['reason']} (rows in {where})"
