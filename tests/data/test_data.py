"""Tests for data/: tokenizer, Tiny Shakespeare fetch, token cache, batch sampler."""

import hashlib
import io
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt2ladder import data
from gpt2ladder.data import (
    Batches,
    DataUnavailable,
    cache,
    load_tokens,
    text,
    tokenizer,
)
from gpt2ladder.errors import LadderError, UsageError


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty cache folder of this test's own."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPT2LADDER_CACHE", str(cache))
    return cache


def _no_network(*args, **kwargs):
    raise urllib.error.URLError("network is off in tests")


@pytest.fixture(autouse=True)
def _forbid_downloads(monkeypatch):
    """Tests never reach the network; a test that wants a download patches urlopen itself."""
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)


# --- cache_dir ------------------------------------------------------------------------------------


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.cache_dir() == tmp_path / "a"
    monkeypatch.delenv("GPT2LADDER_CACHE")
    assert data.cache_dir() == tmp_path / "xdg" / "gpt2ladder"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.cache_dir() == tmp_path / "home" / ".cache" / "gpt2ladder"
    assert not (tmp_path / "home").exists()  # asking for the path creates nothing


# --- tokenizer ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "Hello world",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "naïve café — 日本語 🎭 Ünïcödé",
    "  leading spaces\t\ttabs\n\n\ntrailing   ",
    "",
])
def test_tokenizer_round_trips(text):
    enc = data.get_tokenizer()
    assert enc.decode(enc.encode_ordinary(text)) == text


def test_tokenizer_is_gpt2():
    enc = data.get_tokenizer()
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    assert data.get_tokenizer() is enc  # built once


def test_a_literal_endoftext_in_a_text_is_the_end_of_text_token():
    from gpt2ladder.data.tokenizer import encode_stream, encode_text, encode_text_array

    enc = data.get_tokenizer()
    text = "<|endoftext|>a<|endoftext|>b\nc <|endoftext|><|endoftext|>\n"
    ids = encode_text(text)
    assert ids.count(50256) == 4 and ids[0] == 50256
    assert enc.decode(ids) == text
    assert 50256 not in enc.encode_ordinary(text)  # what the text would be read as otherwise
    # the streamed (chunked) tokenizing that fills the token cache reads it the same way
    assert [i for part in encode_stream([text[:5], text[5:17], text[17:]]) for i in part] == ids
    # and so does prepare's, as an array
    assert encode_text_array(text).tolist() == ids


def test_tokenizer_hash_mismatch_is_ladder_error(monkeypatch):
    monkeypatch.setattr(tokenizer, "VOCAB_BPE_SHA256", "0" * 64)
    with pytest.raises(LadderError, match="wrong sha256"):
        data.get_tokenizer.__wrapped__()  # bypass the cache so the files are checked again


def test_tokenizer_missing_package_is_ladder_error():
    with pytest.raises(LadderError, match="install the no-such-tokenizer-pkg package"):
        tokenizer._bpe_files("no_such_tokenizer_pkg")


# --- Tiny Shakespeare -----------------------------------------------------------------------------


def test_real_tinyshakespeare_has_338025_tokens(shakespeare_cache):
    td = load_tokens(download=False)
    assert td.n_tokens == 338_025
    assert td.source == "tinyshakespeare"
    assert td.sha256 == text.TINY_SHAKESPEARE_SHA256
    assert len(td.train) == int(338_025 * 0.9) and len(td.train) + len(td.val) == td.n_tokens
    assert td.train.dtype == np.uint16 and not td.train.flags.writeable
    assert data.get_tokenizer().decode(td.train[:3].tolist()) == "First Citizen:"


def test_fetch_without_cache_or_download_says_how_to_supply(tmp_cache):
    with pytest.raises(DataUnavailable, match="--data") as err:
        data.fetch_tinyshakespeare(download=False)
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_cache / "tinyshakespeare" / "input.txt") in message


def test_fetch_failed_download_is_data_unavailable(tmp_cache):
    with pytest.raises(DataUnavailable, match="network is off in tests"):
        data.fetch_tinyshakespeare()


