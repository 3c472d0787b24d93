"""Nothing lost: one process per run directory, a checkpoint only of weights known good, best.pt, the
last good checkpoint for --resume and sample, another text refused, a second Ctrl-C, no empty --out."""

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpt2ladder import cli, data
from gpt2ladder.data import cache_dir
from gpt2ladder.errors import UsageError
from gpt2ladder.runtime.distributed import Dist
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.training import checkpoint, lock
from gpt2ladder.training.checkpoint import load_checkpoint
from gpt2ladder.training.runlog import read_log
from gpt2ladder.training.run import lock_run
from gpt2ladder.training.trainer import Trainer

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40


@pytest.fixture(autouse=True)
def _cache(shakespeare_cache):
    """Tiny Shakespeare from the session's cache, never the network."""


def _args(out, *extra) -> list[str]:
    return ["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2",
            "--seq-len", "32", "--steps", "2", "--ckpt-every", "1", "--eval-every", "0", "--no-progress",
            "--out", str(out), *extra]


def _cli(capsys, args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, *words) -> bool:
    return (err.startswith("gpt2ladder: error: ") and err.count("\n") == 1 and "Traceback" not in err
            and all(w in err for w in words))


@pytest.fixture(scope="module")
def good_run(module_tmp, shakespeare_cache):
    """Two good steps, checkpoints at 1 and 2 (ckpt.prev.pt and ckpt.pt); tests work on copies."""
    out = module_tmp("good") / "run"
    assert cli.main(_args(out)) == 0
    return out


@pytest.fixture
def run(good_run, tmp_path):
    return shutil.copytree(good_run, tmp_path / "run")


def _files(run) -> dict:
    return {p.name: p.read_bytes() for p in run.iterdir()}


# --- one process per run directory ----------------------------------------------------------------


def test_a_second_run_on_a_locked_directory_says_who_holds_it(run, capsys):
    before = _files(run)
    held, holder = lock.try_lock(run)
    try:
        assert holder is None
        code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "8"))
    finally:
        held.release()
    assert code == 2 and _one_line_error(err, "in use by another gpt2ladder run", f"pid {os.getpid()}",
                                        socket.gethostname(), "another --out")
    assert _files(run) == before  # nothing was touched
    assert not (run / ".lock").exists()  # released: the file goes with the lock
    again, holder = lock.try_lock(run)  # free again
    assert holder is None
    again.release()


def test_only_rank_0_locks(tmp_path):
    """Under torchrun rank 0 holds the directory; the other ranks never write there, so they do not lock."""
    held, _ = lock.try_lock(tmp_path)
    try:
        assert lock_run(tmp_path, Dist(rank=1, world_size=2)) is None  # no error although the lock is held
    finally:
        held.release()
    assert list(tmp_path.iterdir()) == []


def test_without_fcntl_the_run_goes_on_unlocked_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lock, "CAN_LOCK", False)
    assert lock_run(tmp_path) is None
    assert "no fcntl.flock" in capsys.readouterr().out and list(tmp_path.iterdir()) == []


HOLDER = """import pathlib, sys, time
from gpt2ladder.training import lock
held, holder = lock.try_lock(pathlib.Path(sys.argv[1]))
print("held" if held else holder, flush=True)
time.sleep(600)
"""


def test_a_killed_holder_leaves_no_lock_behind(tmp_path, capsys):
    """Another live process holds the directory; kill -9 ends its hold (the file stays, unlocked)."""
    out = tmp_path / "run"
    out.mkdir()
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "held\n"
        code, _, err = _cli(capsys, _args(out, "--steps", "1"))
        assert code == 2 and _one_line_error(err, f"pid {proc.pid} on {socket.gethostname()}")
    finally:
        proc.kill()
        proc.wait()
    assert (out / ".lock").exists()  # kill -9 ran no cleanup
    held, holder = lock.try_lock(out)
    assert holder is None
    held.release()


# --- nothing outside the run is touched -------------------------------------------------------------


def _plant(run, outside_dir, names) -> dict:
    """A link in `run` for each name, each to a file of its own outside the run; returns {name: (file, bytes)}."""
    run.mkdir(exist_ok=True)
    outside_dir.mkdir()
    planted = {}
    for name in names:
        target = outside_dir / f"{name.strip('.')}.keep"
        target.write_bytes(f"not the run's: {name}\n".encode())
        (run / name).symlink_to(target)
        planted[name] = (target, target.read_bytes())
    return planted


