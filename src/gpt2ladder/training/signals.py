"""Ctrl-C and SIGTERM as requests to stop after the step in flight, so a checkpoint can be saved; a long
pass between steps (validation) polls for them between its batches and is abandoned."""

from __future__ import annotations

import signal
import threading
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")


class StopRequested(Exception):
    """A stop was asked for during a pass between steps: the pass is abandoned, and the run stops after
    the step it had finished (whose checkpoint is then saved)."""


class StopSignals:
    """Ctrl-C and SIGTERM ask the loop to stop after the step in flight; a second Ctrl-C stops at once.

    The previous handlers are restored on exit. Outside the main thread (where Python allows no
    handlers) this does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.forced = False  # a second Ctrl-C came: wherever its KeyboardInterrupt landed, the user wants out
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            self.forced = True
            raise KeyboardInterrupt
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def check(self, agree: Callable[[bool], bool] | None = None) -> None:
        """StopRequested if a stop was asked for. Under torchrun `agree` (every rank calls it: a collective)
        says whether any rank was asked, so all ranks leave the pass at the same batch."""
        asked = self.requested if agree is None else agree(self.requested)
        if asked:
            raise StopRequested

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def until_stopped(items: Iterable[T], stop: StopSignals | None,
                  agree: Callable[[bool], bool] | None = None) -> Iterator[T]:
    """The items (validation batches), checking before each whether a stop was asked for: a SIGTERM during
    a long validation is then honoured within one batch, not after all of them. No `stop`: all items."""
    for item in items:
        if stop is not None:
            stop.check(agree)
        yield item