def test_fetch_corrupt_cache_redownloads_and_fails_cleanly(tmp_cache, monkeypatch):
    cached = tmp_cache / "tinyshakespeare" / "input.txt"
    cached.parent.mkdir(parents=True)
    cached.write_text("not shakespeare")
    calls = []

    def failing_download(url, dest, sha256):
        calls.append(url)
        raise OSError("connection refused")

    monkeypatch.setattr(text, "_download", failing_download)
    with pytest.raises(DataUnavailable, match="corrupt.*connection refused"):
        data.fetch_tinyshakespeare()
    assert calls == [text.TINY_SHAKESPEARE_URL]


def _fake_urlopen(payload: bytes, fail_midway: bool = False):
    class Response(io.BytesIO):
        def read(self, *args):
            if fail_midway:
                raise ConnectionResetError("connection reset")
            return super().read(*args)

    return lambda url, timeout: Response(payload)


def test_fetch_downloads_verifies_and_replaces_corrupt_cache(tmp_cache, monkeypatch):
    payload = b"Enter a fake Shakespeare.\n" * 10
    monkeypatch.setattr(text, "TINY_SHAKESPEARE_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(urllib.request, "urlopen", _fake_urlopen(payload))
    cached = tmp_cache / "tinyshakespeare" / "input.txt"
    cached.parent.mkdir(parents=True)
    cached.write_text("corrupt")
    assert data.fetch_tinyshakespeare() == cached
    assert cached.read_bytes() == payload
    assert sorted(p.name for p in cached.parent.iterdir()) == ["input.txt"]  # no temp file left


@pytest.mark.parametrize("payload, fail_midway, match", [
    (b"wrong bytes", False, "sha256"),
    (b"whatever", True, "connection reset"),
])
def test_fetch_bad_download_leaves_no_file(tmp_cache, monkeypatch, payload, fail_midway, match):
    monkeypatch.setattr(urllib.request, "urlopen", _fake_urlopen(payload, fail_midway))
    with pytest.raises(DataUnavailable, match=match):
        data.fetch_tinyshakespeare()
    folder = tmp_cache / "tinyshakespeare"
    assert not folder.exists() or list(folder.iterdir()) == []


# --- load_tokens ----------------------------------------------------------------------------------


def test_load_tokens_of_a_text_file(tmp_cache, tmp_path):
    text = "To be, or not to be, that is the question. " * 20
    path = tmp_path / "hamlet.txt"
    path.write_text(text, encoding="utf-8")
    td = load_tokens(path)
    ids = data.get_tokenizer().encode_ordinary(text)
    assert td.n_tokens == len(ids)
    assert np.concatenate([td.train, td.val]).tolist() == ids
    assert td.source == "hamlet.txt"
    assert td.sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_load_tokens_reuses_cache_and_rekeys_on_edit(tmp_cache, tmp_path, monkeypatch):
    path = tmp_path / "t.txt"
    path.write_text("Some words to tokenize once. " * 10)
    first = load_tokens(path)

    def no_tokenizer():
        raise AssertionError("tokenized again although the cache was valid")

    with monkeypatch.context() as mp:
        mp.setattr(tokenizer, "get_tokenizer", no_tokenizer)
        second = load_tokens(path)
    assert np.array_equal(first.train, second.train) and np.array_equal(first.val, second.val)

    path.write_text("Edited words. " * 10)
    edited = load_tokens(path)
    assert edited.sha256 != first.sha256
    files = sorted(p.name for p in (tmp_cache / "tokens").iterdir())
    assert files == sorted(f"{d}.{ext}" for d in (first.sha256, edited.sha256) for ext in ("bin", "json"))  # no temps


def _write(path, content):
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "missing.txt", "does not exist"),
    (lambda d: d, "holds no token shards .* run gpt2ladder prepare"),  # a folder is a corpus, or has to become one
    (lambda d: _write(d / "empty.txt", b""), "is empty"),
    (lambda d: _write(d / "model.bin", bytes(range(256)) * 4), "is not a UTF-8 text file"),
    (lambda d: _write(d / "zeros.bin", b"\0" * 64), "is not a UTF-8 text file"),
])
def test_load_tokens_bad_input_is_usage_error(tmp_cache, tmp_path, make, match):
    with pytest.raises(UsageError, match=match) as err:
        load_tokens(make(tmp_path))
    assert "\n" not in str(err.value)


def test_too_short_text_for_a_sequence_is_usage_error(tmp_cache, tmp_path):
    td = load_tokens(_write(tmp_path / "short.txt", b"Just a few words."))
    with pytest.raises(UsageError, match="too few for one sequence of 65.*--seq-len"):
        Batches(td.train, batch_size=2, seq_len=64)


