"""Corpora of shards as --data: found in every layout the projects we read write, checked once, read
as memory-mapped views that never copy the corpus."""

import os
from pathlib import Path

import numpy as np
import pytest

from gpt2ladder.data import Batches, load_tokens
from gpt2ladder.data import shards as fmt
from gpt2ladder.data.corpus import ShardedTokens
from gpt2ladder.errors import UsageError


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))


def _tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 50257, n, dtype=np.uint16)


def llmc_folder(folder: Path, sizes=(300, 500, 700, 200), name="fineweb") -> list[np.ndarray]:
    """llm.c's naming: the first shard is validation. Returns each shard's tokens, in name order."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = []
    for i, n in enumerate(sizes):
        arrays.append(_tokens(n, i))
        fmt.write_shard(folder / fmt.shard_name(name, "val" if i == 0 else "train", i), arrays[-1])
    return arrays


def test_sharded_tokens_index_like_their_concatenation(tmp_path):
    arrays = llmc_folder(tmp_path / "c")
    paths = sorted((tmp_path / "c").iterdir(), key=lambda p: p.stem[-6:])  # in the order they were written
    view = ShardedTokens([fmt.open_shard(p, fmt.LLMC) for p in paths])
    whole = np.concatenate(arrays)
    assert len(view) == len(whole)
    idx = np.random.default_rng(0).integers(0, len(whole), size=(7, 33))
    assert (view[idx] == whole[idx]).all() and view[idx].shape == (7, 33)
    assert (view[250:1450] == whole[250:1450]).all()  # a slice across three shards
    assert view[-1] == whole[-1] and view[299] == whole[299] and view[300] == whole[300]
    assert len(view[5:5]) == 0
    with pytest.raises(IndexError):
        view[np.array([len(whole)])]


def test_a_folder_of_llmc_shards(tmp_path):
    arrays = llmc_folder(tmp_path / "fineweb10B")
    (tmp_path / "fineweb10B" / "README.md").write_text("not a shard")
    td = load_tokens(tmp_path / "fineweb10B", notify=lambda *_: None)
    assert td.source == "fineweb10B" and td.n_tokens == sum(map(len, arrays))
    assert (td.val[0:len(td.val)] == arrays[0]).all()
    assert (td.train[0:len(td.train)] == np.concatenate(arrays[1:])).all()
    again = load_tokens(str(tmp_path / "fineweb10B" / "*.bin"), notify=lambda *_: None)  # the same shards by glob
    assert again.n_tokens == td.n_tokens


def test_hidden_files_in_a_folder_of_shards_are_not_shards(tmp_path):
    """macOS leaves ._NAME beside every file copied to a foreign disk, and a killed writer its hidden
    temporary: neither is a shard, as a glob (which skips hidden names) and `prepare` agree."""
    arrays = llmc_folder(tmp_path / "c")
    (tmp_path / "c" / "._fineweb_train_000001.bin").write_bytes(b"\x00\x05\x16\x07" + bytes(200))
    (tmp_path / "c" / ".fineweb_train_000004.bin.0123456789ab.tmp.bin").write_bytes(bytes(2048))
    td = load_tokens(tmp_path / "c", notify=lambda *_: None)
    assert td.n_tokens == sum(map(len, arrays))
    assert td.sha256 == load_tokens(str(tmp_path / "c" / "*.bin"), notify=lambda *_: None).sha256


def test_the_identity_of_foreign_shards_is_names_sizes_and_headers(tmp_path):
    llmc_folder(tmp_path / "a")
    first = load_tokens(tmp_path / "a", notify=lambda *_: None).sha256
    os.rename(tmp_path / "a", tmp_path / "b")  # moved: the same corpus
    assert load_tokens(tmp_path / "b", notify=lambda *_: None).sha256 == first
    fmt.write_shard(tmp_path / "b" / "fineweb_train_000003.bin", _tokens(201, 9))  # re-made with another size
    assert load_tokens(tmp_path / "b", notify=lambda *_: None).sha256 != first


def test_llmc_tiny_shakespeare_names_and_a_single_shard_file(tmp_path):
    fmt.write_shard(tmp_path / "tiny_shakespeare_val.bin", _tokens(100, 0))
    fmt.write_shard(tmp_path / "tiny_shakespeare_train.bin", _tokens(900, 1))
    td = load_tokens(tmp_path, notify=lambda *_: None)
    assert (len(td.train), len(td.val)) == (900, 100)
    one = load_tokens(tmp_path / "tiny_shakespeare_train.bin", notify=lambda *_: None)  # a shard file by itself
    assert (len(one.train), len(one.val)) == (900, 0)


def test_nanogpt_train_and_val_bin(tmp_path):
    train, val = _tokens(1000, 0), _tokens(100, 1)
    train.tofile(tmp_path / "train.bin")
    val.tofile(tmp_path / "val.bin")
    for spec in (tmp_path, tmp_path / "train.bin"):
        td = load_tokens(spec, notify=lambda *_: None)
        assert (td.train[0:1000] == train).all() and (td.val[0:100] == val).all()


def test_build_nanogpt_npy_shards(tmp_path):
    arrays = [_tokens(n, i) for i, n in enumerate((100, 400, 300))]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"edufineweb_{'val' if i == 0 else 'train'}_{i:06d}.npy", a)
    td = load_tokens(tmp_path, notify=lambda *_: None)
    assert (td.val[0:100] == arrays[0]).all() and (td.train[0:700] == np.concatenate(arrays[1:])).all()


@pytest.mark.parametrize("make, spec, says", [
    (lambda d: None, "{d}/*.bin", "matches no files"),
    (lambda d: (d / "x.bin").write_bytes(b"\1" * 2048), "{d}", "has magic number"),
    (lambda d: (fmt.write_shard(d / "a_train_000001.bin", np.zeros(3, np.uint16)),
                np.save(d / "b.npy", np.zeros(3, np.uint16))),
     "{d}", "holds both .bin and .npy"),
    (lambda d: fmt.write_shard(d / "a_train_000001.bin", np.array([1, 2, 60000], np.uint16)), "{d}",
     "holds token id 60000 at position 2, outside GPT-2's vocabulary"),
    (lambda d: (d / "manifest.partial.json").write_text("{}"), "{d}", "unfinished gpt2ladder prepare"),
    (lambda d: (fmt.write_shard(d / "a_train_000001.bin", np.zeros(3, np.uint16)),
                (d / "train.bin").write_bytes(bytes(64)), (d / "val.bin").write_bytes(bytes(64))), "{d}",
     r"holds both llm.c shards \(a_train_000001.bin\) and nanoGPT's train.bin/val.bin"),
])
def test_bad_shards_are_one_line(tmp_path, make, spec, says):
    make(tmp_path)
    with pytest.raises(UsageError, match=says) as err:
        load_tokens(spec.format(d=tmp_path), notify=lambda *_: None)
    assert "\n" not in str(err.value)


def _prepared(folder: Path) -> None:
    """A folder as `prepare` leaves it: shards and a manifest recording their sha256."""
    from gpt2ladder.data import manifest
    from gpt2ladder.data.tokenizer import tokenizer_id

    arrays = llmc_folder(folder, name="c")
    entries = [{"name": p.name, "split": "val" if i == 0 else "train", "n_tokens": len(a),
                "sha256": fmt.file_sha256(p)}
               for i, (p, a) in enumerate(zip(sorted(folder.iterdir(), key=lambda p: p.stem[-6:]), arrays))]
    manifest.write(folder / "manifest.json", {"format": manifest.FORMAT, "version": manifest.VERSION,
                                              "tokenizer": tokenizer_id(), "shards": entries})


def test_a_prepared_folder_is_checked_against_its_manifest_once(tmp_path, monkeypatch):
    _prepared(tmp_path / "c")
    said = []
    td = load_tokens(tmp_path / "c", notify=said.append)
    assert td.n_tokens == 1700 and len(said) == 1 and "once" in said[0]
    monkeypatch.setattr(fmt, "scan", lambda *a, **k: pytest.fail("scanned again"))
    assert load_tokens(tmp_path / "c", notify=said.append).sha256 == td.sha256 and len(said) == 1


@pytest.mark.parametrize("damage, says", [
    (lambda p: p.write_bytes(p.read_bytes()[:-2]), "truncated or damaged"),  # the header still counts 500
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"\x01"), "is not the one .*manifest.json records"),
    (lambda p: p.unlink(), "does not exist"),
])
def test_a_changed_shard_of_a_prepared_folder_is_one_line(tmp_path, damage, says):
    _prepared(tmp_path / "c")
    load_tokens(tmp_path / "c", notify=lambda *_: None)  # checked and remembered
    shard = tmp_path / "c" / "c_train_000001.bin"
    os.utime(shard, ns=(1, 1))  # a changed file is caught even where mtime did not move
    damage(shard)
    with pytest.raises(UsageError, match=says):
        load_tokens(tmp_path / "c", notify=lambda *_: None)


def test_batches_sample_a_corpus_as_they_sample_a_text(tmp_path):
    arrays = llmc_folder(tmp_path / "c")
    td = load_tokens(tmp_path / "c", notify=lambda *_: None)
    whole = np.concatenate(arrays[1:])
    x, y = Batches(td.train, 4, 16, seed=3).batch(2)
    xr, yr = Batches(whole, 4, 16, seed=3).batch(2)
    assert (x == xr).all() and (y == yr).all()


def _private_memory() -> int:
    """RssAnon: what a copy of the corpus would take (the page cache behind a mapping does not count)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("RssAnon")).split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from Linux's /proc")
