"""The training loop's wiring: batches through the prefetcher and from a corpus of shards, steps read back
late as on a GPU (forced on the CPU), validation that a signal ends between batches, HellaSwag and a target
validation loss. tests/training/test_trainer.py covers the loop's older duties; tests/training/test_loop_gpu.py
its GPU timing."""

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt2ladder import cli, data
from gpt2ladder.data import shards as fmt
from gpt2ladder.data.corpus import ShardedTokens
from gpt2ladder.data.loader import ORDER
from gpt2ladder.errors import LadderError, UsageError
from gpt2ladder.evals import runner
from gpt2ladder.runtime.distributed import Dist
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect
from gpt2ladder.training import trainer as trainer_mod
from gpt2ladder.training.checkpoint import load_checkpoint
from gpt2ladder.training.loading import load_model
from gpt2ladder.training.run import prepared_hellaswag
from gpt2ladder.training.runlog import Reporter, read_log, scalars
from training_support import (  # noqa: F401 (real_text_offline: an autouse fixture)
    CPU, nan_at_step, real_text_offline, signal_at_step, small_config, train_in)



_cfg, _train = small_config, train_in


def _log(out) -> list[dict]:
    return read_log(out / "log.jsonl")


@pytest.fixture
def lagged(monkeypatch):
    """The loop as it runs on a GPU: each step read back two steps after it was queued (a CPU has no
    device to wait for, so only the reading is late, which is what the bookkeeping must get right)."""
    monkeypatch.setattr(trainer_mod, "readback_lag", lambda device: 2)


@pytest.fixture
def when_logged(monkeypatch):
    """(the step an entry is for, the step the loop had queued when it was logged), for every entry."""
    seen, real = [], Reporter.step
    current = {}

    def step(self, entry):
        seen.append((entry["step"], current["trainer"].step))
        real(self, entry)

    real_init = trainer_mod.Trainer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        current["trainer"] = self

    monkeypatch.setattr(Reporter, "step", step)
    monkeypatch.setattr(trainer_mod.Trainer, "__init__", init)
    return seen


# --- steps read back late -------------------------------------------------------------------------


def test_steps_read_back_late_give_the_synchronous_log_complete_and_in_order(tmp_path, monkeypatch, when_logged):
    cfg = _cfg(steps=9, eval_every=4, ckpt_every=0)
    _train(cfg, tmp_path / "sync")
    monkeypatch.setattr(trainer_mod, "readback_lag", lambda device: 2)
    when_logged.clear()
    _train(cfg, tmp_path / "late")
    fields = ("step", "loss", "lr", "val_loss")
    sync, late = _log(tmp_path / "sync"), _log(tmp_path / "late")
    assert [{k: e.get(k) for k in fields} for e in late] == [{k: e.get(k) for k in fields} for e in sync]
    # logged two steps late, except where the loop needs every step: validation at 4 and 8, the end at 9
    assert when_logged == [(1, 3), (2, 4), (3, 4), (4, 4), (5, 7), (6, 8), (7, 8), (8, 8), (9, 9)]


def test_a_non_finite_loss_read_back_late_stops_naming_its_step_before_any_save(tmp_path, monkeypatch, lagged):
    calls, saved = nan_at_step(monkeypatch, tmp_path, 5)
    with pytest.raises(LadderError) as err:
        _train(_cfg(steps=10, ckpt_every=3), tmp_path)  # step 6's checkpoint reads step 5 first
    message = str(err.value)
    assert "the loss became nan at step 5" in message and "still holds step 3" in message
    assert (tmp_path / "ckpt.pt").read_bytes() == saved["bytes"]
    assert [e["step"] for e in _log(tmp_path)] == [1, 2, 3, 4]
    assert len(calls) == 6  # step 6 ran on the bad weights, and was never saved


def test_a_non_finite_loss_between_points_is_found_two_steps_later(tmp_path, monkeypatch, lagged):
    real_step, calls = Engine.step, []

    def inf_at_second(self, x, y):
        calls.append(1)
        loss = real_step(self, x, y)
        return torch.tensor(float("inf")) if len(calls) == 2 else loss

    monkeypatch.setattr(Engine, "step", inf_at_second)
    with pytest.raises(LadderError, match="the loss became inf at step 2; .*no checkpoint was written"):
        _train(_cfg(steps=10), tmp_path)
    assert len(calls) == 4 and [e["step"] for e in _log(tmp_path)] == [1]
    assert not (tmp_path / "ckpt.pt").exists()


def test_a_signal_with_steps_in_flight_logs_them_all_before_the_save(tmp_path, monkeypatch, lagged):
    signal_at_step(monkeypatch, 4, signal.SIGTERM)
    result = _train(_cfg(steps=20), tmp_path)
    assert result.exit_code == 143 and result.step == 4
    assert [e["step"] for e in _log(tmp_path)] == [1, 2, 3, 4]
    state = load_checkpoint(tmp_path)
    assert state["step"] == 4 and state["data"]["position"] == 4  # the prefetcher's, not what it made ahead


