"""Nothing lost: one process per run directory, a checkpoint only of weights known good, best.pt, the
last good checkpoint for --resume and sample, another text refused, a second Ctrl-C, no empty --out."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from gpt2ladder import cli, data
from gpt2ladder.runtime.distributed import Dist
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.training import checkpoint, lock
from gpt2ladder.training.checkpoint import load_checkpoint
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.runlog import read_log
from gpt2ladder.training.trainer import Trainer, run_training

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40


@pytest.fixture(autouse=True)
def _cache(shakespeare_cache):
    """Tiny Shakespeare from the session's cache, never the network."""


def _args(out, *extra) -> list[str]:
    return ["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2",
            "--seq-len", "32", "--steps", "6", "--ckpt-every", "3", "--eval-every", "0", "--no-progress",
            "--out", str(out), *extra]


def _cli(capsys, args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, *words) -> bool:
    return (err.startswith("gpt2ladder: error: ") and err.count("\n") == 1 and "Traceback" not in err
            and all(w in err for w in words))


@pytest.fixture(scope="module")
def good_run(tmp_path_factory, shakespeare_cache):
    """Six good steps, checkpoints at 3 and 6 (ckpt.prev.pt and ckpt.pt); tests work on copies."""
    out = tmp_path_factory.mktemp("good") / "run"
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
    assert _cli(capsys, _args(run, "--resume", "--steps", "7"))[0] == 0  # free again


def test_only_rank_0_locks(tmp_path):
    """Under torchrun rank 0 holds the directory; the other ranks never write there, so they do not lock."""
    held, _ = lock.try_lock(tmp_path)
    try:
        cfg = TrainConfig(preset="tiny", batch_size=2, seq_len=32, tokens_per_step=128, steps=2, warmup_steps=0,
                          eval_every=0, ckpt_every=0)
        result = run_training(cfg, torch.device("cpu"), tmp_path, progress=False, ranks=Dist(rank=1, world_size=2))
    finally:
        held.release()
    assert result.exit_code == 0 and result.step == 2


def test_without_fcntl_the_run_goes_on_unlocked_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lock, "CAN_LOCK", False)
    code, out, _ = _cli(capsys, _args(tmp_path / "run", "--steps", "1"))
    assert code == 0 and "no fcntl.flock" in out and not (tmp_path / "run" / ".lock").exists()


