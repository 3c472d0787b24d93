"""Where `prepare` reads documents from, in a fixed order: a text file (one document) or a folder of
them (one document per file, in sorted order); JSON Lines, Parquet or CSV files with a text column; or
a Hugging Face dataset by name, streamed through the `datasets` library and never downloaded whole.

A source hands out *pieces* (text, whether it starts a document) through a `Cursor`, whose `position()`
is a small JSON value: given back to `Source.pieces`, it restarts the stream at the next piece, which is
what lets `prepare` resume after its last finished shard. Long texts are cut into pieces only where
`tokenizer.safe_cut` allows, so the pieces tokenize exactly as the whole text does.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import gzip
import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterator

from gpt2ladder.errors import LadderError, UsageError

FORMATS = ("auto", "text", "jsonl", "parquet", "csv", "hf")
READ_BYTES = 4 * 2**20  # a text file is read and cut into pieces this much at a time
MAX_CARRY = 64 * 2**20  # a line longer than this (no safe cut) is cut anyway, as encode_stream does
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}
SNIFF_BYTES = 4096  # how much of each text file is looked at before anything is tokenized
# `Source.check` reads the first documents up to this many, or this much text: a bad record among them is one
# line before the banner, not an error after it; one further on is found while tokenizing.
CHECK_DOCUMENTS = 1000
CHECK_CHARS = 2**20
# Files no reader here understands; a source of another suffix is read as UTF-8 text.
UNKNOWN = {".zst", ".bz2", ".xz", ".zip", ".tar", ".7z", ".arrow", ".feather", ".bin", ".npy", ".pt", ".pkl",
           ".xlsx", ".xls", ".avro", ".orc", ".tfrecord", ".h5"}
EXTRA = "pip install 'gpt2ladder[corpus]' (datasets and pyarrow)"


class BadDocument(UsageError):
    """The source holds something prepare cannot take as a document's text (a record without its text field, bytes
    that are no UTF-8, a damaged file): mended, the source is another one."""
TRUE = ("1", "ON", "YES", "TRUE")

Piece = tuple[str, bool]  # (text, whether it starts a document)


class DataUnavailable(LadderError):
    """A Hugging Face dataset that cannot be reached (offline, no network, no such dataset)."""


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """What the user named: a path or a dataset name, how to read it, and which column holds the text."""

    source: str
    format: str = "auto"
    text_field: str = "text"
    subset: str | None = None
    split: str = "train"
    follow_links: bool = False  # a folder's links out of it are read too (links inside it always are)


class Cursor:
    """The pieces of a source from a position on; `position()` is where the next piece starts.

    The reader calls `mark` just before each piece with the position after it (a value, or a function
    computed only if asked: a streamed dataset's state is worth taking only at a batch's start).
    """

    def __init__(self, read: Callable, start: dict | None) -> None:
        self._next = start
        self._it = read(start, self._mark)

    def _mark(self, position) -> None:
        self._next = position

    def position(self) -> dict | None:
        if callable(self._next):
            self._next = self._next()
        return self._next

    def __iter__(self) -> Cursor:
        return self

    def __next__(self) -> Piece:
        return next(self._it)

    def close(self) -> None:
        self._it.close()


@dataclasses.dataclass
class Source:
    """An opened source: what the manifest records of it, the document count when known, and its reader."""

    description: dict
    total_documents: int | None
    read: Callable  # read(start, mark) -> Iterator[Piece]

    def pieces(self, start: dict | None = None) -> Cursor:
        return Cursor(self.read, start)

    def check(self) -> None:
        """Read the first documents (CHECK_DOCUMENTS, or CHECK_CHARS of text, and at least up to the first text),
        so a missing column, a line that is no JSON or a field that is no text among them, or a source without any
        text (no documents, or empty ones only) is one line before any work."""
        documents = chars = 0
        with contextlib.closing(self.pieces()) as cursor:
            for text, starts in cursor:
                documents, chars = documents + starts, chars + len(text)
                if chars and (documents >= CHECK_DOCUMENTS or chars >= CHECK_CHARS):
                    break
        if not chars:
            raise UsageError(f"{self.description.get('path') or self.description.get('name')} holds no "
                             "documents, or empty ones only: no text to tokenize")


# --- choosing a reader -------------------------------------------------------------------------


def _suffix(path: Path) -> str:
    """The suffix that names the format, under a .gz if there is one (corpus.jsonl.gz -> .jsonl)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def format_of(path: Path) -> str:
    """The format a file is read in when --format is auto."""
    suffix = _suffix(path)
    if suffix in UNKNOWN or path.suffix.lower() in UNKNOWN:
        raise UsageError(f"{path} is of a format prepare does not read ({path.suffix}); give text, JSON Lines, "
                         "Parquet or CSV (.gz allowed), or --format")
    return SUFFIXES.get(suffix, "text")