def test_resident_memory_does_not_grow_with_the_corpus(tmp_path):
    from gpt2ladder.data import training_batches, validation_batches

    budget = 48 * 2**20
    folder = tmp_path / "big"
    folder.mkdir()
    for i, n in enumerate((2**24, 2**27, 2**27)):  # 544 MiB of shards, sparse on disk (holes read as token 0)
        with open(folder / fmt.shard_name("big", "val" if i == 0 else "train", i), "wb") as f:
            f.write(fmt.header(n))
            f.truncate(fmt.HEADER_BYTES + 2 * n)
    before = _private_memory()
    td = load_tokens(folder, notify=lambda *_: None)  # reads every token once, to check it
    batches = training_batches(td, 32, 256, seed=0)
    for _ in range(40):
        batches.next()
    validation_batches(td, 32, 256, 4)
    grew = _private_memory() - before
    assert 2 * td.n_tokens > 10 * budget and grew < budget, grew


def _rot(path: Path, tokens: np.ndarray, at: int = 0) -> None:
    """Write tokens over a shard's, from token `at`, in place: the same size, inode and modification time
    (bit rot, or a copy that kept the times), so only the content says it changed."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(fmt.HEADER_BYTES + 2 * at)
        f.write(tokens.astype(fmt.TOKEN).tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert [st.st_size, st.st_ino, st.st_mtime_ns] == [path.stat().st_size, path.stat().st_ino, path.stat().st_mtime_ns]


def test_a_prepared_shard_rewritten_in_place_under_the_same_stamp_is_refused(tmp_path):
    _prepared(tmp_path / "c")
    load_tokens(tmp_path / "c", notify=lambda *_: None)  # checked and remembered
    _rot(tmp_path / "c" / "c_train_000001.bin", _tokens(500, 42))
    with pytest.raises(UsageError, match="c_train_000001.bin is not the one .*manifest.json records") as err:
        load_tokens(tmp_path / "c", notify=lambda *_: None)
    assert "\n" not in str(err.value)


def test_foreign_shards_rewritten_in_place_are_checked_again_and_are_another_corpus(tmp_path):
    arrays = llmc_folder(tmp_path / "c")
    first = load_tokens(tmp_path / "c", notify=lambda *_: None).sha256
    for i, a in enumerate(arrays[1:], start=1):  # every token rewritten, all inside the vocabulary
        _rot(tmp_path / "c" / fmt.shard_name("fineweb", "train", i), _tokens(len(a), 100 + i))
    said = []
    assert load_tokens(tmp_path / "c", notify=said.append).sha256 != first  # so --resume refuses it
    assert said and "checking the tokens" in said[0]
    _rot(tmp_path / "c" / "fineweb_train_000002.bin", np.array([60000], np.uint16), at=123)
    with pytest.raises(UsageError, match="holds token id 60000 at position 123"):
        load_tokens(tmp_path / "c", notify=lambda *_: None)


def test_a_remembered_check_is_done_again_after_a_while(tmp_path, monkeypatch):
    import time

    from gpt2ladder.data import corpus

    _prepared(tmp_path / "c")
    load_tokens(tmp_path / "c", notify=lambda *_: None)
    scans = []
    real = fmt.scan
    monkeypatch.setattr(fmt, "scan", lambda *a, **k: scans.append(a[0].path.name) or real(*a, **k))
    load_tokens(tmp_path / "c", notify=lambda *_: None)
    assert scans == []
    later = time.time() + corpus.RECHECK_S + 1
    monkeypatch.setattr(corpus.time, "time", lambda: later)
    load_tokens(tmp_path / "c", notify=lambda *_: None)
    assert len(scans) == 4
