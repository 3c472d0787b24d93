"""What the training tests share: a tiny run's config, a run in a folder, stand-in steps (a NaN loss, a signal
at step n), and the real text offline with the global RNGs put back (tests/training/test_trainer.py,
test_loop.py)."""

import dataclasses
import os
import signal
import urllib.error
import urllib.request

import pytest
import torch

from gpt2ladder.model.config import preset
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect
from gpt2ladder.training.checkpoint import rng_state, set_rng_state
from gpt2ladder.training.config import TrainConfig
from gpt2ladder.training.run import run_training

CPU = torch.device("cpu")
CPU_CAPS = detect(CPU)  # what a command detects once and passes down
# The tiny preset narrowed from 128 to 32 wide: GPT-2's 50,257-token embedding and head are most of a tiny step's
# work, and the training loop's duties do not depend on the width.
NARROW = dataclasses.replace(preset("tiny"), n_embd=32)


@pytest.fixture(autouse=True)
def real_text_offline(shakespeare_cache, monkeypatch):
    """Every test of a module that imports this trains on the real Tiny Shakespeare from the cache, never
    the network; the global RNGs that training seeds and a resume restores are put back afterwards."""

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("network is off in tests")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    saved = rng_state()
    yield
    set_rng_state(saved)


def run_cli(capsys, args) -> tuple[int, str, str]:
    """The CLI's exit code, standard output and standard error for `args`."""
    from gpt2ladder import cli

    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> bool:
    """Whether standard error holds exactly one line, the CLI's error, and no traceback."""
    return err.startswith("gpt2ladder: error: ") and err.count("\n") == 1 and "Traceback" not in err


def small_config(**kw) -> TrainConfig:
    """A six-step run of the NARROW model on 64-token steps, without validation or checkpoints unless `kw` asks; a
    preset named in `kw` trains that preset's own model."""
    base = dict(preset="tiny", rungs=("baseline",), batch_size=2, seq_len=32, tokens_per_step=64, steps=6, lr=1e-3,
                min_lr=1e-4, warmup_steps=2, eval_every=0, eval_batches=2, ckpt_every=0, seed=0)
    if "preset" not in kw:
        base["model"] = NARROW
    return TrainConfig(**{**base, **kw})


def train_in(cfg: TrainConfig, out, **kw):
    return run_training(cfg, CPU, out, progress=False, **{"caps": CPU_CAPS, **kw})


def nan_at_step(monkeypatch, out, n: int) -> tuple[list, dict]:
    """Engine.step returns a NaN loss at its n-th call; (the calls so far, {"bytes": what out/ckpt.pt held
    when that step ran})."""
    real_step, calls, saved = Engine.step, [], {}

    def step(self, x, y):
        loss = real_step(self, x, y)
        calls.append(1)
        if len(calls) == n:
            saved["bytes"] = (out / "ckpt.pt").read_bytes()
            return torch.tensor(float("nan"))
        return loss

    monkeypatch.setattr(Engine, "step", step)
    return calls, saved


def signal_at_step(monkeypatch, n: int, signum: int = signal.SIGINT):
    """Engine.step sends this process `signum` at its n-th call, before the step runs (it arrives mid-step:
    the step still completes); returns the real Engine.step, to put back for a resume."""
    real_step, calls = Engine.step, []

    def step(self, x, y):
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signum)
        return real_step(self, x, y)

    monkeypatch.setattr(Engine, "step", step)
    return real_step
