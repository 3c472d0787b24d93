"""Tests for training/signals.py: a stop asked for during a long pass between steps (validation) ends it
within one batch, in this process and in a real one sent SIGTERM; under torchrun all ranks agree."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt2ladder.training.signals import StopRequested, StopSignals, until_stopped


def test_a_pass_without_a_stop_sees_every_batch():
    with StopSignals() as stop:
        assert list(until_stopped(range(5), stop)) == [0, 1, 2, 3, 4]
    assert list(until_stopped(range(3), None)) == [0, 1, 2]  # nothing to poll: the save's one-batch check


def test_a_sigterm_mid_pass_ends_it_before_the_next_batch():
    seen = []
    with StopSignals() as stop:
        with pytest.raises(StopRequested):
            for batch in until_stopped(range(10), stop):
                seen.append(batch)
                if batch == 3:
                    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at once, in this thread
        assert stop.signum == signal.SIGTERM and stop.requested
    assert seen == [0, 1, 2, 3]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the previous handler is back


def test_under_torchrun_every_rank_leaves_at_the_same_batch():
    """Only another rank was signalled: `agree` (the all-reduce) says so, and this rank stops too."""
    calls = []

    def any_rank_asked(mine: bool) -> bool:
        calls.append(mine)
        return len(calls) == 3  # the other rank's signal is seen at the third check

    with StopSignals() as stop:
        with pytest.raises(StopRequested):
            list(until_stopped(range(10), stop, any_rank_asked))
    assert calls == [False, False, False]  # called before every batch, this rank never signalled itself


VALIDATION = """import sys, time
from gpt2ladder.training.signals import StopRequested, StopSignals, until_stopped

with StopSignals() as stop:
    print("validating", flush=True)
    done = 0
    try:
        for _ in until_stopped(range(100), stop):
            time.sleep(0.1)  # one validation batch
            done += 1
    except StopRequested:
        print(f"stopped after {done} batches", flush=True)
        sys.exit(128 + stop.signum)
print("all 100 batches", flush=True)
"""


def test_a_real_process_sent_sigterm_during_a_ten_second_validation_stops_within_a_batch():
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", VALIDATION], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "validating\n"
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        waited = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 143 and out.startswith("stopped after") and "all 100" not in out
    assert int(out.split()[2]) < 100 and waited < 5  # a batch is 0.1 s; the whole pass would be 10 s
