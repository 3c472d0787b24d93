"""A corpus of token shards as `--data`: found on disk, checked, and memory-mapped as one token sequence
per split (`ShardedTokens`), so every command samples it as it samples one text and no corpus is ever
read into memory.

What `--data` may name, besides a text file: a folder `gpt2ladder prepare` wrote (its `manifest.json`
checked: every shard's size and sha256); a folder or glob of llm.c `.bin` shards (llm.c's, modded-nanogpt's,
gpt2ladder's); nanoGPT's `train.bin`/`val.bin` (or their folder); build-nanogpt's `.npy` shards. The
validation split is the shards named `*_val_*` (or `*_val.bin`, `val.bin`), training the rest.

Every token is checked against the vocabulary once per shard file: the check is remembered in the cache
(keyed by the file's path, size, inode and modification time, and a sampled hash of its content), so later
runs read only headers and the samples. A file rewritten in place under the same stamp (bit rot, a copy that
kept the times) no longer matches its samples and is checked again; a remembered check older than
RECHECK_S is done again whatever the samples say, since a change between the samples escapes them. The
loader checks every batch's tokens besides (`loader.py`), so a damaged token never reaches the model.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import time
from pathlib import Path

import numpy as np

from gpt2ladder.data import manifest as manifest_mod
from gpt2ladder.data import shards as fmt
from gpt2ladder.data.files import atomic_file
from gpt2ladder.data.text import TokenData, cache_dir, display_name
from gpt2ladder.data.tokenizer import tokenizer_id
from gpt2ladder.errors import UsageError
from gpt2ladder.model.config import GPT2_VOCAB_SIZE

NANOGPT = ("train.bin", "val.bin")
SAMPLES = 64  # blocks a shard's sampled hash reads, spread evenly over the file
SAMPLE_BYTES = 4096
RECHECK_S = 30 * 24 * 3600  # a remembered check this old is done again in full
GLOB_CHARS = re.compile(r"[*?\[]")


class ShardedTokens:
    """Several memory-mapped shards read as one sequence: len(), and indexing by an int, a slice or an
    integer array of any shape (what `Batches` does), copying only the tokens asked for."""

    def __init__(self, shards: list[fmt.Shard]) -> None:
        self.shards = list(shards)
        self.arrays = [s.tokens() for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum([len(a) for a in self.arrays], dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("a corpus is sliced with step 1 only")
            return self._range(start, max(start, stop))
        idx = np.asarray(index)
        if idx.dtype.kind not in "iu":
            raise IndexError(f"a corpus is indexed by integers, not {idx.dtype}")
        flat = idx.reshape(-1).astype(np.int64)
        flat = np.where(flat < 0, flat + len(self), flat)
        if len(flat) and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"index out of range for a corpus of {len(self):,} tokens")
        which = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=fmt.TOKEN)
        for s in np.unique(which):
            rows = which == s
            out[rows] = self.arrays[s][flat[rows] - self.starts[s]]
        return out.reshape(idx.shape) if idx.ndim else out[0]

    def _range(self, start: int, stop: int) -> np.ndarray:
        parts = []
        for s, array in enumerate(self.arrays):
            lo, hi = max(start, self.starts[s]), min(stop, self.starts[s + 1])
            if lo < hi:
                parts.append(np.asarray(array[lo - self.starts[s]:hi - self.starts[s]]))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=fmt.TOKEN)


# --- finding the shards --------------------------------------------------------------------------


def is_corpus(spec: str | Path) -> bool:
    """Whether --data names token shards (a folder, a glob, a shard file) rather than a text file."""
    p = Path(spec).expanduser()
    if p.is_dir():
        return True
    if not p.exists():
        return bool(GLOB_CHARS.search(str(spec)))
    return p.is_file() and (p.suffix == ".npy" or p.name in NANOGPT or fmt.has_magic(p))


def _layout(paths: list[Path], where: str) -> str:
    kinds = {".npy" if p.suffix == ".npy" else ".bin" for p in paths}
    if len(kinds) > 1:
        raise UsageError(f"{where} holds both .bin and .npy token shards; name one kind with a glob, "
                         f"e.g. --data '{where}/*.bin'")
    return fmt.NPY if kinds == {".npy"} else fmt.LLMC


def _nanogpt(folder: Path) -> list[fmt.Shard] | None:
    """nanoGPT's pair, when the folder holds a train.bin or val.bin without llm.c's header."""
    found = [folder / n for n in NANOGPT if (folder / n).is_file()]
    if not found or any(fmt.has_magic(p) for p in found):
        return None
    return [fmt.open_shard(p, fmt.RAW) for p in found]


def _only_nanogpt(folder: Path) -> None:
    """Refuse a folder of nanoGPT's pair that holds llm.c shards besides: which one is meant is a guess."""
    others = sorted(q.name for q in folder.iterdir() if q.suffix == ".bin" and q.name not in NANOGPT
                    and not q.name.startswith(".") and fmt.has_magic(q))
    if others:
        raise UsageError(f"{folder} holds both llm.c shards ({others[0]}{', ...' if len(others) > 1 else ''}) and "
                         f"nanoGPT's train.bin/val.bin; name one: --data '{folder}/*_*.bin' or --data "
                         f"{folder}/train.bin")


