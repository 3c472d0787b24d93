"""Tests for `gpt2ladder export` without transformers: the files, what the model card states, one-line
errors, and a folder that appears whole or not at all. tests/commands/test_hugging_face.py loads the
export in transformers."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpt2ladder import cli
from gpt2ladder.data.tokenizer import _bpe_files
from gpt2ladder.model.hf import CONV1D_SUFFIXES
from gpt2ladder.training.checkpoint import load_checkpoint
from gpt2ladder.training.runlog import read_log


@pytest.fixture(scope="module")
def trained_run(module_tmp, shakespeare_cache):
    """A real 4-step run of the tiny preset with a padded vocabulary, validated at steps 2 and 4."""
    out = module_tmp("export") / "run"
    code = cli.main(["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline,vocab", "--batch-size", "2",
                     "--seq-len", "32", "--steps", "4", "--eval-every", "2", "--eval-batches", "1", "--ckpt-every", "0",
                     "--no-progress", "--out", str(out)])
    assert code == 0
    return out


@pytest.fixture
def run(trained_run, tmp_path):
    return shutil.copytree(trained_run, tmp_path / "run")


def _export(capsys, *args):
    code = cli.main(["export", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, code: int, expected: int) -> bool:
    return code == expected and err.startswith("gpt2ladder: error: ") and err.count("\n") == 1


def test_export_writes_the_hugging_face_files(run, tmp_path, capsys):
    code, out, _ = _export(capsys, run, tmp_path / "hf")
    assert code == 0 and "2 layers, 4 heads, 128 wide" in out
    names = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert names == ["README.md", "config.json", "generation_config.json", "gpt2ladder.json", "merges.txt",
                     "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    state = load_checkpoint(run)
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert tensors["transformer.wte.weight"].shape == (50257, 128)  # the run's 50304 rows cut back
    assert state["model"]["transformer.wte.weight"].shape == (50304, 128)
    assert torch.equal(tensors["transformer.wte.weight"], state["model"]["transformer.wte.weight"][:50257])
    for suffix in CONV1D_SUFFIXES:  # Conv1D layout: (in, out)
        name = f"transformer.h.1.{suffix}"
        assert torch.equal(tensors[name], state["model"][name].t())
    assert "lm_head.weight" not in tensors  # tied: transformers ties it back to wte
    encoder_json, vocab_bpe = _bpe_files()
    assert (tmp_path / "hf" / "vocab.json").read_bytes() == encoder_json.read_bytes()
    assert (tmp_path / "hf" / "merges.txt").read_bytes() == vocab_bpe.read_bytes()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["n_positions"]) == (2, 4, 128, 256)
    assert config["vocab_size"] == 50257 and config["dtype"] == "float32"


def test_model_card_states_what_the_run_recorded(run, tmp_path, capsys):
    log = read_log(run / "log.jsonl")
    with open(run / "log.jsonl", "a") as f:  # a step logged after the checkpoint was written
        f.write(json.dumps({"step": 5, "loss": 1.0, "val_loss": 0.5}) + "\n")
    assert _export(capsys, run / "ckpt.pt", tmp_path / "hf")[0] == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    record = json.loads((run / "config.json").read_text())
    assert f"| data | tinyshakespeare ({record['data']['n_tokens']:,} tokens, sha256 " in card
    assert "| steps | 4 of 4 planned, 64 tokens per step |" in card
    assert f"| validation loss | {log[3]['val_loss']:.4f} at step 4 (mean over 1 batches of 2 x 32 tokens) |" in card
    assert f"| training loss | {log[3]['loss']:.4f} at step 4 |" in card
    assert "0.5000" not in card and "random weights, seed 0" in card and "baseline, vocab" in card


def test_export_in_bfloat16(run, tmp_path, capsys):
    assert _export(capsys, run, tmp_path / "hf", "--dtype", "bfloat16")[0] == 0
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"


def test_missing_run_is_one_line(tmp_path, capsys):
    code, _, err = _export(capsys, tmp_path / "nothing", tmp_path / "hf")
    assert _one_line_error(err, code, 2) and "no checkpoint at" in err
    assert not (tmp_path / "hf").exists()


def test_a_folder_that_is_not_empty_needs_force(run, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("keep me")
    code, _, err = _export(capsys, run, tmp_path / "hf")
    assert _one_line_error(err, code, 2) and "--force" in err
    assert (tmp_path / "hf" / "mine.txt").read_text() == "keep me"
    assert _export(capsys, run, tmp_path / "hf", "--force")[0] == 0
    assert not (tmp_path / "hf" / "mine.txt").exists() and (tmp_path / "hf" / "model.safetensors").is_file()
    (tmp_path / "empty").mkdir()
    assert _export(capsys, run, tmp_path / "empty")[0] == 0  # an empty folder is filled


def test_an_out_dir_that_is_a_file_or_under_one_is_one_line(run, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep me")
    for target, words in ((tmp_path / "notes.txt", "is not a folder"),
                          (tmp_path / "notes.txt" / "hf", "cannot write to")):
        code, _, err = _export(capsys, run, target, "--force")
        assert _one_line_error(err, code, 2) and words in err
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_the_run_itself_is_never_replaced(run, capsys):
    before = (run / "ckpt.pt").read_bytes()
    for target in (run, run.parent):
        code, _, err = _export(capsys, run, target, "--force")
        assert _one_line_error(err, code, 2) and "holds the run being exported" in err
    assert (run / "ckpt.pt").read_bytes() == before


def test_a_failure_leaves_no_half_folder(run, tmp_path, capsys, monkeypatch):
    def full_disk(folder, model_max_length):
        (folder / "vocab.json").write_text("{")  # half a file, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gpt2ladder.commands.export.write_hf_tokenizer", full_disk)
    code, _, err = _export(capsys, run, tmp_path / "hf")
    assert _one_line_error(err, code, 1) and "No space left" in err
    assert list(tmp_path.iterdir()) == [run]  # neither the folder nor its temp twin
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "mine.txt").write_text("keep me")
    assert _export(capsys, run, tmp_path / "old", "--force")[0] == 1
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["mine.txt"]  # the old folder is kept


def test_export_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "gpt2ladder export runs/shakespeare hf/shakespeare" in text and "(default: float32)" in text
    assert "never a folder holding a gpt2ladder run's checkpoint (ckpt.pt, ckpt.prev.pt or best.pt)" in text
    assert "a recipe whose parts change only the optimizer, the schedule or the initialisation" in text


# --- the destination: never a running run, never two exports at once, nothing followed ---------------


def test_force_never_replaces_the_folder_of_a_run_still_going_on(run, tmp_path, capsys):
    """A run that has written no checkpoint yet (its config.json and log so far) is kept by its lock alone."""
    from gpt2ladder.training import lock

    target = shutil.copytree(run, tmp_path / "running", ignore=shutil.ignore_patterns("*.pt"))
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    held, _ = lock.try_lock(target)  # as `train --out running` holds it
    try:
        code, _, err = _export(capsys, run, target, "--force")
    finally:
        held.release()
    assert _one_line_error(err, code, 2) and "still going on" in err and f"pid {os.getpid()} on" in err
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "running"]  # no temp folder, no lock left


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["the run itself", "a copy of the run", "best.pt alone", "a run two folders down",
                                   "ckpt.prev.pt alone, below"])
def test_force_never_replaces_a_finished_run_or_a_folder_holding_one(run, tmp_path, capsys, where):
    """A run that has finished holds no lock: its checkpoints alone say that replacing the folder would delete it."""
    target = tmp_path / "target"
    if where == "the run itself":
        target = run  # a finished run: no lock
        source = shutil.copytree(run, tmp_path / "source")  # exported from elsewhere, so only --force is in question
    else:
        source = run
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    checkpoint = {"the run itself": target / "ckpt.pt", "a copy of the run": target / "run" / "ckpt.pt",
                  "best.pt alone": target / "best.pt", "a run two folders down": target / "runs" / "a" / "ckpt.pt",
                  "ckpt.prev.pt alone, below": target / "runs" / "ckpt.prev.pt"}[where]
    if where == "a copy of the run":
        shutil.copytree(run, target / "run")  # ckpt.pt, best.pt, config.json, log.jsonl: ckpt.pt is named
    elif not checkpoint.exists():
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(run / "ckpt.pt", checkpoint)
    before = _files(target)
    for force in (["--force"], []):  # without --force too, the refusal names the run, not --force
        code, out, err = _export(capsys, source, target, *force)
        assert _one_line_error(err, code, 2) and out == "", err
        assert f"holds a gpt2ladder run's checkpoint ({checkpoint})" in err and "--force" in err
    assert _files(target) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder, no lock left


def test_force_still_replaces_an_earlier_export_and_a_link_to_a_run_is_not_followed(run, tmp_path, capsys):
    assert _export(capsys, run, tmp_path / "hf")[0] == 0
    assert _export(capsys, run, tmp_path / "hf", "--dtype", "bfloat16", "--force")[0] == 0  # an earlier export
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"
    (tmp_path / "hf" / "the-run").symlink_to(run)  # replacing hf removes the link, never the run it points to
    (tmp_path / "hf" / "ckpt.pt").symlink_to(run / "ckpt.pt")
    before = _files(run)
    assert _export(capsys, run, tmp_path / "hf", "--force")[0] == 0
    assert not (tmp_path / "hf" / "the-run").exists() and _files(run) == before


def test_an_unreadable_folder_inside_is_not_replaced(run, tmp_path, capsys, monkeypatch):
    """What a folder that cannot be read holds is not known, so it may hold a run: refused. (Its listing is made to
    fail, as a folder of mode 000 fails for any user but root.)"""
    locked = tmp_path / "target" / "locked"
    locked.mkdir(parents=True)
    scandir = os.scandir

    def no_permission(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", no_permission)
    code, _, err = _export(capsys, run, tmp_path / "target", "--force")
    assert _one_line_error(err, code, 2) and f"cannot read {locked} to see whether it holds a gpt2ladder run" in err
    assert "(Permission denied)" in err
    assert locked.is_dir()


EXPORT_THAT_HANGS = """import sys, time
import gpt2ladder.commands.export as export
from gpt2ladder.cli import main

