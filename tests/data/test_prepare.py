"""`prepare`'s pipeline: the token stream of llm.c's FineWeb script (each document after <|endoftext|>,
in source order) cut into a validation shard and training shards; the same bytes on any number of
workers; resumable after an interruption, a kill or a full disk, with nothing half-written left behind."""

import errno
import itertools
import json
import os

import numpy as np
import pytest

from gpt2ladder.data import load_tokens, manifest
from gpt2ladder.data import prepare as P
from gpt2ladder.data import shards as fmt
from gpt2ladder.data.sources import SourceSpec, open_source
from gpt2ladder.data.tokenizer import encode_text, tokenizer_id
from gpt2ladder.errors import LadderError, UsageError


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(P, "BATCH_CHARS", 2000)  # many batches from a small source, as a large one makes


@pytest.fixture(scope="module")
def docs(shakespeare_cache):
    text = (shakespeare_cache / "tinyshakespeare" / "input.txt").read_text()[:40_000]
    return text.split("\n\n")  # ~380 speeches


@pytest.fixture
def source_file(tmp_path, docs):
    path = tmp_path / "plays.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def reference(docs) -> np.ndarray:
    return np.array([t for d in docs for t in [50256, *encode_text(d)]], dtype=np.uint16)


def config(source_file, out, **kw) -> P.PrepareConfig:
    return P.PrepareConfig(SourceSpec(str(source_file)), out, "plays",
                           **{"val_tokens": 400, "shard_tokens": 2500, **kw})


def prepare(cfg, progress=None) -> dict:
    source = open_source(cfg.spec)
    return P.run(cfg, source, P.plan(cfg, source, notify=lambda *_: None), progress)


def stream(out, m) -> np.ndarray:
    return np.concatenate([fmt.open_shard(out / s["name"], fmt.LLMC).tokens() for s in m["shards"]])


def test_the_stream_is_every_document_after_endoftext_in_source_order(tmp_path, source_file, docs):
    out = tmp_path / "out"
    m = prepare(config(source_file, out))
    ref = reference(docs)
    assert (stream(out, m) == ref).all() and m["n_tokens"] == len(ref) and m["documents"] == len(docs)
    sizes = [s["n_tokens"] for s in m["shards"]]
    assert sizes[0] == 400 and all(n == 2500 for n in sizes[1:-1]) and 0 < sizes[-1] <= 2500
    names = [s["name"] for s in m["shards"]]
    assert names[:3] == ["plays_val_000000.bin", "plays_train_000001.bin", "plays_train_000002.bin"]
    assert all(s["sha256"] == fmt.file_sha256(out / s["name"]) for s in m["shards"])
    assert m["tokenizer"] == tokenizer_id() and m["settings"] == {"val_tokens": 400, "shard_tokens": 2500}
    assert sorted(p.name for p in out.iterdir()) == sorted(names + ["manifest.json"])  # nothing else left
    assert manifest.read(out / "manifest.json") == m
    td = load_tokens(out, notify=lambda *_: None)  # --data takes it as it is
    assert (len(td.val), len(td.train)) == (400, len(ref) - 400)


