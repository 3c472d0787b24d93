"""The bench: climb the ladder on this machine and time every rung the same way.

Each rung gets a fresh model from the same seed and the same batches, and its steps are timed by the
harness (`harness.timed_step`). Warm-up steps (compile, autotuning, graph capture, allocator growth)
are left out; the median and the spread of the timed steps are reported. How many steps are timed is a
`timing.StepRule` the command chose: exactly --steps, or on a GPU without it more while a rung's
p10-p90 range is wide, up to a bound (each row's n_timed and "timing" say how many, and why).

Under torchrun (`torchrun --nproc_per_node=N -m gpt2ladder bench ...`) every rank runs every rung
under the strategy the command chose (DDP; FSDP2 for gpt2-large/xl, or as --strategy says). --batch-size
is then per GPU, so the global batch is N times larger and each GPU does the work of a one-GPU run:
tokens/s total and per GPU compare directly with a one-GPU ladder.json, passed as --baseline-json for a
scaling efficiency.
A step's time is the slowest rank's; rank 0 alone prints and writes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from gpt2ladder import data as data_mod
from gpt2ladder import defaults
from gpt2ladder.ladder import setup_for, why_unavailable
from gpt2ladder.measure.harness import Row, climb, guarded, timed_step, tokens_for
from gpt2ladder.measure.timing import StepRule
from gpt2ladder.model.recipe import parse_recipe, with_recipe
from gpt2ladder.model.config import ModelConfig, check_run_shape, preset
from gpt2ladder.report.progress import progress_bar
from gpt2ladder.report.records import record_header
from gpt2ladder.runtime import distributed
from gpt2ladder.runtime.engine import Engine, OptimConfig
from gpt2ladder.runtime.hardware import Capabilities, free_memory
from gpt2ladder.runtime.metrics import TimingStats, flops_per_token, mfu, peak_flops


_D = defaults.library("bench")  # a config built without a value: what `bench` decides on a CPU


@dataclass(frozen=True)
class BenchConfig:
    """What a bench times, every choice made: the command resolves flags and defaults into these once."""

    preset: str = _D["preset"]
    rungs: tuple[str, ...] = ()
    batch_size: int = _D["batch_size"]  # per process
    seq_len: int = _D["seq_len"]
    steps: int = _D["steps"]
    warmup: int = _D["warmup"]
    seed: int = _D["seed"]
    data: str | None = None  # a text file; None = Tiny Shakespeare (random tokens if unavailable)
    compile_backend: str = "inductor"
    strategy: str | None = None  # "ddp" or "fsdp" under torchrun, None for one process
    last_only: bool = False  # time only the top of the ladder: every named rung applied together
    start: str | None = None  # time the rungs from this one on; the ones before it are applied, not timed
    model: ModelConfig | None = None  # the preset's shape; None: looked up here, once (the record's "model")
    recipe: str = "gpt2"  # what is trained (`model/recipe.py`); its model parts are set on `model`

    def __post_init__(self) -> None:
        if self.model is None:
            object.__setattr__(self, "model", preset(self.preset))  # frozen: set once, here
        object.__setattr__(self, "recipe", parse_recipe(self.recipe).name)
        object.__setattr__(self, "model", with_recipe(self.model, self.recipe))
        check_run_shape(self.model, self.preset, batch_size=self.batch_size, seq_len=self.seq_len, steps=self.steps,
                        warmup=self.warmup)

    def to_dict(self) -> dict:
        """The record's "config": every field but the shape, which the record keeps as "model"."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}


