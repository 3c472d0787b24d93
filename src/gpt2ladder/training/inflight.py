"""Steps in flight: each training step's loss and time, read back once the device has finished it, so the
host never waits for the step it has just queued.

On a GPU a host sync at the end of every step (`float(loss)`) leaves the GPU idle while the CPU prepares
the next step. Here the CPU queues step i + 1 before it waits for step i: each step is timed by two CUDA
events recorded around it on the stream it runs on, its loss goes to pinned host memory by a
non-blocking copy queued behind it, and both are read once the end event has passed, `lag` steps later
(or at once, at the points where the loop needs every step: validation, a checkpoint, the end).

With lag 0 (the CPU, where every op is synchronous anyway) a step is read at once and timed by the host
clock around it, the loss read included: exactly the synchronous loop.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

CUDA_LAG = 1  # steps queued ahead of the one read back: one keeps the GPU fed; more would only add latency


def readback_lag(device: torch.device) -> int:
    """How many steps the host runs ahead of the one it reads: CUDA_LAG on a CUDA GPU, 0 elsewhere."""
    return CUDA_LAG if device.type == "cuda" else 0


@dataclass(frozen=True)
class Finished:
    """A step the device has finished: what was known when it was queued, its values and its time."""

    facts: dict  # step, lr and the like, as the step was queued
    values: tuple[float, ...]  # what `queue` was given (the loss, and maybe more), on the host
    ms: float


class InFlight:
    """`start()` before a step's first op, `queue(values, facts)` after its last one, `finished()` for the
    steps the host may now read, oldest first."""

    def __init__(self, device: torch.device, lag: int) -> None:
        self.device, self.lag = device, lag
        self.events = device.type == "cuda" and lag > 0
        self._pending: deque = deque()
        self._free: list[torch.Tensor] = []  # pinned buffers of finished steps, reused
        self._start = None

    def start(self) -> None:
        if self.events:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))
        else:
            self._start = time.perf_counter()

    def queue(self, values: torch.Tensor, facts: dict) -> None:
        """The step begun by `start()` is queued; `values` (a 1-d float32 tensor of its results) are read back
        with it."""
        if not self.events:  # the host sync ends the step, and the clock is read after it
            read = tuple(values.detach().float().tolist())
            self._pending.append(Finished(facts, read, (time.perf_counter() - self._start) * 1000))
            return
        host = self._buffer(values.numel())
        host.copy_(values.detach().float(), non_blocking=True)  # queued behind the step, read after its end event
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        self._pending.append((facts, host, self._start, end))

    def _buffer(self, n: int) -> torch.Tensor:
        for i, buffer in enumerate(self._free):
            if buffer.numel() == n:
                return self._free.pop(i)
        return torch.empty(n, dtype=torch.float32, pin_memory=True)

    def finished(self, everything: bool = False) -> list[Finished]:
        """The steps beyond the last `lag` queued (every step with `everything`), waiting for each to end."""
        done = []
        while len(self._pending) > (0 if everything else self.lag):
            item = self._pending.popleft()
            if isinstance(item, Finished):
                done.append(item)
                continue
            facts, host, start, end = item
            end.synchronize()  # this step's end; the steps queued after it keep the device busy meanwhile
            done.append(Finished(facts, tuple(host.tolist()), start.elapsed_time(end)))
            self._free.append(host)
        return done

    def __len__(self) -> int:
        return len(self._pending)
