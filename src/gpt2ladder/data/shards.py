"""Token shards on disk, read and written in one place.

llm.c's format, which gpt2ladder writes and which llm.c's and modded-nanogpt's prepared shards use: a
header of 256 little-endian int32 (the magic 20240520, the version 1, the token count; the rest zero),
then the tokens as little-endian uint16. Read as well: nanoGPT's headerless `train.bin`/`val.bin` (raw
uint16) and build-nanogpt's `.npy` shards (a 1-D uint16 array). Every shard is memory-mapped, never read
whole, and checked as a stream (a block at a time) so memory stays constant whatever its size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import struct
from pathlib import Path

import numpy as np

from gpt2ladder.data.files import atomic_file
from gpt2ladder.errors import UsageError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
MAX_TOKENS = 2**31 - 1  # the header holds the count as an int32
TOKEN = np.dtype("<u2")
SCAN_BYTES = 8 * 2**20  # checks read a shard this much at a time

LLMC, RAW, NPY = "llm.c", "raw", "npy"  # the layouts, as the manifest and messages name them
# A shard's split is in its name, as llm.c names them: fineweb_val_000000.bin, tiny_shakespeare_val.bin, val.bin
VAL_NAME = re.compile(r"(?:^|_)val(?:_|$)")
SPLIT_WORD = re.compile(r"(?:^|_)(?:val|train)(?:_|$)")


def shard_name(name: str, split: str, index: int) -> str:
    """llm.c's file name of a shard: NAME_val_000000.bin, NAME_train_000001.bin, ..."""
    return f"{name}_{split}_{index:06d}.bin"


def is_val(path: Path) -> bool:
    """Whether a shard's name puts it in the validation split."""
    return bool(VAL_NAME.search(Path(path).name.split(".")[0]))


def header(n_tokens: int) -> bytes:
    """The 1024-byte header of a shard holding n_tokens tokens."""
    if not 0 <= n_tokens <= MAX_TOKENS:
        raise ValueError(f"a shard holds 0 to {MAX_TOKENS:,} tokens, not {n_tokens:,}")
    ints = np.zeros(HEADER_INTS, dtype="<i4")
    ints[:3] = MAGIC, VERSION, n_tokens
    return ints.tobytes()


def has_magic(path: Path) -> bool:
    """Whether the file starts as an llm.c token shard does (a cheap sniff, not a check)."""
    try:
        with open(path, "rb") as f:
            start = f.read(4)
    except OSError:
        return False
    return len(start) == 4 and struct.unpack("<i", start)[0] == MAGIC


@dataclasses.dataclass(frozen=True)
class Shard:
    """Where a shard's tokens are: its file, layout, the byte offset of the first token and the count."""

    path: Path
    layout: str
    offset: int
    n_tokens: int

    def tokens(self) -> np.memmap:
        """The tokens, memory-mapped read-only (an empty array for an empty shard: mmap cannot map 0 bytes)."""
        if self.n_tokens == 0:
            return np.zeros(0, dtype=TOKEN)
        return np.memmap(self.path, dtype=TOKEN, mode="r", offset=self.offset, shape=(self.n_tokens,))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise UsageError(f"token shard {path} does not exist") from None
    except OSError as e:
        raise UsageError(f"cannot read token shard {path}: {e.strerror or e}") from None


