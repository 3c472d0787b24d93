"""Tests for training/ and `gpt2ladder train`: schedule, config, learning on real text, exact resume, failures,
signals."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from gpt2ladder import cli, data
from gpt2ladder.commands.defaults import COMPILE_BACKEND_ENV, defaults
from gpt2ladder.commands.train import config_from_args
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.ladder import resolve_rungs
from gpt2ladder.runtime.distributed import Dist
from gpt2ladder.runtime.engine import Engine, OptimConfig
from gpt2ladder.runtime.hardware import detect
from gpt2ladder.training import checkpoint, schedule
from gpt2ladder.training.checkpoint import load_checkpoint
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.runlog import read_log
from gpt2ladder.training.trainer import Trainer
from training_support import (  # noqa: F401 (real_text_offline: an autouse fixture)
    CPU, nan_at_step, one_line_error, real_text_offline, run_cli, signal_at_step, small_config, train_in)


def lr_at(step: int, cfg: TrainConfig) -> float:
    return schedule.lr_at(step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps)



_cfg, _train = small_config, train_in


def _cli_args(out, *extra) -> list[str]:
    return ["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2",
            "--seq-len", "32", "--steps", "6", "--ckpt-every", "3", "--eval-every", "0", "--no-progress",
            "--out", str(out), *extra]


_cli, _one_line_error = run_cli, one_line_error


# --- the schedule and the config ------------------------------------------------------------------


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    cfg = _cfg(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(4, cfg) == pytest.approx(5e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(55, cfg) == pytest.approx(5.5e-4)  # half way through the decay: the mean of lr and min_lr
    assert lr_at(100, cfg) == pytest.approx(1e-4) and lr_at(500, cfg) == pytest.approx(1e-4)
    after = [lr_at(s, cfg) for s in range(10, 100)]
    assert all(a > b for a, b in zip(after, after[1:]))
    assert min(after) > 1e-4
    assert lr_at(0, _cfg(steps=10, warmup_steps=0)) == pytest.approx(1e-3)  # no warm-up: start at the peak


@pytest.mark.parametrize("changes, message", [
    ({"seq_len": 512}, "--seq-len 512 exceeds the model's block size of 256"),
    ({"tokens_per_step": 100}, "--tokens-per-step 100 is not a multiple"),
    ({"steps": 0}, "--steps must be a positive integer"),
    ({"batch_size": -1}, "--batch-size must be a positive integer"),
    ({"eval_every": -1}, "--eval-every must be zero or more"),
    ({"lr": float("nan")}, "--lr must be a finite number"),
    ({"min_lr": 1.0}, "need 0 < --min-lr <= --lr"),
    ({"preset": "gpt5"}, "unknown preset 'gpt5'"),
])
def test_bad_config_is_a_one_line_usage_error(changes, message):
    with pytest.raises(UsageError) as err:
        _cfg(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_accumulation_must_divide_over_processes():
    cfg = _cfg(tokens_per_step=4 * 64)
    assert cfg.grad_accum(1) == 4 and cfg.grad_accum(2) == 2
    with pytest.raises(UsageError, match="x 3 = 192"):
        cfg.grad_accum(3)


def _args(**kw):
    """`train`'s flags as the parser gives them when none is on the command line, then `kw`."""
    args = cli.build_parser().parse_args(["train"])
    for name, value in kw.items():
        setattr(args, name, value)
    return args


def test_cpu_defaults_and_auto_rungs(monkeypatch):
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")
    caps = detect(CPU)
    cfg, strategy = config_from_args(_args(), CPU, caps)
    assert (cfg.preset, cfg.batch_size, cfg.seq_len, cfg.steps) == ("tiny", 8, 128, 200)
    assert cfg.tokens_per_step == 8 * 128 and cfg.grad_accum() == 1
    assert (cfg.warmup_steps, cfg.eval_every, cfg.ckpt_every) == (10, 20, 40)
    assert cfg.min_lr == pytest.approx(6e-5)
    assert cfg.rungs == tuple(resolve_rungs("auto", caps))
    assert cfg.compile_backend == "eager" and strategy is None
    gpu = defaults("train", torch.device("cuda"))
    assert {k: gpu[k] for k in ("preset", "batch_size", "seq_len", "steps")} == {"preset": "gpt2", "batch_size": 16,
                                                                                   "seq_len": None, "steps": 1000}
    assert (gpu["lr"], gpu["rungs"], gpu["seed"]) == (6e-4, "auto", 0)  # the same on every device


