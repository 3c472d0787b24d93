"""Shared pytest fixtures."""

import contextlib
import gc
import itertools
import json
import os
import shutil
import signal
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


def pytest_collection_modifyitems(items):
    """Modules that hold a slow test run first, each as a whole (its module fixtures made once): pytest-xdist hands
    out the tests in this order, so the workers end together on quick ones, not one of them on a slow test alone."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


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


# The process the scripts of `triton_interpret` are forked from: it has imported PyTorch and Triton under
# TRITON_INTERPRET=1, as each script's own process would first (about 1.7 s a script), and each script runs in a
# child of its own that ends with it. A request is a line of JSON; its answers are two: the child's pid, then its
# exit status.
_INTERPRETER = r"""
import json, os, sys, traceback
import torch, triton, triton.language
for line in sys.stdin:
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.argv, code = ["-c", request["arg"]], 0
        try:
            exec(compile(request["script"], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    print(child, flush=True)
    print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), flush=True)
"""


@pytest.fixture(scope="session")
def _triton_interpreter(tmp_path_factory):
    """(the interpreter process, a folder for its scripts' output, a count of the scripts), started once for the
    session."""
    src = str(Path(__file__).parents[1] / "src")
    # One intra-op thread: on a 2-thread CPU, PyTorch sometimes computed a reference's tanh in its second thread
    # to less precision (the GELU test's lower rows, about one run in six), so the references are made alike
    # every run.
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _INTERPRETER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    yield proc, tmp_path_factory.mktemp("triton-interpret"), itertools.count()
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def triton_interpret(_triton_interpreter):
    """run(script, cases): `script` in a process of its own under Triton's CPU interpreter (TRITON_INTERPRET=1 is
    read at import, hence the process), with the JSON of `cases` as its argument; returns the JSON it printed
    last."""
    proc, folder, scripts = _triton_interpreter

    def answer() -> int:
        line = proc.stdout.readline()
        assert line, f"the Triton interpreter's process ended (exit status {proc.poll()})"
        return int(line)

    def run(script: str, cases: list):
        n = next(scripts)
        out, err = folder / f"{n}.out", folder / f"{n}.err"
        proc.stdin.write(json.dumps({"script": script, "arg": json.dumps(cases), "stdout": str(out),
                                     "stderr": str(err)}) + "\n")
        proc.stdin.flush()
        child = answer()
        try:
            code = answer()
        except BaseException:  # the test ended first (its timeout): so does the script
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            answer()
            raise
        assert code == 0, err.read_text()[-2000:]
        return json.loads(out.read_text().strip().splitlines()[-1])

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