# What a folder's walk passes over, as the manifest and the banner name them.
LINK_OUT, LOOP, BROKEN, SPECIAL = "links out of the folder", "links looping back", "broken links", "special files"
# And the files of a folder that are not read: of a suffix no reader here understands (UNKNOWN), or of another
# kind than the one read (text files beside records, or files that --format does not name).
UNREAD, OTHER = "files of a format prepare does not read", "files of another format"
KIND_NAMES = {"jsonl": "JSON Lines", "csv": "CSV", "parquet": "Parquet"}


def _files(folder: Path, follow_links: bool = False) -> tuple[list[Path], dict[str, list[Path]]]:
    """The folder's regular files, recursively and in sorted order, hidden ones (and hidden folders) left
    out; and what was passed over. A link is followed when it points inside the folder (or anywhere, with
    `follow_links`), never when it leads back into a folder the walk is in (a loop, which would never end);
    a FIFO, socket or device is not read (it would block or never end), nor is a broken link."""
    root = folder.resolve()
    found: list[Path] = []
    skipped: dict[str, list[Path]] = {LINK_OUT: [], LOOP: [], BROKEN: [], SPECIAL: []}

    def walk(d: Path, inside: tuple[Path, ...]) -> None:
        for entry in os.scandir(d):
            p = Path(entry.path)
            if entry.name.startswith("."):
                continue
            real = p
            if entry.is_symlink():
                try:
                    real = p.resolve(strict=True)
                except (OSError, RuntimeError):  # a dangling link, or one that loops on itself
                    skipped[BROKEN].append(p)
                    continue
                if not follow_links and not real.is_relative_to(root):
                    skipped[LINK_OUT].append(p)
                    continue
            if real.is_dir():
                if real.resolve() in inside:
                    skipped[LOOP].append(p)
                else:
                    walk(p, inside + (real.resolve(),))
            elif real.is_file():
                found.append(p)
            else:
                skipped[SPECIAL].append(p)

    walk(folder, (root,))
    order = lambda p: p.relative_to(folder).as_posix()  # noqa: E731
    return sorted(found, key=order), {k: sorted(v, key=order) for k, v in skipped.items() if v}


def _kind(path: Path) -> str:
    """How a folder's file is read when --format is auto: a kind of records, text, or "unread" (UNKNOWN)."""
    if _suffix(path) in UNKNOWN or path.suffix.lower() in UNKNOWN:
        return "unread"
    return SUFFIXES.get(_suffix(path), "text")


def _folder(folder: Path, fmt: str, files: list[Path]) -> tuple[str, list[Path], dict[str, list[Path]]]:
    """(format, files, what is left out) of a folder: its files of one kind of records if it holds any (beside
    them, a text file such as a dataset card's README.md is no document), else every file as a text document;
    with --format, the files of that kind (text: every file). Files of a suffix no reader understands are left
    out, and so are those of another kind: both are counted, in the banner and the manifest."""
    if fmt == "text":
        return "text", files, {}
    kinds = [_kind(p) for p in files]
    records = sorted(set(kinds) - {"unread", "text"})
    if fmt == "auto" and len(records) > 1:
        raise _mixed(folder, {k: next(p for p, kind in zip(files, kinds) if kind == k) for k in records})
    if fmt == "auto":
        fmt = records[0] if records else "text"
    left_out = {UNREAD: [p for p, kind in zip(files, kinds) if kind == "unread"],
                OTHER: [p for p, kind in zip(files, kinds) if kind not in (fmt, "unread")]}
    return fmt, [p for p, kind in zip(files, kinds) if kind == fmt], {k: v for k, v in left_out.items() if v}


def _mixed(folder: Path, first: dict[str, Path]) -> UsageError:
    """A folder holding records of several kinds, each named by its first file, and how to prepare them."""
    each = [f"{KIND_NAMES[k]} files ({p.relative_to(folder).as_posix()})" for k, p in first.items()]
    return UsageError(f"{folder} holds {', '.join(each[:-1])} and {each[-1]}, which prepare reads differently; "
                      "prepare each kind from a folder of its own, or read one kind alone with "
                      + " or ".join(f"--format {k}" for k in first))


