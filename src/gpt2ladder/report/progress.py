"""Progress bars on long work: on stderr, gone when done, and off when stderr is not a terminal, so a
log file never fills with carriage-return frames."""

from __future__ import annotations

import sys


def on_terminal() -> bool:
    """Whether stderr (where the bars go) is a terminal."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bar(total: int, label: str, enabled: bool = True, **kwargs):
    """One bar per rung or run, on stderr, gone when done; off with `enabled=False` or without a terminal."""
    from tqdm.auto import tqdm

    options = {"desc": f"{label:>11}", "unit": "step", "leave": False, **kwargs}
    return tqdm(total=total, disable=not (enabled and on_terminal()), **options)
