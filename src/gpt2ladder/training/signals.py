"""Ctrl-C and SIGTERM as requests to stop after the step in flight, so a checkpoint can be saved."""

from __future__ import annotations

import signal
import threading


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

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
