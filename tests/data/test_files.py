"""Tests for data/files.py: a file is created new under a name no one else chose and renamed into place, so
nothing planted at a name (a symbolic link to someone's file, a leftover temp file) is ever written through."""

import errno
import os

import pytest

from gpt2ladder.data import files
from gpt2ladder.data.files import atomic_file, atomic_path, new_temp, open_append, write_atomic

OUTSIDE = b"someone else's file, not the run's\n"


@pytest.fixture
def outside(tmp_path):
    """A file outside the folder written to, which a planted link points at."""
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_bytes(OUTSIDE)
    return path


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "run").mkdir()
    return tmp_path / "run"


def test_a_link_at_the_destination_is_replaced_not_written_through(folder, outside):
    (folder / "config.json").symlink_to(outside)
    write_atomic(folder / "config.json", '{"ok": true}\n')
    assert outside.read_bytes() == OUTSIDE
    assert not (folder / "config.json").is_symlink() and (folder / "config.json").read_text() == '{"ok": true}\n'
    assert [p.name for p in folder.iterdir()] == ["config.json"]  # no temp file left


def test_a_planted_temp_name_is_never_opened_and_another_is_drawn(folder, outside, monkeypatch):
    """The first random name is taken (a link to the outside file), as if guessed: it is left alone."""
    names = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    planted = folder / ".log.jsonl.aaaaaaaaaaaa.tmp.jsonl"
    planted.symlink_to(outside)
    with atomic_file(folder / "log.jsonl") as f:
        f.write(b"{}\n")
    assert outside.read_bytes() == OUTSIDE and planted.is_symlink()
    assert (folder / "log.jsonl").read_bytes() == b"{}\n" and not (folder / "log.jsonl").is_symlink()


def test_a_dangling_link_counts_as_taken(folder, tmp_path):
    """O_EXCL with O_NOFOLLOW: a link to a file that does not exist yet is not created through either."""
    target = tmp_path / "would-be-created"
    (folder / "x").symlink_to(target)
    with pytest.raises(FileExistsError):
        os.close(files.open_new(folder / "x"))
    assert not target.exists()


def test_when_every_name_is_taken_it_says_so(folder, monkeypatch):
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "cccccccccccc")
    (folder / ".a.cccccccccccc.tmp").write_bytes(b"")
    with pytest.raises(FileExistsError, match="every name tried was taken"):
        new_temp(folder / "a")


def test_a_failed_write_leaves_the_old_file_and_no_temp(folder):
    write_atomic(folder / "ladder.md", "old\n")
    with pytest.raises(RuntimeError), atomic_file(folder / "ladder.md") as f:
        f.write(b"half")
        raise RuntimeError("the writer failed")
    assert (folder / "ladder.md").read_text() == "old\n" and [p.name for p in folder.iterdir()] == ["ladder.md"]


def test_atomic_path_hands_a_writer_a_new_file_with_the_destination_suffix(folder, outside):
    (folder / "trace.json").symlink_to(outside)
    with atomic_path(folder / "trace.json") as tmp:
        assert tmp.suffix == ".json" and tmp.is_file() and not tmp.is_symlink() and tmp.stat().st_size == 0
        tmp.write_text("[]")  # a writer that opens the name itself
    assert outside.read_bytes() == OUTSIDE and (folder / "trace.json").read_text() == "[]"
    assert [p.name for p in folder.iterdir()] == ["trace.json"]


def test_new_files_follow_the_umask_not_mkstemps_0600(folder):
    mask = os.umask(0o022)
    try:
        write_atomic(folder / "loss.png", b"png")
    finally:
        os.umask(mask)
    assert (folder / "loss.png").stat().st_mode & 0o777 == 0o644


def test_a_log_that_is_a_link_is_refused_not_appended_through(folder, outside):
    (folder / "log.jsonl").symlink_to(outside)
    with pytest.raises(OSError) as err:
        open_append(folder / "log.jsonl")
    assert err.value.errno in (errno.ELOOP, errno.EMLINK)
    assert outside.read_bytes() == OUTSIDE
    (folder / "log.jsonl").unlink()
    with open_append(folder / "log.jsonl") as f:
        f.write("one\n")
    with open_append(folder / "log.jsonl") as f:
        f.write("two\n")
    assert (folder / "log.jsonl").read_text() == "one\ntwo\n"


def test_temp_of_names_the_destination_of_every_temporary_made_beside_it(folder):
    for dest, suffix in ((folder / "edu_train_000001.bin", None), (folder / "ckpt.pt", None), (folder / "out", "")):
        fd, tmp = files.beside(dest, files.open_new, suffix)
        os.close(fd)
        assert files.temp_of(tmp.name) == dest.name
    for other in ("edu_train_000001.bin", ".edu_train_000001.bin.x1y2.part", ".ckpt.pt.tmp", ".a.0123456789ab.old"):
        assert files.temp_of(other) is None
