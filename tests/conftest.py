"""Shared pytest fixtures."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def shakespeare_cache(tmp_path_factory):
    """A cache folder holding the real Tiny Shakespeare, set as $GPT2LADDER_CACHE for the session.

    The text is copied from the shared data folder, never downloaded: tests run without network.
    Session-scoped so the real text is tokenized once per test run.
    """
    repo = Path(__file__).resolve().parents[1]
    candidates = [repo.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"]
    source = next((p for p in candidates if p.is_file()), None)
    if source is None:
        pytest.skip(f"real Tiny Shakespeare not found at {candidates[0]}")
    cache = tmp_path_factory.mktemp("gpt2ladder-cache")
    (cache / "tinyshakespeare").mkdir()
    shutil.copyfile(source, cache / "tinyshakespeare" / "input.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPT2LADDER_CACHE", str(cache))
        yield cache


@pytest.fixture
def triton_interpret():
    """run(script, cases): `script` in a subprocess under Triton's CPU interpreter (TRITON_INTERPRET=1 is
    read at import, hence the subprocess), with the JSON of `cases` as its argument; returns the JSON
    it printed last."""
    def run(script: str, cases: list):
        src = str(Path(__file__).parents[1] / "src")
        env = {**os.environ, "TRITON_INTERPRET": "1",
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
