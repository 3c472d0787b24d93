"""Choosing the batch: one size that fits every rung asked for, and `--batch-size best`'s search.

`plan_batch` estimates each rung's step memory from its shapes and dtypes (`runtime/memory.py`), takes
the largest batch at which the heaviest rung fits (capped at the size asked for, 16 for GPT-2 by
default), then confirms it with a probe: two eager steps of the heaviest rung at that size, under the
allocator's cap. Eager steps need at least the memory of the compiled ones, so a size the probe passes
fits every rung. If the probe does not fit, the size shrinks by what it measured, a few probes at most;
a rung that still runs out of memory when timed is reported as such, never retried.

`fastest_batch` (`--batch-size best`) times the top rung at a few sizes up to the largest that fits
and keeps the one with the most tokens/s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gpt2ladder.errors import LadderError
from gpt2ladder.measure.bench import BenchConfig, run_bench
from gpt2ladder.model.config import GPT2_VOCAB_SIZE, ModelConfig
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import Capabilities, free_memory
from gpt2ladder.runtime.memory import HEADROOM, GiB, StepMemory, step_memory
from gpt2ladder.model.setup import Setup

PROBES = 4  # at most this many probe steps before giving up on a size


@dataclass(frozen=True)
class BatchPlan:
    """The micro-batch every rung runs at, and why."""

    batch: int
    largest: int  # the most sequences the heaviest rung fits (by the estimate, then the probe)
    heaviest: str  # that rung
    per_sequence: int  # bytes per sequence the heaviest rung needs (estimated)
    memory: int  # bytes planned against: the --gpu-memory cap, else the card
    capped: bool
    probed_peak: int | None  # bytes the probe's step peaked at, None when not probed
    asked: int | None = None  # the size asked for (the default 16, say); None: as large as fits

    def reason(self) -> str:
        """The line the commands print first, e.g. 'batch 3: the fp32 baseline needs 1.74 GiB per sequence
        on this 8 GiB card'."""
        gib = self.memory / GiB
        card = f"{gib:.0f} GiB" if abs(gib - round(gib)) < 0.05 else f"{gib:.1f} GiB"
        card += " (--gpu-memory)" if self.capped else ""
        who = "the fp32 baseline" if self.heaviest == "baseline" else f"the {self.heaviest} rung"
        need = f"{who} needs {self.per_sequence / GiB:.2f} GiB per sequence"
        if self.asked and self.batch >= self.asked:
            return f"batch {self.batch}: fits ({need}; up to {self.largest} fit on this {card} GPU)"
        if self.batch < self.largest:
            return f"batch {self.batch}: {need}; {self.largest} fit on this {card} GPU, {self.batch} divides the step"
        return f"batch {self.batch}: {need} on this {card} GPU"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def eager(setup: Setup) -> Setup:
    """The same step without compile or graph capture: what the probe runs (at least as much memory)."""
    return dataclasses.replace(setup, compile=False, cuda_graph=False)


def plan_batch(model_cfg: ModelConfig, rungs: list[tuple[str, Setup]], seq_len: int, caps: Capabilities,
               device: torch.device, want: int | None = None, divides: int | None = None, probe: bool = True,
               seed: int = 0) -> BatchPlan:
    """The batch for these (name, setup) rungs: the largest that fits, at most `want`, and (when given) a
    divisor of `divides` (train's accumulation needs micro-batch x steps = the batch it keeps)."""
    memory = caps.usable_memory
    heaviest, est = _heaviest(model_cfg, rungs, seq_len, accumulates=False)
    largest = est.largest_batch(memory)
    if divides is not None and want and largest < want:  # the step will accumulate micro-batches
        heaviest, est = _heaviest(model_cfg, rungs, seq_len, accumulates=True)
        largest = est.largest_batch(memory)
    peak = None
    if probe and largest:
        setup = dict(rungs)[heaviest]
        largest, peak = _confirm(model_cfg, eager(setup), seq_len, device, memory, min(largest, want or largest),
                                 est, seed)
    batch = _fitting(min(largest, want or largest), divides)
    if batch == 0:
        raise LadderError(f"not even one sequence of {seq_len} tokens fits: the {heaviest} rung needs "
                          f"{est.at(1) / GiB:.1f} GiB of this {memory / GiB:.1f} GiB GPU; try a smaller --seq-len "
                          "or --preset")
    return BatchPlan(batch, largest, heaviest, est.per_sequence, memory, bool(caps.memory_cap), peak, want)


