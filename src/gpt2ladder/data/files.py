"""Files read and written safely: written whole or not at all (a temp file renamed over the destination),
hashed a block at a time."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator


@contextlib.contextmanager
def atomic_file(dest: Path) -> Iterator[BinaryIO]:
    """Yield a temp file beside dest that replaces dest only if the block finishes.

    Readers (and a later run after a crash or Ctrl-C) then never see a half-written file. No fsync: what
    is written here (downloads, token caches) is checked when read, and rebuilt when it does not match.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sha256_stream(f: BinaryIO, block: int = 8 * 2**20) -> str:
    """sha256 of the rest of an open file, read a block at a time (a 40 GB text never sits in memory)."""
    h = hashlib.sha256()
    while data := f.read(block):
        h.update(data)
    return h.hexdigest()