def test_a_small_source_gives_its_first_tenth_to_validation(tmp_path, source_file, docs):
    m = prepare(config(source_file, tmp_path / "out", val_tokens=10**7, shard_tokens=10**8))
    n = len(reference(docs))
    assert [s["n_tokens"] for s in m["shards"]] == [n // 10, n - n // 10]


def test_two_workers_give_the_same_tokens_in_order_with_few_batches_in_flight(source_file, docs):
    source = open_source(SourceSpec(str(source_file)))
    pulled = [0]

    def counted():
        for item in P._batches(source.pieces(), 0):
            pulled[0] += 1
            yield item

    parts = []
    for _, tokens in P.tokenized(counted(), workers=2):
        parts.append(tokens)
        assert pulled[0] - len(parts) < P.IN_FLIGHT * 2  # read from the source but not yet written
    assert len(parts) > 10 and (np.concatenate(parts) == reference(docs)).all()


def _interrupt_after(batches: int):
    seen = itertools.count(1)

    def progress(*_):
        if next(seen) == batches:
            raise KeyboardInterrupt

    return progress


@pytest.mark.parametrize("batches", [2, 9, 14])  # in the spool (no shard yet), just after it, later on
def test_an_interrupted_run_continues_after_its_finished_shards(tmp_path, source_file, batches):
    straight = prepare(config(source_file, tmp_path / "straight"))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare(config(source_file, out), _interrupt_after(batches))
    assert not (out / "manifest.json").exists()
    left = sorted(p.name for p in out.iterdir())
    partial = manifest.read(out / "manifest.partial.json")["shards"] if "manifest.partial.json" in left else []
    assert left == sorted([s["name"] for s in partial] + (["manifest.partial.json"] if partial else []))
    stamps = {s["name"]: (out / s["name"]).stat().st_mtime_ns for s in partial}
    assert prepare(config(source_file, out)) == straight
    assert all((out / n).stat().st_mtime_ns == t for n, t in stamps.items())  # kept, not written again
    assert (batches > 2) == bool(partial)


def test_a_damaged_or_stray_shard_of_a_killed_run_is_made_again(tmp_path, source_file):
    straight = prepare(config(source_file, tmp_path / "straight"))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare(config(source_file, out), _interrupt_after(14))
    kept = manifest.read(out / "manifest.partial.json")["shards"]
    assert len(kept) >= 3
    damaged = out / kept[2]["name"]
    damaged.write_bytes(damaged.read_bytes()[:-2] + b"\x00\x01")
    (out / "plays_train_000042.bin").write_bytes(b"a stray shard")  # what a SIGKILL can leave
    (out / ".plays_train_000007.bin.x1y2.part").write_bytes(bytes(100))
    notes = []
    source = open_source(config(source_file, out).spec)
    planned = P.plan(config(source_file, out), source, notify=notes.append)
    assert len(planned.kept) == 2 and "making it again" in notes[0]
    assert P.run(config(source_file, out), source, planned) == straight
    assert sorted(p.name for p in out.iterdir()) == sorted([s["name"] for s in straight["shards"]] + ["manifest.json"])


def test_a_full_disk_is_one_line_and_keeps_the_finished_shards(tmp_path, source_file, monkeypatch):
    straight = prepare(config(source_file, tmp_path / "straight"))
    out = tmp_path / "out"
    real_write = fmt.ShardWriter.write

    def write(self, tokens):
        if self.path.name == "plays_train_000003.bin" and self.n_tokens > 1000:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, tokens)

    monkeypatch.setattr(fmt.ShardWriter, "write", write)
    with pytest.raises(LadderError, match="the disk holding it is full; the 3 finished shards and "
                                          "manifest.partial.json are kept") as err:
        prepare(config(source_file, out))
    assert "\n" not in str(err.value)
    kept = manifest.read(out / "manifest.partial.json")["shards"]
    assert [s["sha256"] for s in kept] == [s["sha256"] for s in straight["shards"][:3]]
    assert sorted(p.name for p in out.iterdir()) == sorted([s["name"] for s in kept] + ["manifest.partial.json"])
    monkeypatch.setattr(fmt.ShardWriter, "write", real_write)  # space freed
    assert prepare(config(source_file, out)) == straight


def test_out_holding_something_else_is_one_line(tmp_path, source_file):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="is not empty and holds no gpt2ladder prepare"):
        prepare(config(source_file, tmp_path / "full"))
    done = tmp_path / "done"
    first = prepare(config(source_file, done))
    assert prepare(config(source_file, done)) == first  # finished: nothing to do
    with pytest.raises(UsageError, match="already holds a corpus prepared from another source or with other"):
        prepare(config(source_file, done, shard_tokens=3000))