def test_links_planted_in_a_run_directory_are_never_written_through(tmp_path, capsys):
    """Every name the run writes, and the fixed temp names older versions wrote through."""
    run = tmp_path / "run"
    planted = _plant(run, tmp_path / "outside", ["config.json", "config.json.tmp", "log.jsonl", "log.jsonl.tmp",
                                                 "loss.png"])
    code, _, err = _cli(capsys, _args(run))
    assert code == 0, err
    for name, (target, before) in planted.items():
        assert target.read_bytes() == before, f"{name} was written through"
    for name in ("config.json", "log.jsonl", "loss.png", "ckpt.pt", "ckpt.prev.pt"):
        assert (run / name).is_file() and not (run / name).is_symlink(), name
    assert [e["step"] for e in read_log(run / "log.jsonl")] == [1, 2]


def test_a_lock_file_that_is_a_link_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    planted = _plant(run, tmp_path / "outside", [".lock"])
    code, _, err = _cli(capsys, _args(run))
    assert code == 2 and _one_line_error(err, ".lock is a symbolic link", "remove it")
    target, before = planted[".lock"]
    assert target.read_bytes() == before and sorted(p.name for p in run.iterdir()) == [".lock"]


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / ".lock")
    with pytest.raises(UsageError, match="not a regular file"):
        lock.try_lock(tmp_path)


def test_a_lock_file_that_is_a_hard_link_to_another_file_is_refused_and_left_as_it_was(tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("someone's notes\n")
    run = tmp_path / "run"
    run.mkdir()
    os.link(victim, run / ".lock")  # the same file under a second name: writing the pid would replace the notes
    with pytest.raises(UsageError, match="hard link") as err:
        lock.try_lock(run)
    assert "\n" not in str(err.value) and victim.read_text() == "someone's notes\n"


def test_releasing_never_removes_a_lock_file_another_run_has_made_since(tmp_path):
    held, _ = lock.try_lock(tmp_path)
    os.unlink(tmp_path / ".lock")  # gone, and another process has locked a new one there
    again, _ = lock.try_lock(tmp_path)
    held.release()
    assert (tmp_path / ".lock").is_file()
    assert lock.try_lock(tmp_path)[1] == f"{(tmp_path / '.lock').read_text().strip()}"  # still held
    again.release()
    assert not (tmp_path / ".lock").exists()


# --- a checkpoint only of weights known good ------------------------------------------------------


@pytest.mark.parametrize("eval_every", ["1", "0"])
def test_a_diverged_but_finite_model_never_replaces_the_last_good_checkpoint(run, capsys, eval_every):
    """The issue's reproduction: resume a good run with --lr 1e6 --grad-clip 0 --ckpt-every 1. Step 3's
    weights are finite but useless (loss ~1e13); validation, or without it one batch, catches them."""
    before = (run / "ckpt.pt").read_bytes()
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "4", "--lr", "1e6", "--grad-clip", "0",
                                      "--ckpt-every", "1", "--eval-every", eval_every, "--eval-batches", "1"))
    assert code == 1 and _one_line_error(err, "at step 3", "ckpt.pt still holds step 2", "lower --lr")
    assert "exploded" in err or "non-finite" in err or "became nan" in err
    assert (run / "ckpt.pt").read_bytes() == before
    assert load_checkpoint(run / "ckpt.prev.pt")["step"] == 1
    assert _cli(capsys, ["sample", run, "--device", "cpu", "--num-tokens", "3"])[0] == 0


