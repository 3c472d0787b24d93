"""Sources of documents for `prepare`: every reader gives the documents in order, restarts at any
position it handed out, and says in one line what is wrong with a source. The Hugging Face path runs
through `datasets` on a dataset these tests write, never the network."""

import gzip
import json
import sys

import pytest

from gpt2ladder.data import sources
from gpt2ladder.data.sources import DataUnavailable, SourceSpec, open_source
from gpt2ladder.data.tokenizer import encode_text
from gpt2ladder.errors import LadderError, UsageError

DOCS = ["First Citizen:\nBefore we proceed any further, hear me speak.\n", "", "All:\nSpeak, speak.\n\n\n",
        "Ünïcödé 😀 text <|endoftext|> inside", "   spaces   \n  \n"]


def documents(source, start=None) -> list[str]:
    """The documents of a cursor: pieces joined up to each start of a document."""
    out = []
    for text, starts in source.pieces(start):
        if starts:
            out.append("")
        out[-1] += text
    return out


def every_restart(source) -> None:
    """From every position a cursor handed out, the rest of the stream is exactly what followed it."""
    cursor = source.pieces()
    seen = [(cursor.position(), None)]
    for piece in cursor:
        seen.append((cursor.position(), piece))
    pieces = [p for _, p in seen[1:]]
    for i, (position, _) in enumerate(seen):
        rest = list(source.pieces(position))
        assert "".join(t for t, _ in rest) == "".join(t for t, _ in pieces[i:])
        assert [s for _, s in rest][:1] == [s for _, s in pieces[i:]][:1]  # a document's start stays one
        json.dumps(position)  # positions go into the partial manifest


def test_a_folder_of_texts_is_one_document_per_file_in_sorted_order(tmp_path):
    for i, doc in enumerate(DOCS):
        (tmp_path / "docs" / f"sub{i % 2}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "docs" / f"sub{i % 2}" / f"{i:02d}.txt").write_text(doc, encoding="utf-8")
    (tmp_path / "docs" / ".hidden.txt").write_text("left out")
    source = open_source(SourceSpec(str(tmp_path / "docs")))
    order = [0, 2, 4, 1, 3]  # sub0/00, sub0/02, sub0/04, sub1/01, sub1/03
    assert documents(source) == [DOCS[i] for i in order] and source.total_documents == 5
    every_restart(source)


def test_a_long_text_is_cut_only_where_its_tokens_stay_the_same(tmp_path, monkeypatch, shakespeare_cache):
    monkeypatch.setattr(sources, "READ_BYTES", 4096)
    text = (shakespeare_cache / "tinyshakespeare" / "input.txt").read_text()[:60_000]
    (tmp_path / "one.txt").write_text(text)
    source = open_source(SourceSpec(str(tmp_path / "one.txt")))
    pieces = list(source.pieces())
    assert len(pieces) > 10 and [s for _, s in pieces] == [True] + [False] * (len(pieces) - 1)
    assert [t for p, _ in pieces for t in encode_text(p)] == encode_text(text)
    every_restart(source)


def test_json_lines_plain_and_gzipped(tmp_path):
    lines = [json.dumps({"id": i, "content": d}) for i, d in enumerate(DOCS)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:3]) + "\n\n")  # a blank line is no document
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("\n".join(lines[3:]))  # no newline at the end
    source = open_source(SourceSpec(str(tmp_path), text_field="content"))
    assert source.description["kind"] == "jsonl" and documents(source) == DOCS
    every_restart(source)


def test_csv_with_quoted_newlines(tmp_path):
    import csv

    with open(tmp_path / "d.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows([i, d] for i, d in enumerate(DOCS))
    source = open_source(SourceSpec(str(tmp_path / "d.csv")))
    assert documents(source) == DOCS
    every_restart(source)


def _parquet(path, docs, row_group_size=2):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), path, row_group_size=row_group_size)


def test_parquet_across_row_groups_and_files(tmp_path):
    _parquet(tmp_path / "part-0.parquet", DOCS[:3])
    _parquet(tmp_path / "part-1.parquet", DOCS[3:])
    (tmp_path / "README.md").write_text("a dataset card is not data")
    source = open_source(SourceSpec(str(tmp_path)))
    assert source.total_documents == 5 and documents(source) == DOCS
    every_restart(source)