# --- the prefetcher ---------------------------------------------------------------------------------


def test_the_checkpoint_holds_the_batch_the_next_step_takes_and_the_thread_is_gone(tmp_path):
    _train(_cfg(steps=5, ckpt_every=2), tmp_path)
    assert load_checkpoint(tmp_path / "ckpt.prev.pt")["data"]["position"] == 4  # made ahead: 5, 6, ...
    assert load_checkpoint(tmp_path)["data"]["position"] == 5
    assert not [t for t in threading.enumerate() if t.name == "gpt2ladder-prefetch"]
    assert "host_ms" not in _log(tmp_path)[0]  # the CPU's log keeps its keys


# --- a corpus of shards ----------------------------------------------------------------------------


def _corpus(tmp_path, n_train=3, train_tokens=3000, val_tokens=600) -> data.TokenData:
    """Shards of distinct tokens (token = its position), so a window names itself."""
    shards, at = [], 0
    for i in range(n_train):
        path = tmp_path / fmt.shard_name("c", "train", i + 1)
        fmt.write_shard(path, np.arange(at, at + train_tokens, dtype=np.uint16))
        shards.append(fmt.open_shard(path, fmt.LLMC))
        at += train_tokens
    val = tmp_path / fmt.shard_name("c", "val", 0)
    fmt.write_shard(val, np.arange(at, at + val_tokens, dtype=np.uint16))
    return data.TokenData(ShardedTokens(shards), ShardedTokens([fmt.open_shard(val, fmt.LLMC)]), "c", "id",
                          at + val_tokens)


def _rows(x) -> set[tuple[int, ...]]:
    return {tuple(r) for r in x.tolist()}


def test_two_ranks_train_on_disjoint_shard_windows_that_make_up_the_one_process_batch(tmp_path):
    """The trainer hands its rank to the ordered loader (tests/data/test_loader.py checks the loader's split)."""
    corpus, cfg = _corpus(tmp_path), _cfg(tokens_per_step=4 * 32)  # 2 ranks x micro-batch 2 x 32 tokens
    caps = detect(CPU)
    ranks = [trainer_mod.Trainer(cfg, CPU, tmp_path / f"r{r}", corpus, Dist(rank=r, world_size=2), caps=caps)
             for r in (0, 1)]
    one = trainer_mod.Trainer(cfg, CPU, tmp_path / "one", corpus, caps=caps)
    assert all(type(t.batches) is data.OrderedBatches for t in (*ranks, one))
    seen = set()
    for step in range(5):
        mine = [_rows(t.batches.batch(step)[0]) for t in ranks]
        assert not mine[0] & mine[1] and mine[0] | mine[1] == _rows(one.batches.batch(step)[0])
        assert not (mine[0] | mine[1]) & seen  # no window twice in an epoch
        seen |= mine[0] | mine[1]


def test_val_tokens_are_the_start_of_the_validation_shards(tmp_path):
    corpus = _corpus(tmp_path)
    trainer = trainer_mod.Trainer(_cfg(tokens_per_step=128, eval_every=1, val_tokens=320), CPU, tmp_path / "r",
                                  corpus, caps=detect(CPU))
    x = torch.cat([x for x, _ in trainer.val])
    # 320 tokens are 10 windows of 32; whole batches of a step's 4 sequences: 8, cut to micro-batches of 2
    assert [len(b) for b, _ in trainer.val] == [2, 2, 2, 2]
    first = len(corpus.train)
    assert torch.equal(x, first + torch.arange(8 * 32).view(8, 32))
    default = trainer_mod.Trainer(_cfg(tokens_per_step=128, eval_every=1), CPU, tmp_path / "d", corpus,
                                  caps=detect(CPU))
    assert sum(len(b) for b, _ in default.val) == 2 * 4  # --eval-batches 2 steps' worth


def _jsonl_of_shakespeare(path: Path, chars: int = 200_000) -> Path:
    text = data.fetch_tinyshakespeare(download=False).read_text()[:chars]
    with open(path, "w") as f:
        for doc in filter(str.strip, text.split("\n\n")):
            f.write(json.dumps({"text": doc}) + "\n")
    return path


