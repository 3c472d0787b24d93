"""Shared pytest fixtures."""

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TEXT_ENV = "GPT2LADDER_TEST_TEXT"  # an explicit path to Tiny Shakespeare's input.txt


def pytest_configure(config):
    """Under pytest-xdist, each worker's PyTorch takes its share of the cores, not all of them: two workers of
    two intra-op threads each on CI's two cores wait on each other's threads (OpenMP spins while it waits)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def _real_text() -> Path | None:
    """Tiny Shakespeare from $GPT2LADDER_TEST_TEXT, else from the cache $GPT2LADDER_CACHE names."""
    if os.environ.get(TEXT_ENV):
        return Path(os.environ[TEXT_ENV])
    if os.environ.get("GPT2LADDER_CACHE"):
        return Path(os.environ["GPT2LADDER_CACHE"]) / "tinyshakespeare" / "input.txt"
    return None


@pytest.fixture(scope="module", autouse=True)
def _settled_heap():
    """The commands collect garbage between rungs and runs (`runtime/hardware.free_memory`), and a full
    collection walks every object the process holds: torch's, matplotlib's, every earlier module's, about
    0.3 s a time by the end of the suite. What is alive when a test module starts (after one collection)
    is frozen out of later collections, which then walk only what that module makes. Garbage is still
    collected; objects that outlive their module are no longer walked again."""
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(scope="session")
def shakespeare_cache(tmp_path_factory):
    """A fresh cache folder holding the real Tiny Shakespeare, set as $GPT2LADDER_CACHE for the session.

    The text is copied from $GPT2LADDER_TEST_TEXT or from the cache $GPT2LADDER_CACHE names (CI seeds
    one), never downloaded: tests run without network. Session-scoped so it is tokenized once.
    """
    source = _real_text()
    if source is None or not source.is_file():
        pytest.skip(f"the real Tiny Shakespeare was not found: set {TEXT_ENV} to its input.txt or "
                    "GPT2LADDER_CACHE to a cache that holds tinyshakespeare/input.txt")
    cache = tmp_path_factory.mktemp("gpt2ladder-cache")
    (cache / "tinyshakespeare").mkdir()
    shutil.copyfile(source, cache / "tinyshakespeare" / "input.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2LADDER_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request):
    """module_tmp(name): a new folder for a module's shared fixture, all of them removed when the module
    ends, unless a test failed meanwhile (kept to look at, as pyproject's tmp_path_retention_policy keeps a
    failed test's own folder). Those fixtures hold checkpoints of up to hundreds of MB, and the suite must fit
    the disk of a small CI machine."""
    failed = request.session.testsfailed
    root = tmp_path_factory.mktemp("module")

    def make(name: str) -> Path:
        path = root / name
        path.mkdir()
        return path

    yield make
    if request.session.testsfailed == failed:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def triton_interpret():
    """run(script, cases): `script` in a subprocess under Triton's CPU interpreter (TRITON_INTERPRET=1 is
    read at import, hence the subprocess), with the JSON of `cases` as its argument; returns the JSON
    it printed last."""
    def run(script: str, cases: list):
        src = str(Path(__file__).parents[1] / "src")
        # One intra-op thread: on a 2-thread CPU, PyTorch sometimes computed a reference's tanh in its second thread
        # to less precision (the GELU test's lower rows, about one run in six), so the references are made alike
        # every run.
        env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture
def same_function():
    """check(plain, other, x, out_tol, x_grad_tol, param_tol): both modules map x to the same output and
    give the same input and parameter gradients for one random output gradient; each tolerance is
    (rtol, atol), or None for torch's defaults."""
    def close(actual, expected, tol, msg=None):
        rtol, atol = tol or (None, None)
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=msg)

    def check(plain, other, x, out_tol=None, x_grad_tol=None, param_tol=None):
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = plain(xa), other(xb)
        close(yb, ya, out_tol)
        g = torch.randn_like(ya)
        ya.backward(g), yb.backward(g)
        close(xb.grad, xa.grad, x_grad_tol)
        for (name, a), b in zip(plain.named_parameters(), other.parameters()):
            close(b.grad, a.grad, param_tol, msg=name)

    return check