def open_source(spec: SourceSpec) -> Source:
    """The source spec names, opened and checked enough to say what it is; a one-line error otherwise."""
    if spec.format not in FORMATS:
        raise UsageError(f"unknown format {spec.format!r}; use one of {', '.join(FORMATS)}")
    path = Path(spec.source).expanduser()
    if spec.format == "hf" or (spec.format == "auto" and not path.exists() and _looks_like_name(spec.source)):
        return _hub(spec)
    if not path.exists():
        raise UsageError(f"source {spec.source} does not exist")
    skipped: dict[str, list[Path]] = {}
    if path.is_dir():
        found, skipped = _files(path, spec.follow_links)
        fmt, files, left_out = _folder(path, spec.format, found)
        skipped.update(left_out)
    elif not path.is_file():  # a FIFO or a device would block or never end
        raise UsageError(f"source {path} is not a regular file (a FIFO, socket or device)")
    else:
        fmt, files = (format_of(path) if spec.format == "auto" else spec.format), [path]
    if not files:
        unread = skipped.get(UNREAD, [])
        raise UsageError(f"source folder {path} holds no {'' if spec.format == 'auto' else spec.format + ' '}files"
                         + (f" prepare reads ({len(unread):,} of a format it does not read, such as "
                            f"{unread[0].relative_to(path).as_posix()})" if unread else ""))
    for f in files:
        if not os.access(f, os.R_OK):
            raise UsageError(f"cannot read {f}: permission denied")
        if fmt == "text":
            _check_text_start(f, path.is_dir())  # a picture among a folder's texts: refused before any work
    reader = {"text": _text_reader, "jsonl": _jsonl_reader, "csv": _csv_reader, "parquet": _parquet_reader}[fmt]
    total = _parquet_rows(files, spec.text_field) if fmt == "parquet" else len(files) if fmt == "text" else None
    description = {"kind": fmt, "path": os.fsdecode(path.resolve()), "files": len(files),
                   "fingerprint": _fingerprint(files, path)}
    if fmt != "text":
        description["text_field"] = spec.text_field
    if skipped:  # said in the banner, and kept in the manifest: a count, and the first few of each
        description["skipped"] = {what: {"count": len(paths), "first": [p.relative_to(path).as_posix()
                                                                         for p in paths[:3]]}
                                  for what, paths in skipped.items()}
    if spec.follow_links:
        description["follow_links"] = True
    return Source(description, total, reader(files, spec.text_field))


def _looks_like_name(text: str) -> bool:
    """A Hugging Face dataset id (`name` or `owner/name`), not a path that is simply missing."""
    return (not text.startswith((".", "/", "~")) and text.count("/") <= 1 and "\\" not in text
            and Path(text).suffix.lower() not in SUFFIXES and Path(text).suffix.lower() not in (".txt", ".gz"))


def _fingerprint(files: list[Path], root: Path) -> str:
    """What a resumed prepare compares to know the source did not change: names, sizes, modification times."""
    h = hashlib.sha256()
    base = root if root.is_dir() else root.parent
    for f in files:
        st = f.stat()
        h.update(json.dumps([f.relative_to(base).as_posix(), st.st_size, st.st_mtime_ns]).encode())
    return h.hexdigest()


# --- text files ----------------------------------------------------------------------------------


def _open(path: Path):
    """A file for reading as bytes, through gzip when it is compressed."""
    try:
        return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None


def _check_text_start(path: Path, in_folder: bool) -> None:
    """A UsageError when the file's first bytes are not UTF-8 text (a NUL, or bytes no UTF-8 holds)."""
    with _open(path) as f:
        try:
            head = f.read(SNIFF_BYTES)
        except (OSError, EOFError) as e:
            raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head)  # not final: a character cut at the end is fine
    except UnicodeError:
        text = "\0"
    if "\0" in text:
        raise BadDocument(f"{path} is not UTF-8 text" + ("; a folder's files are read as text documents: move it "
                                                         "out, or give the text files alone" if in_folder else ""))


def _quoted(names, limit: int = 80) -> str:
    """Field names as an error message shows them: comma-separated, cut to `limit` characters (a CSV read
    with the wrong --format has a whole record as its one column name)."""
    text = ", ".join(str(n) for n in names) or "none"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _text_reader(files: list[Path], _field: str) -> Callable:
    def read(start: dict | None, mark) -> Iterator[Piece]:
        first, offset = (start["file"], start["byte"]) if start else (0, 0)
        for i in range(first, len(files)):
            yield from _text_pieces(files[i], i, offset if i == first else 0, mark)
    return read


