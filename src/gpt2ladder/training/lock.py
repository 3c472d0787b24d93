"""One process owns a run directory at a time: an advisory lock (fcntl.flock) on OUT/.lock.

flock belongs to the open file and dies with the process, so a run killed by kill -9 leaves no lock,
only the file, which the next run takes over. The file names its holder (pid, host, since when) so a
second run can say who has the directory. It is removed on release while still locked; a run that
opened the old file meanwhile finds it gone and locks the new one (`_still_there`). The file is opened
without following a symbolic link, and one that is not a regular file of its own (a FIFO, a device, a
second name of another file) is refused: a `.lock` planted as a link to another file would otherwise have
that file's contents replaced by the pid line.
Where fcntl does not exist (Windows) nothing is locked and the run says so.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import stat
from pathlib import Path

from gpt2ladder.data.files import NOFOLLOW
from gpt2ladder.errors import UsageError

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
        if _still_there(self.fd, self.path):  # not a file another process has put there since
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def try_lock(out: Path) -> tuple[RunLock | None, str | None]:
    """(the lock, None) when this process now holds the run directory `out`; (None, who holds it) when
    another does. (None, None) where this platform cannot lock."""
    return try_lock_file(out / LOCKFILE)


def try_lock_file(path: Path) -> tuple[RunLock | None, str | None]:
    """`try_lock` for the lock file at `path` (a run's `.lock`, or one beside a folder being written)."""
    if not CAN_LOCK:
        return None, None
    for _ in range(100):  # each retry means a holder released the directory just now
        fd = _open(path)
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


def _open(path: Path) -> int:
    """The lock file, created if missing; a symbolic link or anything but a regular file is refused."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError:
        if os.path.islink(path):  # ELOOP, or EMLINK on some BSDs
            raise UsageError(f"{path} is a symbolic link, not a lock file of gpt2ladder's; remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device
        os.close(fd)
        raise UsageError(f"{path} is not a regular file, so it is not a lock file of gpt2ladder's; remove it")
    if st.st_nlink > 1:  # another file's second name: the pid line would replace that file's contents
        os.close(fd)
        raise UsageError(f"{path} is a hard link to a file with {st.st_nlink} names, not a lock file of "
                         "gpt2ladder's; remove it")
    return fd


def _still_there(fd: int, path: Path) -> bool:
    """Whether the file locked is still the one at `path` (its last holder may have removed it meanwhile)."""
    try:
        here, mine = os.lstat(path), os.fstat(fd)
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)
    except FileNotFoundError:
        return False


def _write_holder(fd: int) -> None:
    since = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode(), 0)


def _holder(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    return text or "another process (it has not yet written its pid)"
