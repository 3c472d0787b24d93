"""Tests for training/checkpoint.py: atomic writes, integrity checks, one-line errors, RNG states."""

import errno
import os
import random
import zipfile

import numpy as np
import pytest
import torch

from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.training import checkpoint
from gpt2ladder.training.checkpoint import (
    config_differences,
    load_checkpoint,
    model_from_checkpoint,
    remove_stale_temps,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


@pytest.fixture
def restore_rng():
    """These tests set the global RNGs; put them back afterwards."""
    saved = rng_state()
    yield
    set_rng_state(saved)


def _state(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    model = {"w": torch.randn(64, 32, generator=gen), "b": torch.zeros(32),
             "h": torch.randn(8, generator=gen).bfloat16()}
    return {"model": model, "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 1e-3}]},
            "step": 7, "train_config": {"rungs": ("baseline", "flash"), "data": None}, "rng": rng_state()}


def _one_line(err: Exception) -> bool:
    return "\n" not in str(err) and str(err).strip() != ""


def test_round_trip_preserves_every_value(tmp_path, restore_rng):
    state = _state()
    path = save_checkpoint(tmp_path / "ckpt.pt", state)
    loaded = load_checkpoint(path)
    assert loaded["format"] == "gpt2ladder-checkpoint" and loaded["version"] == 1
    assert loaded["step"] == 7 and loaded["train_config"]["rungs"] == ("baseline", "flash")
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v) and loaded["model"][k].dtype == v.dtype
    assert torch.equal(loaded["optimizer"]["state"][0]["step"], torch.tensor(3.0))
    # plain torch.load with weights_only works too: the file holds no pickled classes
    raw = torch.load(path, weights_only=True)
    assert raw["sha256"] == checkpoint.state_digest({k: v for k, v in raw.items() if k != "sha256"})


def test_a_directory_means_its_ckpt_pt(tmp_path):
    save_checkpoint(tmp_path / "ckpt.pt", _state())
    assert load_checkpoint(tmp_path)["step"] == 7


def test_missing_file_is_a_one_line_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no checkpoint at") as err:
        load_checkpoint(tmp_path / "nope.pt")
    assert _one_line(err.value)


@pytest.mark.parametrize("damage", ["truncate", "flip_tensor_bytes", "text_file", "empty", "other_zip",
                                    "garbled_pickle"])
def test_damaged_file_is_a_one_line_error(tmp_path, damage):
    path = save_checkpoint(tmp_path / "ckpt.pt", _state())
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "flip_tensor_bytes":
        # the payload of tensor "w" (its first values) sits somewhere in the file: flip one of its bytes
        needle = _state()["model"]["w"][0, :4].numpy().tobytes()
        at = bytes(raw).index(needle)
        raw[at + 2] ^= 0xFF
    elif damage == "text_file":
        raw = bytearray(b"hello, I am not a checkpoint\n")
    elif damage == "other_zip":  # a whole zip archive, but not torch.save's
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes.txt", "hello")
        raw = bytearray(path.read_bytes())
    elif damage == "garbled_pickle":  # torch.save's layout, whole, but a pickle torch.load cannot read
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("ckpt/data.pkl", b"\x80\x02not a pickle")
        raw = bytearray(path.read_bytes())
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    with pytest.raises(LadderError) as err:
        load_checkpoint(path)
    assert _one_line(err.value)
    expected = {"flip_tensor_bytes": "do not match their sha256", "text_file": "is not a PyTorch file",
                "truncate": f"checkpoint {path} is unreadable (not a whole torch.save archive: truncated or corrupted)",
                "empty": f"checkpoint {path} is unreadable (empty or zeroed, as a crash can leave a file)",
                "other_zip": f"{path} is a zip archive that torch.save did not write, so no gpt2ladder checkpoint",
                "garbled_pickle": f"checkpoint {path} is unreadable (torch.load cannot read what the archive holds: "
                                  "corrupted, or not written by gpt2ladder)"}
    assert expected[damage] in str(err.value)
    if "unreadable" in expected[damage]:  # our reason whole, nothing of torch's after it
        assert str(err.value) == expected[damage]
    assert isinstance(err.value, UsageError) is (damage in ("text_file", "other_zip"))  # another kind: a mistake


def test_foreign_torch_file_is_rejected(tmp_path):
    torch.save({"state_dict": {"w": torch.ones(2)}}, tmp_path / "other.pt")
    with pytest.raises(LadderError, match="not a gpt2ladder checkpoint") as err:
        load_checkpoint(tmp_path / "other.pt")
    assert _one_line(err.value)


def test_other_format_version_is_rejected(tmp_path):
    payload = {"format": "gpt2ladder-checkpoint", "version": 99, "step": 1}
    torch.save(payload, tmp_path / "ckpt.pt")
    with pytest.raises(LadderError, match="format version 99"):
        load_checkpoint(tmp_path / "ckpt.pt")


def test_disk_full_mid_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "ckpt.pt", _state(seed=0))
    before = path.read_bytes()
    real_save = torch.save

    def half_then_enospc(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial bytes of a new checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint.torch, "save", half_then_enospc)
    with pytest.raises(LadderError) as err:
        save_checkpoint(path, _state(seed=1))
    assert _one_line(err.value) and "No space left on device" in str(err.value)
    assert "previous checkpoint" in str(err.value)
    assert path.read_bytes() == before  # the old file is byte for byte intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # the temp file is gone
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert load_checkpoint(path)["step"] == 7


