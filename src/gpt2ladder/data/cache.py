"""The token cache: a text's GPT-2 ids as raw uint16 (`<sha256>.bin`, memory-mapped by every run) and its
record (`<sha256>.json`: the text's sha256, the tokenizer, the token count and the bin's own sha256).

The record is checked on every load, so a truncated, padded or overwritten bin, one made by another
tokenizer, or one holding an id outside GPT-2's vocabulary, is rebuilt (with a notice) instead of
trained on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from gpt2ladder.data.files import atomic_file
from gpt2ladder.data.tokenizer import encode_stream, tokenizer_id
from gpt2ladder.errors import LadderError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE

FORMAT = "gpt2ladder-tokens"
VERSION = 1
PROGRESS_BYTES = 64 * 2**20  # tokenizing a text this large shows a progress bar (on a terminal)


def load_or_build(folder: Path, text_sha256: str, chunks: Callable[[], Iterable[str]], text_bytes: int,
                  notify=print) -> np.memmap:
    """The cached ids of the text with this sha256, tokenizing `chunks()` first when the cache is not valid."""
    bin_path, record_path = folder / f"{text_sha256}.bin", folder / f"{text_sha256}.json"
    problem = check(bin_path, record_path, text_sha256)
    if problem:
        if bin_path.exists() or record_path.exists():  # a first tokenization is not news
            notify(f"notice: the token cache {bin_path} {problem}; tokenizing the text again")
        build(bin_path, record_path, text_sha256, chunks(), text_bytes)
    return np.memmap(bin_path, dtype=np.uint16, mode="r")


def check(bin_path: Path, record_path: Path, text_sha256: str) -> str | None:
    """None when the cache is whole and belongs to this text and tokenizer, else what is wrong with it."""
    if not bin_path.is_file():
        return "is missing"
    try:
        record = json.loads(record_path.read_text())
    except FileNotFoundError:
        return "has no record of its text and tokenizer (an older gpt2ladder wrote it)"
    except (OSError, ValueError):
        return "has an unreadable record"
    if not isinstance(record, dict) or (record.get("format"), record.get("version")) != (FORMAT, VERSION):
        return "has a record of another format"
    if record.get("text_sha256") != text_sha256:
        return "records another text"
    if record.get("tokenizer") != tokenizer_id():
        return "was made with another tokenizer"
    n, size = record.get("n_tokens"), bin_path.stat().st_size
    if not isinstance(n, int) or n < 1 or size != 2 * n:
        return f"holds {size:,} bytes, not the 2 bytes of each of its {n} tokens"
    with open(bin_path, "rb") as f:
        digest, largest = _digest_and_largest_id(f)
    if digest != record.get("bin_sha256"):
        return "does not match its checksum"
    if largest >= GPT2_VOCAB_SIZE:  # a bin and record rewritten to match: its ids would index past the embedding
        return f"holds token id {largest}, beyond GPT-2's vocabulary of {GPT2_VOCAB_SIZE}"
    return None


def _digest_and_largest_id(f, block: int = 8 * 2**20) -> tuple[str, int]:
    """The sha256 of a bin and its largest id, in one pass a block at a time (even-sized: whole ids)."""
    h, largest = hashlib.sha256(), 0
    while data := f.read(block):
        h.update(data)
        largest = max(largest, int(np.frombuffer(data, dtype=np.uint16).max()))
    return h.hexdigest(), largest


def build(bin_path: Path, record_path: Path, text_sha256: str, chunks: Iterable[str], text_bytes: int) -> None:
    """Tokenize chunk by chunk into the bin (written atomically), then write its record."""
    from tqdm.auto import tqdm

    bar = tqdm(total=text_bytes, unit="B", unit_scale=True, desc="tokenizing", leave=False,
               disable=text_bytes < PROGRESS_BYTES or not sys.stderr.isatty())
    h, n = hashlib.sha256(), 0
    try:
        with atomic_file(bin_path) as f:
            for ids in encode_stream(_counted(chunks, bar)):
                data = np.asarray(ids, dtype=np.uint16).tobytes()  # GPT-2's 50257 ids fit in 16 bits
                f.write(data)
                h.update(data)
                n += len(ids)
        record = {"format": FORMAT, "version": VERSION, "text_sha256": text_sha256, "tokenizer": tokenizer_id(),
                  "n_tokens": n, "bin_sha256": h.hexdigest()}
        with atomic_file(record_path) as f:
            f.write((json.dumps(record, indent=1) + "\n").encode())
    except OSError as e:
        raise LadderError(f"cannot write the token cache {bin_path}: {e.strerror or e}; "
                          "set GPT2LADDER_CACHE to a writable folder") from e
    finally:
        bar.close()


def _counted(chunks: Iterable[str], bar) -> Iterable[str]:
    for chunk in chunks:
        bar.update(len(chunk.encode("utf-8")))
        yield chunk