def test_names_and_sizes():
    assert P.default_name("HuggingFaceFW/fineweb-edu") == "fineweb-edu"
    assert P.default_name("data/input.txt") == "input" and P.default_name("my texts/") == "my-texts"
    assert P.default_name("data/train.jsonl") == "train-corpus" and P.default_name("my_val_set") == "my-val-set"
    for bad in ("fine_val_web", "train", "a/b", ".hidden", ""):
        with pytest.raises(UsageError, match="--name"):
            P.check_name(bad)
    with pytest.raises(UsageError, match="--shard-tokens must be from 1 to 2,147,483,647"):
        P.PrepareConfig(SourceSpec("x"), "out", "x", shard_tokens=2**31)
    assert os.path.basename(fmt.shard_name("edu", "val", 0)) == "edu_val_000000.bin"


def test_what_a_killed_shard_writer_leaves_is_removed_by_the_next_run(tmp_path, source_file):
    """kill -9 while a shard is written leaves the writer's temporary (`data/files.py`'s name beside the
    shard, up to --shard-tokens x 2 bytes of zeros and tokens); the next run removes it with the rest."""
    straight = prepare(config(source_file, tmp_path / "straight"))
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare(config(source_file, out), _interrupt_after(14))
    killed = fmt.ShardWriter(out / "plays_train_000007.bin")  # open, never closed nor aborted: as if killed
    killed.write(np.arange(10, dtype=np.uint16))
    killed._f.flush()
    (left,) = [p for p in out.iterdir() if p.name.startswith(".")]
    assert prepare(config(source_file, out)) == straight
    assert not left.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([s["name"] for s in straight["shards"]] + ["manifest.json"])


def test_the_spool_is_a_new_file_of_its_own_never_written_through_a_link(tmp_path):
    """A link planted at the spool's name (or a killed run's spool) is replaced, and the file it points to
    is left as it was."""
    outside = tmp_path / "someone-elses.txt"
    outside.write_text("keep me\n")
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / ".spool.part").symlink_to(outside)
    spool = P._Spool(folder)
    spool.write(np.arange(5, dtype=fmt.TOKEN))
    assert [int(t) for block in spool.blocks(0, 5) for t in block] == [0, 1, 2, 3, 4]
    assert not spool.path.is_symlink() and outside.read_text() == "keep me\n"
    spool.remove()
    assert not spool.path.exists() and outside.read_text() == "keep me\n"