def _text_pieces(path: Path, i: int, offset: int, mark) -> Iterator[Piece]:
    """One file's text from a byte offset (0, or just after a safe cut) in pieces cut where safe_cut allows."""
    from gpt2ladder.data.tokenizer import safe_cut  # here: the CLI reads FORMATS for --help, without numpy

    decoder, carry, at, new = codecs.getincrementaldecoder("utf-8")(), "", offset, offset == 0
    with _open(path) as f:
        f.seek(offset)
        while True:
            try:
                data = f.read(READ_BYTES)
                text = carry + decoder.decode(data, final=not data)
            except OSError as e:
                raise UsageError(f"{path} is not readable: {e.strerror or e}") from None
            except (UnicodeError, EOFError):
                raise BadDocument(f"{path} is not UTF-8 text") from None
            if "\0" in text:  # valid UTF-8 can still be binary; text has no NUL
                raise BadDocument(f"{path} is not UTF-8 text")
            cut = len(text) if not data else safe_cut(text) or (len(text) if len(text) > MAX_CARRY else 0)
            if cut or (new and not data):  # an empty file is an empty document
                piece, carry = text[:cut], text[cut:]
                at += len(piece.encode("utf-8"))
                mark({"file": i + (not data), "byte": 0 if not data else at})
                yield piece, new
                new = False
            else:
                carry = text
            if not data:
                return


# --- records: JSON Lines, CSV, Parquet ------------------------------------------------------------


def _text_of(record, field: str, where: str) -> str:
    if not isinstance(record, dict):
        raise BadDocument(f"{where} is not a JSON object; JSON Lines hold one object per line")
    if field not in record:
        keys = _quoted(list(record)[:8])
        raise BadDocument(f"{where} has no field {field!r} (its fields: {keys}); name the text's with --text-field")
    value = record[field]
    if not isinstance(value, str):
        raise BadDocument(f"{where}: field {field!r} is {type(value).__name__}, not text")
    return value


def _jsonl_reader(files: list[Path], field: str) -> Callable:
    def read(start: dict | None, mark) -> Iterator[Piece]:
        first = start["file"] if start else 0
        for i in range(first, len(files)):
            byte, line = (start["byte"], start["line"]) if start and i == first else (0, 0)
            with _open(files[i]) as f:
                f.seek(byte)
                for raw in _lines(f, files[i]):
                    byte, line = byte + len(raw), line + 1
                    if not raw.strip():
                        continue
                    where = f"{files[i]} line {line}"
                    try:
                        record = json.loads(raw)
                    except ValueError:
                        raise BadDocument(f"{where} is not valid JSON (JSON Lines hold one object per line)") from None
                    text = _text_of(record, field, where)
                    mark({"file": i, "byte": byte, "line": line})
                    yield text, True
            mark({"file": i + 1, "byte": 0, "line": 0})
    return read


def _lines(f, path: Path) -> Iterator[bytes]:
    try:
        yield from f
    except (OSError, EOFError) as e:  # a damaged .gz, a disk error
        raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _csv_reader(files: list[Path], field: str) -> Callable:
    def read(start: dict | None, mark) -> Iterator[Piece]:
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a document is longer than csv's 128 KiB default
        first = start["file"] if start else 0
        for i in range(first, len(files)):
            skip = start["row"] if start and i == first else 0
            # newline="": csv splits records itself, so a quoted newline stays inside its field
            with _open(files[i]) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
                rows = csv.DictReader(f)
                try:
                    for row_number, row in enumerate(rows, 1):
                        if row_number == 1 and field not in row:
                            raise BadDocument(f"{files[i]} has no column {field!r} (its columns: "
                                             f"{_quoted(rows.fieldnames or [])}); name it with --text-field")
                        if row_number <= skip:
                            continue
                        mark({"file": i, "row": row_number})
                        yield row[field] or "", True
                except (UnicodeError, csv.Error) as e:
                    raise BadDocument(f"{files[i]} is not a readable UTF-8 CSV file: {e}") from None
            mark({"file": i + 1, "row": 0})
    return read


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise LadderError(f"reading Parquet needs pyarrow: {EXTRA}") from None
    return pq


def _parquet_file(path: Path, field: str):
    pq = _pyarrow()
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's ArrowInvalid and friends: not a Parquet file, or damaged
        raise BadDocument(f"{path} is not a readable Parquet file: {' '.join(str(e).split())[:200]}") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise BadDocument(f"{path} has no column {field!r} (its columns: {', '.join(names[:8])}); name it with "
                         "--text-field")
    return pf