def hang(folder, model_max_length):
    (folder / "vocab.json").write_text("{")
    print("writing", flush=True)
    time.sleep(600)

export.write_hf_tokenizer = hang
main(["export", sys.argv[1], sys.argv[2]])
"""


def test_two_exports_to_one_place_cannot_both_write_and_a_killed_ones_leftovers_go(run, tmp_path, capsys):
    """A real second process writes to hf and is killed -9 mid-write: meanwhile an export to hf is refused
    naming its pid; afterwards the next export succeeds and removes the killed one's temp folder."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", EXPORT_THAT_HANGS, str(run), str(tmp_path / "hf")],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "writing\n"
        code, _, err = _export(capsys, run, tmp_path / "hf")
        assert _one_line_error(err, code, 2) and f"being written by another gpt2ladder export (pid {proc.pid} on" in err
    finally:
        proc.kill()
        proc.wait()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".hf."))
    assert len(left) == 2 and left[1] == ".hf.lock" and left[0].endswith(".tmp")  # what kill -9 leaves
    assert _export(capsys, run, tmp_path / "hf")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "run"]


def test_what_a_killed_export_left_beside_the_folder_is_removed_and_nothing_else(run, tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("keep me")
    stale = [".hf.0123456789ab.tmp", ".hf.abcdefgh.tmp", ".hf.0123456789ab.old"]  # this version's, mkdtemp's
    for name in stale:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".hf.fedcba987654.tmp").symlink_to(tmp_path / "elsewhere")  # a link among them: never followed
    others = [".hf2.0123456789ab.tmp", ".hf.x.0123456789ab.tmp", "hf.0123456789ab.tmp"]  # not hf's
    for name in others:
        (tmp_path / name).mkdir()
    assert _export(capsys, run, tmp_path / "hf")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["elsewhere", "hf", "run", *others])
    assert (tmp_path / "elsewhere" / "keep.txt").read_text() == "keep me"


