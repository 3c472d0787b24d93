"""The training loop on a GPU: steps timed by CUDA events and read back a step late give the synchronous
loop's losses, and times that are the pace the run goes at (never more than the synchronous loop's host
clock, which also counts the GPU idle while each step is launched); the batches come from pinned memory; a
non-finite loss still stops the run at its step. Skipped without a GPU."""

import statistics
import time
import urllib.error
import urllib.request

import pytest
from gpu_support import GPU, needs_cuda

from gpt2ladder.errors import LadderError
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect
from gpt2ladder.training import trainer as trainer_mod
from gpt2ladder.training.checkpoint import load_checkpoint
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.run import run_training
from gpt2ladder.training.runlog import Reporter, read_log

pytestmark = pytest.mark.gpu

# Eager (no compile: seconds, not minutes) with the CUDA graph, so the step is the top rung's kind of step:
# one replay, with a classifier over 32 x 256 positions large enough that the GPU, not the host, sets its pace.
RUNGS = ("baseline", "tf32", "bf16", "flash", "vocab", "fused_adamw", "cuda_graph")


@pytest.fixture(autouse=True)
def _offline(shakespeare_cache, monkeypatch):
    def no_network(*args, **kwargs):
        raise urllib.error.URLError("network is off in tests")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


def _cfg(**kw) -> TrainConfig:
    base = dict(preset="tiny", rungs=RUNGS, batch_size=32, seq_len=256, tokens_per_step=32 * 256, steps=40,
                lr=1e-3, min_lr=1e-4, warmup_steps=5, eval_every=0, ckpt_every=0, seed=0)
    return TrainConfig(**{**base, **kw})


def _run(out, monkeypatch, lag: int, **kw) -> list[dict]:
    monkeypatch.setattr(trainer_mod, "readback_lag", lambda device: lag)
    run_training(_cfg(**kw), GPU, out, progress=False, caps=detect(GPU))
    return read_log(out / "log.jsonl")


@needs_cuda
def test_event_timed_steps_read_back_late_match_the_synchronous_loop(tmp_path, monkeypatch):
    queued_at_log, logged_at = [], []
    real_step = Reporter.step
    trainers = []
    real_init = trainer_mod.Trainer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        trainers.append(self)

    def step(self, entry):
        queued_at_log.append((entry["step"], trainers[-1].step))
        logged_at.append(time.perf_counter())
        real_step(self, entry)

    monkeypatch.setattr(trainer_mod.Trainer, "__init__", init)
    monkeypatch.setattr(Reporter, "step", step)
    sync = _run(tmp_path / "sync", monkeypatch, lag=0)  # float(loss) after every step, host clock around it
    queued_at_log.clear()
    logged_at.clear()
    late = _run(tmp_path / "late", monkeypatch, lag=1)
    assert trainers[-1].inflight.events  # CUDA events, not the host clock
    assert queued_at_log[:-1] == [(s, s + 1) for s in range(1, 40)]  # each step read with the next one queued
    assert [e["step"] for e in late] == list(range(1, 41))
    a, b = [e["loss"] for e in sync], [e["loss"] for e in late]
    assert b == pytest.approx(a, rel=1e-4)  # the same run (GPU reductions may round in another order)
    assert all(abs(b[i] - a[i]) < abs(b[i] - a[i + 1]) for i in range(10) if a[i] != a[i + 1])  # not shifted
    # The events time what the GPU did, and the run goes at that pace: with the next step queued, the host
    # logs step i as soon as the GPU has finished it, so the host clock between two logs is one step's time.
    # The synchronous loop's host clock also holds the GPU idle while the host launches each step (8.5 ms
    # against 9.7 for this tiny model on an H200): events never read more than it, give or take noise.
    event_ms, host_ms = statistics.median(e["ms"] for e in late[1:]), statistics.median(e["ms"] for e in sync[1:])
    pace_ms = statistics.median(1000 * (b - a) for a, b in zip(logged_at[1:-2], logged_at[2:-1]))
    assert event_ms == pytest.approx(pace_ms, rel=0.05), (event_ms, pace_ms)
    assert event_ms <= 1.02 * host_ms, (event_ms, host_ms)
    assert {"host_ms", "wait_ms"} <= set(late[0])  # the prefetcher's share, off the CPU only


@needs_cuda
def test_a_non_finite_loss_on_the_gpu_stops_at_its_step_with_nothing_saved_after_it(tmp_path, monkeypatch):
    real_step, calls = Engine.step, []

    def nan_at_fifth(self, x, y):
        calls.append(1)
        loss = real_step(self, x, y)
        return loss * float("nan") if len(calls) == 5 else loss  # on the device, as a real one would be

    monkeypatch.setattr(Engine, "step", nan_at_fifth)
    with pytest.raises(LadderError, match="the loss became nan at step 5; .*still holds step 4"):
        _run(tmp_path, monkeypatch, lag=1, steps=10, ckpt_every=4)
    assert [e["step"] for e in read_log(tmp_path / "log.jsonl")] == [1, 2, 3, 4]
    assert load_checkpoint(tmp_path)["step"] == 4
