"""One process owns a run directory at a time: an advisory lock (fcntl.flock) on OUT/.lock.

flock belongs to the open file and dies with the process, so a run killed by kill -9 leaves no lock,
only the file, which the next run takes over. The file names its holder (pid, host, since when) so a
second run can say who has the directory. It is removed on release while still locked; a run that
opened the old file meanwhile finds it gone and locks the new one (`_still_there`). Where fcntl does
not exist (Windows) nothing is locked and the run says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCKFILE = ".lock"
CAN_LOCK = fcntl is not None


class RunLock:
    """A held lock on a run directory; `release` gives it up and removes the file."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def try_lock(out: Path) -> tuple[RunLock | None, str | None]:
    """(the lock, None) when this process now holds `out`; (None, who holds it) when another does.

    (None, None) where this platform cannot lock.
    """
    if not CAN_LOCK:
        return None, None
    path = out / LOCKFILE
    for _ in range(100):  # each retry means a holder released the directory just now
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EWOULDBLOCK: another process holds it
            holder = _holder(fd)
            os.close(fd)
            return None, holder
        if _still_there(fd, path):
            _write_holder(fd)
            return RunLock(fd, path), None
        os.close(fd)
    raise OSError(f"could not lock {path}: it keeps being replaced")


def _still_there(fd: int, path: Path) -> bool:
    """Whether the file locked is still the one at `path` (its last holder may have removed it meanwhile)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _write_holder(fd: int) -> None:
    since = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode(), 0)


def _holder(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    return text or "another process (it has not yet written its pid)"