def _heaviest(model_cfg: ModelConfig, rungs, seq_len: int, accumulates: bool) -> tuple[str, StepMemory]:
    estimates = {name: _estimate(model_cfg, setup, seq_len, accumulates) for name, setup in rungs}
    name = max(estimates, key=lambda n: (estimates[n].per_sequence, estimates[n].fixed))
    return name, estimates[name]


def _estimate(model_cfg: ModelConfig, setup: Setup, seq_len: int, accumulates: bool = False) -> StepMemory:
    """The larger of the rung's own estimate and its eager step's (which the probe runs): the eager
    step saves more activations, a CUDA graph keeps a pool of its own. A graph that captures several
    accumulated micro-batches is counted at twice each micro-batch's activations: on an H200 capped at
    8 GiB, GPT-2's graphed step of micro-batch 8 x 2 ran out of memory while capturing, 4 x 4 peaked at
    4.5 GiB and 8 x 2 without the graph at 6.2 GiB (benchmarks, 2026-12-01 memory runs)."""
    own, plain = step_memory(model_cfg, setup, seq_len), step_memory(model_cfg, eager(setup), seq_len)
    per_sequence = max(own.per_sequence, plain.per_sequence) * (2 if accumulates and setup.cuda_graph else 1)
    return StepMemory(max(own.fixed, plain.fixed), per_sequence)


def _fitting(batch: int, divides: int | None) -> int:
    """The largest size <= batch that divides `divides` (any size when None)."""
    if divides is None:
        return batch
    return max([d for d in range(1, batch + 1) if divides % d == 0], default=0)


def _confirm(model_cfg, setup: Setup, seq_len: int, device, memory: int, batch: int, est: StepMemory,
             seed: int) -> tuple[int, int | None]:
    """(a size whose probe fits, its peak bytes); shrinks by what each failed probe measured."""
    budget = HEADROOM * memory
    for _ in range(PROBES):
        if batch < 1:
            break
        peak = probe_peak(model_cfg, setup, seq_len, batch, device, seed)
        if peak is not None and peak <= budget:
            return batch, peak
        over = (peak or est.at(batch) * 1.25) / budget  # out of memory: assume a quarter more than estimated
        batch = min(batch - 1, int(batch / over))
    return 0, None


def probe_peak(model_cfg, setup: Setup, seq_len: int, batch: int, device, seed: int = 0) -> int | None:
    """Peak allocated bytes of two training steps at this batch (the second holds AdamW's state), or
    None when they run out of memory."""
    engine = None
    try:
        engine = Engine(model_cfg, setup, device, seed=seed)
        gen = torch.Generator().manual_seed(batch)
        x = torch.randint(0, GPT2_VOCAB_SIZE, (batch, seq_len), generator=gen).to(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(2):
            engine.step(x, x)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    except torch.OutOfMemoryError:
        peak = None
    del engine
    free_memory(device)
    return peak


BEST_FRACTIONS = (1, 3 / 4, 1 / 2, 3 / 8, 1 / 4)  # of the largest batch that fits: what `best` times


def batch_candidates(largest: int) -> list[int]:
    """The sizes `--batch-size best` times, largest first: fractions of the largest that fits, rounded
    down to a multiple of 8 from 16 up (whole tiles for the matmuls), without repeats."""
    sizes = []
    for f in BEST_FRACTIONS:
        b = max(1, int(largest * f))
        b = b - b % 8 if b >= 16 else b
        if b not in sizes:
            sizes.append(b)
    return sizes


def fastest_batch(cfg: BenchConfig, device, tokens, progress: bool, say, caps=None) -> tuple[BenchConfig, dict, dict]:
    """--batch-size best: the top rung timed at each candidate size up to the largest that fits; the
    config at the size with the most tokens/s, the search (every size tried) and the winner's record.

    The largest size is not always the fastest: near the memory limit the allocator and the caches do
    worse, while small sizes pay the per-step costs (optimizer, launches) on fewer tokens.
    """
    largest, tried, best = cfg.batch_size, [], None
    for b in batch_candidates(largest):
        say(f"--batch-size best: timing {b} sequences", flush=True)
        rec = run_bench(dataclasses.replace(cfg, batch_size=b, last_only=True), device, progress=progress,
                        notify=lambda *a, **k: None, tokens=tokens, caps=caps)
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
