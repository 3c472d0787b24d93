"""The token shard format: llm.c's header exactly, the headerless layouts of nanoGPT and build-nanogpt,
and every damaged shard as one line naming the file."""

import struct

import numpy as np
import pytest

from gpt2ladder.data import shards as fmt
from gpt2ladder.errors import UsageError


def test_a_shard_is_llmc_header_then_uint16_tokens(tmp_path):
    tokens = np.array([50256, 0, 1, 65535 // 2, 50255], dtype=np.uint16)
    path = tmp_path / "x_train_000001.bin"
    fmt.write_shard(path, tokens)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert list(header[:3]) == [20240520, 1, 5] and not header[3:].any()  # llm.c's data_common.py layout
    assert len(raw) == 1024 + 2 * 5
    assert (np.frombuffer(raw[1024:], dtype="<u2") == tokens).all()
    shard = fmt.open_shard(path, fmt.LLMC)
    assert shard.n_tokens == 5 and (shard.tokens() == tokens).all()


def test_a_shard_can_be_empty(tmp_path):
    fmt.write_shard(tmp_path / "e.bin", np.zeros(0, dtype=np.uint16))
    assert len(fmt.open_shard(tmp_path / "e.bin", fmt.LLMC).tokens()) == 0


def _header(magic=20240520, version=1, n=4):
    return struct.pack("<3i", magic, version, n) + bytes(1012)


@pytest.mark.parametrize("content, says", [
    (_header(magic=12345) + bytes(8), "has magic number 12345, not llm.c's 20240520"),
    (_header(version=7) + bytes(8), "is version 7 of the format"),
    (_header(n=4) + bytes(6), "its header counts 4 tokens"),  # truncated
    (_header(n=4) + bytes(9), "its header counts 4 tokens"),  # an odd byte count
    (_header(n=-1), "its header counts -1 tokens"),
    (b"\x58\xee\x34\x01" + bytes(20), "shorter than the 1024-byte header"),
])
def test_a_damaged_shard_is_one_line_naming_the_file(tmp_path, content, says):
    path = tmp_path / "bad_train_000001.bin"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=says) as err:
        fmt.open_shard(path, fmt.LLMC)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_token_outside_the_vocabulary_is_found_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(fmt, "SCAN_BYTES", 64)  # 32 tokens a block: the bad one sits in the fourth block
    tokens = np.arange(200, dtype=np.uint16)
    tokens[100] = 50257
    fmt.write_shard(tmp_path / "t.bin", tokens)
    shard = fmt.open_shard(tmp_path / "t.bin", fmt.LLMC)
    with pytest.raises(UsageError, match="holds token id 50257 at position 100, outside GPT-2's vocabulary"):
        fmt.scan(shard, 50257)
    assert fmt.scan(shard, 50258, digest=True) == fmt.file_sha256(tmp_path / "t.bin")  # the whole file's sha256


def test_an_interrupted_writer_leaves_nothing_a_loader_accepts(tmp_path):
    path = tmp_path / "x_train_000001.bin"
    writer = fmt.ShardWriter(path)
    writer.write(np.arange(10, dtype=np.uint16))
    writer._f.flush()
    (temp,) = [p for p in tmp_path.iterdir()]
    assert temp.name.startswith(f".{path.name}.") and temp.name != path.name  # never under the shard's own name
    with pytest.raises(UsageError, match="has magic number 0"):  # until close, the header is zeros
        fmt.open_shard(temp, fmt.LLMC)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_an_error_inside_the_writer_block_drops_the_shard(tmp_path):
    with pytest.raises(KeyError):
        with fmt.ShardWriter(tmp_path / "s.bin") as w:
            w.write(np.arange(3, dtype=np.uint16))
            raise KeyError("boom")
    assert list(tmp_path.iterdir()) == []


def test_nanogpt_raw_and_build_nanogpt_npy_are_read_as_they_are(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")  # nanoGPT's prepare.py: arr.tofile, no header
    np.save(tmp_path / "edu_train_000001.npy", tokens)  # build-nanogpt's fineweb.py: np.save of uint16
    for path, layout in ((tmp_path / "train.bin", fmt.RAW), (tmp_path / "edu_train_000001.npy", fmt.NPY)):
        shard = fmt.open_shard(path, layout)
        assert isinstance(shard.tokens(), np.memmap) and (shard.tokens() == tokens).all()


@pytest.mark.parametrize("make, says", [
    (lambda p: (p / "train.bin").write_bytes(b"\0" * 7), "holds an odd number of bytes"),
    (lambda p: np.save(p / "x.npy", np.arange(5, dtype=np.int32)), "holds a int32 array of shape"),
    (lambda p: np.save(p / "x.npy", np.zeros((2, 3), dtype=np.uint16)), "of shape (2, 3)"),
    (lambda p: (p / "x.npy").write_bytes(b"not numpy"), "is not a readable .npy array"),
])
def test_a_foreign_file_that_is_not_tokens_is_one_line(tmp_path, make, says):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(UsageError, match=says.replace("(", r"\(").replace(")", r"\)")):
        fmt.open_shard(path, fmt.NPY if path.suffix == ".npy" else fmt.RAW)


def test_split_is_read_from_the_name():
    val = ["fineweb_val_000000.bin", "tiny_shakespeare_val.bin", "val.bin", "edufineweb_val_000000.npy"]
    train = ["fineweb_train_000001.bin", "tiny_shakespeare_train.bin", "train.bin", "interval_000001.bin"]
    assert all(fmt.is_val(n) for n in val) and not any(fmt.is_val(n) for n in train)
    assert fmt.shard_name("edu", "train", 12) == "edu_train_000012.bin"