@pytest.mark.parametrize("steps", [1, 2, 5, 10, 20, 40, 60, 100, 200, 333, 1000, 5000])
def test_default_validation_is_a_bounded_share_of_the_run(steps):
    """With --eval-every and --eval-batches left to their defaults, all validations together take at most a fifth
    of a run (a validation batch costing about a third of a training step), short runs included."""
    from gpt2ladder.commands.train import validation_share

    cfg, _ = config_from_args(_args(steps=steps, rungs="baseline"), CPU, detect(CPU))
    assert validation_share(steps, cfg.eval_every, cfg.eval_batches) <= 0.2 or steps < 5
    assert 1 <= cfg.eval_batches <= 20 and cfg.eval_every >= 1
    given, _ = config_from_args(_args(steps=steps, rungs="baseline", eval_batches=7), CPU, detect(CPU))
    assert given.eval_batches == 7  # a number given is kept


def test_rungs_this_machine_cannot_run_are_left_out_with_a_reason():
    notes = []
    cfg, _ = config_from_args(_args(rungs="baseline,tf32,flash"), CPU, detect(CPU), notify=notes.append)
    assert cfg.rungs == ("baseline", "flash")
    assert len(notes) == 1 and "tf32" in notes[0] and "CUDA" in notes[0]


def test_auto_says_which_of_its_rungs_the_recipe_leaves_out_as_a_list_that_names_them_does():
    """--rungs auto for a recipe is doctor's list (the gpt2 recipe's) less the rungs the recipe declines: each is
    said once, in the words an explicit --rungs list gets (here on a CPU where the model compiles)."""
    from gpt2ladder.commands.train import usable_rungs
    from gpt2ladder.model.recipe import parse_recipe
    from gpt2ladder.runtime.hardware import Capabilities

    caps = Capabilities("cpu", "cpu (x86_64)", compile_problem=None)
    speedrun = parse_recipe("speedrun")
    tied = ("notice: leaving out rung tied_grad: the tied_grad rung's graph pass is written for GPT-2's own Blocks; "
            "recipe speedrun changes them")
    notes = []
    assert "tied_grad" not in usable_rungs("auto", caps, None, notes.append, speedrun) and notes == [tied]
    listed = []
    usable_rungs(",".join(resolve_rungs("auto", caps)), caps, None, listed.append, speedrun)
    assert listed == notes
    windowed = parse_recipe("speedrun+doc_windows")
    notes = []
    assert "flash" not in usable_rungs("auto", caps, None, notes.append, windowed)
    assert notes == ["notice: leaving out rung flash: the flash rung's causal SDPA is replaced by doc_windows' "
                     "attention within documents and a window (FlexAttention where compiled on a GPU)",
                     tied.replace("recipe speedrun", f"recipe {windowed.name}")]
    notes = []
    usable_rungs("auto", caps, None, notes.append)  # the gpt2 recipe: doctor's list itself
    assert notes == []


# --- learning -------------------------------------------------------------------------------------


def test_training_lowers_the_validation_loss_on_tiny_shakespeare(tmp_path):
    cfg = _cfg(preset="tiny", batch_size=4, seq_len=32, tokens_per_step=128, steps=24, lr=3e-3, min_lr=3e-4,
               warmup_steps=3, eval_every=8, eval_batches=4)
    result = _train(cfg, tmp_path)
    log = read_log(tmp_path / "log.jsonl")
    assert [e["step"] for e in log] == list(range(1, 25))
    assert all({"step", "loss", "lr", "ms", "tokens_per_s"} <= set(e) for e in log)
    assert abs(log[0]["loss"] - math.log(50257)) < 0.5  # an untrained model guesses uniformly
    vals = [e["val_loss"] for e in log if "val_loss" in e]
    assert [e["step"] for e in log if "val_loss" in e] == [8, 16, 24]
    assert vals[-1] < vals[0] - 0.5, vals
    assert result.exit_code == 0 and result.step == 24 and result.val_loss == vals[-1]
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((tmp_path / "config.json").read_text())
    assert record["train_config"]["steps"] == 24 and record["data"]["source"] == "tinyshakespeare"
    assert load_checkpoint(tmp_path)["step"] == 24


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    one = _train(_cfg(batch_size=4, tokens_per_step=128, steps=2), tmp_path / "one")
    two = _train(_cfg(batch_size=2, tokens_per_step=128, steps=2), tmp_path / "two")
    a, b = read_log(one.out / "log.jsonl"), read_log(two.out / "log.jsonl")
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
    assert len(a) == len(b) == 2