def test_a_destination_or_its_lock_that_is_a_link_is_refused(run, tmp_path, capsys):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("keep me")
    (tmp_path / "hf").symlink_to(tmp_path / "elsewhere")
    code, _, err = _export(capsys, run, tmp_path / "hf", "--force")
    assert _one_line_error(err, code, 2) and "is a symbolic link" in err
    (tmp_path / "hf").unlink()
    (tmp_path / "outside.txt").write_text("not the export's")
    (tmp_path / ".hf.lock").symlink_to(tmp_path / "outside.txt")
    code, _, err = _export(capsys, run, tmp_path / "hf")
    assert _one_line_error(err, code, 2) and ".hf.lock is a symbolic link" in err
    assert (tmp_path / "outside.txt").read_text() == "not the export's"
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == ["keep.txt"] and not (tmp_path / "hf").exists()


# --- the checkpoint: the last good one, as sample reads it ---------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "damaged"])
def test_export_falls_back_to_ckpt_prev_like_sample(run, tmp_path, capsys, damage):
    from gpt2ladder.training.checkpoint import save_checkpoint

    state = load_checkpoint(run)
    save_checkpoint(run / "ckpt.prev.pt", {**state, "step": 2})  # the checkpoint before the last
    if damage == "missing":
        (run / "ckpt.pt").unlink()  # a kill between the two renames of a save
    else:
        (run / "ckpt.pt").write_bytes((run / "ckpt.pt").read_bytes()[:4000])
    code, out, err = _export(capsys, run, tmp_path / "hf")
    assert code == 0 and "ckpt.prev.pt (step 2)" in err and err.startswith("notice: ")
    assert f"step 2 of {run / 'ckpt.prev.pt'}" in out
    assert "| steps | 2 of 4 planned" in (tmp_path / "hf" / "README.md").read_text()