def _run(args, env=None):
    return subprocess.run([sys.executable, "-m", "gpt2ladder", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.mark.slow  # prepare and three short runs in fresh processes: about 30 s on two cores
def test_a_run_on_shards_resumed_from_its_previous_checkpoint_gives_the_straight_runs_losses(tmp_path):
    shards = tmp_path / "shards"
    done = _run(["prepare", _jsonl_of_shakespeare(tmp_path / "docs.jsonl"), shards, "--val-tokens", "2K",
                 "--shard-tokens", "10K", "--workers", "1", "--no-progress"])
    assert done.returncode == 0, done.stderr
    assert len(list(shards.glob("*_train_*.bin"))) > 3
    train = ["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--batch-size", "2", "--seq-len",
             "32", "--tokens-per-step", "128", "--steps", "6", "--ckpt-every", "3", "--eval-every", "3",
             "--val-tokens", "320", "--eval-batches", "2", "--no-progress", "--data", shards]
    straight = _run([*train, "--out", tmp_path / "straight"])
    assert straight.returncode == 0, straight.stderr
    copy = shutil.copytree(tmp_path / "straight", tmp_path / "copy")
    (copy / "ckpt.pt").unlink(), (copy / "best.pt").unlink()
    resumed = _run([*train, "--out", copy, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step 3" in resumed.stdout
    a, b = _log(tmp_path / "straight"), _log(copy)
    assert [e["step"] for e in b] == list(range(1, 7))
    assert [e["loss"] for e in b[3:]] == [e["loss"] for e in a[3:]]  # exact, steps 4-6
    assert b[5]["val_loss"] == a[5]["val_loss"] and b[2]["val_loss"] == a[2]["val_loss"]
    assert load_checkpoint(copy)["data"]["order"] == ORDER  # the ordered loader's position, not Batches'


# --- a signal during validation ----------------------------------------------------------------------


def test_ctrl_c_in_a_long_validation_ends_it_between_batches_and_saves_the_step(tmp_path, monkeypatch):
    real_loss, calls = Engine.loss, []

    def loss_then_ctrl_c(self, x, y):
        if not torch.is_grad_enabled():  # a validation batch
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGINT)
        return real_loss(self, x, y)

    monkeypatch.setattr(Engine, "loss", loss_then_ctrl_c)
    result = _train(_cfg(steps=10, eval_every=1, eval_batches=500), tmp_path)
    assert result.exit_code == 130 and result.step == 1
    assert len(calls) == 4  # three batches, then the save's one-batch check of step 1's weights
    (entry,) = _log(tmp_path)
    assert entry["step"] == 1 and "val_loss" not in entry
    assert load_checkpoint(tmp_path)["step"] == 1 and not (tmp_path / "best.pt").exists()


def test_ctrl_c_in_a_validation_step_leaves_out_its_validation(tmp_path, monkeypatch):
    signal_at_step(monkeypatch, 3)
    result = _train(_cfg(steps=10, eval_every=3), tmp_path)
    assert result.exit_code == 130 and result.step == 3
    assert [("val_loss" in e) for e in _log(tmp_path)] == [False, False, False]
    assert load_checkpoint(tmp_path)["step"] == 3


def _ctrl_c_in_validation(monkeypatch, at_step: int):
    """Engine.loss sends this process Ctrl-C during the second validation batch of step `at_step`'s validation."""
    real_loss, current = Engine.loss, {}
    real_init, calls = trainer_mod.Trainer.__init__, []

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        current["trainer"] = self

    def loss(self, x, y):
        if not torch.is_grad_enabled() and current["trainer"].step == at_step:
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGINT)
        return real_loss(self, x, y)

    monkeypatch.setattr(trainer_mod.Trainer, "__init__", init)
    monkeypatch.setattr(Engine, "loss", loss)


def _figures(log: list[dict]) -> list[tuple]:
    return [(e["step"], e["loss"], e.get("val_loss"), (e.get("target") or {}).get("tokens")) for e in log]


@pytest.mark.parametrize("target", [None, "second"])
def test_a_validation_a_signal_cut_short_is_made_on_resume_as_if_never_interrupted(tmp_path, monkeypatch, capsys,
                                                                                   vals, target):
    target = vals[1]["val_loss"] if target else None
    cfg = _cfg(steps=6, eval_every=2, eval_batches=3, lr=3e-3, target_val_loss=target)
    straight = _train(cfg, tmp_path / "straight")
    assert straight.step == (4 if target else 6)  # the target is met at the validation cut short
    with monkeypatch.context() as patched:
        _ctrl_c_in_validation(patched, at_step=4)
        assert _train(cfg, tmp_path / "cut").exit_code == 130
    assert [("val_loss" in e) for e in _log(tmp_path / "cut")] == [False, True, False, False]
    assert (load_checkpoint(tmp_path / "cut").get("pending") or {}).get("step") == 4
    result = _train(cfg, tmp_path / "cut", resume=True)
    assert result.exit_code == 0 and result.step == straight.step
    assert _figures(_log(tmp_path / "cut")) == _figures(_log(tmp_path / "straight"))
    assert load_checkpoint(tmp_path / "cut")["pending"] is None
    if target:
        assert "reached the target" in capsys.readouterr().out.splitlines()[-1]


def test_a_run_that_saves_nothing_at_its_end_makes_its_last_validation_on_resume_and_saves_nothing(tmp_path,
                                                                                                   monkeypatch, capsys):
    """save_at_end off (a race's runs): the signal's checkpoint, which holds the last step with its validation cut
    short, is what --resume measures from; the run then ends without saving again, and says it wrote none."""
    cfg = _cfg(steps=4, eval_every=2, eval_batches=3, lr=3e-3, save_at_end=False)
    with monkeypatch.context() as patched:
        _ctrl_c_in_validation(patched, at_step=4)
        assert _train(cfg, tmp_path / "cut").exit_code == 130
    saved = (tmp_path / "cut" / "ckpt.pt").stat().st_mtime_ns
    capsys.readouterr()
    result = _train(cfg, tmp_path / "cut", resume=True)
    assert result.exit_code == 0 and result.step == 4 and "val_loss" in _log(tmp_path / "cut")[-1]
    assert (tmp_path / "cut" / "ckpt.pt").stat().st_mtime_ns == saved
    done = capsys.readouterr().out.splitlines()[-1]
    assert "measured step 4 again" in done and "ckpt.pt" not in done


def test_resuming_with_fewer_steps_than_the_checkpoint_holds_is_refused_and_all_of_them_changes_nothing(tmp_path):
    cfg = _cfg(steps=4, ckpt_every=2)
    _train(cfg, tmp_path)
    kept = {name: (tmp_path / name).read_bytes() for name in ("ckpt.pt", "config.json", "log.jsonl")}
    with pytest.raises(UsageError, match=f"{re.escape(str(tmp_path / 'ckpt.pt'))} holds step 4, past --steps 3: give "
                                        "--steps 4 or more to continue the run"):
        _train(dataclasses.replace(cfg, steps=3), tmp_path, resume=True)
    assert _train(dataclasses.replace(cfg, batch_size=1), tmp_path, resume=True).step == 4  # nothing left to train
    assert {name: (tmp_path / name).read_bytes() for name in kept} == kept


def test_a_run_extended_past_its_end_says_the_rate_it_goes_on_at(tmp_path, capsys):
    """Its schedule is planned for the new steps: the notice gives the next step's rate beside its last one's, the
    rates its log then holds."""
    cfg = _cfg(steps=6, ckpt_every=2)
    _train(cfg, tmp_path)
    capsys.readouterr()
    _train(dataclasses.replace(cfg, steps=12), tmp_path, resume=True)
    log = _log(tmp_path)
    assert log[6]["lr"] > 2 * log[5]["lr"]  # the cosine stretched over 12 steps: back near the peak
    assert (f"steps 6 -> 12; the learning rate follows the schedule for these settings: {log[6]['lr']:.3g} at step 7, "
            f"where step 6 trained at {log[5]['lr']:.3g}") in capsys.readouterr().out
    _train(dataclasses.replace(cfg, steps=12, lr=2e-3), tmp_path, resume=True)  # no step left: the rate is moot
    out = capsys.readouterr().out
    assert "lr 0.001 -> 0.002" in out and "learning rate follows" not in out


def test_a_run_that_reached_its_target_resumed_for_more_steps_says_no_rate(tmp_path, capsys, vals):
    cfg = _cfg(steps=8, eval_every=2, lr=3e-3, target_val_loss=vals[1]["val_loss"])
    assert _train(cfg, tmp_path).step == 4
    capsys.readouterr()
    assert _train(dataclasses.replace(cfg, steps=12), tmp_path, resume=True).step == 4  # done: nothing trains
    out = capsys.readouterr().out
    assert "nothing to do" in out and "steps 8 -> 12" in out and "learning rate follows" not in out


def test_a_warm_up_longer_than_the_run_is_said(tmp_path, capsys):
    _train(_cfg(steps=3, warmup_steps=6, lr=1e-3), tmp_path)
    log = _log(tmp_path)
    assert (f"notice: --warmup-steps 6 is more than --steps 3: the learning rate never reaches --lr 0.001 (its last "
            f"step trains at {log[-1]['lr']:.3g})") in capsys.readouterr().out
    assert log[-1]["lr"] == pytest.approx(0.5e-3)


def test_a_run_that_reached_its_target_has_nothing_to_do_on_resume(tmp_path, capsys, vals):
    cfg = _cfg(steps=8, eval_every=2, lr=3e-3, target_val_loss=vals[1]["val_loss"])
    assert _train(cfg, tmp_path).step == 4
    log = (tmp_path / "log.jsonl").read_bytes()
    capsys.readouterr()
    result = _train(cfg, tmp_path, resume=True)
    assert result.exit_code == 0 and result.step == 4
    assert (tmp_path / "log.jsonl").read_bytes() == log  # no step trained, no second "target"
    assert "nothing to do" in capsys.readouterr().out
    config = (tmp_path / "config.json").read_bytes()
    assert _train(dataclasses.replace(cfg, batch_size=1), tmp_path, resume=True).step == 4
    assert (tmp_path / "config.json").read_bytes() == config  # nothing trained: no setting recorded as if it had
    lower = _cfg(steps=5, eval_every=2, lr=3e-3, target_val_loss=vals[1]["val_loss"] / 2)
    assert _train(lower, tmp_path, resume=True).step == 5  # a lower target trains on


def _train_process(out, *extra):
    return [sys.executable, "-m", "gpt2ladder", "train", "--device", "cpu", "--preset", "tiny", "--rungs",
            "baseline", "--batch-size", "2", "--seq-len", "32", "--steps", "100", "--no-progress", "--out", str(out),
            *extra]


@pytest.mark.slow  # a real process, which takes a few seconds to start
def test_sigterm_during_a_long_validation_exits_143_within_seconds_with_the_step_saved(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(_train_process(tmp_path, "--eval-every", "1", "--eval-batches", "5000"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not proc.stdout.readline().startswith("model:"):  # the line before the loop starts
            assert proc.poll() is None, proc.stderr.read()
        time.sleep(3)  # step 1 takes well under a second; its validation of 5,000 batches far longer
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        waited = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert waited < 20, waited  # the whole validation takes over a minute here (a loaded machine slows the save)
    assert "stopped by SIGTERM after step 1" in out and err == ""
    assert [("val_loss" in e) for e in _log(tmp_path)] == [False]
    assert load_checkpoint(tmp_path)["step"] == 1


# --- HellaSwag -----------------------------------------------------------------------------------------


def _hellaswag_file(path: Path) -> Path:
    """Three examples in the official file's format."""
    rows = [("A man is sitting on a roof. he", ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
             "is holding a rubik's cube.", "starts pulling up roofing on a roof."], 3),
            ("A woman is outside with a bucket and a dog. The dog", ["runs away.", "gets into the bath tub.",
             "uses a hose to wash the car.", "sleeps."], 0),
            ("Two people are standing in a kitchen. They", ["cook pasta.", "dance", "paint the walls blue.",
             "sing a song"], 0)]
    with open(path, "w") as f:
        for i, (ctx, endings, label) in enumerate(rows):
            f.write(json.dumps({"ind": i, "activity_label": "Test", "ctx": ctx, "ctx_a": ctx, "ctx_b": "",
                                "endings": endings, "label": label, "split": "val", "source_id": f"t~{i}"}) + "\n")
    return path


def test_hellaswag_every_n_steps_and_at_the_last_scores_the_runs_weights_outside_the_timed_steps(
        tmp_path, monkeypatch, capsys):
    real_evaluate, results, skipped = runner.evaluate, [], [0.0]
    real_clock = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + skipped[0])  # every clock of the run

    def slow_evaluate(*args, **kwargs):
        skipped[0] += 1000.0  # 1000 s pass while HellaSwag runs: inside a step, that step's ms would show it
        results.append(real_evaluate(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(runner, "evaluate", slow_evaluate)
    cfg = _cfg(steps=3, hellaswag_every=2, hellaswag_data=str(_hellaswag_file(tmp_path / "hs.jsonl")))
    _train(cfg, tmp_path / "run")
    log = _log(tmp_path / "run")
    assert [("hellaswag" in e) for e in log] == [False, True, True]
    assert [("clock" in e) for e in log] == [False, True, True]  # the run's clock, after each scoring
    assert [round(e["clock"]["hellaswag_s"], -3) for e in log[1:]] == [1000.0, 2000.0]
    assert log[2]["clock"]["wall_s"] > 2000.0
    entry = log[2]["hellaswag"]
    assert entry["task"] == "hellaswag" and entry["n"] == 3 and entry["official"] is False
    assert entry["acc"] == results[-1].acc and entry["acc_norm"] == results[-1].acc_norm
    assert all(e["ms"] < 100_000 for e in log)
    reported = re.search(r"HellaSwag (\d+\.\d) s", capsys.readouterr().out)  # reported apart, between the steps
    assert reported and 2000.0 <= float(reported.group(1)) < 2060.0  # the 2000 s skipped, and the real time
    # what the run scored is what `eval` computes on the weights saved at that step
    model = load_model(tmp_path / "run", CPU, notify=lambda *a: None).model
    direct = real_evaluate(runner.prepare("hellaswag", cfg.hellaswag_data), model, device=CPU,
                           block_size=model.config.block_size, vocab_size=model.config.vocab_size, batch_size=4,
                           progress=False)
    torch.testing.assert_close(results[-1].sums, direct.sums)
    assert not torch.equal(results[0].sums, results[1].sums)  # step 2's weights, then step 3's


def test_hellaswag_offline_without_the_set_is_evals_one_line_before_anything_is_said(tmp_path, capsys, monkeypatch):
    text = _text(tmp_path)
    monkeypatch.setenv("GPT2LADDER_CACHE", str(tmp_path / "empty-cache"))
    code = cli.main(["train", "--device", "cpu", "--preset", "tiny", "--rungs", "baseline", "--steps", "2",
                     "--data", str(text), "--hellaswag-every", "1", "--no-progress",
                     "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "the HellaSwag validation set is not in the cache and could not be downloaded" in err
    assert "or pass --hellaswag-data FILE" in err
    assert not (tmp_path / "run" / "log.jsonl").exists()


def _text(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    if not path.exists():
        path.write_text(data.fetch_tinyshakespeare(download=False).read_text()[:20_000])
    return path


def test_nested_log_values_are_tensorboard_scalars_by_path():
    entry = {"step": 3, "loss": 2.5, "mfu": None, "hellaswag": {"acc": 0.25, "n": 4, "official": True, "task": "h"},
             "target": {"val_loss": 3.0, "train_s": 1.5}}
    assert scalars(entry) == {"loss": 2.5, "hellaswag/acc": 0.25, "hellaswag/n": 4, "target/val_loss": 3.0,
                              "target/train_s": 1.5}


def test_a_log_entry_is_read_with_its_clock_or_without_one_and_skipped_with_a_damaged_one(tmp_path):
    lines = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.9, "val_loss": 3.1, "clock": {"wall_s": 1.5}},
             {"step": 3, "loss": 2.8, "val_loss": 3.0, "clock": 1.5}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert read_log(tmp_path / "log.jsonl") == lines[:2]  # an older version's entry has no clock


def test_without_hellaswag_every_nothing_is_read():
    assert prepared_hellaswag(_cfg()) is None


# --- a target validation loss ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vals(shakespeare_cache, module_tmp) -> list[dict]:
    """The validations of a run validating every 2 steps, to choose a target from (made once)."""
    out = module_tmp("curve") / "run"
    _train(_cfg(steps=4, eval_every=2, lr=3e-3), out)
    return [e for e in _log(out) if "val_loss" in e]


def test_a_target_stops_at_the_first_validation_at_or_below_it_and_logs_what_it_took(tmp_path, capsys, vals):
    assert vals[0]["val_loss"] > vals[1]["val_loss"]  # step 2 misses a target that step 4 meets exactly
    target = vals[1]["val_loss"]
    result = _train(_cfg(steps=8, eval_every=2, lr=3e-3, target_val_loss=target), tmp_path / "run")
    out = capsys.readouterr().out
    assert result.exit_code == 0 and result.step == 4
    log = _log(tmp_path / "run")
    assert [e["step"] for e in log] == [1, 2, 3, 4] and "target" not in log[1]
    got = log[3]["target"]
    assert got == {"val_loss": target, **log[3]["clock"]}  # the clock after the validation that reached it
    assert [("clock" in e) for e in log] == [False, True, False, True]  # on the validations only
    assert got["val_loss"] == target and got["tokens"] == 4 * 64 and got["warmup_steps"] == 1
    assert got["warmup_s"] == pytest.approx(log[0]["ms"] / 1000, abs=2e-3)  # step 1 compiles (here: warms up)
    assert got["train_s"] == pytest.approx(sum(e["ms"] for e in log[1:]) / 1000, abs=2e-3)
    assert got["wall_s"] > got["train_s"] + got["warmup_s"] and got["validation_s"] > 0 and got["from_step"] == 0
    assert load_checkpoint(tmp_path / "run")["step"] == 4 and load_checkpoint(tmp_path / "run" / "best.pt")["step"] == 4
    assert f"reached the target {target:g} at step 4: {got['train_s']:.1f} s of training" in out
    assert f"{got['warmup_s']:.1f} s more in 1 warm-up step" in out and "256 tokens" in out
    assert "capture" not in out  # a CPU captures no CUDA graph


def test_the_target_line_says_what_its_warm_up_steps_did_after_one_step_or_several():
    from types import SimpleNamespace

    from gpt2ladder.model.setup import Setup
    from gpt2ladder.training.run import _target_text

    def text(warm: int, device: str, **setup) -> str:
        got = {"step": 4, "from_step": 0, "train_s": 1.0, "warmup_s": 2.0, "warmup_steps": warm, "wall_s": 4.0,
               "tokens": 256}
        return _target_text(SimpleNamespace(cfg=SimpleNamespace(target_val_loss=5.0), reached=got, last_val_loss=4.9,
                                            step=4, engine=SimpleNamespace(setup=Setup(**setup)),
                                            device=torch.device(device)))

    assert "(the timed steps; 2.0 s more in 1 warm-up step, which compiled), " in text(1, "cpu", compile=True)
    assert "2.0 s more in 2 warm-up steps, which compiled and captured), " in text(
        2, "cuda", compile=True, cuda_graph=True)
    assert "2.0 s more in 1 warm-up step, which captured), " in text(1, "cuda", cuda_graph=True)
    assert "2.0 s more in 1 warm-up step), " in text(1, "cpu")


def test_the_done_line_lists_every_file_the_session_wrote(tmp_path, capsys, vals):
    """ckpt.prev.pt and best.pt too; ckpt.pt with its step where it does not hold the last (a run that saves nothing
    at its end, here the target's step 4 after a checkpoint at step 3)."""
    _train(_cfg(steps=4, eval_every=2, ckpt_every=2), tmp_path / "run")
    done = capsys.readouterr().out.splitlines()[-1]
    assert done.endswith(f"; wrote {tmp_path / 'run'}/log.jsonl, ckpt.pt, ckpt.prev.pt, best.pt, loss.png")
    _train(_cfg(steps=8, eval_every=2, ckpt_every=3, lr=3e-3, target_val_loss=vals[1]["val_loss"],
                save_at_end=False), tmp_path / "kept")
    done = capsys.readouterr().out.splitlines()[-1]
    assert done.endswith(f"; wrote {tmp_path / 'kept'}/log.jsonl, ckpt.pt (step 3), best.pt, loss.png")


def test_a_session_of_one_step_gives_no_ms_per_step_its_warm_up_is_not_a_timed_step(tmp_path, capsys):
    """The first step of a session is its warm-up (compile, capture): with no other, no median is made of it."""
    _train(_cfg(steps=1), tmp_path)
    out = capsys.readouterr().out
    (entry,) = _log(tmp_path)
    assert f"one step this session ({entry['ms']:.1f} ms, a warm-up: no step timed apart from it)" in out
    assert "ms/step" not in out and "tokens/s" not in out
    _train(_cfg(steps=3), tmp_path, resume=True)  # its next session: step 2 warms up, step 3 is timed
    out = capsys.readouterr().out
    assert f"{_log(tmp_path)[-1]['ms']:.1f} ms/step (median)" in out


def test_every_validation_logs_the_runs_clock_as_it_stands_after_it(vals):
    """Without a target too: a target chosen after the run (the race's gpt2 rung) is timed from these."""
    first, second = (v["clock"] for v in vals)
    assert [v["step"] for v in vals] == [2, 4] and "target" not in vals[1]
    assert 0 < first["validation_s"] < second["validation_s"] and first["wall_s"] < second["wall_s"]
    assert (first["tokens"], second["tokens"]) == (2 * 64, 4 * 64)
    assert first["warmup_steps"] == second["warmup_steps"] == 1
    assert first["train_s"] < second["train_s"] and first["warmup_s"] == second["warmup_s"] > 0
    for clock in (first, second):
        assert clock["wall_s"] > clock["train_s"] + clock["warmup_s"] + clock["validation_s"]


def test_a_target_not_reached_runs_every_step_and_says_so(tmp_path, capsys):
    result = _train(_cfg(steps=4, eval_every=2, target_val_loss=0.5), tmp_path)
    assert result.exit_code == 0 and result.step == 4
    assert not any("target" in e for e in _log(tmp_path))
    assert "target val loss 0.5 not reached" in capsys.readouterr().out


def test_the_time_to_a_target_adds_up_across_a_resume(tmp_path, monkeypatch, vals):
    cfg = _cfg(steps=8, eval_every=2, ckpt_every=2, lr=3e-3, target_val_loss=vals[1]["val_loss"])
    real_step = signal_at_step(monkeypatch, 2)
    assert _train(cfg, tmp_path / "run").exit_code == 130
    monkeypatch.setattr(Engine, "step", real_step)
    result = _train(cfg, tmp_path / "run", resume=True)
    assert result.exit_code == 0 and result.step == 4
    log = _log(tmp_path / "run")
    got = log[3]["target"]
    assert got["tokens"] == 4 * 64 and got["warmup_steps"] == 2  # step 1, and step 3 after the resume
    assert got["warmup_s"] == pytest.approx((log[0]["ms"] + log[2]["ms"]) / 1000, abs=2e-3)
    assert got["train_s"] == pytest.approx((log[1]["ms"] + log[3]["ms"]) / 1000, abs=2e-3)
    assert got["from_step"] == 0
    assert [e["step"] for e in log if e.get("warmup")] == [1, 3]  # the log marks the steps the clock left out


def test_config_json_names_every_card_a_resumed_run_trained_on(tmp_path, monkeypatch):
    cfg = _cfg(steps=4, eval_every=2, ckpt_every=2)
    real_step = signal_at_step(monkeypatch, 2)
    assert _train(cfg, tmp_path / "run").exit_code == 130
    path = tmp_path / "run" / "config.json"
    first = json.loads(path.read_text())
    here = first["device"]["name"]
    assert first["cards"] == [here]
    path.write_text(json.dumps({**first, "device": {**first["device"], "name": "NVIDIA H100 80GB HBM3"},
                                "cards": ["NVIDIA H100 80GB HBM3"]}))  # as if the first session ran there
    monkeypatch.setattr(Engine, "step", real_step)
    assert _train(cfg, tmp_path / "run", resume=True).exit_code == 0
    assert json.loads(path.read_text())["cards"] == ["NVIDIA H100 80GB HBM3", here]
    assert _train(cfg, tmp_path / "fresh").exit_code == 0  # a fresh run names its own card alone
    assert json.loads((tmp_path / "fresh" / "config.json").read_text())["cards"] == [here]


def test_a_target_needs_validation():
    with pytest.raises(Exception, match="--target-val-loss needs validation"):
        _cfg(target_val_loss=3.0)
    for bad in (0.0, -1.0, math.inf, math.nan, math.log(50257), 50.0):  # at or above ln 50257: met untrained
        with pytest.raises(Exception, match=r"--target-val-loss must be a finite number above 0 and below 10\.8249 "):
            _cfg(eval_every=1, target_val_loss=bad)


def test_near_the_target_a_run_validates_more_often_and_resumed_validates_where_it_would_have(tmp_path, monkeypatch):
    """--eval-near: once a validation lands within eval_near nats above the target, validation comes every
    eval_every // 8 steps (here 1); a run stopped in the band and resumed validates at the steps the straight run
    did, its checkpoint holding that it is near. Without a target nothing changes."""
    def validated(out):
        return [e["step"] for e in _log(out) if "val_loss" in e]

    cfg = _cfg(steps=20, eval_every=8, ckpt_every=4, target_val_loss=0.5, eval_near=100.0)
    assert cfg.near_every == 1
    _train(cfg, tmp_path / "straight")
    assert validated(tmp_path / "straight") == [8, *range(9, 21)]
    _train(_cfg(steps=20, eval_every=8, target_val_loss=0.5), tmp_path / "grid")
    assert validated(tmp_path / "grid") == [8, 16, 20]
    _train(_cfg(steps=20, eval_every=8, eval_near=100.0), tmp_path / "no-target")
    assert validated(tmp_path / "no-target") == [8, 16, 20]
    real_step = signal_at_step(monkeypatch, 12)
    assert _train(cfg, tmp_path / "cut").exit_code == 130
    assert load_checkpoint(tmp_path / "cut")["near"] is True
    shutil.copytree(tmp_path / "cut", tmp_path / "moved")  # the same run, stopped at the same step
    monkeypatch.setattr(Engine, "step", real_step)
    _train(cfg, tmp_path / "cut", resume=True)
    assert validated(tmp_path / "cut") == validated(tmp_path / "straight")
    # resumed with another target: on the grid until a validation is near it
    _train(dataclasses.replace(cfg, target_val_loss=0.4), tmp_path / "moved", resume=True)
    assert validated(tmp_path / "moved") == [8, 9, 10, 11, *range(16, 21)]  # 12: due near the old target only
    with pytest.raises(Exception, match="--eval-near must be a finite number of nats >= 0"):
        _cfg(eval_near=-1.0)


def test_the_bar_on_a_terminal_shows_each_steps_own_loss_and_can_leave_nothing_behind(tmp_path, monkeypatch, capsys):
    """Each frame the bar draws gives the loss of the step its count names (it was the step before's); a bar made
    with leave=False (a race's run, whose line follows it) is cleared when the run ends."""
    from gpt2ladder.training import runlog

    monkeypatch.setattr(runlog, "on_terminal", lambda: True)
    entries = [{"step": n, "loss": 10.0 - n, "ms": 5.0, "tokens_per_s": 100.0, "mfu": None} for n in (1, 2, 3)]
    for leave in (True, False):
        out = tmp_path / f"leave-{leave}"
        out.mkdir()
        report = Reporter(out, _cfg(steps=5), is_main=True, progress=True, start=0, label="gpt2 seed 1", leave=leave)
        report.bar.mininterval, report.bar.miniters = 0, 1  # draw at every update
        capsys.readouterr()
        for entry in entries:
            report.step(entry)
        report.close()
        err = capsys.readouterr().err
        frames = [f for f in re.split(r"[\r\n]", err) if "/5" in f]
        for n in (1, 2, 3):
            drawn = [f for f in frames if f" {n}/5 " in f]
            assert drawn and all(f"loss {10.0 - n:.4f}" in f for f in drawn), frames
        assert all(f.lstrip().startswith("gpt2 seed 1:") for f in frames)
        last = err.rstrip("\n").split("\r")[-1]  # what the terminal's line holds once the run has ended
        assert ("3/5" in last) is leave and err.endswith("\n") is leave, repr(err[-200:])
