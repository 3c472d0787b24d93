"""The one harness every measuring command stands on: climb the rungs, guard a rung, time a step.

- `climb` walks a list of rungs the way the ladder is defined: rung k is every rung up to k that can
  run here (a rung that cannot is a skipped row, and the climb goes on without it, as the write-up's
  "if not, go straight to compile"). `bench`, `parity` and `profile` all take their rows from it.
- `guarded` runs one rung's work: a rung that breaks (out of memory included) becomes a row with a
  status and a one-line reason, never a lost run.
- `timed_step` times one training step as the write-up does, made strict: the batch is copied to the
  device first, then synchronize, read the clock, zero_grad + forward + backward + optimizer step,
  synchronize, read the clock.
- `tokens_for` gives the text the steps run on; step time does not depend on it, so random tokens
  stand in (and say so) where Tiny Shakespeare cannot be had.

Messages for people about what was measured live in `report/notices.py`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from gpt2ladder import data as data_mod
from gpt2ladder.errors import LadderError, describe_failure, out_of_memory_advice
from gpt2ladder.ladder import RUNGS_BY_NAME
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import free_memory, synchronize


@dataclass(frozen=True)
class Row:
    """One row of a climb: the rung it is named after, the rungs applied to reach it, or why it cannot run."""

    name: str
    applied: tuple[str, ...]
    reason: str | None = None  # not None: the rung cannot run here (a skipped row)

    def rung_fields(self) -> dict:
        """The rung's name, summary and kind: the fields every row of every record starts with."""
        rung = RUNGS_BY_NAME[self.name]
        return {"name": self.name, "summary": rung.summary, "kind": rung.kind}

    def skipped(self) -> dict:
        return {**self.rung_fields(), "status": "skipped", "reason": self.reason}


def climb(names: list[str] | tuple[str, ...], why_not: Callable[[str], str | None],
          last_only: bool = False, start: str | None = None) -> list[Row]:
    """The rows of a ladder over `names`, each with the rungs applied to reach it.

    With `last_only` one row: the top of what can run here, under its own name (every named rung that
    can run, applied together). With `start` (one of `names`) the rows from that rung on: the rungs
    before it are applied, not timed. With both, `start` and the top (one row where they are the same).
    """
    rows, applied = [], []
    begin = names.index(start) if start is not None else 0
    for k, name in enumerate(names):
        reason = why_not(name)
        if reason is None:
            applied.append(name)
        top = k == len(names) - 1
        if k < begin or (last_only and not top and not (start is not None and k == begin)):
            continue
        if last_only and top and applied:
            name, reason = applied[-1], None
            if rows and rows[-1].reason is None and rows[-1].applied == tuple(applied):
                continue  # nothing after `start` can run here: the top is `start` itself
        rows.append(Row(name, tuple(applied), reason))
    return rows


def guarded(work: Callable[[], dict], device: torch.device, batch_size: int, *, auto_batch: bool = False) -> dict:
    """{"status": "ok", **work()}, or a row saying why the work broke: "oom" or "failed" with a reason.

    A rung that breaks is a finding, not a reason to lose the others. A `LadderError` (a problem of
    the whole run, not of this rung) still ends the run. `auto_batch`: the command takes `--batch-size
    auto`, so an out-of-memory row may suggest it.
    """
    try:
        result = {"status": "ok", **work()}
    except LadderError:
        raise
    except torch.OutOfMemoryError:
        # at batch 1 no smaller batch is left to suggest: the advice names the sequence, rungs or model
        result = {"status": "oom", "reason": f"out of memory at batch size {batch_size}; "
                  f"{out_of_memory_advice(batch_size, auto_batch=auto_batch)}"}
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
