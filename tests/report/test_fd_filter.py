"""Lines a C++ library writes to fd 2 are dropped, whatever fd 2 is; everything else passes, as it comes."""

import os
import select
import time

import pytest
import torch

from gpt2ladder.measure.profile import KINETO_LINE, KINETO_STARTS
from gpt2ladder.report.fd_filter import lines_dropped, split_dropped

STOP = b"USDT:2026-12-01 20:14:03 1794:1794 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
FRAME = b"\r   baseline: 100%|#####| 2/2 [00:05<00:00,  2.86s/step]"


def streamed(pieces: list[bytes]) -> bytes:
    """What split_dropped passes on when the text arrives in these pieces."""
    out, held = b"", b""
    for piece in pieces:
        ready, held = split_dropped(held + piece, KINETO_LINE, KINETO_STARTS)
        out += ready
    return out + b"".join(split_dropped(held, KINETO_LINE, KINETO_STARTS, final=True))


def test_a_log_line_right_after_a_progress_bar_frame_is_dropped():
    # On a terminal the bar leaves the cursor at the end of its frame: the log line starts mid-line.
    text = FRAME + STOP + b"\r" + b" " * 20 + b"\r"
    assert streamed([text]) == FRAME + b"\r" + b" " * 20 + b"\r"


def test_a_log_line_split_into_single_bytes_is_still_dropped():
    text = b"before\n" + STOP + b"after\n"
    assert streamed([text[i:i + 1] for i in range(len(text))]) == b"before\nafter\n"


def test_text_that_only_looks_like_a_log_line_passes_unchanged():
    text = b"INFO: not a C++ log line\nUSDT without a date\nWARNING:root:from Python 2026\nthe end, unfinished US"
    assert streamed([text]) == text
    assert streamed([text[i:i + 7] for i in range(0, len(text), 7)]) == text


def test_a_bar_frame_is_passed_on_before_its_line_ends():
    ready, held = split_dropped(FRAME, KINETO_LINE, KINETO_STARTS)
    assert (ready, held) == (FRAME, b"")
    ready, held = split_dropped(FRAME + b"US", KINETO_LINE, KINETO_STARTS)  # "US" may begin "USDT"
    assert (ready, held) == (FRAME, b"US")


def _read(fd: int, until: bytes, timeout: float = 5.0) -> bytes:
    """What arrives on fd until `until` is in it (or the timeout passes)."""
    got, end = b"", time.monotonic() + timeout
    while until not in got and time.monotonic() < end:
        if select.select([fd], [], [], 0.05)[0]:
            got += os.read(fd, 65536)
    return got


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs pseudo-terminals")
def test_on_a_terminal_the_profilers_lines_are_dropped_and_a_bar_moves(capfd):
    """fd 2 is a pseudo-terminal, as in a user's shell: the profiler's own start and stop lines (written
    by its C++ library) never reach it, a bar frame does, before the block ends."""
    from torch.profiler import profile

    master, slave = os.openpty()
    saved = os.dup(2)
    os.dup2(slave, 2)
    try:
        with lines_dropped(KINETO_LINE, KINETO_STARTS):
            with profile():
                torch.ones(4) @ torch.ones(4)
            os.write(2, FRAME)
            during = _read(master, FRAME)
            os.write(2, b"\nnot dropped\n")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(slave)
    after = _read(master, b"not dropped")
    os.close(master)
    assert FRAME.strip() in during  # passed on while the block still ran
    assert b"not dropped" in after
    assert b"profiler_st" not in during + after and b"USDT" not in during + after


@pytest.mark.timeout(30)  # what it guards against is a block that never ends
def test_a_closed_stderr_neither_blocks_nor_breaks_the_block():
    """`gpt2ladder profile 2>&1 | head -1`: the reader is gone; the block still ends, and text written to
    it goes nowhere rather than raising."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    saved = os.dup(2)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        with lines_dropped(KINETO_LINE, KINETO_STARTS):
            os.write(2, b"nobody reads this\n" + STOP)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