# --- a full disk, and the run's records of the wrong types ------------------------------------------------


def test_a_full_disk_while_safetensors_writes_is_one_line(run, tmp_path, capsys, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def disk_full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    code, _, err = _export(capsys, run, tmp_path / "hf")
    assert _one_line_error(err, code, 1) and "No space left on device" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no folder, no temp folder, no lock


def test_a_run_record_of_the_wrong_types_leaves_those_facts_out_of_the_card(run, tmp_path, capsys):
    from gpt2ladder.training.checkpoint import save_checkpoint

    record = json.loads((run / "config.json").read_text())
    record.update(data=["tinyshakespeare"], device="a string", date=20261201, gpt2ladder={"v": 1}, git_sha=None)
    (run / "config.json").write_text(json.dumps(record))
    state = load_checkpoint(run)
    train = {**state["train_config"], "steps": "many", "tokens_per_step": [64], "rungs": "baseline", "seed": 1.5}
    save_checkpoint(run / "ckpt.pt", {**state, "train_config": train})
    code, _, err = _export(capsys, run, tmp_path / "hf")
    assert code == 0, err
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "| steps | 4 |" in card and "| data | tinyshakespeare (sha256" in card
    for absent in ("many", "planned", "tokens per step", "a string", "20261201", "| rungs |", "seed"):
        assert absent not in card, absent


# --- which recipes export: GPT-2's model, whatever optimizer, schedule or initialisation trained it -----------


@pytest.mark.parametrize("parts, refused", [(("zero_init",), None), (("rope",), "rope"),
                                            (("relu2", "zero_init"), "relu2")])
def test_only_a_recipe_that_keeps_gpt2s_function_exports(tmp_path, capsys, parts, refused):
    """zero_init only sets where the output projections start: its model is GPT-2's, tensor for tensor. A part that
    changes the network is refused in one line naming it (and only it), before anything is written."""
    from gpt2ladder.model.config import ModelConfig
    from gpt2ladder.model.family import built
    from gpt2ladder.model.gpt import GPT
    from gpt2ladder.training.checkpoint import save_checkpoint

    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, parts=parts)
    model = built(cfg, seed=1)
    (tmp_path / "run").mkdir()
    save_checkpoint(tmp_path / "run" / "ckpt.pt", {"model": model.state_dict(), "model_config": cfg.to_dict(),
                                                   "setup": {}, "step": 1})
    code, _, err = _export(capsys, tmp_path / "run", tmp_path / "hf")
    if refused:
        assert _one_line_error(err, code, 2) and f"GPT-2 with the recipe parts {refused}, which" in err
        assert "zero_init" not in err and not (tmp_path / "hf").exists()
        return
    assert code == 0, err
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    gpt2 = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)).state_dict()
    assert sorted(tensors) == sorted(k for k in gpt2 if k != "lm_head.weight")
    assert not tensors["transformer.h.0.attn.c_proj.weight"].any()  # where zero_init starts it
