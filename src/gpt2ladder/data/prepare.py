"""A source's documents into llm.c token shards: `gpt2ladder prepare`'s work.

The token stream is the documents in source order, each preceded by <|endoftext|> (50256), as llm.c,
build-nanogpt and modded-nanogpt prepare FineWeb. Its first `val_tokens` tokens are the validation shard
`NAME_val_000000.bin`; the rest fill `NAME_train_000001.bin`, ... of `shard_tokens` each. A source of fewer
than 10 x val_tokens tokens gives its first tenth to validation instead, so a small corpus still trains on
90% of itself; to know which case holds, the first 10 x val_tokens tokens wait in a spool file on disk.

Tokenizing runs on `workers` processes fed with batches of about a MiB of text, at most two batches per
worker in flight, and the results are written in source order: memory stays the same whatever the
source's size. Every finished shard is recorded in `manifest.partial.json` with where in the source it
ends, so a run that is killed or interrupted continues after its last finished shard; `manifest.json` is
written last, once every shard is whole.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import errno
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from gpt2ladder.data import manifest as manifest_mod
from gpt2ladder.data import shards as fmt
from gpt2ladder.data.files import open_new, temp_of
from gpt2ladder.data.sources import BadDocument, Piece, Source, SourceSpec
from gpt2ladder.data.tokenizer import GPT2_EOT, encode_bounded, get_tokenizer, tokenizer_id
from gpt2ladder.errors import LadderError, UsageError

BATCH_CHARS = 2**20  # text per task handed to a worker: large enough to pay for the trip, small enough to spread
IN_FLIGHT = 2  # batches per worker queued or running
SPOOL_FACTOR = 10  # a source of fewer than this many times val_tokens tokens gives a tenth to validation
COPY_TOKENS = 8 * 2**20  # the spool is copied into shards this many tokens at a time


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    spec: SourceSpec
    out: Path
    name: str
    val_tokens: int = 10_000_000
    shard_tokens: int = 100_000_000
    workers: int = 1

    def __post_init__(self) -> None:
        for flag, value in (("--val-tokens", self.val_tokens), ("--shard-tokens", self.shard_tokens)):
            if not 1 <= value <= fmt.MAX_TOKENS:
                raise UsageError(f"{flag} must be from 1 to {fmt.MAX_TOKENS:,} (a shard's header counts its "
                                 f"tokens in 32 bits), got {value:,}")
        if self.workers < 1:
            raise UsageError(f"--workers must be at least 1, got {self.workers}")
        check_name(self.name)


def check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise UsageError(f"--name {name!r} must be letters, digits, '-', '_' or '.', and not start with '.'")
    if fmt.SPLIT_WORD.search(name):
        raise UsageError(f"--name {name!r} must not hold 'val' or 'train' between underscores: the shards' "
                         "names say their split")


def default_name(source: str) -> str:
    """The shards' name when --name is not given: the source's last path part, without suffixes, in the
    characters a name may hold (HuggingFaceFW/fineweb-edu -> fineweb-edu, input.txt -> input, and
    train.jsonl -> train-corpus, since a shard's name may not say a split of its own)."""
    part = Path(source.rstrip("/\\")).name.split(".")[0]
    name = "".join(c if c.isalnum() or c in "-." else "-" for c in part).strip("-.") or "corpus"
    return f"{name}-corpus" if fmt.SPLIT_WORD.search(name) else name


def available_cores() -> int:
    """The cores this process may run on (a container's or taskset's limit, not the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --- tokenizing -------------------------------------------------------------------------------------


def encode_pieces(pieces: list[Piece]) -> np.ndarray:
    """The ids of a batch of pieces, <|endoftext|> before each document: what a worker returns."""
    eot = np.array([GPT2_EOT], dtype=np.uint32)
    parts = []
    for text, starts_document in pieces:
        if starts_document:
            parts.append(eot)
        parts.append(encode_bounded(text))  # a long document a bounded piece at a time
    return np.concatenate(parts).astype(fmt.TOKEN) if parts else np.zeros(0, dtype=fmt.TOKEN)


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that made it ends


def _end_with(parent: int) -> None:
    """This worker ends when its parent does, however the parent ends (even SIGKILL, which runs no
    cleanup): a worker waits on a queue whose write end it holds itself, so it would never see EOF. Linux
    has the kernel kill it (PR_SET_PDEATHSIG); elsewhere a thread looks at the parent's pid every second."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent ended before the request was made
                os._exit(1)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="gpt2ladder-parent-watch", daemon=True).start()


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held():
    """Ctrl-C or SIGTERM arriving inside is acted on once the block is done, by the handler it would have met.
    The pool starts a worker inside `submit`: stopped half-way, the parent leaves the new interpreter without
    its start-up data, and it prints a traceback. Outside the main thread (no handlers there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: arrived.append(signum)) for sig in HELD_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if arrived:
            signal.raise_signal(arrived[0])  # to the handler restored above


def _worker_init(parent: int) -> None:
    _end_with(parent)
    # Ctrl-C and a SIGTERM to the whole group are the parent's to handle: it stops the pool, no tracebacks
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    get_tokenizer()


@dataclasses.dataclass(frozen=True)
class Meta:
    """Where a batch starts in the source, and the documents before it."""

    position: dict | None
    documents: int
    n_documents: int


def _batches(cursor, documents: int) -> Iterator[tuple[Meta, list[Piece]]]:
    while True:
        position, pieces, chars = cursor.position(), [], 0
        for piece in cursor:
            pieces.append(piece)
            chars += len(piece[0])
            if chars >= BATCH_CHARS:
                break
        if not pieces:
            return
        n = sum(starts for _, starts in pieces)
        yield Meta(position, documents, n), pieces
        documents += n


def tokenized(batches: Iterator[tuple[Meta, list[Piece]]], workers: int) -> Iterator[tuple[Meta, np.ndarray]]:
    """Each batch's ids, in order; with several workers, at most IN_FLIGHT x workers batches at once."""
    if workers == 1:
        for meta, pieces in batches:
            yield meta, encode_pieces(pieces)
        return
    # spawn: a fresh interpreter per worker, safe whatever threads the parent runs (a dataset's streaming)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                                                initargs=(os.getpid(),)) as pool:
        pending: collections.deque = collections.deque()
        try:
            yield from _in_order(pool, batches, pending, workers)
        except concurrent.futures.process.BrokenProcessPool:
            raise LadderError("a tokenizing worker process died (killed, or out of memory); the finished shards "
                              "are kept: run the same command again, perhaps with fewer --workers") from None
        finally:
            for _, future in pending:
                future.cancel()