def _parquet_rows(files: list[Path], field: str) -> int:
    return sum(_parquet_file(f, field).metadata.num_rows for f in files)


def _parquet_reader(files: list[Path], field: str) -> Callable:
    def read(start: dict | None, mark) -> Iterator[Piece]:
        first = start["file"] if start else 0
        for i in range(first, len(files)):
            row = start["row"] if start and i == first else 0
            pf = _parquet_file(files[i], field)
            for text in _parquet_texts(pf, field, row, files[i]):
                row += 1
                mark({"file": i, "row": row})
                yield text, True
            mark({"file": i + 1, "row": 0})
    return read


def _parquet_texts(pf, field: str, skip: int, path: Path) -> Iterator[str]:
    """The column's values from row `skip` on; whole row groups before it are not read at all."""
    first, seen, n_groups = 0, 0, pf.metadata.num_row_groups
    while first < n_groups and seen + pf.metadata.row_group(first).num_rows <= skip:
        seen += pf.metadata.row_group(first).num_rows
        first += 1
    if first == n_groups:
        return
    for batch in pf.iter_batches(batch_size=1024, columns=[field], row_groups=list(range(first, n_groups))):
        values = batch.column(0).to_pylist()
        start, seen = max(0, skip - seen), seen + len(values)
        for value in values[start:]:
            if not isinstance(value, str):
                raise BadDocument(f"{path}: column {field!r} holds {type(value).__name__}, not text")
            yield value


# --- a Hugging Face dataset -------------------------------------------------------------------------


def offline() -> str | None:
    """The variable that puts the Hugging Face libraries offline, when one does (datasets' rule:
    HF_DATASETS_OFFLINE when set, else HF_HUB_OFFLINE)."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(name) is not None:
            return name if os.environ[name].upper() in TRUE else None
    return None


def _hub(spec: SourceSpec) -> Source:
    local = Path(spec.source).expanduser().exists()
    variable = None if local else offline()
    if variable:
        raise DataUnavailable(f"{spec.source} is no file or folder here, and {variable} is set, so the Hugging "
                              "Face dataset of that name cannot be streamed; unset it, or give a local path")
    try:
        import datasets
    except ImportError:
        raise LadderError(f"reading a Hugging Face dataset needs the datasets package: {EXTRA}") from None
    ds = _load(datasets, spec)
    features = getattr(ds, "features", None)
    if features is not None and spec.text_field not in features:
        raise UsageError(f"{spec.source} has no column {spec.text_field!r} (its columns: "
                         f"{', '.join(list(features)[:8])}); name it with --text-field")
    splits = getattr(getattr(ds, "info", None), "splits", None) or {}
    total = getattr(splits.get(spec.split), "num_examples", None) if hasattr(splits, "get") else None
    description = {"kind": "hf", "name": spec.source, "subset": spec.subset, "split": spec.split,
                   "text_field": spec.text_field}
    return Source(description, total or None, _hub_reader(datasets, spec))


def _load(datasets, spec: SourceSpec):
    """`load_dataset(..., streaming=True)`: nothing is downloaded before the first document is read."""
    try:
        return datasets.load_dataset(spec.source, name=spec.subset, split=spec.split, streaming=True)
    except Exception as e:  # the library's many failures (no network, no such dataset or subset) as one line
        here = "" if Path(spec.source).expanduser().exists() else f"{spec.source} is no file or folder here, and "
        raise DataUnavailable(f"{here}cannot stream the Hugging Face dataset {spec.source}"
                              f"{' (' + spec.subset + ')' if spec.subset else ''}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


def _hub_reader(datasets, spec: SourceSpec) -> Callable:
    def read(start: dict | None, mark) -> Iterator[Piece]:
        ds = _load(datasets, spec)
        if start and start.get("state") is not None:
            ds.load_state_dict(start["state"])
        n = start["doc"] if start else 0
        examples = iter(ds)
        while True:
            try:
                example = next(examples)
            except StopIteration:
                return
            except Exception as e:  # a network failure mid-stream: the finished shards stay, a rerun continues
                raise DataUnavailable(f"streaming {spec.source} failed at document {n:,}: {_first_line(e)}") from e
            text = _text_of(example, spec.text_field, f"document {n:,} of {spec.source}")
            n += 1
            mark(lambda n=n: {"doc": n, "state": ds.state_dict()})
            yield text, True
    return read