def find_shards(spec: str | Path) -> tuple[str, list[fmt.Shard]]:
    """(a name to show, the shards) of a folder, glob or shard file; a one-line UsageError if there are none."""
    p = Path(spec).expanduser()
    if p.is_file():
        raw = _nanogpt(p.parent) if p.name in NANOGPT else None
        return display_name(p.parent if raw else p), raw or [fmt.open_shard(p, _layout([p], str(p)))]
    if p.is_dir():
        raw = _nanogpt(p)
        if raw:
            _only_nanogpt(p)
            return display_name(p), raw
        paths = sorted(q for q in p.iterdir() if q.suffix in (".bin", ".npy") and q.is_file()
                       and not q.name.startswith("."))  # hidden: macOS's ._NAME, a writer's temporary; as glob
        if not paths:
            raise UsageError(f"data folder {p} holds no token shards (llm.c .bin, nanoGPT train.bin/val.bin, "
                             "build-nanogpt .npy) and no manifest.json; for a folder of texts run "
                             f"gpt2ladder prepare {p} OUT first")
        return display_name(p), [fmt.open_shard(q, _layout(paths, str(p))) for q in paths]
    paths = sorted(Path(q) for q in glob.glob(str(p)) if Path(q).is_file())
    if not paths:
        raise UsageError(f"--data {spec} matches no files")
    return f"{display_name(p.parent)}/{p.name}", [fmt.open_shard(q, _layout(paths, str(p.parent))) for q in paths]


# --- checking them ------------------------------------------------------------------------------


def _memo_path(path: Path) -> Path:
    key = hashlib.sha256(os.fsencode(os.path.realpath(path))).hexdigest()[:32]
    return cache_dir() / "shard-checks" / f"{key}.json"


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_ino, st.st_mtime_ns]