def run_bench(cfg: BenchConfig, device: torch.device, dist: distributed.Dist = distributed.SINGLE, *,
              progress: bool = True, notify=print, tokens: data_mod.TokenData | None = None, on_row=None,
              caps: Capabilities, rule: StepRule | None = None) -> dict:
    """Measure every rung in `cfg.rungs` (cumulatively) and return the self-describing record.

    `on_row(record)`, if given, sees the record so far after each rung: a long run that is cut off
    still leaves the rungs it measured. `caps` is what the caller detected of the device and what the record
    says of it, a --gpu-memory cap included. `rule` says how many steps each rung times (default: `cfg.steps`).
    """
    tokens = tokens_for(cfg.data, cfg.seed, notify) if tokens is None else tokens
    rule = rule or StepRule.fixed(cfg.steps)
    rows = []
    for row in climb(cfg.rungs, lambda name: why_unavailable(name, caps, cfg.strategy, parse_recipe(cfg.recipe)),
                     cfg.last_only, cfg.start):
        rows.append(measure_rung(row, cfg, tokens, device, caps, dist, progress, rule))
        add_speedups(rows)
        if on_row is not None:
            on_row(bench_record(cfg, caps, device, dist, tokens, rows, partial=True, rule=rule))
    return bench_record(cfg, caps, device, dist, tokens, rows, partial=False, rule=rule)


def bench_record(cfg: BenchConfig, caps, device, dist: distributed.Dist, tokens, rows, partial: bool,
                 rule: StepRule | None = None) -> dict:
    """The record: what ran, on what, and the rows; "step_rule" only when the count of timed steps adapted."""
    parallel = {"world_size": dist.world_size, "backend": dist.backend, "strategy": cfg.strategy,
                "global_batch_size": cfg.batch_size * dist.world_size}
    adaptive = {"step_rule": rule.to_dict()} if rule is not None and rule.adaptive else {}
    return {**record_header(caps, device), "command": "bench", "config": cfg.to_dict(), **parallel,
            "model": cfg.model.to_dict(), "data": {"source": tokens.source, "n_tokens": tokens.n_tokens},
            "peak_flops": peak_flops(caps.name), "partial": partial, "rungs": list(rows), **adaptive}


class NotTraining(RuntimeError):
    """A rung whose step ran but does not train: its loss is not a number. Its row says so instead of a time."""


def measure_rung(row: Row, cfg: BenchConfig, tokens, device, caps: Capabilities,
                 dist: distributed.Dist = distributed.SINGLE, progress: bool = True,
                 rule: StepRule | None = None) -> dict:
    """One row of the ladder: the setup of `row.applied` timed (as many steps as `rule` asks for, default
    `cfg.steps`), or why it was not."""
    if row.reason:
        return row.skipped()
    setup = setup_for(list(row.applied))
    rule = rule or StepRule.fixed(cfg.steps)
    result = guarded(lambda: _time_setup(setup, cfg, tokens, device, dist, progress, row.name, rule),
                     device, cfg.batch_size, auto_batch=True)
    if result["status"] != "ok":
        return {**row.rung_fields(), **result}
    flops = flops_per_token(result.pop("model_config"), cfg.seq_len, result.pop("n_params"))
    # Utilisation of each GPU against one GPU's peak: the per-GPU share of the tokens, not the total.
    tok_s = result["tokens_per_s_per_gpu"]
    measured = {k: v for k, v in result.items() if k != "status"}
    return {**row.rung_fields(), "status": "ok", "setup": setup.to_dict(), **measured,
            "flops_per_token": flops, "mfu": mfu(tok_s, flops, peak_flops(caps.name))}