def test_a_hugging_face_dataset_streams_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    _parquet(tmp_path / "train-00000-of-00002.parquet", DOCS[:3])
    _parquet(tmp_path / "train-00001-of-00002.parquet", DOCS[3:])
    source = open_source(SourceSpec(str(tmp_path), format="hf"))  # a local folder, as load_dataset takes one
    assert source.description["kind"] == "hf" and documents(source) == DOCS
    cursor = source.pieces()
    next(cursor), next(cursor), next(cursor), next(cursor)
    position = cursor.position()  # the library's own state after the fourth document
    assert position["doc"] == 4 and position["state"] is not None
    assert documents(source, json.loads(json.dumps(position))) == DOCS[4:]


@pytest.mark.parametrize("variable, value", [("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "true")])
def test_a_dataset_name_offline_is_one_line_at_once(monkeypatch, variable, value):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv(variable, value)
    monkeypatch.setitem(sys.modules, "datasets", None)  # offline is decided before the library is imported
    with pytest.raises(DataUnavailable, match=f"{variable} is set, so the Hugging Face dataset"):
        open_source(SourceSpec("HuggingFaceFW/fineweb-edu", subset="sample-10BT"))


def test_without_datasets_a_dataset_name_says_what_to_install(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(LadderError, match=r"needs the datasets package: pip install 'gpt2ladder\[corpus\]'"):
        open_source(SourceSpec("HuggingFaceFW/fineweb-edu"))


@pytest.mark.parametrize("make, field, says", [
    (lambda d: (d / "x.jsonl").write_text('{"body": "a"}\n'), "text", "line 1 has no field 'text' .*body"),
    (lambda d: (d / "x.jsonl").write_text('{"text": "a"}\nnot json\n'), "text", "line 2 is not valid JSON"),
    (lambda d: (d / "x.jsonl").write_text('{"text": 3}\n'), "text", "field 'text' is int, not text"),
    (lambda d: (d / "x.jsonl").write_text(""), "text", "holds no documents"),
    (lambda d: (d / "x.csv").write_text("id,body\n1,a\n"), "text", "has no column 'text' .*id, body"),
    (lambda d: _parquet(d / "x.parquet", ["a"]), "body", "has no column 'body' .*text, n"),
    (lambda d: (d / "x.parquet").write_bytes(b"PAR1 not really"), "text", "is not a readable Parquet file"),
    (lambda d: (d / "x.jsonl.gz").write_bytes(b"not gzip at all"), "text", "cannot read"),
    (lambda d: (d / "x.txt").write_bytes(b"\xff\xfe binary"), "text", "is not UTF-8 text"),
    (lambda d: (d / "x.zst").write_bytes(b"(\xb5/\xfd"), "text", "of a format prepare does not read"),
    (lambda d: (d / "sub").mkdir(), "text", "holds no files"),
])
def test_a_bad_source_is_one_line(tmp_path, make, field, says):
    make(tmp_path)
    target = next(p for p in tmp_path.iterdir())
    with pytest.raises(UsageError, match=says) as err:
        source = open_source(SourceSpec(str(target), text_field=field))
        source.check()  # the first document, before any work
        documents(source)  # the others, as a run reads them
    assert "\n" not in str(err.value)


def test_a_missing_path_and_a_mixed_folder_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        open_source(SourceSpec(str(tmp_path / "nope.jsonl")))
    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "b.csv").write_text("text\nb\n")
    with pytest.raises(UsageError) as err:
        open_source(SourceSpec(str(tmp_path)))
    assert str(err.value) == (f"{tmp_path} holds CSV files (b.csv) and JSON Lines files (a.jsonl), which prepare "
                              "reads differently; prepare each kind from a folder of its own, or read one kind alone "
                              "with --format csv or --format jsonl")
    csv_only = open_source(SourceSpec(str(tmp_path), format="csv"))
    assert documents(csv_only) == ["b"]
    assert csv_only.description["skipped"] == {sources.OTHER: {"count": 1, "first": ["a.jsonl"]}}


def test_text_files_beside_records_are_left_out_and_counted(tmp_path):
    """A folder's records are its documents (a dataset card beside them is not one); the text files left out
    were dropped without a word, and are now counted as what the folder's walk passes over is."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("a text")
    (tmp_path / "sub" / "b.md").write_text("another text")
    (tmp_path / "d.jsonl").write_text('{"text": "a record"}\n')
    records = open_source(SourceSpec(str(tmp_path)))
    assert documents(records) == ["a record"] and records.description["kind"] == "jsonl"
    assert records.description["skipped"] == {sources.OTHER: {"count": 2, "first": ["a.txt", "sub/b.md"]}}
    assert sources.OTHER == "files of another format"
    texts = open_source(SourceSpec(str(tmp_path), format="text"))  # every file, read as text
    assert len(documents(texts)) == 3 and "skipped" not in texts.description


def test_files_of_a_suffix_no_reader_understands_are_counted(tmp_path):
    (tmp_path / "a.txt").write_text("a text")
    (tmp_path / "c.bin").write_bytes(b"\x7fELF\0\0")
    source = open_source(SourceSpec(str(tmp_path)))
    assert documents(source) == ["a text"] and source.description["files"] == 1
    assert source.description["skipped"] == {sources.UNREAD: {"count": 1, "first": ["c.bin"]}}
    assert sources.UNREAD == "files of a format prepare does not read"
    (tmp_path / "a.txt").unlink()
    with pytest.raises(UsageError) as err:
        open_source(SourceSpec(str(tmp_path)))
    assert str(err.value) == (f"source folder {tmp_path} holds no files prepare reads (1 of a format it does not "
                              "read, such as c.bin)")


def test_check_reads_the_first_documents_not_only_the_first(tmp_path, monkeypatch):
    """A bad record among the first documents is found before any work; one further on, while tokenizing."""
    (tmp_path / "x.jsonl").write_text('{"text": "hello"}\n{"text": 5}\n')
    with pytest.raises(UsageError, match="line 2: field 'text' is int, not text"):
        open_source(SourceSpec(str(tmp_path / "x.jsonl"))).check()
    monkeypatch.setattr(sources, "CHECK_DOCUMENTS", 1)
    open_source(SourceSpec(str(tmp_path / "x.jsonl"))).check()  # past the documents it reads: no error yet


def test_without_pyarrow_a_parquet_source_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(LadderError, match=r"reading Parquet needs pyarrow: pip install 'gpt2ladder\[corpus\]'"):
        open_source(SourceSpec(str(tmp_path / "x.parquet")))


def test_links_in_a_source_folder_are_followed_inside_it_only_and_the_rest_is_counted(tmp_path):
    import os

    folder, outside = tmp_path / "texts", tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    outside.mkdir()
    (folder / "a.txt").write_text("inside a")
    (folder / "sub" / "b.txt").write_text("inside b")
    (outside / "secret.txt").write_text("outside")
    (folder / "to_a.txt").symlink_to(folder / "a.txt")  # inside: followed
    (folder / "out.txt").symlink_to(outside / "secret.txt")  # out of the folder: skipped
    (folder / "sub" / "up").symlink_to(folder)  # a loop: skipped, the walk ends
    (folder / "gone.txt").symlink_to(tmp_path / "missing.txt")
    os.mkfifo(folder / "pipe")  # reading it would block
    source = open_source(SourceSpec(str(folder), "text"))
    assert documents(source) == ["inside a", "inside b", "inside a"]  # a.txt, sub/b.txt, to_a.txt
    skipped = source.description["skipped"]
    assert {k: v["count"] for k, v in skipped.items()} == {sources.LINK_OUT: 1, sources.LOOP: 1, sources.BROKEN: 1,
                                                          sources.SPECIAL: 1}
    assert skipped[sources.LINK_OUT]["first"] == ["out.txt"] and skipped[sources.LOOP]["first"] == ["sub/up"]
    followed = open_source(SourceSpec(str(folder), "text", follow_links=True))
    assert "outside" in documents(followed) and sources.LINK_OUT not in followed.description["skipped"]