def test_training_and_evaluation_under_compile(tmp_path):
    eager = _train(_cfg(steps=4, eval_every=2), tmp_path / "eager")
    try:
        compiled = _train(_cfg(steps=4, eval_every=2, rungs=("baseline", "compile"), compile_backend="eager"),
                          tmp_path / "compiled")
    finally:
        torch._dynamo.reset()
    a, b = read_log(eager.out / "log.jsonl"), read_log(compiled.out / "log.jsonl")
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
    assert [e.get("val_loss") for e in b][1::2] == pytest.approx([e.get("val_loss") for e in a][1::2], rel=1e-5)
    state = load_checkpoint(compiled.out)
    assert state["setup"]["compile"] is True
    assert not [k for k in state["model"] if k.startswith(("_orig_mod.", "module."))]


def test_other_ranks_write_nothing_and_get_their_share_of_each_batch(tmp_path):
    cfg = _cfg(tokens_per_step=128, steps=2)  # 2 processes x micro-batch 2 x 32 tokens
    trainer = Trainer(cfg, CPU, tmp_path, data.load_tokens(None), Dist(rank=1, world_size=2), caps=detect(CPU))
    full = data.Batches(trainer.tokens.train, 4, 32, seed=0).batch(0)[0]
    assert torch.equal(trainer.batches.batch(0)[0], full[2:])
    result = _train(cfg, tmp_path, dist=Dist(rank=1, world_size=2))
    assert result.step == 2 and list(tmp_path.iterdir()) == []


# --- resume ---------------------------------------------------------------------------------------


def _subprocess_env() -> dict:
    # one thread: the same float operations in the same order in every process, so losses match bit for bit
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _train_args(out, *extra) -> list[str]:
    return [sys.executable, "-m", "gpt2ladder", "train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline",
            "--batch-size", "2", "--seq-len", "32", "--steps", "30", "--ckpt-every", "5", "--eval-every", "10",
            "--eval-batches", "2", "--no-progress", "--out", str(out), *extra]