@pytest.mark.slow
def test_a_killed_holder_leaves_no_lock_behind(tmp_path, capsys):
    """A live run holds its directory; kill -9 ends the hold with the process (the file stays, unlocked)."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "gpt2ladder", *_args(out, "--steps", "100000", "--ckpt-every", "0")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (out / "log.jsonl").is_file() or not (out / "log.jsonl").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        code, _, err = _cli(capsys, _args(out, "--steps", "1"))
        assert code == 2 and _one_line_error(err, f"pid {proc.pid}")
    finally:
        proc.kill()
        proc.wait()
    assert (out / ".lock").exists()  # kill -9 ran no cleanup
    assert _cli(capsys, _args(out, "--steps", "1"))[0] == 0


# --- a checkpoint only of weights known good ------------------------------------------------------


@pytest.mark.parametrize("eval_every", ["1", "0"])
def test_a_diverged_but_finite_model_never_replaces_the_last_good_checkpoint(run, capsys, eval_every):
    """The issue's reproduction: resume a good run with --lr 1e6 --grad-clip 0 --ckpt-every 1. Step 7's
    weights are finite but useless (loss ~1e13); validation, or without it one batch, catches them."""
    before = (run / "ckpt.pt").read_bytes()
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "9", "--lr", "1e6", "--grad-clip", "0",
                                      "--ckpt-every", "1", "--eval-every", eval_every, "--eval-batches", "1"))
    assert code == 1 and _one_line_error(err, "at step 7", "ckpt.pt still holds step 6", "lower --lr")
    assert "exploded" in err or "non-finite" in err or "became nan" in err
    assert (run / "ckpt.pt").read_bytes() == before
    assert load_checkpoint(run / "ckpt.prev.pt")["step"] == 3
    assert _cli(capsys, ["sample", run, "--device", "cpu", "--num-tokens", "3"])[0] == 0


def test_best_pt_holds_the_lowest_validation_loss(tmp_path, monkeypatch):
    """Validation at 2, 4 and 6 (scripted); checkpoints at 3 and 6: best.pt is step 4, saved on its own."""
    scripted = {2: 9.0, 4: 7.0, 6: 8.0}
    monkeypatch.setattr(Trainer, "_mean_loss", lambda self, batches: scripted.get(self.step, 9.5))
    assert cli.main(_args(tmp_path / "run", "--eval-every", "2", "--eval-batches", "1")) == 0
    best, last = load_checkpoint(tmp_path / "run" / "best.pt"), load_checkpoint(tmp_path / "run")
    assert best["step"] == 4 and best["val_loss"] == 7.0
    assert last["step"] == 6 and last["val_loss"] == 8.0 and last["best"] == {"step": 4, "val_loss": 7.0}


def test_best_pt_is_ckpt_pt_itself_when_the_last_step_is_best(tmp_path, monkeypatch):
    monkeypatch.setattr(Trainer, "_mean_loss", lambda self, batches: 10.0 - self.step / 10)
    assert cli.main(_args(tmp_path / "run", "--eval-every", "3", "--eval-batches", "1")) == 0
    run = tmp_path / "run"
    assert os.stat(run / "best.pt").st_ino == os.stat(run / "ckpt.pt").st_ino  # a hard link: no extra space
    assert sorted(p.name for p in run.iterdir()) == ["best.pt", "ckpt.prev.pt", "ckpt.pt", "config.json",
                                                     "log.jsonl", "loss.png"]


def test_resume_keeps_the_best_so_far(run, capsys, monkeypatch):
    monkeypatch.setattr(Trainer, "_mean_loss", lambda self, batches: 5.0 if self.step == 7 else 6.0)
    assert _cli(capsys, _args(run, "--resume", "--steps", "9", "--eval-every", "1", "--eval-batches", "1"))[0] == 0
    assert load_checkpoint(run / "best.pt")["step"] == 7 and load_checkpoint(run)["best"]["step"] == 7


# --- the last good checkpoint is what --resume and sample use ---------------------------------------


def test_a_run_killed_between_the_renames_resumes_from_ckpt_prev(run, capsys):
    os.replace(run / "ckpt.pt", run / "ckpt.prev.pt")  # what a kill right after the first rename leaves
    code, _, err = _cli(capsys, ["sample", run, "--device", "cpu", "--num-tokens", "3"])
    assert code == 0 and "notice: no checkpoint at" in err and "ckpt.prev.pt (step 6)" in err
    code, out, _ = _cli(capsys, _args(run, "--resume", "--steps", "8"))
    assert code == 0 and "resuming from step 6 of" in out and "ckpt.prev.pt" in out
    assert load_checkpoint(run)["step"] == 8 and [e["step"] for e in read_log(run / "log.jsonl")] == list(range(1, 9))


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
    (tmp_path / "other.txt").write_text(TEXT)
    before = _files(run)
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "8", "--data", tmp_path / "other.txt"))
    assert code == 2 and _one_line_error(err, "another text", "tinyshakespeare", "other.txt", "--allow-data-change")
    assert _files(run) == before  # config.json too: its data hash is the checkpoint's
    code, out, _ = _cli(capsys, _args(run, "--resume", "--steps", "8", "--data", tmp_path / "other.txt",
                                      "--allow-data-change"))
    assert code == 0 and "notice: resuming on another text" in out
    assert load_checkpoint(run)["data_source"]["source"] == "other.txt"


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

    def ctrl_c_at_step_3(self, x, y):
        steps.append(1)
        if len(steps) == 3:
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
        return real_save(obj, CtrlCMidWrite(f) if len(steps) == 3 else f)

    monkeypatch.setattr(Engine, "step", ctrl_c_at_step_3)
    monkeypatch.setattr(checkpoint.torch, "save", save)
    code, _, err = _cli(capsys, _args(tmp_path / "run", "--steps", "10", "--ckpt-every", "2"))
    assert code == 130 and err == "gpt2ladder: interrupted\n"
    assert load_checkpoint(tmp_path / "run")["step"] == 2
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]  # no temp file, no lock


# --- what a run reads back: its log, its data file's name --------------------------------------------


def test_a_damaged_log_is_read_around_on_resume(run, capsys):
    with open(run / "log.jsonl", "ab") as f:  # stray bytes, a line of the wrong types, a cut line
        f.write(b"\xff\xfe garbage\n" + b'{"step": 9, "loss": "high"}\n' + b'{"step": 10, "lo')
    code, _, err = _cli(capsys, _args(run, "--resume", "--steps", "7"))
    assert code == 0, err
    assert [e["step"] for e in read_log(run / "log.jsonl")] == list(range(1, 8))
    assert (run / "loss.png").stat().st_size > 0


def test_a_data_file_whose_name_is_not_utf8_trains_and_plots(tmp_path, capsys):
    path = tmp_path / os.fsdecode(b"bad\xffname.txt")
    path.write_text(TEXT)
    code, out, err = _cli(capsys, _args(tmp_path / "run", "--data", path, "--seq-len", "16", "--steps", "2"))
    assert code == 0 and err == "" and "data: bad\ufffdname.txt" in out
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"