def test_best_pt_holds_the_lowest_validation_loss_across_a_resume(tmp_path, capsys, monkeypatch):
    """Validation every step (scripted). Step 1's best is not a checkpoint step: best.pt is a save of its own.
    Resumed, the best comes back from the checkpoint, so the worse step 3 does not replace it; step 4's
    new best, a checkpoint step too, is saved as best.pt as well."""
    scripted = {1: 7.0, 2: 9.0, 3: 8.0, 4: 6.5}
    monkeypatch.setattr(Trainer, "_mean_loss", lambda self, batches, stop=None: scripted.get(self.step, 9.5))
    run, validate = tmp_path / "run", ["--eval-every", "1", "--eval-batches", "1"]
    assert _cli(capsys, _args(run, "--ckpt-every", "2", *validate))[0] == 0
    assert (load_checkpoint(run / "best.pt")["step"] == 1
            and load_checkpoint(run)["best"] == {"step": 1, "val_loss": 7.0})
    assert _cli(capsys, _args(run, "--resume", "--steps", "3", *validate))[0] == 0
    assert load_checkpoint(run / "best.pt")["step"] == 1
    assert _cli(capsys, _args(run, "--resume", "--steps", "4", *validate))[0] == 0
    best, last = load_checkpoint(run / "best.pt"), load_checkpoint(run)
    assert best["step"] == 4 and best["val_loss"] == 6.5 and last["best"] == {"step": 4, "val_loss": 6.5}
    assert sorted(p.name for p in run.iterdir()) == ["best.pt", "ckpt.prev.pt", "ckpt.pt", "config.json",
                                                     "log.jsonl", "loss.png"]


def test_best_pt_holds_the_weights_alone_for_sample_and_export_and_is_never_resumed(tmp_path, capsys):
    run = tmp_path / "run"
    assert _cli(capsys, _args(run, "--eval-every", "1", "--eval-batches", "1"))[0] == 0
    best, full = load_checkpoint(run / "best.pt"), load_checkpoint(run)
    assert set(best) == {"model", "step", "train_config", "model_config", "setup", "data_source", "val_loss", "best",
                         "format", "version"}
    assert {"optimizer", "rng", "data"} <= set(full) and best["model"].keys() == full["model"].keys()
    ratio = (run / "best.pt").stat().st_size / (run / "ckpt.pt").stat().st_size
    assert 0.3 < ratio < 0.4, ratio  # the weights, without AdamW's two moments of every weight
    code, text, _ = _cli(capsys, ["sample", run / "best.pt", "--device", "cpu", "--num-tokens", "3"])
    assert code == 0 and text.strip()
    assert _cli(capsys, ["export", run / "best.pt", tmp_path / "hf"])[0] == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    for name in ("ckpt.pt", "ckpt.prev.pt"):
        (run / name).unlink()
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "3"))
    assert code == 2 and _one_line_error(err, "no checkpoint at", "ckpt.pt")  # best.pt is not a checkpoint to resume


# --- the last good checkpoint is what --resume and sample use ---------------------------------------


def test_a_run_killed_between_the_renames_resumes_from_ckpt_prev(run, capsys):
    os.replace(run / "ckpt.pt", run / "ckpt.prev.pt")  # what a kill right after the first rename leaves
    code, _, err = _cli(capsys, ["sample", run, "--device", "cpu", "--num-tokens", "3"])
    assert code == 0 and "notice: no checkpoint at" in err and "ckpt.prev.pt (step 2)" in err
    code, out, _ = _cli(capsys, _args(run, "--resume", "--steps", "3"))
    assert code == 0 and "resuming from step 2 of" in out and "ckpt.prev.pt" in out
    assert load_checkpoint(run)["step"] == 3 and [e["step"] for e in read_log(run / "log.jsonl")] == list(range(1, 4))


def test_a_checkpoint_with_a_valid_hash_but_missing_keys_is_one_line(run, capsys):
    state = load_checkpoint(run)
    del state["optimizer"], state["rng"]
    checkpoint.save_checkpoint(run / "ckpt.pt", state)
    before = _files(run)
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "8"))
    assert code == 1 and _one_line_error(err, "lacks optimizer, rng")
    assert _files(run) == before
    del state["model_config"]
    checkpoint.save_checkpoint(run / "odd.pt", state)
    code, _, err = _cli(capsys, ["sample", run / "odd.pt", "--device", "cpu"])
    assert code == 1 and _one_line_error(err, "lacks model_config")


def test_a_checkpoint_with_odd_contents_cannot_be_resumed_in_one_line(run, capsys):
    state = load_checkpoint(run)
    state["data"] = {"position": "far"}  # the right keys, the wrong values
    checkpoint.save_checkpoint(run / "ckpt.pt", state)
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "8"))
    assert code == 1 and _one_line_error(err, "cannot be resumed", "ValueError")


