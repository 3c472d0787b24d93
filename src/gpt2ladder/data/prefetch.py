"""Batches made ahead of the step: a background thread builds batch i+1 (the loader's gather from the
memory-mapped corpus) while step i runs, so the device never waits on the host.

On CUDA the thread fills page-locked (pinned) buffers made once here, on the calling thread, and
`next()` copies one to the device with `non_blocking=True`: the copy is queued behind the step and the
host goes on. The thread itself makes no CUDA call at all, so it cannot disturb a CUDA-graph capture on
the training thread; a buffer is filled again only after the event recorded behind its copy has passed.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

import torch

POLL_S = 0.05  # how often a waiting thread looks at the stop flag


@dataclasses.dataclass
class _Slot:
    x: torch.Tensor
    y: torch.Tensor
    copied: torch.cuda.Event | None = None  # recorded behind the copy that last read this slot


class Prefetcher:
    """`next()` gives the loader's batches in order, already on `device`; `state_dict()` is the loader's
    at the batch `next()` gives next, whatever the thread has made ahead."""

    def __init__(self, batches, device: torch.device | str, depth: int = 2) -> None:
        self.batches, self.device, self.depth = batches, torch.device(device), depth
        self.position = batches.position
        self.host_ms = 0.0  # the thread's time to make the batch `next()` gave last (gather and fill)
        self.wait_ms = 0.0  # how long that `next()` waited for it: above zero, the loader held up the step
        self._slots = self._pinned_slots() if self.device.type == "cuda" else []
        self._handed: _Slot | None = None
        self._thread: threading.Thread | None = None
        self._start()

    def _pinned_slots(self) -> list[_Slot]:
        rows = self.batches.batch_size // self.batches.world_size
        shape = (rows, self.batches.seq_len)
        return [_Slot(torch.empty(shape, dtype=torch.int64, pin_memory=True),
                      torch.empty(shape, dtype=torch.int64, pin_memory=True)) for _ in range(self.depth + 2)]

    def _start(self) -> None:
        self._stop = threading.Event()
        self._ready: queue.Queue = queue.Queue(maxsize=self.depth)
        self._free: queue.Queue = queue.Queue()
        for slot in self._slots:
            self._free.put(slot)
        self._thread = threading.Thread(target=self._fill, args=(self.position,), name="gpt2ladder-prefetch",
                                        daemon=True)
        self._thread.start()

    def _fill(self, index: int) -> None:
        """The thread: batch after batch from `index`, until stopped; a failure is handed to `next()`."""
        try:
            while not self._stop.is_set():
                slot = self._wait(self._free.get) if self._slots else None
                if self._slots and slot is None:
                    return
                t0 = time.perf_counter()
                x, y = self.batches.batch(index)
                if slot is not None:
                    slot.x.copy_(x)
                    slot.y.copy_(y)
                    x, y = slot.x, slot.y
                item = (index, x, y, slot, (time.perf_counter() - t0) * 1000)
                if not self._wait(lambda timeout: self._ready.put(item, timeout=timeout) or True):
                    return
                index += 1
        except BaseException as err:  # noqa: BLE001 - re-raised on the training thread by next()
            self._wait(lambda timeout: self._ready.put(err, timeout=timeout) or True)

    def _wait(self, call):
        """call(timeout=...) until it returns, or None once the prefetcher is stopped."""
        while not self._stop.is_set():
            try:
                return call(timeout=POLL_S)
            except (queue.Empty, queue.Full):
                continue
        return None

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch on the device: x and y, int64 (B/W, T)."""
        self._release()
        t0 = time.perf_counter()
        item = self._ready.get()
        self.wait_ms = (time.perf_counter() - t0) * 1000
        if isinstance(item, BaseException):
            self._ready.put(item)  # the thread has stopped: every later call fails the same way
            raise item
        _, x, y, slot, self.host_ms = item
        self.position += 1
        if slot is None:
            return x.to(self.device), y.to(self.device)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        slot.copied = torch.cuda.Event()
        slot.copied.record(torch.cuda.current_stream(self.device))  # the stream the copies were queued on
        self._handed = slot
        return x, y

    def _release(self) -> None:
        """The slot handed out last goes back to the thread once its copy is done (long done, in practice:
        a step has run since)."""
        if self._handed is not None:
            self._handed.copied.synchronize()
            self._free.put(self._handed)
            self._handed = None

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `index` on the host, as the loader makes it (for a probe; no state changes)."""
        return self.batches.batch(index)

    def state_dict(self) -> dict:
        return {**self.batches.state_dict(), "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's position: the batches made ahead are dropped."""
        self.close()
        self.batches.load_state_dict(state)
        self.position = self.batches.position
        self._start()

    def close(self) -> None:
        """Stop the thread; the buffers are idle once this returns."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._handed is not None:
            self._handed.copied.synchronize()
            self._handed = None

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
