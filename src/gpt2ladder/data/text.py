"""The text to train on: Tiny Shakespeare (downloaded once and verified) or a user's file, tokenized
once and memory-mapped from a cache keyed by the text's sha256."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from gpt2ladder.data.tokenizer import get_tokenizer
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
DOWNLOAD_TIMEOUT_S = 20
TRAIN_FRACTION = 0.9


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
    return _sha256_bytes(path.read_bytes())


@contextlib.contextmanager
def _atomic_file(dest: Path) -> Iterator[BinaryIO]:
    """Yield a temp file beside dest that replaces dest only if the block finishes.

    Readers (and a later run after a crash or Ctrl-C) then never see a half-written file.
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


# --- Tiny Shakespeare ---------------------------------------------------------------------------


def _download(url: str, dest: Path, sha256: str) -> None:
    """Download url to dest; dest appears only if the bytes match sha256."""
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
        data = response.read()
    if _sha256_bytes(data) != sha256:
        got = _sha256_bytes(data)
        raise ValueError(f"downloaded file has sha256 {got[:12]}..., expected {sha256[:12]}...")
    with _atomic_file(dest) as f:
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
    """A tokenized text split into train (first 90%) and val (last 10%) uint16 token arrays."""

    train: np.ndarray
    val: np.ndarray
    source: str
    sha256: str
    n_tokens: int


def _split(tokens: np.ndarray, source: str, sha256: str) -> TokenData:
    cut = int(len(tokens) * TRAIN_FRACTION)
    return TokenData(tokens[:cut], tokens[cut:], source, sha256, len(tokens))


def _read_text_file(path: Path) -> bytes:
    """The bytes of a user's text file, or a UsageError saying what is wrong with it."""
    if not path.exists():
        raise UsageError(f"data file {path} does not exist")
    if path.is_dir():
        raise UsageError(f"data file {path} is a directory, not a text file")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read data file {path}: {e.strerror or e}") from e
    if not raw:
        raise UsageError(f"data file {path} is empty")
    return raw


def _decode_text(raw: bytes, path: Path) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:  # valid UTF-8 can still be binary (all zeros); text has no NUL
        raise UsageError(f"data file {path} is not a UTF-8 text file")
    return text


def _tokenize_to(raw: bytes, path: Path, bin_path: Path) -> None:
    """Tokenize the text once and store it as raw uint16 (GPT-2's 50257 ids fit in 16 bits)."""
    ids = get_tokenizer().encode_ordinary(_decode_text(raw, path))
    try:
        with _atomic_file(bin_path) as f:
            f.write(np.asarray(ids, dtype=np.uint16).tobytes())
    except OSError as e:
        raise LadderError(
            f"cannot write the token cache {bin_path}: {e.strerror or e}; "
            "set GPT2LADDER_CACHE to a writable folder"
        ) from e


def load_tokens(text_path: Path | str | None = None, *, download: bool = True) -> TokenData:
    """Tokens of a text file (None: Tiny Shakespeare), tokenized once and then memory-mapped from cache.

    The cache is keyed by the sha256 of the file's bytes, so an edited file is tokenized again.
    """
    if text_path is None:
        path, source = fetch_tinyshakespeare(download), "tinyshakespeare"
    else:
        path = Path(text_path).expanduser()
        source = path.name
    raw = _read_text_file(path)
    digest = _sha256_bytes(raw)
    bin_path = cache_dir() / "tokens" / f"{digest}.bin"
    if not bin_path.is_file() or bin_path.stat().st_size == 0:
        _tokenize_to(raw, path, bin_path)
    tokens = np.memmap(bin_path, dtype=np.uint16, mode="r")
    return _split(tokens, source, digest)


def random_tokens(n_tokens: int, vocab_size: int = GPT2_VOCAB_SIZE, seed: int = 0) -> TokenData:
    """Uniform random tokens, for benchmarks when the real text is unavailable (step time ignores content)."""
    if n_tokens < 1:
        raise UsageError(f"random token count must be at least 1, got {n_tokens}")
    if not 1 <= vocab_size <= 2**16:
        raise UsageError(f"random token vocab size must be in [1, 65536], got {vocab_size}")
    tokens = np.random.default_rng(seed).integers(0, vocab_size, size=n_tokens, dtype=np.uint16)
    return _split(tokens, "random", _sha256_bytes(tokens.tobytes()))
