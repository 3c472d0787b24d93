"""`--batch-size auto`: the largest micro-batch that fits this GPU's memory for the chosen rungs, and
`--batch-size best`: the fastest of a few sizes up to that one.

The probe runs eager steps (no compile, no graph capture: compiled steps use less memory, so the answer
errs on the safe side and costs seconds, not a compile per size). It doubles the batch until a step
runs out of memory or passes the headroom limit, then bisects between the last fit and the first
failure. Out-of-memory is caught and freed on the way; it never ends the run. The probe is an estimate:
if the measured (compiled, graphed) step still runs out of memory, `bench` measures again at 7/8 of
the size.
"""

from __future__ import annotations

import dataclasses

import torch

from gpt2ladder.errors import LadderError
from gpt2ladder.ladder import setup_for, why_unavailable
from gpt2ladder.measure.bench import BenchConfig, run_bench
from gpt2ladder.model.config import preset
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import free_memory

HEADROOM = 0.90  # never plan past 90% of device memory: the allocator and compile need slack
LIMIT = 4096


def largest_batch(cfg, device: torch.device, caps, notify=print) -> int:
    if device.type != "cuda":
        notify(f"notice: the memory probe of --batch-size auto/best needs a GPU; on {device.type} starting "
               f"from {cfg.batch_size if cfg.batch_size > 1 else 4}")
        return cfg.batch_size if cfg.batch_size > 1 else 4
    names = [n for n in cfg.rungs if why_unavailable(n, caps) is None]
    setup = dataclasses.replace(setup_for(names), compile=False, cuda_graph=False)
    good, bad = _probe(cfg, setup, device, caps.total_memory)
    free_memory(device)  # the probe's engine is gone with its frame
    if good == 0:
        raise LadderError("out of memory even at batch size 1 for these rungs and sequence length")
    notify(f"--batch-size auto: {good} sequences of {cfg.seq_len} fit (first failure at {bad})")
    return good


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


def _probe(cfg, setup, device, total_memory: int) -> tuple[int, int]:
    engine = Engine(preset(cfg.preset), setup, device, seed=cfg.seed)
    return search_largest(lambda b: _fits(engine, b, cfg.seq_len, device, total_memory))


def search_largest(fits, limit: int = LIMIT) -> tuple[int, int]:
    """The largest batch for which `fits` holds (0 if none), and the first that failed.

    Doubles from 1 until a failure, then bisects to within about 6%: a handful of probes, never one
    past the first failure's size.
    """
    good, b = 0, 1
    while b <= limit and fits(b):
        good, b = b, b * 2
    bad = b
    while bad - good > max(1, good // 16):
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good, bad


def _fits(engine: Engine, batch: int, seq_len: int, device, total_memory: int) -> bool:
    gen = torch.Generator().manual_seed(batch)
    x = torch.randint(0, 50257, (batch, seq_len), generator=gen).to(device)
    try:
        torch.cuda.reset_peak_memory_stats(device)
        engine.step(x, x)
        torch.cuda.synchronize(device)
        ok = torch.cuda.max_memory_reserved(device) <= HEADROOM * total_memory
    except torch.OutOfMemoryError:
        ok = False
    engine.optimizer.zero_grad(set_to_none=True)
    free_memory(device)
    return ok


AUTO_BACKOFF = 7 / 8  # when the measured step does not fit the probed batch: try this fraction of it
AUTO_RETRIES = 4


def back_off_if_oom(record: dict, cfg: BenchConfig, device, tokens, progress: bool, say, on_row) -> dict:
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


def fastest_batch(cfg: BenchConfig, device, tokens, progress: bool, say) -> tuple[BenchConfig, dict, dict]:
    """--batch-size best: the top rung timed at each candidate size up to the largest that fits; the
    config at the size with the most tokens/s, the search (every size tried) and the winner's record.

    The largest size is not always the fastest: near the memory limit the allocator and the caches do
    worse, while small sizes pay the per-step costs (optimizer, launches) on fewer tokens.
    """
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