def test_a_ctrl_c_between_making_a_temporary_and_renaming_it_leaves_nothing_behind(tmp_path):
    """What `prepare` removes when interrupted: temporaries of its shards and manifests, nothing else."""
    cfg = P.PrepareConfig(SourceSpec("x"), tmp_path, "plays")
    names = [".manifest.partial.json.0123456789ab.tmp.json", ".manifest.json.0123456789ab.tmp.json",
             ".plays_train_000001.bin.0123456789ab.tmp.bin", ".spool.1.part", "notes.txt", ".lock",
             ".other.json.0123456789ab.tmp.json"]
    for name in names:
        (tmp_path / name).write_text("x")
    P.drop_temporaries(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", ".other.json.0123456789ab.tmp.json", "notes.txt"]


def _written_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar")).split()[1])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="counts written bytes in Linux's /proc")
def test_the_partial_manifest_costs_the_same_for_every_shard(tmp_path, source_file):
    """Recording a finished shard appends its line: a run of N shards writes O(N) bytes of manifest, not the
    O(N**2) of rewriting every record after every shard."""
    out = tmp_path / "out"
    cfg = config(source_file, out, val_tokens=40, shard_tokens=25)
    source = open_source(cfg.spec)
    planned = P.plan(cfg, source, notify=lambda *_: None)
    before = _written_bytes()
    m = P.run(cfg, source, planned)
    written = _written_bytes() - before
    shards = len(m["shards"])
    tokens = sum(s["n_tokens"] for s in m["shards"])
    manifest_bytes = (out / "manifest.json").stat().st_size
    assert shards > 300
    # the shards (a header of zeros, then the real one, and the tokens), the spool's copy of the tokens, and a
    # few manifests' worth of records (rewriting every record after every shard: about shards / 2 manifests)
    assert written < 2 * shards * fmt.HEADER_BYTES + 3 * 2 * tokens + 4 * manifest_bytes, (written, manifest_bytes)


def test_a_partial_manifest_line_cut_short_is_not_a_record(tmp_path):
    path = tmp_path / manifest.PARTIAL
    base = {"format": manifest.FORMAT, "version": manifest.VERSION, "name": "c"}
    entry = {"name": "c_val_000000.bin", "split": "val", "n_tokens": 3, "sha256": "0" * 64}
    manifest.start_partial(path, base, [entry])
    manifest.append_partial(path, {**entry, "name": "c_train_000001.bin", "split": "train"})
    assert [s["name"] for s in manifest.read(path)["shards"]] == ["c_val_000000.bin", "c_train_000001.bin"]
    with open(path, "a") as f:
        f.write('{"name": "c_train_000002.bin", "n_tok')  # killed while appending
    assert [s["name"] for s in manifest.read(path)["shards"]] == ["c_val_000000.bin", "c_train_000001.bin"]


def test_a_long_document_is_tokenized_in_bounded_pieces_with_the_ids_of_the_whole(shakespeare_cache, monkeypatch):
    """One line of 3 MB (a JSON Lines record as long as a book, a text with no newline): the BPE never sees
    more than PIECE_CHARS of it at once, so its working memory stays flat, and the ids are the whole
    line's. The cuts fall between a word and the space after it, where GPT-2's split cannot merge."""
    from gpt2ladder.data import tokenizer

    words = (shakespeare_cache / "tinyshakespeare" / "input.txt").read_text().split()
    line = " ".join(words)[:3_000_000] + " <|endoftext|> 123,456.78 it's   spaced\tout"
    whole = tokenizer.encode_text_array(line)
    seen = []
    real = tokenizer.encode_text_array
    monkeypatch.setattr(tokenizer, "encode_text_array", lambda text: seen.append(len(text)) or real(text))
    ids = P.encode_pieces([(line, True)])
    assert max(seen) <= tokenizer.PIECE_CHARS and len(seen) >= len(line) // tokenizer.PIECE_CHARS
    assert ids[0] == 50256 and np.array_equal(ids[1:], whole)
    small = list(tokenizer.bounded_pieces(line[:200_000], 5_000))  # many seams, each between word and space
    assert "".join(small) == line[:200_000] and max(map(len, small)) <= 5_000
    assert np.array_equal(np.concatenate([real(p) for p in small]), real(line[:200_000]))
    endless = "x" * 12_000  # no whitespace: cut at the limit
    assert [len(p) for p in tokenizer.bounded_pieces(endless, 5_000)] == [5_000, 5_000, 2_000]


def test_a_signal_inside_signals_held_is_acted_on_when_the_block_is_done():
    import signal

    from gpt2ladder.data.prepare import signals_held

    done = []
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interpreter starts, whatever the runner's
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals_held():
                signal.raise_signal(signal.SIGINT)  # to this thread, so its handler runs before the block ends
                done.append("the block went on")  # a worker's start is not cut short
    finally:
        signal.signal(signal.SIGINT, before)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert done == ["the block went on"]

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped

    previous = signal.signal(signal.SIGTERM, stop)  # as prepare's command turns SIGTERM into its stop
    try:
        with pytest.raises(Stopped):
            with signals_held():
                signal.raise_signal(signal.SIGTERM)
                done.append("again")
        assert signal.getsignal(signal.SIGTERM) is stop and done[-1] == "again"
    finally:
        signal.signal(signal.SIGTERM, previous)