def test_a_split_too_short_names_the_whole_text(tmp_cache, tmp_path):
    """Not "the text has 24 tokens" for a 240-token text whose validation split is 24 tokens."""
    td = load_tokens(_write(tmp_path / "t.txt", ("Words of a short text.\n" * 40).encode()))
    data.check_splits(td, seq_len=32, validate=False)  # the training split holds one sequence
    with pytest.raises(UsageError) as err:
        data.check_splits(td, seq_len=32, validate=True)
    assert (f"the text has {td.n_tokens} tokens, and its validation split (the last 10%) {len(td.val)}: too few for "
            "one sequence of 33") in str(err.value) and "--eval-every 0" in str(err.value)


# --- streaming: chunked tokenization, hashing, only regular files -----------------------------------


@pytest.mark.parametrize("whole", [
    "word\nnext",
    "it's\n\n  \nthey'll  go\n\tend",
    "a  \n  b\n\n\nc d  e\n",
    "naïve café\n— 日本語 🎭\nÜnï  cödé\n\n",
    "12,345\n678\n!!\n??",
])
def test_a_safe_cut_tokenizes_as_the_whole_text(whole):
    enc = data.get_tokenizer()
    for end in range(1, len(whole) + 1):  # every prefix's safe cut, wherever it falls
        cut = tokenizer.safe_cut(whole[:end])
        if cut:
            assert enc.encode_ordinary(whole[:cut]) + enc.encode_ordinary(whole[cut:]) == enc.encode_ordinary(whole)


def test_chunked_tokens_equal_the_whole_text_on_tiny_shakespeare(shakespeare_cache, tmp_path, monkeypatch):
    """Read 4 KiB at a time (about 270 seams), the ids are those of tokenizing the whole text at once."""
    whole = (shakespeare_cache / "tinyshakespeare" / "input.txt").read_text()
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(text, "READ_BYTES", 4096)
    (tmp_path / "cache" / "tinyshakespeare").mkdir(parents=True)
    (tmp_path / "cache" / "tinyshakespeare" / "input.txt").write_text(whole)
    td = load_tokens(download=False)
    assert np.concatenate([td.train, td.val]).tolist() == data.get_tokenizer().encode_ordinary(whole)
    assert td.n_tokens == 338_025


def test_a_text_without_a_safe_cut_is_still_tokenized_in_bounded_pieces():
    chunks = ["abcdefgh" * 4] * 10  # one 320-character word: no newline anywhere
    pieces = list(tokenizer.encode_stream(chunks, max_carry=100))
    assert len(pieces) > 2  # cut where it had to be, not carried to the end
    assert data.get_tokenizer().decode([i for p in pieces for i in p]) == "".join(chunks)


