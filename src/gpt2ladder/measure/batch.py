"""Choosing the batch: one size that fits every rung asked for, and `--batch-size best`'s search.

`plan_batch` estimates each rung's step memory from its shapes and dtypes (`runtime/memory.py`), takes
the largest batch at which the heaviest rung fits what the card's allocator can hold (capped at the size
asked for, 16 for GPT-2 by default), then confirms it with a probe: two eager steps of the heaviest rung
at that size, under the allocator's cap. Eager steps save at least the activations of the compiled
ones, so a size the probe passes fits every rung's activations; what the probe never runs (a second set
of gradients when micro-batches accumulate, a CUDA graph's pool, validation beside it) only the estimate
counts. If the probe does not fit, the size shrinks by what it measured, a few probes at most; a rung
that still runs out of memory when timed is reported as such, never retried.

`plan_training` decides, once, whether `train` keeps its CUDA graph: not where the graphed step cannot
fit even one sequence per micro-batch and the plain one can. `plan_bench_batch` climbs the ladder at a
shorter sequence where not even one sequence of the asked length fits every rung.

Off CUDA nothing is planned: `check_sizes` refuses, in one line before anything is allocated, a step
that the host (or an Apple GPU) cannot hold by the estimate.

`fastest_batch` (`--batch-size best`) times the top rung at a few sizes up to the largest that fits
and keeps the one with the most tokens/s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from gpt2ladder.errors import SMALLER_STEP, LadderError, UsageError
from gpt2ladder.ladder import RUNGS_BY_NAME, setup_for
from gpt2ladder.measure.bench import BenchConfig, run_bench
from gpt2ladder.measure.timing import StepRule
from gpt2ladder.model.config import GPT2_VOCAB_SIZE, ModelConfig
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import Capabilities, free_memory
from gpt2ladder.runtime.memory import HEADROOM, GiB, StepMemory, check_all_fit, step_memory
from gpt2ladder.model.setup import Setup

PROBES = 4  # at most this many probe steps before giving up on a size
MIN_SEQ_LEN = 64  # the shortest sequence bench falls back to: shorter, a step measures mostly its overheads


@dataclass(frozen=True)
class BatchPlan:
    """The micro-batch every rung runs at, and why."""

    batch: int
    largest: int  # the most sequences the heaviest rung fits (by the estimate, then the probe)
    heaviest: str  # that rung
    per_sequence: int  # bytes per sequence the heaviest rung needs (estimated)
    memory: int  # bytes planned against: what this card's allocator can hold
    capped: bool
    probed_peak: int | None  # bytes the probe's step peaked at, None when not probed
    asked: int | None = None  # the size asked for (the default 16, say); None: as large as fits
    card: int = 0  # bytes of the card: the one --gpu-memory stands in for, else what the device reports
    seq_len: int = 0  # tokens per sequence planned for
    shortened_from: int | None = None  # the length asked for, when not even one sequence of it fit every rung
    full_length_heaviest: str | None = None  # then the rung that needed the most for one such sequence
    full_length_need: int | None = None  # and the bytes it needed

    def reason(self) -> str:
        """The line the commands print first, e.g. 'batch 2: the bf16 rung needs 1.74 GiB per sequence on
        this 8 GiB GPU, 7.5 GiB of it for PyTorch'."""
        card = card_text(self.card, self.memory, self.capped)
        need = f"{_who(self.heaviest)} needs {self.per_sequence / GiB:.2f} GiB per sequence"
        if self.asked and self.batch >= self.asked:
            text = f"batch {self.batch}: fits ({need}; up to {self.largest} fit on this {card})"
        elif self.batch < self.largest:
            text = f"batch {self.batch}: {need}; {self.largest} fit on this {card}; {self.batch} divides the step"
        else:
            text = f"batch {self.batch}: {need} on this {card}"
        if self.shortened_from is None:
            return text
        return (f"sequences of {self.seq_len} tokens: not even one of {self.shortened_from} fits every rung "
                f"({_who(self.full_length_heaviest)} needs {self.full_length_need / GiB:.2f} GiB for one, of "
                f"{HEADROOM * self.memory / GiB:.2f} GiB planned for), so every rung runs at {self.seq_len}, the "
                f"longest power of two that fits; {text}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def card_text(card: int, memory: int, capped: bool) -> str:
    """'8 GiB GPU, 7.5 GiB of it for PyTorch' ('8 GiB (--gpu-memory) GPU, ...' for a stand-in)."""
    return f"{_gib(card)}{' (--gpu-memory)' if capped else ''} GPU, {_gib(memory)} of it for PyTorch"


def _gib(n: int) -> str:
    gib = n / GiB
    return f"{gib:.0f} GiB" if abs(gib - round(gib)) < 0.05 else f"{gib:.1f} GiB"


def _who(rung: str | None) -> str:
    return "the fp32 baseline" if rung == "baseline" else f"the {rung} rung"


def eager(setup: Setup) -> Setup:
    """The same step without compile or graph capture: what the probe runs (at least as much memory)."""
    return dataclasses.replace(setup, compile=False, cuda_graph=False)


def plan_batch(model_cfg: ModelConfig, rungs: list[tuple[str, Setup]], seq_len: int, caps: Capabilities,
               device: torch.device, want: int | None = None, divides: int | None = None, probe: bool = True,
               seed: int = 0, validates: bool = False) -> BatchPlan:
    """The batch for these (name, setup) rungs: the largest that fits, at most `want`, and (when given) a
    divisor of `divides` (train's accumulation needs micro-batch x steps = the batch it keeps).
    `validates`: validation runs between the steps (train), beside what a CUDA graph keeps."""
    memory = caps.usable_memory
    heaviest, est = _heaviest(model_cfg, rungs, seq_len, accumulates=False, validates=validates)
    largest = est.largest_batch(memory)
    if divides is not None and want and largest < want:  # the step will accumulate micro-batches
        heaviest, est = _heaviest(model_cfg, rungs, seq_len, accumulates=True, validates=validates)
        largest = est.largest_batch(memory)
    peak, probed = None, None
    if probe and largest:
        setup = dict(rungs)[heaviest]
        largest, peak, probed = _confirm(model_cfg, eager(setup), seq_len, device, memory,
                                         min(largest, want or largest), est, seed)
    batch = _fitting(min(largest, want or largest), divides)
    if batch == 0:
        raise LadderError(nothing_fits(seq_len, heaviest, est, caps) if probed is None
                          else probe_failed(seq_len, heaviest, est, caps, probed, peak))
    return BatchPlan(batch, largest, heaviest, est.per_sequence, memory, bool(caps.memory_cap), peak, want,
                     card=caps.card_memory, seq_len=seq_len)


def nothing_fits(seq_len: int, heaviest: str, est: StepMemory, caps: Capabilities) -> str:
    """The one line for a card where not even one sequence fits, naming what to change."""
    card = card_text(caps.card_memory, caps.usable_memory, bool(caps.memory_cap))
    return (f"not even one sequence of {seq_len} tokens fits: {_who(heaviest)} needs {est.at(1) / GiB:.2f} GiB "
            f"for one, more than the {HEADROOM * caps.usable_memory / GiB:.2f} GiB planned for on this {card}; "
            f"{SMALLER_STEP}")


def check_sizes(model_cfg: ModelConfig, rungs: list[tuple[str, Setup]], batch: int, seq_len: int,
                caps: Capabilities, batch_tokens: int, fewer_tokens: str) -> None:
    """Off CUDA, before anything is allocated: a UsageError (one line, naming the largest batch that fits)
    unless a step of `batch` x `seq_len` of every one of these (name, setup) rungs, and `batch_tokens`
    tokens of batches made on the host, fit the memory they run in (`runtime/memory.py check_all_fit`).

    On a GPU the plan decides instead: a rung that runs out of memory there is a measured row, and the
    estimate runs high for compiled rungs, so a size it refused might well have run.
    """
    if caps.device_type == "cuda" or not rungs:
        return
    problem = check_all_fit(model_cfg, [setup for _, setup in rungs], batch, seq_len, caps,
                            batch_tokens=batch_tokens, fewer_tokens=fewer_tokens)
    if problem:
        raise UsageError(problem)


def probe_failed(seq_len: int, heaviest: str, est: StepMemory, caps: Capabilities, tried: int,
                 peak: int | None) -> str:
    """The one line when the estimate fits a batch but no probe does: what the last probe measured."""
    card = card_text(caps.card_memory, caps.usable_memory, bool(caps.memory_cap))
    found = f"peaked at {peak / GiB:.2f} GiB" if peak is not None else "ran out of memory"
    planned = HEADROOM * caps.usable_memory / GiB
    probe = (f"its probe (two eager steps) at batch {tried} {found}, over the {planned:.2f} GiB planned for "
             f"on this {card}")
    if tried == 1:
        return (f"not even one sequence of {seq_len} tokens fits: {_who(heaviest)} is estimated at "
                f"{est.at(1) / GiB:.2f} GiB for one, but {probe}; {SMALLER_STEP}")
    return (f"no batch of {seq_len}-token sequences passed its probe: for {_who(heaviest)} {probe}, the last of "
            f"{PROBES} tries; give a smaller --batch-size, or {SMALLER_STEP.removeprefix('use ')}")


def plan_bench_batch(model_cfg: ModelConfig, rungs: list[tuple[str, Setup]], seq_len: int, caps: Capabilities,
                     device: torch.device, want: int | None = None, probe: bool = True, seed: int = 0,
                     shorten: bool = True) -> BatchPlan:
    """`plan_batch` for bench; where not even one sequence of `seq_len` tokens fits every rung and
    `shorten` (the length was not asked for), the plan at the longest power-of-two length that does.
    Every rung then runs at that one length, and the plan's reason, the command's first line, says why."""
    heaviest, est = _heaviest(model_cfg, rungs, seq_len, accumulates=False)
    shorter = longest_fitting_seq_len(model_cfg, rungs, seq_len, caps.usable_memory) if shorten else None
    if est.largest_batch(caps.usable_memory) or shorter is None:
        return plan_batch(model_cfg, rungs, seq_len, caps, device, want=want, probe=probe, seed=seed)
    plan = plan_batch(model_cfg, rungs, shorter, caps, device, want=want, probe=probe, seed=seed)
    return dataclasses.replace(plan, shortened_from=seq_len, full_length_heaviest=heaviest,
                               full_length_need=est.at(1))


def longest_fitting_seq_len(model_cfg: ModelConfig, rungs: list[tuple[str, Setup]], seq_len: int,
                            memory: int) -> int | None:
    """The longest power of two below `seq_len`, and not below MIN_SEQ_LEN, at which one sequence fits
    every rung in `memory` bytes by the estimate; None when none does."""
    length = 1 << ((seq_len - 1).bit_length() - 1)  # the largest power of two under seq_len
    while length >= MIN_SEQ_LEN:
        if _heaviest(model_cfg, rungs, length, accumulates=False)[1].largest_batch(memory) >= 1:
            return length
        length //= 2
    return None


def plan_training(model_cfg: ModelConfig, rungs: tuple[str, ...], seq_len: int, caps: Capabilities,
                  device: torch.device, per_rank: int, validates: bool, graph_only_too: bool = False,
                  probe: bool = True, seed: int = 0) -> tuple[tuple[str, ...], BatchPlan, str | None]:
    """The rungs and the micro-batch `train` runs: the largest micro-batch that fits and divides the step's
    `per_rank` sequences, with every rung asked for; or, where a CUDA graph does not fit even at
    micro-batch 1 and the step without it does, the rungs without the graph (and, `graph_only_too`,
    without those that pay only inside one), with the notice that says so (else None)."""
    memory, accumulates = caps.usable_memory, per_rank > 1
    notice = None
    if "cuda_graph" in rungs:
        plain = without_graph(rungs, graph_only_too)
        graphed_est = _top_estimate(model_cfg, rungs, seq_len, accumulates, validates)
        plain_est = _top_estimate(model_cfg, plain, seq_len, accumulates, validates)
        if graphed_est.largest_batch(memory) == 0 and plain_est.largest_batch(memory) > 0:
            notice = graph_notice(rungs, plain, graphed_est.at(1), plain_est.at(1), caps)
            rungs = plain
    plan = plan_batch(model_cfg, [(rungs[-1], setup_for(list(rungs)))], seq_len, caps, device, want=per_rank,
                      divides=per_rank, probe=probe, seed=seed, validates=validates)
    return rungs, plan, notice


def without_graph(rungs: tuple[str, ...], graph_only_too: bool) -> tuple[str, ...]:
    """These rungs less cuda_graph and, `graph_only_too`, less those that pay only inside a graph."""
    return tuple(n for n in rungs if n != "cuda_graph" and not (graph_only_too and RUNGS_BY_NAME[n].pays_with_graph))


def graph_notice(rungs: tuple[str, ...], plain: tuple[str, ...], graphed: int, ungraphed: int,
                 caps: Capabilities) -> str:
    """The one line `train` prints when it leaves the CUDA graph out to fit."""
    others = [n for n in rungs if n not in plain and n != "cuda_graph"]
    also = f" (nor {', '.join(others)}, which pay only inside one)" if others else ""
    card = card_text(caps.card_memory, caps.usable_memory, bool(caps.memory_cap))
    return (f"notice: training without a CUDA graph{also}: its memory pool keeps the step's activations apart, "
            f"so micro-batch 1 would need {graphed / GiB:.2f} GiB with it and needs {ungraphed / GiB:.2f} GiB "
            f"without, of {HEADROOM * caps.usable_memory / GiB:.2f} GiB planned for on this {card}")


def _top_estimate(model_cfg: ModelConfig, rungs: tuple[str, ...], seq_len: int, accumulates: bool,
                  validates: bool) -> StepMemory:
    return _estimate(model_cfg, setup_for(list(rungs)), seq_len, accumulates, validates)


def _heaviest(model_cfg: ModelConfig, rungs, seq_len: int, accumulates: bool,
              validates: bool = False) -> tuple[str, StepMemory]:
    estimates = {name: _estimate(model_cfg, setup, seq_len, accumulates, validates) for name, setup in rungs}
    name = max(estimates, key=lambda n: (estimates[n].per_sequence, estimates[n].fixed))
    return name, estimates[name]


def _estimate(model_cfg: ModelConfig, setup: Setup, seq_len: int, accumulates: bool = False,
              validates: bool = False) -> StepMemory:
    """The larger of the rung's own estimate and its eager step's (which the probe runs): the eager step
    saves more activations, the compiled one holds more gradients when accumulating, a CUDA graph keeps
    a pool of its own."""
    own = step_memory(model_cfg, setup, seq_len, accumulates, validates)
    plain = step_memory(model_cfg, eager(setup), seq_len, accumulates, validates)
    return StepMemory(max(own.fixed, plain.fixed), max(own.per_sequence, plain.per_sequence))


def _fitting(batch: int, divides: int | None) -> int:
    """The largest size <= batch that divides `divides` (any size when None)."""
    if divides is None:
        return batch
    return max([d for d in range(1, batch + 1) if divides % d == 0], default=0)


def _confirm(model_cfg, setup: Setup, seq_len: int, device, memory: int, batch: int, est: StepMemory,
             seed: int) -> tuple[int, int | None, int]:
    """(a size whose probe fits, its peak bytes, that size); shrinks by what each failed probe measured.
    When none fits: (0, the last probe's peak or None if it ran out of memory, the last size probed)."""
    budget, peak, tried = HEADROOM * memory, None, batch
    for _ in range(PROBES):
        if batch < 1:
            break
        tried, peak = batch, probe_peak(model_cfg, setup, seq_len, batch, device, seed)
        if peak is not None and peak <= budget:
            return batch, peak, batch
        over = (peak or est.at(batch) * 1.25) / budget  # out of memory: assume a quarter more than estimated
        batch = min(batch - 1, int(batch / over))
    return 0, peak, tried


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


def fastest_batch(cfg: BenchConfig, device, tokens, progress: bool, say, caps=None,
                  rule: StepRule | None = None) -> tuple[BenchConfig, dict, dict]:
    """--batch-size best: the top rung timed at each candidate size up to the largest that fits (each as
    `rule` says, like every rung of the bench); the config at the size with the most tokens/s, the search
    (every size tried) and the winner's record.

    The largest size is not always the fastest: near the memory limit the allocator and the caches do
    worse, while small sizes pay the per-step costs (optimizer, launches) on fewer tokens.
    """
    largest, tried, best = cfg.batch_size, [], None
    for b in batch_candidates(largest):
        say(f"--batch-size best: timing {b} sequences", flush=True)
        rec = run_bench(dataclasses.replace(cfg, batch_size=b, last_only=True, start=None), device, progress=progress,
                        notify=lambda *a, **k: None, tokens=tokens, caps=caps, rule=rule)
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
