"""Progress bars on long work: on stderr, gone when done, and off when output is not a terminal."""

from __future__ import annotations


def progress_bar(total: int, label: str, enabled: bool = True):
    """One bar per rung or run, on stderr, gone when done; `enabled=False` keeps logs clean."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"{label:>11}", unit="step", leave=False, disable=not enabled)