def test_failed_fsync_also_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "ckpt.pt", _state(seed=0))
    before = path.read_bytes()

    def fail(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(checkpoint.os, "fsync", fail)
    with pytest.raises(LadderError, match="Input/output error"):
        save_checkpoint(path, _state(seed=1))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_new_checkpoint_replaces_old_and_is_readable_by_others(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt.pt", _state(seed=0))
    save_checkpoint(path, {**_state(seed=1), "step": 8})
    assert load_checkpoint(path)["step"] == 8
    assert path.stat().st_mode & 0o044  # not the 0600 of a temp file (unless the umask says so)


def test_remove_stale_temps_leaves_the_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt.pt", _state())
    (tmp_path / ".ckpt.pt.abc123.tmp").write_bytes(b"half")
    (tmp_path / "notes.txt").write_text("mine")
    remove_stale_temps(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "notes.txt"]


def test_rng_state_round_trip(tmp_path, restore_rng):
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    save_checkpoint(tmp_path / "ckpt.pt", {"rng": rng_state()})
    first = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(load_checkpoint(tmp_path / "ckpt.pt")["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1])
    assert first[2] == again[2]


def test_config_differences_names_each_field():
    saved = {"n_layer": 2, "n_head": 4, "attention": "manual"}
    requested = {"n_layer": 12, "n_head": 4, "attention": "sdpa"}
    assert config_differences(saved, requested) == ["n_layer 2 -> 12", "attention 'manual' -> 'sdpa'"]
    assert config_differences(saved, requested, ignore=("attention",)) == ["n_layer 2 -> 12"]


# --- the last good checkpoint: ckpt.pt, ckpt.prev.pt, best.pt -------------------------------------


def test_a_new_checkpoint_keeps_the_previous_one(tmp_path):
    path, previous = tmp_path / "ckpt.pt", tmp_path / "ckpt.prev.pt"
    save_checkpoint(path, {**_state(), "step": 1}, previous=previous)
    assert not previous.exists()  # nothing to keep yet
    save_checkpoint(path, {**_state(), "step": 2}, previous=previous)
    assert load_checkpoint(path)["step"] == 2 and load_checkpoint(previous)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.prev.pt", "ckpt.pt"]


def test_a_save_stopped_between_its_renames_leaves_the_previous_one_to_use(tmp_path, monkeypatch):
    """A kill there leaves no ckpt.pt: the run directory's last good checkpoint is then ckpt.prev.pt."""
    path, previous = tmp_path / "ckpt.pt", tmp_path / "ckpt.prev.pt"
    save_checkpoint(path, {**_state(), "step": 1}, previous=previous)
    real_replace, calls = os.replace, []

    def killed_after_the_first(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands in for the process dying right here
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", killed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {**_state(), "step": 2}, previous=previous)
    monkeypatch.undo()
    assert not path.exists()
    notes = []
    state, used = checkpoint.last_good(tmp_path, notify=notes.append)
    assert used == previous and state["step"] == 1
    assert "no checkpoint at" in notes[0] and "ckpt.prev.pt (step 1)" in notes[0]


def test_a_damaged_ckpt_falls_back_to_the_previous_and_can_be_set_aside(tmp_path):
    path, previous = tmp_path / "ckpt.pt", tmp_path / "ckpt.prev.pt"
    save_checkpoint(path, {**_state(), "step": 1}, previous=previous)
    save_checkpoint(path, {**_state(), "step": 2}, previous=previous)
    path.write_bytes(path.read_bytes()[:100])
    assert checkpoint.last_good(tmp_path, notify=lambda _: None)[0]["step"] == 1
    assert path.exists()  # read-only use (sample) moves nothing
    notes = []
    checkpoint.last_good(tmp_path, notify=notes.append, set_aside=True)
    assert not path.exists() and (tmp_path / "ckpt.pt.damaged").exists() and "ckpt.pt.damaged" in notes[0]
    with pytest.raises(LadderError, match="unreadable"):  # a file named explicitly is that file, no fallback
        checkpoint.last_good(tmp_path / "ckpt.pt.damaged")
    path.write_bytes(b"\0" * 4096)  # zeroed, as a crash can leave a file: damage too, not another kind of file
    assert checkpoint.last_good(tmp_path, notify=lambda _: None)[0]["step"] == 1


def test_the_fallback_notice_gives_our_reason_not_torchs_cut_short(tmp_path):
    """A ckpt.pt cut to 1000 bytes: torch's message is a paragraph of miniz's advice; the notice says in a few
    words of ours what is wrong, and the checkpoint before it is used."""
    path, previous = tmp_path / "ckpt.pt", tmp_path / "ckpt.prev.pt"
    save_checkpoint(path, {**_state(), "step": 1}, previous=previous)
    save_checkpoint(path, {**_state(), "step": 2}, previous=previous)
    path.write_bytes(path.read_bytes()[:1000])
    notes = []
    state, used = checkpoint.last_good(tmp_path, notify=notes.append)
    assert used == previous and state["step"] == 1
    assert notes == [f"notice: checkpoint {path} is unreadable (not a whole torch.save archive: truncated or "
                     f"corrupted); using the checkpoint before it, {previous} (step 1)"]


def test_a_foreign_ckpt_is_not_passed_over(tmp_path):
    """Only damage falls back: a file of another format or version may be someone's, and says so."""
    save_checkpoint(tmp_path / "ckpt.prev.pt", _state())
    torch.save({"format": "gpt2ladder-checkpoint", "version": 99}, tmp_path / "ckpt.pt")
    with pytest.raises(LadderError, match="format version 99"):
        checkpoint.last_good(tmp_path)


@pytest.mark.parametrize("needs, missing", [
    (checkpoint.RESUME_KEYS, "data"),
    (checkpoint.SAMPLE_KEYS, "model_config"),
])
def test_a_valid_hash_with_missing_keys_is_one_line(tmp_path, needs, missing):
    state = {k: v for k, v in _state().items() if k not in ("model_config", "data")}
    path = save_checkpoint(tmp_path / "ckpt.pt", state)
    with pytest.raises(LadderError, match=f"lacks .*{missing}") as err:
        load_checkpoint(path, needs=needs)
    assert _one_line(err.value)


def test_a_model_config_gpt2ladder_cannot_build_is_one_line(tmp_path):
    from gpt2ladder.training.checkpoint import model_from_checkpoint

    for config in ({"n_layer": 2, "flux_capacitor": 1}, {"n_layer": 1, "n_head": 3, "n_embd": 32}):
        with pytest.raises(LadderError, match="does not hold a GPT") as err:
            model_from_checkpoint({"model_config": config, "model": {}}, torch.device("cpu"), "x.pt")
        assert _one_line(err.value)


# --- what a failed write says ------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_says_so_not_torchs_unexpected_pos(tmp_path, monkeypatch):
    """torch.save on a full disk raises "unexpected pos N vs M"; the message must name ENOSPC."""
    path = save_checkpoint(tmp_path / "ckpt.pt", _state(seed=0))
    before = path.read_bytes()
    real_new_temp = checkpoint.new_temp

    def onto_a_full_disk(dest):  # the temp file is real, its writes go to /dev/full (ENOSPC on every write)
        fd, name = real_new_temp(dest)
        os.dup2(os.open("/dev/full", os.O_WRONLY), fd)
        return fd, name

    monkeypatch.setattr(checkpoint, "new_temp", onto_a_full_disk)
    with pytest.raises(LadderError) as err:
        save_checkpoint(path, {**_state(seed=1), "big": torch.zeros(100_000)})
    message = str(err.value)
    assert "No space left on device" in message and "unexpected pos" not in message and _one_line(err.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_a_ctrl_c_inside_torch_save_stays_a_ctrl_c(tmp_path, monkeypatch):
    """torch's writer turns an exception in a write into RuntimeError; the KeyboardInterrupt comes back out."""
    real_save = torch.save

    class Interrupting:
        def __init__(self, f):
            self.f, self.writes = f, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                self.f.error = KeyboardInterrupt()  # as if it landed inside the recording writer
                raise self.f.error
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    monkeypatch.setattr(checkpoint.torch, "save", lambda obj, f: real_save(obj, Interrupting(f)))
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "ckpt.pt", _state())
    assert list(tmp_path.iterdir()) == []


# --- nothing planted in the run is written through -------------------------------------------------


def _planted_names(monkeypatch, tmp_path, dest_name: str):
    """The next random temp name is taken by a link to a file outside the run; returns (that file, link)."""
    from gpt2ladder.data import files

    names = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not the run's")
    link = tmp_path / f".{dest_name}.aaaaaaaaaaaa.tmp.pt"
    link.symlink_to(outside)
    return outside, link


def test_a_link_at_the_checkpoints_temp_name_is_not_written_through(tmp_path, monkeypatch):
    outside, link = _planted_names(monkeypatch, tmp_path, "ckpt.pt")
    save_checkpoint(tmp_path / "ckpt.pt", _state())
    assert outside.read_bytes() == b"not the run's" and link.is_symlink()
    assert load_checkpoint(tmp_path / "ckpt.pt")["step"] == 7 and not (tmp_path / "ckpt.pt").is_symlink()
    remove_stale_temps(tmp_path / "ckpt.pt")  # the next run clears the link, not what it points at
    assert not link.is_symlink() and outside.read_bytes() == b"not the run's"


def test_best_pt_is_written_under_a_new_name_never_through_a_link(tmp_path, monkeypatch):
    outside, link = _planted_names(monkeypatch, tmp_path, "best.pt")
    (tmp_path / "best.pt").symlink_to(outside)  # best.pt itself planted too
    save_checkpoint(tmp_path / "best.pt", _state())
    assert outside.read_bytes() == b"not the run's" and link.is_symlink()
    best = tmp_path / "best.pt"
    assert not best.is_symlink() and load_checkpoint(best)["step"] == _state()["step"]


# --- fields of another form, sizes that are not the tensors' ---------------------------------------


@pytest.mark.parametrize("field, value, named", [
    ("data_source", "tinyshakespeare", "data_source"),
    ("data_source", {"source": "x", "sha256": 12}, "data_source.sha256"),
    ("best", {"step": "1", "val_loss": 2.0}, "best.step"),
    ("setup", ["bf16"], "setup"),
    ("step", "7", "step"),
])
def test_a_field_of_another_form_is_one_line(tmp_path, field, value, named):
    save_checkpoint(tmp_path / "ckpt.pt", {**_state(), field: value})
    with pytest.raises(LadderError, match=f"holds {named} in another form") as err:
        load_checkpoint(tmp_path / "ckpt.pt")
    assert _one_line(err.value)


def test_a_model_config_larger_than_its_tensors_is_refused_before_it_is_built(monkeypatch):
    """10,000 layers of the tensors' width would be gigabytes: refused from the shapes alone."""
    from gpt2ladder.model.config import ModelConfig
    from gpt2ladder.model.gpt import GPT

    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16)
    state = {"model": GPT(cfg).state_dict(), "model_config": {**cfg.to_dict(), "n_layer": 10_000}}
    built = []
    monkeypatch.setattr(checkpoint.family, "build", lambda c: built.append(c) or GPT(c))
    with pytest.raises(LadderError, match="n_layer 10000 in model_config, 1 in the tensors") as err:
        model_from_checkpoint(state, torch.device("cpu"), "x.pt")
    assert _one_line(err.value) and built == []
    state["model_config"] = {**cfg.to_dict(), "block_size": 10**6}  # a (T, T) mask of 10**12 bytes
    with pytest.raises(LadderError, match=r"block_size x n_embd \(1000000, 32\) in model_config, \(16, 32\)"):
        model_from_checkpoint(state, torch.device("cpu"), "x.pt")
    assert built == []
    state["model_config"] = cfg.to_dict()
    assert model_from_checkpoint(state, torch.device("cpu")).config == cfg and len(built) == 1
