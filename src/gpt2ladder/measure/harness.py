"""The one harness every measuring command stands on: climb the rungs, guard a rung, time a step.

- `climb` walks a list of rungs the way the ladder is defined: rung k is every rung up to k that can
  run here (a rung that cannot is a skipped row, and the climb goes on without it, as the write-up's
  "if not, go straight to compile"). `bench`, `parity` and `profile` all take their rows from it.
- `guarded` runs one rung's work: a rung that breaks (out of memory included) becomes a row with a
  status and a one-line reason, never a lost run.
- `timed_step` times one training step as the seed does, made strict: the batch is copied to the
  device first, then synchronize, read the clock, zero_grad + forward + backward + optimizer step,
  synchronize, read the clock.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.errors import LadderError, describe_failure
from gpt2ladder.ladder import RUNGS_BY_NAME
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import free_memory, synchronize
from gpt2ladder.runtime.memory import parameters
from gpt2ladder.runtime.metrics import flops_per_token
from gpt2ladder.model.setup import Setup


@dataclass(frozen=True)
class Row:
    """One row of a climb: the rung it is named after, the rungs applied to reach it, or why it cannot run."""

    name: str
    applied: tuple[str, ...]
    reason: str | None = None  # not None: the rung cannot run here (a skipped row)

    def row(self) -> dict:
        """The fields every row of every record starts with."""
        rung = RUNGS_BY_NAME[self.name]
        return {"name": self.name, "summary": rung.summary, "kind": rung.kind}

    def skipped(self) -> dict:
        return {**self.row(), "status": "skipped", "reason": self.reason}


def climb(names: list[str] | tuple[str, ...], why_not: Callable[[str], str | None],
          last_only: bool = False) -> list[Row]:
    """The rows of a ladder over `names`, each with the rungs applied to reach it.

    With `last_only` one row: the top of what can run here, under its own name (every named rung that
    can run, applied together).
    """
    rows, applied = [], []
    for k, name in enumerate(names):
        reason = why_not(name)
        if reason is None:
            applied.append(name)
        if last_only and k < len(names) - 1:
            continue
        if last_only and applied:
            name, reason = applied[-1], None
        rows.append(Row(name, tuple(applied), reason))
    return rows


def guarded(work: Callable[[], dict], device: torch.device, batch_size: int) -> dict:
    """{"status": "ok", **work()}, or a row saying why the work broke: "oom" or "failed" with a reason.

    A rung that breaks is a finding, not a reason to lose the others. A `LadderError` (a problem of
    the whole run, not of this rung) still ends the run.
    """
    try:
        result = {"status": "ok", **work()}
    except LadderError:
        raise
    except torch.OutOfMemoryError:
        result = {"status": "oom", "reason": f"out of memory at batch size {batch_size}; "
                  "try a smaller --batch-size or --batch-size auto"}
    except Exception as err:
        result = {"status": "failed", "reason": describe_failure(err)}
    free_memory(device)  # after the except block, so the traceback no longer holds the failed step's tensors
    return result


def timed_step(engine: Engine, batches: data_mod.Batches, device: torch.device,
               region=contextlib.nullcontext) -> tuple[float, torch.Tensor]:
    """One training step on the next batch: (milliseconds, the loss as a device tensor).

    The copy to the device is outside the clock; `region` (a context manager, e.g. a profiler range)
    encloses exactly what the clock measures.
    """
    x, y = data_mod.to_device(*batches.next(), device)
    synchronize(device)
    t0 = time.perf_counter()
    with region():
        loss = engine.step(x, y)
        synchronize(device)  # the step ends when the device is done
    return (time.perf_counter() - t0) * 1000, loss


def tokens_for(data: str | None, seed: int, notify=print) -> data_mod.TokenData:
    """The text to time steps on; step time does not depend on it, so random tokens stand in if needed."""
    if data is not None:
        return data_mod.load_tokens(Path(data), notify=notify)
    try:
        return data_mod.load_tokens(None, notify=notify)
    except data_mod.DataUnavailable as err:
        notify(f"notice: {err} -- timing on random tokens instead; the loss column is not meaningful.")
        return data_mod.random_tokens(400_000, seed=seed)


def matmul_rate(device: torch.device, n: int = 1024, repeats: int = 3) -> float:
    """FLOP/s of an (n x n) @ (n x n) fp32 matmul on this device, the best of a few: a ceiling for a step."""
    a = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first call warms up
        synchronize(device)
        t0 = time.perf_counter()
        a @ a
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def cpu_warning(model_cfg, cfg, n_rungs: int, rate: float | None = None) -> str:
    """A notice before a GPT-2-sized bench on a CPU: how long it takes at least, from this CPU's matmul rate."""
    rate = matmul_rate(torch.device("cpu")) if rate is None else rate
    n_params = parameters(model_cfg, Setup()) - model_cfg.block_size * model_cfg.n_embd  # without wpe, as MFU counts
    flops = flops_per_token(model_cfg, cfg.seq_len, n_params) * cfg.batch_size * cfg.seq_len
    seconds = flops / rate * (cfg.steps + cfg.warmup) * n_rungs
    return (f"notice: {cfg.preset} on a CPU: one step of batch {cfg.batch_size} x {cfg.seq_len} is "
            f"{flops / 1e12:.1f} TFLOP; at this CPU's fp32 matmul rate ({rate / 1e9:.0f} GFLOP/s, measured now) "
            f"the {(cfg.steps + cfg.warmup) * n_rungs} steps of this ladder take at least {_duration(seconds)}; "
            "--preset tiny runs the same ladder in about a minute")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


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