def open_shard(path: Path, layout: str) -> Shard:
    """The shard at path in the given layout, its header and size checked; one-line UsageError otherwise."""
    path = Path(path)
    if layout == LLMC:
        return _llmc(path)
    if layout == NPY:
        return _npy(path)
    size = _size(path)
    if size % TOKEN.itemsize:
        raise UsageError(f"token file {path} holds an odd number of bytes ({size:,}), not uint16 tokens")
    return Shard(path, RAW, 0, size // TOKEN.itemsize)


def _llmc(path: Path) -> Shard:
    size = _size(path)
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError as e:
        raise UsageError(f"cannot read token shard {path}: {e.strerror or e}") from None
    if len(head) < 12 or size < HEADER_BYTES:
        raise UsageError(f"token shard {path} is {size:,} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, n = struct.unpack("<3i", head)
    if magic != MAGIC:
        raise UsageError(f"token shard {path} has magic number {magic}, not llm.c's {MAGIC}: not a token shard")
    if version != VERSION:
        raise UsageError(f"token shard {path} is version {version} of the format; this gpt2ladder reads version "
                         f"{VERSION} (uint16 GPT-2 tokens)")
    if n < 0 or size != HEADER_BYTES + TOKEN.itemsize * n:
        raise UsageError(f"token shard {path} is {size:,} bytes, but its header counts {n:,} tokens "
                         f"({HEADER_BYTES + TOKEN.itemsize * max(n, 0):,} bytes): truncated or damaged")
    return Shard(path, LLMC, HEADER_BYTES, n)


def _npy(path: Path) -> Shard:
    _size(path)
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise UsageError(f"token file {path} is not a readable .npy array: {' '.join(str(e).split())}") from None
    if array.dtype.newbyteorder("<") != TOKEN or array.ndim != 1:
        raise UsageError(f"token file {path} holds a {array.dtype} array of shape {array.shape}, not the 1-D "
                         "uint16 tokens build-nanogpt writes")
    offset = getattr(array, "offset", 0) if isinstance(array, np.memmap) else 0
    if array.dtype != TOKEN:  # big-endian uint16: not what any of these projects writes
        raise UsageError(f"token file {path} holds big-endian uint16; expected little-endian")
    return Shard(path, NPY, offset, len(array))


def scan(shard: Shard, vocab_size: int, digest: bool = False) -> str | None:
    """Read the shard once, a block at a time: a UsageError naming the first token >= vocab_size; with
    `digest`, the sha256 of the whole file (header included, as `sha256sum` prints it)."""
    h = hashlib.sha256() if digest else None
    buf = np.empty(SCAN_BYTES // TOKEN.itemsize, dtype=TOKEN)
    done = 0
    with open(shard.path, "rb") as f:
        head = f.read(shard.offset)
        if h:
            h.update(head)
        while (n := f.readinto(buf)) > 0:
            block = buf[:n // TOKEN.itemsize]
            if h:
                h.update(buf.view(np.uint8)[:n])
            if len(block) and int(block.max()) >= vocab_size:
                at = done + int(np.argmax(block >= vocab_size))
                raise UsageError(f"token shard {shard.path} holds token id {int(block[at - done])} at position "
                                 f"{at:,}, outside GPT-2's vocabulary of {vocab_size:,}: it was made with another "
                                 "tokenizer")
            done += len(block)
    return h.hexdigest() if h else None


class _Aborted(Exception):
    """Hands `atomic_file` the failure that makes it remove its temporary file."""


class ShardWriter:
    """A shard written as a stream of token arrays, to a temporary name renamed into place by `close`.

    The header is written last: until then it is all zeros, so a shard cut short (Ctrl-C, a full disk, a
    killed process) has no magic number and no loader accepts it; `atomic_file` removes it besides.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.n_tokens = 0
        self._stack = contextlib.ExitStack()
        self._f = self._stack.enter_context(atomic_file(self.path))
        self._f.write(bytes(HEADER_BYTES))

    def write(self, tokens: np.ndarray) -> None:
        if self.n_tokens + len(tokens) > MAX_TOKENS:
            raise ValueError(f"a shard holds at most {MAX_TOKENS:,} tokens")
        self._f.write(np.ascontiguousarray(tokens, dtype=TOKEN).view(np.uint8).data)
        self.n_tokens += len(tokens)

    def close(self) -> None:
        """Write the header and put the shard in place."""
        self._f.flush()
        self._f.seek(0)
        self._f.write(header(self.n_tokens))
        self._stack.close()

    def abort(self) -> None:
        """Drop the shard: its temporary file goes, nothing is put in place."""
        self._stack.__exit__(_Aborted, _Aborted(), None)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """A whole shard at once (tests, benchmarks): the same writer, one array."""
    with ShardWriter(path) as w:
        w.write(tokens)


def file_sha256(path: Path) -> str:
    """sha256 of a whole file, read a block at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(SCAN_BYTES):
            h.update(data)
    return h.hexdigest()
