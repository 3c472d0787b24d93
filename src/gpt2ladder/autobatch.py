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

from gpt2ladder.config import preset
from gpt2ladder.engine import Engine
from gpt2ladder.hardware import free_memory
from gpt2ladder.rungs import setup_for, why_unavailable

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
        from gpt2ladder.errors import LadderError

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
