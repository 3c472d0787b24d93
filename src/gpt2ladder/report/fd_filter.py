"""Lines a C++ library writes straight to file descriptor 2, kept off the terminal, pipe or file it is.

Python's `sys.stderr` never sees such lines (PyTorch's profiler logs its start and stop so, past its own
log-level settings), so they are filtered at the descriptor: for the length of a block fd 2 is a pipe,
and a thread passes everything on to the real stderr as it arrives, so progress bars keep moving, except
the lines that match. A match can begin in the middle of a line: a progress bar leaves the cursor at the
end of its frame, and the library's line follows it directly. Text from where a match could begin (one
of the line's possible first words) is held until its line ends, or grows longer than any log line, then
passed on or dropped.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import uuid

HOLD_LIMIT = 4096  # bytes: held text longer than this is no log line, so it is passed on


class Relay(threading.Thread):
    """Reads the pipe and writes what is not dropped to `real`; stops at the end of the pipe."""

    def __init__(self, read_fd: int, real_fd: int, line: re.Pattern[bytes], starts: tuple[bytes, ...]):
        super().__init__(name="gpt2ladder-stderr-relay", daemon=True)
        self.read_fd, self.real_fd, self.line, self.starts = read_fd, real_fd, line, starts
        self.marker = b"\0end-of-block-" + uuid.uuid4().hex.encode() + b"\0"
        self.caught_up = threading.Event()  # set once the marker, written when the block ends, is read
        self.broken = False

    def run(self) -> None:
        pending = b""  # read, not yet passed on
        while chunk := os.read(self.read_fd, 65536):
            pending = self._pass_on(pending + chunk)
        self._write(pending)
        os.close(self.read_fd)
        os.close(self.real_fd)
        self.caught_up.set()

    def _pass_on(self, pending: bytes) -> bytes:
        """Write what can be written now; return what must wait for more (a line, or half the marker)."""
        if not self.caught_up.is_set() and self.marker in pending:
            before, pending = pending.split(self.marker, 1)
            self._write(b"".join(split_dropped(before, self.line, self.starts, final=True)))
            self.caught_up.set()
        cut = len(pending) - (0 if self.caught_up.is_set() else _partial_start(pending, (self.marker,)))
        ready, held = split_dropped(pending[:cut], self.line, self.starts)
        self._write(ready)
        return held + pending[cut:]

    def _write(self, data: bytes) -> None:
        """Write all of `data`; once the real stderr is gone (a closed pipe), drop what comes, but keep
        reading, so the writers never block and the block's end is still seen."""
        try:
            while data and not self.broken:
                data = data[os.write(self.real_fd, data):]
        except OSError:
            self.broken = True


def split_dropped(text: bytes, line: re.Pattern[bytes], starts: tuple[bytes, ...],
                  final: bool = False) -> tuple[bytes, bytes]:
    """(the text to pass on now, with every complete matching line taken out; the text held back).

    A matching line begins with one of `starts`; `line` matches a whole one, its newline included. With
    `final` nothing is held: an unfinished line is passed on as it is.
    """
    start = re.compile(b"|".join(re.escape(s) for s in starts))
    out = bytearray()
    while (found := start.search(text)) is not None:
        out += text[:found.start()]
        text = text[found.start():]
        end = text.find(b"\n")
        if end < 0:
            if final or len(text) > HOLD_LIMIT:
                return bytes(out + text), b""
            return bytes(out), text
        if line.match(text[:end + 1]):
            text = text[end + 1:]
        else:  # not a log line after all: pass its first byte on and look again after it
            out += text[:1]
            text = text[1:]
    held = 0 if final else _partial_start(text, starts)
    return bytes(out + text[:len(text) - held]), text[len(text) - held:]


def _partial_start(text: bytes, starts: tuple[bytes, ...]) -> int:
    """How many of the last bytes of `text` could be the first bytes of one of `starts`."""
    return max((k for s in starts for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


@contextlib.contextmanager
def lines_dropped(line: re.Pattern[bytes], starts: tuple[bytes, ...], fd: int = 2):
    """Inside the block, the lines written to `fd` that begin with one of `starts` and match `line` never
    reach it; everything else does, as it comes."""
    sys.stderr.flush()
    real = os.dup(fd)
    read_fd, write_fd = os.pipe()
    relay = Relay(read_fd, real, line, starts)
    relay.start()
    os.dup2(write_fd, fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.write(write_fd, relay.marker)
        os.dup2(relay.real_fd, fd)
        os.close(write_fd)  # the pipe ends (and the relay with it) once nothing else holds it open
        relay.caught_up.wait()