def _wait_for_log(path, n_lines: int, proc, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().count("\n") >= n_lines:
            return
        assert proc.poll() is None, "the run ended before it could be interrupted"
        time.sleep(0.002)
    raise AssertionError(f"{path} did not reach {n_lines} lines")


KILL_9_RUN = ("--steps", "12", "--ckpt-every", "4", "--eval-every", "4")  # checkpoints at 4, 8, 12


@pytest.mark.slow
def test_kill_9_and_resume_gives_exactly_the_same_losses(tmp_path):
    env = _subprocess_env()
    subprocess.run(_train_args(tmp_path / "whole", *KILL_9_RUN), env=env, check=True, capture_output=True,
                   timeout=300)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_args(killed, *KILL_9_RUN), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # step 8's line is written just before step 8's checkpoint: the kill often lands mid-save
        _wait_for_log(killed / "log.jsonl", 8, proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    saved_step = load_checkpoint(killed)["step"]
    assert saved_step in (4, 8)
    resumed = subprocess.run(_train_args(killed, *KILL_9_RUN, "--resume"), env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {saved_step}" in resumed.stdout
    whole, again = read_log(tmp_path / "whole" / "log.jsonl"), read_log(killed / "log.jsonl")
    assert [e["step"] for e in again] == list(range(1, 13))  # no step logged twice
    assert [e["loss"] for e in again] == [e["loss"] for e in whole]  # exact float equality
    assert [e.get("val_loss") for e in again] == [e.get("val_loss") for e in whole]
    assert sorted(p.name for p in killed.iterdir()) == ["best.pt", "ckpt.prev.pt", "ckpt.pt", "config.json",
                                                        "log.jsonl", "loss.png"]  # no temp file, no lock left


@pytest.mark.slow
def test_sigterm_finishes_the_step_saves_and_exits_143(tmp_path):
    proc = subprocess.Popen(_train_args(tmp_path, "--steps", "1000", "--ckpt-every", "0"), env=_subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_log(tmp_path / "log.jsonl", 3, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    steps = [e["step"] for e in read_log(tmp_path / "log.jsonl")]
    assert load_checkpoint(tmp_path)["step"] == steps[-1] >= 3
    assert f"stopped by SIGTERM after step {steps[-1]}" in out and "--resume" in out
    assert err == ""


def test_ctrl_c_saves_and_restores_the_signal_handlers(tmp_path, monkeypatch):
    signal_at_step(monkeypatch, 3)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    result = _train(_cfg(steps=10, ckpt_every=0), tmp_path)
    assert result.exit_code == 130 and result.step == 3
    assert load_checkpoint(tmp_path)["step"] == 3
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _signal_during_setup(monkeypatch, signum=signal.SIGTERM):
    """The Engine, built while the Trainer is set up, sends this process `signum` (the model built, no step begun)."""
    real_init = Engine.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(Engine, "__init__", init)


def test_a_sigterm_during_the_set_up_ends_the_run_before_its_first_step_with_one_line(tmp_path, monkeypatch, capsys):
    _signal_during_setup(monkeypatch)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    result = _train(_cfg(steps=10, ckpt_every=0), tmp_path)
    assert result.exit_code == 143 and result.step == 0
    assert "stopped by SIGTERM before step 1 began: nothing was trained or saved" in capsys.readouterr().out
    assert not (tmp_path / "ckpt.pt").exists() and read_log(tmp_path / "log.jsonl") == []
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_during_a_resumes_set_up_keeps_its_checkpoint_as_it_was(tmp_path, monkeypatch, capsys):
    signal_at_step(monkeypatch, 3)
    assert _train(_cfg(steps=10, ckpt_every=0), tmp_path).exit_code == 130
    monkeypatch.undo()
    saved = (tmp_path / "ckpt.pt").read_bytes()
    capsys.readouterr()
    _signal_during_setup(monkeypatch, signal.SIGINT)
    result = _train(_cfg(steps=10, ckpt_every=0), tmp_path, resume=True)
    assert result.exit_code == 130 and result.step == 3
    assert (f"stopped by SIGINT before step 4 began: {tmp_path / 'ckpt.pt'} still holds step 3; continue with "
            "--resume") in capsys.readouterr().out
    assert (tmp_path / "ckpt.pt").read_bytes() == saved
    monkeypatch.undo()
    assert _train(_cfg(steps=10, ckpt_every=0), tmp_path, resume=True).exit_code == 0


@pytest.mark.parametrize("saved_graph, live_graph", [(False, True), (True, False), (False, False)])
def test_loading_an_engines_state_keeps_the_learning_rate_type(saved_graph, live_graph):
    """The CUDA-graph rung's learning rate is a device tensor a replayed graph reads in place."""
    from gpt2ladder.model.config import preset
    from gpt2ladder.model.setup import Setup

    saved = Engine(preset("tiny"), Setup(cuda_graph=saved_graph), CPU, optim=OptimConfig(lr=0.5))
    engine = Engine(preset("tiny"), Setup(cuda_graph=live_graph), CPU, optim=OptimConfig(lr=0.1))
    live_lr = engine.optimizer.param_groups[0]["lr"]
    engine.load_state_dict(saved.state_dict())
    lr = engine.optimizer.param_groups[0]["lr"]
    assert float(lr) == 0.5
    if live_graph:
        assert lr is live_lr  # the same tensor a captured CUDA graph would read
    else:
        assert isinstance(lr, float)


@pytest.fixture(scope="module")
def finished_run(module_tmp, shakespeare_cache):
    """A 6-step run with checkpoints at steps 3 and 6, made once; tests work on copies."""
    out = module_tmp("finished") / "run"
    assert cli.main(_cli_args(out)) == 0
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path):
    return shutil.copytree(finished_run, tmp_path / "run")


def test_resume_can_extend_a_finished_run(run_copy, capsys):
    code, out, _ = _cli(capsys, _cli_args(run_copy, "--steps", "8", "--resume"))
    assert code == 0
    assert "resuming from step 6" in out and "steps 6 -> 8" in out  # a changed setting is pointed out
    assert [e["step"] for e in read_log(run_copy / "log.jsonl")] == list(range(1, 9))
    assert load_checkpoint(run_copy)["step"] == 8


def test_resume_alone_continues_with_the_runs_own_settings(tmp_path, capsys, monkeypatch):
    """Stopped by Ctrl-C after step 2 of a run with no setting at its default, `train --resume` with no
    other flag continues that run: the same config, the losses of a run never stopped. A flag given with
    --resume changes its setting, and the one notice names exactly that change. (Step 2 measures nothing:
    a stop at a validation step would leave that validation out, as test_ctrl_c_at_a_validation_step shows.)"""
    settings = ["--preset", "tiny", "--rungs", "baseline", "--batch-size", "2", "--seq-len", "32",
                "--tokens-per-step", "128", "--steps", "6", "--lr", "2e-3", "--min-lr", "3e-4", "--warmup-steps", "1",
                "--weight-decay", "0.05", "--grad-clip", "0.5", "--eval-every", "3", "--eval-batches", "1",
                "--ckpt-every", "2", "--seed", "5", "--data", str(_text_file(tmp_path))]
    where = ["--device", "cpu", "--no-progress", "--out"]
    assert _cli(capsys, ["train", *settings, *where, str(tmp_path / "whole")])[0] == 0
    real_step = signal_at_step(monkeypatch, 2)
    run = tmp_path / "run"
    assert _cli(capsys, ["train", *settings, *where, str(run)])[0] == 130
    saved = load_checkpoint(run)["train_config"]
    monkeypatch.setattr(Engine, "step", real_step)
    code, out, _ = _cli(capsys, ["train", "--resume", *where, str(run)])
    assert code == 0 and "resuming from step 2" in out and "other settings" not in out
    assert load_checkpoint(run)["train_config"] == saved == load_checkpoint(tmp_path / "whole")["train_config"]
    def losses(folder):
        return [(e["step"], e["loss"], e.get("val_loss")) for e in read_log(folder / "log.jsonl")]

    assert [step for step, _, _ in losses(run)] == list(range(1, 7))
    assert losses(run) == losses(tmp_path / "whole")  # exact: the same batches, schedule and weights
    code, out, _ = _cli(capsys, ["train", "--resume", "--steps", "8", *where, str(run)])
    assert code == 0
    changed = [line for line in out.splitlines() if "other settings" in line]
    log = read_log(run / "log.jsonl")
    assert changed == ["notice: resuming with other settings than the checkpoint's: steps 6 -> 8; the learning rate "
                       f"follows the schedule for these settings: {log[6]['lr']:.3g} at step 7, where step 6 trained "
                       f"at {log[5]['lr']:.3g}"]
    assert load_checkpoint(run)["train_config"] == {**saved, "steps": 8}


def _text_file(tmp_path):
    """Tiny Shakespeare's first 40,000 characters, as a file given by --data."""
    path = tmp_path / "text.txt"
    path.write_text(data.fetch_tinyshakespeare(download=False).read_text()[:40_000])
    return path


def test_resume_with_another_model_names_the_fields(run_copy, capsys):
    args = _cli_args(run_copy, "--resume")
    args[args.index("baseline")] = "baseline,vocab"
    before = (run_copy / "ckpt.pt").read_bytes()
    code, _, err = _cli(capsys, args)
    assert code == 2 and _one_line_error(err) and "vocab_multiple 1 -> 128" in err
    assert (run_copy / "ckpt.pt").read_bytes() == before


def test_fresh_run_will_not_overwrite_a_checkpoint(run_copy, capsys):
    code, _, err = _cli(capsys, _cli_args(run_copy))
    assert code == 2 and _one_line_error(err) and "--resume" in err


def test_resume_without_a_checkpoint_is_one_line(tmp_path, capsys):
    code, _, err = _cli(capsys, _cli_args(tmp_path / "empty", "--resume"))
    assert code == 2 and _one_line_error(err) and "no checkpoint at" in err


def _damage(path, how: str) -> bytes:
    raw = bytearray(path.read_bytes())
    if how == "truncate":
        raw = raw[: len(raw) * 2 // 3]
    else:
        for i in range(len(raw) // 2, len(raw) // 2 + 64):  # bytes deep inside the tensor data
            raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    return bytes(raw)


@pytest.mark.parametrize("damage", ["truncate", "flip_bytes"])
def test_corrupt_checkpoint_alone_is_one_line_and_left_as_it_was(run_copy, capsys, damage):
    (run_copy / "ckpt.prev.pt").unlink()  # no older checkpoint to fall back on
    raw = _damage(run_copy / "ckpt.pt", damage)
    log_before = (run_copy / "log.jsonl").read_bytes()
    code, _, err = _cli(capsys, _cli_args(run_copy, "--resume"))
    assert code == 1 and _one_line_error(err)
    assert ("unreadable" if damage == "truncate" else "sha256") in err
    assert (run_copy / "ckpt.pt").read_bytes() == raw  # nothing was written over it
    assert (run_copy / "log.jsonl").read_bytes() == log_before


def test_a_corrupt_checkpoint_resumes_from_the_one_before_it(finished_run, run_copy, capsys):
    """(A truncated one falls back alike: tests/training/test_checkpoint.py.)"""
    raw = _damage(run_copy / "ckpt.pt", "flip_bytes")
    code, out, _ = _cli(capsys, _cli_args(run_copy, "--resume"))
    assert code == 0
    assert "ckpt.prev.pt (step 3)" in out and "resuming from step 3" in out and "ckpt.pt.damaged" in out
    assert (run_copy / "ckpt.pt.damaged").read_bytes() == raw  # kept for a look, out of the rotation
    assert load_checkpoint(run_copy)["step"] == 6
    again, whole = read_log(run_copy / "log.jsonl"), read_log(finished_run / "log.jsonl")
    assert [e["loss"] for e in again] == [e["loss"] for e in whole]


# --- failures -------------------------------------------------------------------------------------


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    calls, saved = nan_at_step(monkeypatch, tmp_path, 5)
    with pytest.raises(LadderError) as err:
        _train(_cfg(steps=10, ckpt_every=3), tmp_path)
    message = str(err.value)
    assert "at step 5" in message and "still holds step 3" in message and "\n" not in message
    assert (tmp_path / "ckpt.pt").read_bytes() == saved["bytes"]
    assert [e["step"] for e in read_log(tmp_path / "log.jsonl")] == [1, 2, 3, 4]


def test_non_finite_weights_are_never_saved(tmp_path, monkeypatch):
    real_step, calls = Engine.step, []

    def poison(self, x, y):
        loss = real_step(self, x, y)
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                self.raw_model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("inf")
        return loss  # the loss of this step was still finite

    monkeypatch.setattr(Engine, "step", poison)
    with pytest.raises(LadderError, match="weights became non-finite at step 2; .*no checkpoint was written"):
        _train(_cfg(steps=4, ckpt_every=2), tmp_path)
    assert not (tmp_path / "ckpt.pt").exists()


def test_huge_learning_rate_stops_with_one_line(tmp_path, capsys):
    code, _, err = _cli(capsys, _cli_args(tmp_path, "--lr", "1e30", "--ckpt-every", "1", "--eval-every", "1",
                                          "--eval-batches", "1"))
    assert code == 1 and _one_line_error(err) and "at step 1" in err and "lower --lr" in err
    assert not (tmp_path / "ckpt.pt").exists()  # step 1's weights were finite but useless: not saved


def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    real_save, saved = torch.save, {}

    def second_save_fails(obj, f, *args, **kwargs):
        if (tmp_path / "ckpt.pt").exists():
            saved["bytes"] = (tmp_path / "ckpt.pt").read_bytes()
            f.write(b"the first bytes of a checkpoint that will not fit")
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", second_save_fails)
    with pytest.raises(LadderError, match="could not write checkpoint .*No space left on device") as err:
        _train(_cfg(steps=6, ckpt_every=3), tmp_path)
    assert "\n" not in str(err.value)
    assert (tmp_path / "ckpt.pt").read_bytes() == saved["bytes"]
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert load_checkpoint(tmp_path)["step"] == 3
    assert not list(tmp_path.glob(".ckpt.pt.*"))


def test_missing_text_is_an_error_not_random_tokens(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "empty-cache"))
    code, _, err = _cli(capsys, _cli_args(tmp_path / "run"))
    assert code == 1 and _one_line_error(err) and "Tiny Shakespeare" in err and "--data" in err
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_tokens_per_step_must_divide_on_the_command_line(tmp_path, capsys):
    code, _, err = _cli(capsys, _cli_args(tmp_path, "--tokens-per-step", "100"))
    assert code == 2 and _one_line_error(err) and "--tokens-per-step 100" in err
