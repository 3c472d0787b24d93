"""The text to train on: Tiny Shakespeare (downloaded once and verified) or a user's regular file, read
as a stream (hashed and decoded a block at a time), its tokens memory-mapped from the token cache
(`cache.py`) keyed by the text's sha256. A corpus of token shards is `corpus.py`'s; `load.py` chooses between them."""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import http.client
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from gpt2ladder.data import cache as token_cache
from gpt2ladder.data.files import atomic_file, sha256_stream
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DOWNLOAD_TIMEOUT_S = 20
TRAIN_FRACTION = 0.9
READ_BYTES = 8 * 2**20  # hashing and tokenizing read the text this much at a time


class DataUnavailable(LadderError):
    """The training text is neither cached nor downloadable; the message says how to supply it."""


# --- where things live --------------------------------------------------------------------------


def cache_dir() -> Path:
    """The cache root: $GPT2LADDER_CACHE, else $XDG_CACHE_HOME/gpt2ladder, else ~/.cache/gpt2ladder.

    Not created here; each writer creates the sub-folder it writes into.
    """
    if os.environ.get("GPT2LADDER_CACHE"):
        return Path(os.environ["GPT2LADDER_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):  # the XDG spec says an empty value counts as unset
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "gpt2ladder"
    return Path.home() / ".cache" / "gpt2ladder"


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return sha256_stream(f, READ_BYTES)


# --- Tiny Shakespeare ---------------------------------------------------------------------------


def _download(url: str, dest: Path, sha256: str) -> None:
    """Download url to dest; dest appears only if the bytes match sha256."""
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
        data = response.read()
    if _sha256_bytes(data) != sha256:
        got = _sha256_bytes(data)
        raise ValueError(f"downloaded file has sha256 {got[:12]}..., expected {sha256[:12]}...")
    with atomic_file(dest) as f:
        f.write(data)


def _one_line(e: BaseException) -> str:
    """A download failure as one short line (URLError hides the useful part in .reason)."""
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    return " ".join(str(reason).split()) or type(e).__name__


def fetch_tinyshakespeare(download: bool = True) -> Path:
    """Path to a verified Tiny Shakespeare input.txt in the cache, downloading it if needed."""
    path = cache_dir() / "tinyshakespeare" / "input.txt"
    if path.is_file() and _sha256_file(path) == TINY_SHAKESPEARE_SHA256:
        return path
    state = "is corrupt (wrong sha256)" if path.exists() else "is not cached"
    if not download:
        reason = "downloading is turned off"
    else:
        try:
            _download(TINY_SHAKESPEARE_URL, path, TINY_SHAKESPEARE_SHA256)
            return path
        except (OSError, ValueError, http.client.HTTPException) as e:
            reason = _one_line(e)
    raise DataUnavailable(
        f"Tiny Shakespeare {state} and could not be downloaded ({reason}); "
        f"put input.txt at {path} or pass --data PATH"
    )


# --- tokens -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: comparing arrays with == is ambiguous
class TokenData:
    """A tokenized text split into train (first 90%) and val (last 10%) uint16 token arrays; for a corpus
    of shards, train and val are `corpus.ShardedTokens` views and sha256 is the corpus's identity."""

    train: np.ndarray
    val: np.ndarray
    source: str
    sha256: str
    n_tokens: int


def _split(tokens: np.ndarray, source: str, sha256: str) -> TokenData:
    cut = int(len(tokens) * TRAIN_FRACTION)
    return TokenData(tokens[:cut], tokens[cut:], source, sha256, len(tokens))


def display_name(path: Path) -> str:
    """The file's name as text that prints and plots: a byte that is not UTF-8 becomes U+FFFD."""
    return os.fsencode(path.name).decode("utf-8", "replace")


def open_text(path: Path) -> BinaryIO:
    """A user's text file opened for reading, or a UsageError saying what is wrong with it.

    Only regular files: a FIFO or a device would block or never end. O_NONBLOCK lets the open itself
    return for a FIFO that has no writer, so fstat can say what it is.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise UsageError(f"data file {path} does not exist") from None
    except OSError as e:
        raise UsageError(f"cannot read data file {path}: {e.strerror or e}") from None
    info = os.fstat(fd)
    problem = ("is a directory, not a text file" if stat.S_ISDIR(info.st_mode) else
               "is not a regular file (a FIFO, socket or device); give a text file" if not stat.S_ISREG(info.st_mode)
               else "is empty" if info.st_size == 0 else None)
    if problem:
        os.close(fd)
        raise UsageError(f"data file {path} {problem}")
    return os.fdopen(fd, "rb")


def text_chunks(f: BinaryIO, path: Path, block: int | None = None) -> Iterator[str]:
    """The text of an open file from its start, decoded a block at a time; UsageError if it is not UTF-8."""
    block = block or READ_BYTES
    f.seek(0)
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        while True:
            data = f.read(block)
            text = decoder.decode(data, final=not data)
            if "\0" in text:  # valid UTF-8 can still be binary (all zeros); text has no NUL
                raise UnicodeError("NUL")
            if text:
                yield text
            if not data:
                return
    except UnicodeError:
        raise UsageError(f"data file {path} is not a UTF-8 text file") from None


def load_text(text_path: Path | str | None = None, *, download: bool = True, notify=print,
              check=None, identify=None) -> TokenData:
    """Tokens of a text file (None: Tiny Shakespeare), tokenized once and then memory-mapped from cache.

    The cache is keyed by the sha256 of the file's bytes, so an edited file is tokenized again; a cache
    that does not match its record is rebuilt, and `notify` says so. `check` (a TokenData -> None that
    raises, e.g. `check_splits`) sees the tokens before they are handed back; `identify` (source, sha256 -> None
    that raises) sees the text's name and sha256 before a text not yet cached is tokenized (and `notify` says so).
    Records (JSON Lines, Parquet, CSV) are refused: `prepare` reads them.
    """
    if text_path is None:
        path, source = fetch_tinyshakespeare(download), "tinyshakespeare"
    else:
        path = Path(text_path).expanduser()
        source = display_name(path)
        refuse_records(path)
    with open_text(path) as f:
        digest = sha256_stream(f, READ_BYTES)
        if identify is not None:
            identify(source, digest)
        tokens = token_cache.load_or_build(cache_dir() / "tokens", digest, lambda: text_chunks(f, path),
                                           os.fstat(f.fileno()).st_size, notify)
    data = _split(tokens, source, digest)
    if check is not None:
        check(data)
    return data


RECORD_KINDS = {"jsonl": "JSON Lines", "parquet": "Parquet", "csv": "CSV"}


def refuse_records(path: Path) -> None:
    """A UsageError for a file of records (.jsonl, .json, .parquet, .csv, .gz or not): trained on as it is, the
    model would learn the JSON's quotes and keys; `prepare` takes the text field out of each record."""
    from gpt2ladder.data.sources import SUFFIXES  # the formats prepare reads by suffix

    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    kind = SUFFIXES.get(suffixes[-1]) if suffixes else None
    if kind:
        raise UsageError(f"data file {path} holds {RECORD_KINDS[kind]} records, not plain text; run "
                         f"`gpt2ladder prepare {path} OUT` first and train with --data OUT")


def random_tokens(n_tokens: int, vocab_size: int = GPT2_VOCAB_SIZE, seed: int = 0) -> TokenData:
    """Uniform random tokens, for benchmarks when the real text is unavailable (step time ignores content)."""
    if n_tokens < 1:
        raise UsageError(f"random token count must be at least 1, got {n_tokens}")
    if not 1 <= vocab_size <= 2**16:
        raise UsageError(f"random token vocab size must be in [1, 65536], got {vocab_size}")
    tokens = np.random.default_rng(seed).integers(0, vocab_size, size=n_tokens, dtype=np.uint16)
    return _split(tokens, "random", _sha256_bytes(tokens.tobytes()))