# --- the text ---------------------------------------------------------------------------------------


def test_resume_refuses_another_text_unless_allowed(run, tmp_path, capsys):
    """A text never tokenized says so and tokenizes it: a --resume on another text than the checkpoint's is refused
    first (exit 2, before anything is printed or cached), not after that."""
    (tmp_path / "other.txt").write_text(TEXT + "A text the cache has not seen.\n")
    before, cached = _files(run), sorted((cache_dir() / "tokens").glob("*"))
    code, out, err = _cli(capsys, _args(run, "--resume", "--steps", "8", "--data", tmp_path / "other.txt"))
    assert code == 2 and out == "" and _one_line_error(err, "another text", "tinyshakespeare", "other.txt",
                                                       "--allow-data-change")
    assert _files(run) == before  # config.json too: its data hash is the checkpoint's
    assert sorted((cache_dir() / "tokens").glob("*")) == cached
    code, out, _ = _cli(capsys, _args(run, "--resume", "--steps", "3", "--data", tmp_path / "other.txt",
                                      "--allow-data-change"))
    assert code == 0 and "notice: resuming on another text" in out
    assert len(sorted((cache_dir() / "tokens").glob("*"))) == len(cached) + 2  # its bin and record, now
    assert load_checkpoint(run)["data_source"]["source"] == "other.txt"


def test_the_api_resume_refuses_another_text_before_tokenizing_it(run, tmp_path):
    """run_training(resume=True), the API's train, refuses another text as `train --resume` does: before it is
    tokenized (nothing new cached), unless the change is allowed."""
    from training_support import small_config, train_in

    other = tmp_path / "other.txt"
    other.write_text(TEXT + "Another text the cache has not seen.\n")
    cfg = small_config(preset="tiny", batch_size=2, seq_len=32, tokens_per_step=64, steps=3, ckpt_every=1,
                       data=str(other))
    cached = sorted((cache_dir() / "tokens").glob("*"))
    with pytest.raises(UsageError, match="was trained on another text than this run's"):
        train_in(cfg, run, resume=True)
    assert sorted((cache_dir() / "tokens").glob("*")) == cached
    assert train_in(cfg, run, resume=True, allow_data_change=True).exit_code == 0
    assert load_checkpoint(run)["data_source"]["source"] == "other.txt"


def test_resume_refuses_another_corpus_before_it_checks_or_says_anything(run, tmp_path, capsys):
    """A corpus of shards not yet checked says so and scans every token: a --resume on another text than the
    checkpoint's is refused first (exit 2, before anything is printed), not after that scan."""
    from gpt2ladder.data import shards as fmt

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    fmt.write_shard(corpus / fmt.shard_name("c", "val", 0), np.arange(2000, dtype=np.uint16))
    fmt.write_shard(corpus / fmt.shard_name("c", "train", 1), np.arange(8000, dtype=np.uint16))
    before = _files(run)
    code, out, err = _cli(capsys, _args(run, "--resume", "--steps", "8", "--data", corpus))
    assert code == 2 and out == "" and _one_line_error(err, "another text", "tinyshakespeare", "--allow-data-change")
    assert _files(run) == before
    code, out, _ = _cli(capsys, _args(run, "--resume", "--steps", "3", "--data", corpus, "--allow-data-change"))
    assert code == 0 and out.startswith("checking the tokens of corpus") and "notice: resuming on another text" in out