def sampled_sha256(path: Path) -> str:
    """sha256 of the file's size and SAMPLES blocks spread evenly from its start to its end (the header
    and the last tokens among them): a few hundred KiB whatever the size, and a different value for a file
    whose tokens were rewritten anywhere but between the samples."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(str(size).encode())
        last = max(0, size - SAMPLE_BYTES)
        for at in sorted({last * i // (SAMPLES - 1) for i in range(SAMPLES)}):
            f.seek(at)
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def _remembered(shard: fmt.Shard, digest: bool) -> dict | None:
    """The cache's record of a scan of this very file (same path, size, inode, modification time and
    sampled content), unless it is older than RECHECK_S."""
    try:
        known = json.loads(_memo_path(shard.path).read_text())
        if (known.get("stamp") == _stamp(shard.path) and known.get("vocab") == GPT2_VOCAB_SIZE
                and (known.get("sha256") or not digest)
                and 0 <= time.time() - known.get("checked_at", 0) < RECHECK_S
                and known.get("sample") == sampled_sha256(shard.path)):
            return known
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return None


def checked_sha256(shard: fmt.Shard, digest: bool) -> str | None:
    """Scan the shard (tokens < vocabulary; its sha256 with `digest`) unless the cache remembers a scan of
    this very file; the sha256 when there is one."""
    known = _remembered(shard, digest)
    if known:
        return known.get("sha256")
    stamp, sample, now = _stamp(shard.path), sampled_sha256(shard.path), time.time()
    sha = fmt.scan(shard, GPT2_VOCAB_SIZE, digest)
    try:  # a read-only cache only costs the next run the same scan
        with atomic_file(_memo_path(shard.path)) as f:
            f.write(json.dumps({"path": os.fsdecode(shard.path), "stamp": stamp, "vocab": GPT2_VOCAB_SIZE,
                                "sha256": sha, "sample": sample, "checked_at": now}).encode())
    except OSError:
        pass
    return sha


def _check_all(shards: list[fmt.Shard], where: str, digest: bool, notify) -> list[str | None]:
    """checked_sha256 of every shard, saying first how much must be read when the cache has not seen it."""
    todo = sum(s.offset + 2 * s.n_tokens for s in shards if not _remembered(s, digest))
    if todo:
        size = f"{todo / 1e9:.1f} GB" if todo >= 1e9 else f"{todo / 1e6:.1f} MB"
        notify(f"checking the tokens of {where} ({size}) once; later runs reuse the check")
    return [checked_sha256(s, digest) for s in shards]


# --- loading -------------------------------------------------------------------------------------


def _split(shards: list[fmt.Shard], source: str, identity: str) -> TokenData:
    val = [s for s in shards if fmt.is_val(s.path)]
    train = [s for s in shards if not fmt.is_val(s.path)]
    n = sum(s.n_tokens for s in shards)
    return TokenData(ShardedTokens(train), ShardedTokens(val), source, identity, n)


def foreign_identity(shards: list[fmt.Shard]) -> str:
    """A corpus without a manifest is known by its shards' names, sizes and sampled content (headers
    included), so a copy on another disk is the same corpus and a re-made or rewritten one is not; the
    tokens between the samples are not hashed."""
    h = hashlib.sha256()
    for s in shards:
        h.update(json.dumps([s.path.name, s.layout, s.path.stat().st_size, sampled_sha256(s.path)]).encode())
    return h.hexdigest()


def load_prepared(folder: Path, notify=print, check=None) -> TokenData:
    """A folder `prepare` wrote: every shard the manifest lists, each the size and sha256 it records.
    `check` sees the splits before any shard is scanned (see `load_corpus`)."""
    m = manifest_mod.read(folder / manifest_mod.FINAL)
    if m.get("tokenizer") != tokenizer_id():
        raise UsageError(f"{folder} was prepared with another tokenizer than this gpt2ladder's GPT-2; "
                         f"prepare its source again into another folder")
    shards = [fmt.open_shard(folder / s["name"], fmt.LLMC) for s in m["shards"]]
    for entry, shard in zip(m["shards"], shards):
        if shard.n_tokens != entry["n_tokens"]:
            raise UsageError(f"token shard {shard.path} holds {shard.n_tokens:,} tokens, but "
                             f"{folder / manifest_mod.FINAL} records {entry['n_tokens']:,}: changed; prepare the "
                             "corpus again")
    val = [s for e, s in zip(m["shards"], shards) if e["split"] == "val"]
    train = [s for e, s in zip(m["shards"], shards) if e["split"] == "train"]
    data = TokenData(ShardedTokens(train), ShardedTokens(val), display_name(folder),
                     manifest_mod.identity(m), sum(s.n_tokens for s in shards))
    if check is not None:
        check(data)
    for entry, shard, sha in zip(m["shards"], shards, _check_all(shards, display_name(folder), True, notify)):
        if sha != entry["sha256"]:
            raise UsageError(f"token shard {shard.path} is not the one {folder / manifest_mod.FINAL} records "
                             f"(sha256 {entry['sha256'][:12]}...): changed or damaged; "
                             "prepare the corpus again")
    return data


def load_corpus(spec: str | Path, notify=print, check=None) -> TokenData:
    """The shards --data names, checked, as a TokenData whose train and val are memory-mapped views.
    `check` (a TokenData -> None that raises) sees them first: a corpus too small for the run is refused
    before the scan's notice."""
    p = Path(spec).expanduser()
    if p.is_dir() and (p / manifest_mod.FINAL).is_file():
        return load_prepared(p, notify, check)
    if p.is_dir() and (p / manifest_mod.PARTIAL).is_file():
        raise UsageError(f"{p} holds an unfinished gpt2ladder prepare; run the same prepare command again to "
                         "finish it")
    source, shards = find_shards(spec)
    data = _split(shards, source, foreign_identity(shards))
    if check is not None:
        check(data)
    _check_all(shards, source, False, notify)
    return data
