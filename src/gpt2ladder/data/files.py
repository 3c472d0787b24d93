"""Files read and written safely: every file gpt2ladder writes is created here, new, under a name no one
else chose, and never through a symbolic link; a file that replaces another appears whole or not at all.

A destination may already hold anything (a symbolic link to someone's file, a hard link, a leftover
temp file), so nothing is ever opened for writing by its final name. A new file is created with
O_CREAT | O_EXCL | O_NOFOLLOW under a fresh random name beside the destination (a name that exists,
even as a dangling link, is refused and another drawn), written, then renamed over the destination:
rename(2) replaces whatever the name was, a link included, and never writes through it. Files are
also hashed a block at a time here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TextIO, TypeVar

# O_NOFOLLOW does not exist on Windows (where making symbolic links needs privileges anyway).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NEW = os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_NAME_TRIES = 16  # each failed try means a name was taken since it was drawn: someone is guessing
T = TypeVar("T")


def open_new(path: str | Path, flags: int = os.O_WRONLY) -> int:
    """A file descriptor of a file created now at `path`, which must not exist in any form (no link followed).

    The mode is 0o666 less the umask, as for any file a program creates (not mkstemp's 0600).
    """
    return os.open(path, flags | _NEW, 0o666)


def beside(dest: Path, make: Callable[[Path], T], suffix: str | None = None) -> tuple[T, Path]:
    """(make(name), name) for a new hidden name beside `dest`, `.NAME.<random>.tmpSUFFIX`, SUFFIX being
    dest's own unless given (so tools that read a format off a name still can); `make` must create it
    exclusively, and a name taken (FileExistsError) is replaced by another."""
    suffix = dest.suffix if suffix is None else suffix
    for _ in range(_NAME_TRIES):
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(6)}.tmp{suffix}")  # the form `temp_of` reads
        try:
            return make(tmp), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file beside {dest}: every name tried was taken")


_TEMP_NAME = re.compile(r"\.(?P<dest>.+)\.[0-9a-f]{12}\.tmp(?:\.[^.]*)?")


def temp_of(name: str) -> str | None:
    """The destination's name when `name` is one that `beside` makes (`.NAME.<random>.tmpSUFFIX`), else
    None: what lets a command remove the temporaries a killed process left behind."""
    match = _TEMP_NAME.fullmatch(name)
    return match["dest"] if match else None


def new_temp(dest: Path) -> tuple[int, Path]:
    """(descriptor, path) of a new hidden file beside `dest` (see `beside`)."""
    return beside(dest, open_new)


@contextlib.contextmanager
def replaced_on_success(dest: Path, tmp: Path) -> Iterator[None]:
    """Rename `tmp` over `dest` if the block finishes; remove it if not."""
    try:
        yield
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_file(dest: Path) -> Iterator[BinaryIO]:
    """Yield a new temp file beside dest that replaces dest only if the block finishes.

    Readers (and a later run after a crash or Ctrl-C) then never see a half-written file. No fsync: what
    is written here (records, plots, token caches, downloads) is checked when read, or rebuilt by
    running the command again; checkpoints add their own fsync (`training/checkpoint.py`).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp(dest)
    with replaced_on_success(dest, tmp), os.fdopen(fd, "wb") as f:
        yield f


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """For a writer that takes a file name, not a file (torch.profiler's trace): the name of a new, empty
    temp file beside dest, renamed over dest if the block finishes."""
    dest = Path(dest)
    fd, tmp = new_temp(dest)
    os.close(fd)
    with replaced_on_success(dest, tmp):
        yield tmp


def write_atomic(dest: Path, content: bytes | str) -> Path:
    """Write bytes, or text as UTF-8, to dest through `atomic_file`."""
    with atomic_file(dest) as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)
    return Path(dest)


def open_append(path: Path) -> TextIO:
    """A text file to append lines to, created if missing; a symbolic link there is an OSError (ELOOP),
    never followed."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666)
    return os.fdopen(fd, "a", encoding="utf-8")


def sha256_stream(f: BinaryIO, block: int = 8 * 2**20) -> str:
    """sha256 of the rest of an open file, read a block at a time (a 40 GB text never sits in memory)."""
    h = hashlib.sha256()
    while data := f.read(block):
        h.update(data)
    return h.hexdigest()