def _time_setup(setup, cfg: BenchConfig, tokens, device, dist: distributed.Dist, progress: bool, label: str,
                rule: StepRule) -> dict:
    engine = Engine(cfg.model, setup, device, seed=cfg.seed, compile_backend=cfg.compile_backend,
                    optim=OptimConfig.of(parse_recipe(cfg.recipe)),
                    parallelize=distributed.parallelize_for(dist, cfg.strategy))
    # --batch-size is per GPU: this rank reads its share of a global batch W times larger.
    batches = data_mod.Batches(tokens.train, cfg.batch_size * dist.world_size, cfg.seq_len, seed=cfg.seed,
                               rank=dist.rank, world_size=dist.world_size)
    samples, losses = _timed_steps(engine, batches, cfg, device, progress_bar(
        cfg.warmup + rule.steps, label, progress and dist.is_main), rule, dist)
    final_loss = float(distributed.all_reduce_mean(losses[-1], dist))
    if not math.isfinite(final_loss):
        raise NotTraining(f"its loss was {final_loss} after {cfg.warmup + len(samples)} steps: the step does not "
                          "compute the model's function, so its time is no speed")
    # Every rank has the same samples (the slowest rank's), and so makes the same decisions (--rungs best).
    stats = TimingStats.of(samples)
    logits_dtype, weight_dtype = _dtypes(engine, data_mod.to_device(*batches.batch(0), device)[0])
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    if peak is not None:
        peak = int(distributed.reduce_floats([peak], dist, "max")[0])  # per GPU: the fullest one
    tokens_per_s = cfg.batch_size * dist.world_size * cfg.seq_len / (stats.median / 1000)
    result = {
        "ms_per_step": stats.median, "ms_p10": stats.p10, "ms_p90": stats.p90, "ms_min": stats.min,
        "ms_max": stats.max, "n_timed": stats.n, "samples_ms": [round(s, 4) for s in samples],
        **({"timing": rule.outcome(samples)} if rule.adaptive else {}),
        "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / dist.world_size,
        "peak_mem_bytes": peak, "loss": final_loss,
        "logits_dtype": logits_dtype,
        "weight_dtype": weight_dtype, "model_config": engine.raw_model.config,
        "n_params": engine.raw_model.num_params(),
    }
    del engine
    free_memory(device)
    return result


def _timed_steps(engine: Engine, batches, cfg: BenchConfig, device, bar, rule: StepRule,
                 dist: distributed.Dist = distributed.SINGLE) -> tuple[list, list]:
    """Warm-up steps, then timed steps while `rule` asks for more; the timed steps' milliseconds and losses.

    The group steps together, so a step lasts as long as its slowest rank: each step's time is the
    slowest rank's (reduced outside the clock), and every rank, judging the same samples, stops together.
    """
    samples, losses = [], []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(cfg.warmup):
        _tick(bar, timed_step(engine, batches, device)[0])
    while rule.more(samples):
        ms, loss = timed_step(engine, batches, device)
        samples.append(distributed.reduce_floats([ms], dist, "max")[0])
        losses.append(loss)
        bar.total = max(bar.total, cfg.warmup + len(samples))  # an adaptive rung may run past the count
        _tick(bar, ms)
    bar.close()
    return samples, losses


def _tick(bar, ms: float) -> None:
    bar.update(1)
    bar.set_postfix_str(f"{ms:.1f} ms")


@torch.no_grad()
def _dtypes(engine: Engine, x: torch.Tensor) -> tuple[str, str]:
    """What the write-up prints: the logits' dtype inside the step, and the weights' dtype."""
    with engine.precision(), engine.autocast():
        # The whole forward (not hidden + lm_head): under FSDP2 only it gathers the sharded weights.
        logits, _ = engine.raw_model(x[:1, :16])
    weight = engine.raw_model.lm_head.weight.dtype  # the matrices' (a bf16_tables recipe's tables are bf16)
    head = "float8_e4m3fn" if engine.setup.fp8_head else str(logits.dtype).replace("torch.", "")
    return head, str(weight).replace("torch.", "")


def add_speedups(rows: list[dict]) -> None:
    """Speed-up against the baseline (first measured rung) and against the previous measured rung, and
    whether the rung is within noise of that one (their p10-p90 ranges overlap)."""
    measured = [r for r in rows if r["status"] == "ok"]
    if not measured:
        return
    base = measured[0]["ms_per_step"]
    prev = None
    for r in measured:
        r["speedup_vs_baseline"] = base / r["ms_per_step"]
        r["speedup_vs_prev"] = prev["ms_per_step"] / r["ms_per_step"] if prev else None
        r["within_noise_of_prev"] = within_noise(r, prev) if prev else None
        prev = r


def within_noise(row: dict, prev: dict) -> bool:
    """Whether two measured rows' p10-p90 ranges overlap: then the step did not measurably change."""
    return row["ms_p10"] <= prev["ms_p90"] and prev["ms_p10"] <= row["ms_p90"]