def test_a_text_too_short_for_validation_counts_the_whole_text(tmp_path, capsys):
    (tmp_path / "short.txt").write_text(TEXT[: len(TEXT) // 4])  # about 220 tokens, 22 of them for validation
    code, _, err = _cli(capsys, _args(tmp_path / "run", "--data", tmp_path / "short.txt", "--eval-every", "2"))
    n = len(data.get_tokenizer().encode_ordinary(TEXT[: len(TEXT) // 4]))
    assert code == 2 and _one_line_error(err, f"the text has {n} tokens", f"validation split (the last 10%) "
                                         f"{n - int(n * 0.9)}", "--eval-every 0")


def test_a_failed_run_leaves_no_empty_out_behind(tmp_path, capsys):
    code, _, _ = _cli(capsys, _args(tmp_path / "new" / "deeper", "--data", tmp_path / "missing.txt"))
    assert code == 2 and not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    code, _, _ = _cli(capsys, _args(tmp_path / "mine", "--data", tmp_path / "missing.txt"))
    assert code == 2 and (tmp_path / "mine").is_dir()  # there before the run: not the run's to remove


# --- a second Ctrl-C --------------------------------------------------------------------------------


def test_a_second_ctrl_c_during_the_checkpoint_write_exits_130(tmp_path, capsys, monkeypatch):
    """The first Ctrl-C stops the run after its step and saves; the second lands inside torch.save's writer,
    which reports it as a failed write: the exit must still be Ctrl-C's, with the last checkpoint kept."""
    real_step, real_save, steps = Engine.step, checkpoint.torch.save, []

    def ctrl_c_at_step_2(self, x, y):
        steps.append(1)
        if len(steps) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, x, y)

    class CtrlCMidWrite:
        def __init__(self, f):
            self.f, self.writes = f, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                os.kill(os.getpid(), signal.SIGINT)  # its KeyboardInterrupt is raised inside torch's writer
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    def save(obj, f):
        return real_save(obj, CtrlCMidWrite(f) if len(steps) == 2 else f)

    monkeypatch.setattr(Engine, "step", ctrl_c_at_step_2)
    monkeypatch.setattr(checkpoint.torch, "save", save)
    code, _, err = _cli(capsys, _args(tmp_path / "run", "--steps", "10", "--ckpt-every", "1"))
    assert code == 130 and err == "gpt2ladder: interrupted\n"
    assert load_checkpoint(tmp_path / "run")["step"] == 1
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]  # no temp file, no lock


# --- what a run reads back: its log, its data file's name --------------------------------------------


def test_a_damaged_log_is_read_around_on_resume(run, capsys):
    with open(run / "log.jsonl", "ab") as f:  # stray bytes, a line of the wrong types, a cut line
        f.write(b"\xff\xfe garbage\n" + b'{"step": 9, "loss": "high"}\n' + b'{"step": 10, "lo')
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "3"))
    assert code == 0, err
    assert [e["step"] for e in read_log(run / "log.jsonl")] == list(range(1, 4))
    assert (run / "loss.png").stat().st_size > 0


def test_a_data_file_whose_name_is_not_utf8_trains_and_plots(tmp_path, capsys):
    path = tmp_path / os.fsdecode(b"bad\xffname.txt")
    path.write_text(TEXT)
    code, out, err = _cli(capsys, _args(tmp_path / "run", "--data", path, "--seq-len", "16", "--steps", "1"))
    assert code == 0 and err == "" and "data: bad\ufffdname.txt" in out
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_out_into_a_folder_of_the_users_own_files_is_refused_and_leaves_them(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    files = {"config.json": '{"mine": true}', "log.jsonl": "my log\n", "loss.png": "not a plot", "notes.txt": "x"}
    for name, text in files.items():
        (mine / name).write_text(text)
    code, out, err = _cli(capsys, _args(mine))
    assert code == 2 and out == "" and _one_line_error(err, f"--out {mine} holds files that are not a gpt2ladder run")
    assert {p.name: p.read_text() for p in mine.iterdir()} == files


def test_out_into_a_run_directory_without_a_checkpoint_yet_is_a_run(run, capsys):
    """A run stopped before its first checkpoint left config.json and log.jsonl: that is a run's folder."""
    for name in ("ckpt.pt", "ckpt.prev.pt", "best.pt"):
        (run / name).unlink(missing_ok=True)
    code, _, err = _cli(capsys, _args(run))
    assert code == 0, err


def test_resume_with_the_runs_own_seed_goes_on(run, capsys):
    seed = load_checkpoint(run)["train_config"]["seed"]
    code, out, err = _cli(capsys, _args(run, "--resume", "--steps", "3", "--seed", seed))
    assert code == 0 and "seed" not in out, err
    code, out, err = _cli(capsys, _args(run, "--resume", "--steps", "4", "--seed", seed + 1))
    assert code == 2 and _one_line_error(err, f"--seed {seed + 1} with --resume") and out == ""