def test_the_text_is_hashed_and_read_as_a_stream(tmp_cache, tmp_path, monkeypatch):
    path = _write(tmp_path / "t.txt", ("Lines of text, read in blocks.\n" * 300).encode())
    monkeypatch.setattr(text, "READ_BYTES", 512)
    reads, real_open = [], text.open_text

    class Recorded(io.BufferedReader):
        def read(self, size=-1):
            reads.append(size)
            return super().read(size)

    monkeypatch.setattr(text, "open_text", lambda p: Recorded(real_open(p).detach()))
    td = load_tokens(path)
    assert td.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert td.n_tokens == len(data.get_tokenizer().encode_ordinary(path.read_text()))
    assert set(reads) == {512}  # never the whole file at once
    assert len(reads) >= 2 * (path.stat().st_size // 512)  # once to hash it, once to tokenize it


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_only_regular_files_are_read(tmp_cache, tmp_path, kind):
    """A FIFO as --data would block forever on open or read; a device (/dev/zero) would never end."""
    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        path = tmp_path / "pipe"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
        if not path.exists():
            pytest.skip("no /dev/zero here")
    with pytest.raises(UsageError, match="is not a regular file") as err:
        load_tokens(path)
    assert "\n" not in str(err.value)


def test_a_name_that_is_not_utf8_still_prints(tmp_cache, tmp_path):
    path = Path(os.fsdecode(bytes(tmp_path) + b"/bad\xffname.txt"))
    path.write_text("Some words to tokenize. " * 10)
    td = load_tokens(path)
    assert td.source == "bad\ufffdname.txt"
    td.source.encode("utf-8")  # no surrogate left to fail a print or a plot title


# --- the token cache ------------------------------------------------------------------------------


def _cached(tmp_cache, tmp_path):
    path = _write(tmp_path / "t.txt", ("Words to tokenize and cache, line after line.\n" * 50).encode())
    first = load_tokens(path)
    return path, first, tmp_cache / "tokens" / f"{first.sha256}.bin"


def _beyond_the_vocabulary(bin_path):
    """One id past the vocabulary, and the record rewritten to match: size and checksum both hold."""
    ids = np.fromfile(bin_path, dtype=np.uint16)
    ids[len(ids) // 2] = 60000
    ids.tofile(bin_path)
    record = json.loads(bin_path.with_suffix(".json").read_text())
    record["bin_sha256"] = hashlib.sha256(bin_path.read_bytes()).hexdigest()
    bin_path.with_suffix(".json").write_text(json.dumps(record))


def _ids(td):
    return np.concatenate([td.train, td.val]).tolist()


@pytest.mark.parametrize("damage, says", [
    (lambda b: b.write_bytes(b.read_bytes()[: len(b.read_bytes()) // 4 * 2]), "holds"),  # even size: half the tokens
    (lambda b: b.write_bytes(b.read_bytes()[:-1]), "holds"),  # odd size
    (lambda b: b.write_bytes(os.urandom(b.stat().st_size)), "checksum"),  # random bytes, the same size
    (lambda b: b.with_suffix(".json").unlink(), "no record"),  # a cache from before records
    (lambda b: b.with_suffix(".json").write_text("{not json"), "unreadable record"),
    (lambda b: b.unlink(), "is missing"),
    (lambda b: _beyond_the_vocabulary(b), "holds token id 60000, beyond GPT-2's vocabulary of 50257"),
])
def test_a_damaged_token_cache_is_rebuilt_with_a_notice(tmp_cache, tmp_path, damage, says):
    path, first, bin_path = _cached(tmp_cache, tmp_path)
    ids = _ids(first)  # read now: `first` maps the very bytes the damage rewrites
    damage(bin_path)
    notes = []
    again = load_tokens(path, notify=notes.append)
    assert _ids(again) == ids and again.n_tokens == len(ids)
    assert len(notes) == 1 and str(bin_path) in notes[0] and says in notes[0] and "\n" not in notes[0]
    assert load_tokens(path, notify=notes.append).n_tokens == first.n_tokens and len(notes) == 1  # valid again


def test_a_cache_of_another_tokenizer_is_rebuilt(tmp_cache, tmp_path, monkeypatch):
    path, first, bin_path = _cached(tmp_cache, tmp_path)
    record = json.loads(bin_path.with_suffix(".json").read_text())
    assert record["n_tokens"] == first.n_tokens and record["text_sha256"] == first.sha256
    record["tokenizer"]["vocab_bpe_sha256"] = "0" * 64
    bin_path.with_suffix(".json").write_text(json.dumps(record))
    notes = []
    load_tokens(path, notify=notes.append)
    assert "another tokenizer" in notes[0]


def test_an_interrupted_tokenization_leaves_no_cache(tmp_cache, tmp_path, monkeypatch):
    path = _write(tmp_path / "t.txt", ("Line of text.\n" * 400).encode())
    monkeypatch.setattr(text, "READ_BYTES", 256)
    real = tokenizer.encode_stream

    def ctrl_c_midway(chunks, **kw):
        for i, ids in enumerate(real(chunks, **kw)):
            if i == 3:
                raise KeyboardInterrupt
            yield ids

    monkeypatch.setattr(cache, "encode_stream", ctrl_c_midway)
    with pytest.raises(KeyboardInterrupt):
        load_tokens(path)
    assert list((tmp_cache / "tokens").iterdir()) == []  # no bin, no record, no temp file
    monkeypatch.undo()
    assert load_tokens(path, notify=pytest.fail).n_tokens == 400 * 5  # a first build, not a repair


def test_a_large_text_shows_a_progress_bar_on_a_terminal(tmp_cache, tmp_path, monkeypatch, capsys):
    path = _write(tmp_path / "t.txt", b"Some words.\n" * 100)
    monkeypatch.setattr(cache, "PROGRESS_BYTES", 1)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    load_tokens(path)
    assert "tokenizing" in capsys.readouterr().err


# --- random_tokens --------------------------------------------------------------------------------


def test_random_tokens_deterministic_and_in_vocab():
    a, b = data.random_tokens(10_000, seed=7), data.random_tokens(10_000, seed=7)
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    assert a.sha256 == b.sha256 and a.source == "random" and a.n_tokens == 10_000
    assert (len(a.train), len(a.val)) == (9_000, 1_000)
    assert a.train.dtype == np.uint16 and int(a.train.max()) < 50257
    assert not np.array_equal(a.train, data.random_tokens(10_000, seed=8).train)
    small = data.random_tokens(1_000, vocab_size=10)
    assert set(np.unique(np.concatenate([small.train, small.val])).tolist()) == set(range(10))


# --- Batches --------------------------------------------------------------------------------------


@pytest.fixture
def ramp():
    """Tokens equal to their own index, so every window reveals its offset."""
    return np.arange(5_000, dtype=np.uint16)


def test_targets_are_inputs_shifted_by_one(ramp):
    x, y = Batches(ramp, batch_size=8, seq_len=16, seed=3).next()
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x.numpy(), y.numpy()):
        o = int(row_x[0])
        assert np.array_equal(row_x, ramp[o:o + 16]) and np.array_equal(row_y, ramp[o + 1:o + 17])


def test_offsets_reach_both_ends_without_overrunning():
    tokens = np.arange(10, dtype=np.uint16)  # seq_len 8: offsets may only be 0 or 1
    x, y = Batches(tokens, batch_size=64, seq_len=8).next()
    assert set(x[:, 0].tolist()) == {0, 1}
    assert int(y.max()) == 9


def test_batches_are_a_pure_function_of_seed_and_index(ramp):
    run = Batches(ramp, batch_size=4, seq_len=8, seed=5)
    stream = [run.next() for _ in range(6)]
    assert run.state_dict() == {"position": 6, "seed": 5}

    resumed = Batches(ramp, batch_size=4, seq_len=8, seed=0)
    resumed.load_state_dict({"position": 3, "seed": 5})
    for expected in stream[3:]:
        got = resumed.next()
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not torch.equal(stream[0][0], stream[1][0])
    assert not torch.equal(Batches(ramp, 4, 8, seed=6).next()[0], stream[0][0])


def test_two_ranks_together_see_the_one_rank_batch(ramp):
    single = Batches(ramp, batch_size=6, seq_len=8, seed=2)
    ranks = [Batches(ramp, batch_size=6, seq_len=8, seed=2, rank=r, world_size=2) for r in range(2)]
    for _ in range(3):
        x, y = single.next()
        parts = [r.next() for r in ranks]
        assert parts[0][0].shape == (3, 8)
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=6, world_size=4), "batch size 6 is not divisible by world size 4"),
    (dict(batch_size=4, rank=2, world_size=2), "rank 2 is not valid"),
    (dict(batch_size=0), "at least 1"),
    (dict(batch_size=4, seed=-1), "non-negative"),
])
def test_bad_batch_arguments_are_usage_errors(ramp, kwargs, match):
    with pytest.raises(UsageError, match=match):
        Batches(ramp, seq_len=8, **kwargs)


def test_eval_batches_are_fixed(ramp):
    a = data.eval_batches(ramp, batch_size=4, seq_len=8, n_batches=3)
    b = data.eval_batches(ramp, batch_size=4, seq_len=8, n_batches=3)
    assert len(a) == 3
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b))
    assert not torch.equal(a[0][0], Batches(ramp, 4, 8).next()[0])  # not the training stream


def test_to_device_cpu_keeps_values():
    x, y = torch.arange(6).view(2, 3), torch.arange(1, 7).view(2, 3)
    dx, dy = data.to_device(x, y, "cpu")
    assert dx.device.type == "cpu" and torch.equal(dx, x) and torch.equal(dy, y)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_to_device_cuda_copies_values():
    x, y = torch.arange(6).view(2, 3), torch.arange(1, 7).view(2, 3)
    dx, dy = data.to_device(x, y, "cuda")
    assert dx.is_cuda and torch.equal(dx.cpu(), x) and torch.equal(dy.cpu(), y)
