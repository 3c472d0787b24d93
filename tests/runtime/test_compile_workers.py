"""Inductor's compile workers in a session of their own (`runtime/compile_workers.py`): a SIGTERM sent to the
trainer's process group during a compile lets the compile end, where without it the trainer waited for ever."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch._inductor.compile_worker.subproc_pool")

# A trainer in miniature: it notes SIGTERM and goes on (training/signals.py), has Inductor's worker pool run four
# jobs of a second each on two workers, as a compile's kernels are, and says when they are in flight.
CHILD = textwrap.dedent("""
    import os, sys, time
    from gpt2ladder.runtime import compile_workers
    from gpt2ladder.training.signals import StopSignals
    detached = compile_workers.detach() if sys.argv[1] == "detach" else False
    import torch._inductor.config as config
    config.compile_threads = 2
    from torch._inductor.async_compile import AsyncCompile
    with StopSignals() as stop:
        AsyncCompile.warm_pool()
        AsyncCompile.wait_pool_ready()
        pool = AsyncCompile.process_pool()
        own = os.getsid(pool.process.pid) != os.getsid(0)
        jobs = [pool.submit(time.sleep, 1.0) for _ in range(4)]
        print("in flight", flush=True)
        done = sum(job.result() is None for job in jobs)
    print(f"detached {detached} own session {own} done {done} stop asked {stop.requested}", flush=True)
""")


@pytest.mark.slow
def test_a_sigterm_to_the_group_during_a_compile_leaves_its_workers_to_finish():
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, "detach"], stdout=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)  # its own group, which the test signals as timeout would
    try:
        assert child.stdout.readline().strip() == "in flight"
        os.killpg(child.pid, signal.SIGTERM)
        out, _ = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 0, out
    assert out.strip() == "detached True own session True done 4 stop asked True"


def test_every_inductor_compile_of_a_run_asks_for_the_workers_session_first(monkeypatch):
    import torch

    from gpt2ladder.model.config import preset
    from gpt2ladder.model.setup import Setup
    from gpt2ladder.runtime import compile_workers, optim
    from gpt2ladder.runtime.engine import Engine

    asked = []
    monkeypatch.setattr(compile_workers, "detach", lambda: asked.append(True) or True)
    Engine(preset("tiny"), Setup(compile=True), torch.device("cpu"), seed=0)  # Inductor, the default backend
    optim.compile_pass(lambda x: x, "inductor")
    assert len(asked) == 2
    Engine(preset("tiny"), Setup(compile=True), torch.device("cpu"), seed=0, compile_backend="eager")
    Engine(preset("tiny"), Setup(), torch.device("cpu"), seed=0)
    optim.compile_pass(lambda x: x, "eager")
    assert len(asked) == 2  # no Inductor, no workers