def _in_order(pool, batches, pending: collections.deque, workers: int) -> Iterator[tuple[Meta, np.ndarray]]:
    """Submit batches as results are taken, oldest first: the order is the source's, memory is bounded."""
    for meta, pieces in batches:
        with signals_held():  # a submit may start a worker
            pending.append((meta, pool.submit(encode_pieces, pieces)))
        if len(pending) >= IN_FLIGHT * workers:
            meta, future = pending.popleft()
            yield meta, future.result()
    while pending:
        meta, future = pending.popleft()
        yield meta, future.result()


# --- writing shards ---------------------------------------------------------------------------------


def shard_path(cfg: PrepareConfig, index: int) -> Path:
    return cfg.out / fmt.shard_name(cfg.name, "val" if index == 0 else "train", index)


class _Spool:
    """The first tokens of a fresh run, on disk until the validation split's size is known."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / ".spool.part"
        self.path.unlink(missing_ok=True)  # whatever is there (a killed run's, a link): removed, never written through
        self.f = os.fdopen(open_new(self.path, os.O_RDWR), "w+b")
        self.n_tokens = 0

    def write(self, tokens: np.ndarray) -> None:
        self.f.write(tokens.view(np.uint8).data)
        self.n_tokens += len(tokens)

    def blocks(self, start: int, stop: int) -> Iterator[np.ndarray]:
        self.f.flush()
        for at in range(start, stop, COPY_TOKENS):
            self.f.seek(at * fmt.TOKEN.itemsize)
            yield np.fromfile(self.f, dtype=fmt.TOKEN, count=min(COPY_TOKENS, stop - at))

    def remove(self) -> None:
        self.f.close()
        self.path.unlink(missing_ok=True)


class Sink:
    """The token stream into shards: the spool, then the validation shard, then training shards; each
    finished shard goes into the partial manifest with the point in the source where the next one starts."""

    def __init__(self, cfg: PrepareConfig, base: dict, done: list[dict], skip: int) -> None:
        self.cfg, self.base, self.done = cfg, base, list(done)
        self.placed = sum(e["n_tokens"] for e in done)  # tokens in finished shards and the open one
        self.fed, self.discard = self.placed - skip, skip  # a resumed run re-reads `skip` tokens already kept
        self.spool = None if done else _Spool(cfg.out)
        self.writer: fmt.ShardWriter | None = None
        self.starts: collections.deque = collections.deque()  # (stream index, Meta) of batches not yet past
        self.recorded = False  # this run has written the partial manifest: later shards are appended to it

    def feed(self, meta: Meta, tokens: np.ndarray) -> None:
        self.starts.append((self.fed, meta))
        self.fed += len(tokens)
        if self.discard:
            drop = min(self.discard, len(tokens))
            tokens, self.discard = tokens[drop:], self.discard - drop
        if self.spool is None:
            self._train(tokens)
            return
        self.spool.write(tokens)
        if self.spool.n_tokens >= SPOOL_FACTOR * self.cfg.val_tokens:
            self._flush(self.cfg.val_tokens)

    def finish(self, documents: int) -> dict:
        """Close the last shard and write manifest.json; returns it."""
        if self.spool is not None:
            self._flush(self.spool.n_tokens // SPOOL_FACTOR)
        if self.writer is not None and self.writer.n_tokens:
            self._close()
        shards = [{k: e[k] for k in manifest_mod.SHARD_KEYS} for e in self.done]
        final = {**self.base, "documents": documents, "n_tokens": sum(e["n_tokens"] for e in shards), "shards": shards}
        manifest_mod.write(self.cfg.out / manifest_mod.FINAL, final)
        (self.cfg.out / manifest_mod.PARTIAL).unlink(missing_ok=True)
        return final

    def abort(self) -> None:
        """Drop the open shard and the spool; the finished shards and the partial manifest stay."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None
        if self.spool is not None:
            self.spool.remove()
            self.spool = None

    def _flush(self, val_n: int) -> None:
        spool, self.spool = self.spool, None
        try:
            with fmt.ShardWriter(shard_path(self.cfg, 0)) as val:
                for block in spool.blocks(0, val_n):
                    val.write(block)
            self.placed = val_n
            self._finished(0, val_n)
            for block in spool.blocks(val_n, spool.n_tokens):
                self._train(block)
        finally:  # interrupted or not, the spool is done with
            spool.remove()

    def _train(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self.writer is None:
                self.writer = fmt.ShardWriter(shard_path(self.cfg, len(self.done)))
            room = self.cfg.shard_tokens - self.writer.n_tokens
            self.writer.write(tokens[:room])
            self.placed += min(room, len(tokens))
            tokens = tokens[room:]
            if self.writer.n_tokens == self.cfg.shard_tokens:
                self._close()

    def _close(self) -> None:
        writer, self.writer = self.writer, None
        writer.close()
        self._finished(len(self.done), writer.n_tokens)

    def _finished(self, index: int, n_tokens: int) -> None:
        """Record shard `index` in the partial manifest, with where the stream after it starts: the last
        batch that began at or before it, and how many of that batch's tokens are already in shards."""
        while len(self.starts) > 1 and self.starts[1][0] <= self.placed:
            self.starts.popleft()
        start, meta = self.starts[0]
        path = shard_path(self.cfg, index)
        self.done.append({"name": path.name, "split": "val" if index == 0 else "train", "n_tokens": n_tokens,
                          "sha256": fmt.file_sha256(path),
                          "next": {"position": meta.position, "documents": meta.documents,
                                   "skip": self.placed - start}})
        partial = self.cfg.out / manifest_mod.PARTIAL
        if self.recorded:
            manifest_mod.append_partial(partial, self.done[-1])
        else:  # written whole once a run: a resumed run's record holds only the shards it kept
            manifest_mod.start_partial(partial, self.base, self.done)
            self.recorded = True


# --- a run, fresh or resumed ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run does: nothing (`finished` holds the manifest), or continue after the `kept` shards."""

    base: dict
    kept: list
    finished: dict | None = None

    @property
    def start(self) -> dict | None:
        return self.kept[-1]["next"] if self.kept else None


def _base(cfg: PrepareConfig, source: Source) -> dict:
    return {"format": manifest_mod.FORMAT, "version": manifest_mod.VERSION, "name": cfg.name,
            "source": source.description, "tokenizer": tokenizer_id(),
            "settings": {"val_tokens": cfg.val_tokens, "shard_tokens": cfg.shard_tokens}}


def _same(found: dict, base: dict) -> bool:
    return all(found.get(k) == base[k] for k in ("name", "source", "tokenizer", "settings"))


def plan(cfg: PrepareConfig, source: Source, notify=print) -> Plan:
    """Read OUT: a finished corpus of this source, an unfinished one to continue, or nothing of gpt2ladder's."""
    base, out = _base(cfg, source), cfg.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file; OUT is the folder the shards go into")
    read_from = source.description.get("path")
    if read_from and Path(read_from).is_dir() and out.resolve().is_relative_to(read_from):
        raise UsageError(f"{out} is inside the source folder {read_from}, whose files would then include the "
                         "shards; give an OUT outside it")
    if (out / manifest_mod.FINAL).is_file():
        found = manifest_mod.read(out / manifest_mod.FINAL)
        if not _same(found, base):
            raise UsageError(f"{out} already holds a corpus prepared from another source or with other settings; "
                             "give another OUT")
        return Plan(base, found["shards"], finished=found)
    if (out / manifest_mod.PARTIAL).is_file():
        found = manifest_mod.read(out / manifest_mod.PARTIAL)
        if not _same(found, base):
            raise UsageError(f"{out} holds an unfinished prepare of another source or with other settings; rerun "
                             "that command to finish it, or give another OUT or empty this one")
        return Plan(base, _verified(cfg, found["shards"], notify))
    if out.is_dir() and any(not p.name.startswith(".") for p in out.iterdir()):
        raise UsageError(f"{out} is not empty and holds no gpt2ladder prepare; give an empty or new folder")
    return Plan(base, [])


def _verified(cfg: PrepareConfig, entries: list[dict], notify) -> list[dict]:
    """The finished shards that are still whole and what the partial manifest recorded, up to the first
    that is not; that one and the shards after it are made again."""
    kept = []
    for entry in entries:
        path = cfg.out / entry["name"]
        try:
            ok = (fmt.open_shard(path, fmt.LLMC).n_tokens == entry["n_tokens"]
                  and fmt.file_sha256(path) == entry["sha256"] and "next" in entry)
        except (UsageError, OSError):
            ok = False
        if not ok:
            notify(f"notice: {path} is not the shard {manifest_mod.PARTIAL} records; making it again")
            break
        kept.append(entry)
    return kept


def _clean(cfg: PrepareConfig, kept: list[dict]) -> None:
    """Remove what an interrupted run left beyond the kept shards: later shards and temporary files."""
    keep = {e["name"] for e in kept}

    def ours(name: str) -> bool:
        return name.startswith((f"{cfg.name}_val_", f"{cfg.name}_train_")) and name.endswith(".bin")

    for p in cfg.out.iterdir():
        if (ours(p.name) and p.name not in keep) or _temporary(cfg, p.name):
            p.unlink(missing_ok=True)


def _temporary(cfg: PrepareConfig, name: str) -> bool:
    """A temporary of a shard or of a manifest (`files.beside`), or a spool part, left by an interrupted run."""
    written = temp_of(name)
    shard = written is not None and written.startswith((f"{cfg.name}_val_", f"{cfg.name}_train_"))
    manifest = written in ("manifest.json", "manifest.partial.json")
    return shard or manifest or (name.startswith((f".{cfg.name}_", ".spool.")) and name.endswith(".part"))


def drop_temporaries(cfg: PrepareConfig) -> None:
    """Remove the temporaries a Ctrl-C caught between making a file and renaming it into place."""
    if cfg.out.is_dir():
        for p in cfg.out.iterdir():
            if _temporary(cfg, p.name):
                p.unlink(missing_ok=True)


def run(cfg: PrepareConfig, source: Source, planned: Plan, progress: Callable[[int, int], None] | None = None) -> dict:
    """Tokenize the source from where the plan starts into shards; returns the manifest."""
    if planned.finished:
        return planned.finished
    cfg.out.mkdir(parents=True, exist_ok=True)
    _clean(cfg, planned.kept)
    start = planned.start
    sink = Sink(cfg, planned.base, planned.kept, start["skip"] if start else 0)
    documents = start["documents"] if start else 0
    try:
        with contextlib.closing(source.pieces(start["position"] if start else None)) as cursor, \
                contextlib.closing(tokenized(_batches(cursor, documents), cfg.workers)) as stream:
            for meta, tokens in stream:
                _write(sink.feed, cfg, sink, meta, tokens)
                documents = meta.documents + meta.n_documents
                if progress:
                    progress(meta.n_documents, len(tokens))
        if documents == 0:
            raise UsageError(f"{source.description.get('path') or source.description.get('name')} holds no documents")
        return _write(sink.finish, cfg, sink, documents)
    except BadDocument as e:  # found while tokenizing: this source, as it is, can never be finished
        sink.abort()
        if not sink.done:
            raise
        kept = f"{cfg.out} keeps the {len(sink.done)} shard{'' if len(sink.done) == 1 else 's'} finished before it"
        if "fingerprint" not in source.description:  # a Hub dataset: named, not fingerprinted
            raise BadDocument(f"{e}; {kept}, with {manifest_mod.PARTIAL}") from None
        raise BadDocument(f"{e}; {kept}, which the source mended (another source to prepare) does not continue: "
                          "prepare that into another OUT, or empty this one first") from None
    except BaseException:
        sink.abort()
        raise


def _write(step, cfg: PrepareConfig, sink: Sink, *args):
    """A sink step; a failed write (a full disk) is one line saying what is kept."""
    try:
        return step(*args)
    except OSError as e:
        kept = len(sink.done)
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        what = "the disk holding it is full" if full else f"cannot write it: {e.strerror or e}"
        shards = (f"the {kept} finished shard{'' if kept == 1 else 's'} and {manifest_mod.PARTIAL} are kept"
                  if kept else "no shard was finished yet")
        raise LadderError(f"{cfg.out}: {what}; {shards}: {'free some space and ' if full else ''}run the same "
                          "command again to continue") from e
