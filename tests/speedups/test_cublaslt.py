"""cublaslt's wiring, on the CPU: the engine's step context asks PyTorch for cuBLASLt (or, without the rung, cuBLAS)
on a CUDA device only, and hands back whatever library was chosen before, also when the step raises. The library
itself is exercised on a GPU (test_cublaslt_gpu.py)."""

import types

import pytest
import torch

from gpt2ladder.ladder import setup_for
from gpt2ladder.runtime.engine import Engine


class Library:
    """Stands in for torch.backends.cuda.preferred_blas_library: remembers what it was told."""

    def __init__(self, current: str):
        self.current, self.calls = current, []

    def __call__(self, backend: str | None = None) -> str:
        if backend is not None:
            self.calls.append(backend)
            self.current = backend
        return self.current


def step_context(setup, device: str):
    return Engine.precision(types.SimpleNamespace(setup=setup, device=torch.device(device)))


@pytest.mark.parametrize("rungs,inside", [(["cuda_graph", "cublaslt"], "cublaslt"), (["cuda_graph"], "cublas")])
def test_the_step_runs_with_the_rungs_library_and_restores_the_one_before(monkeypatch, rungs, inside):
    library = Library("default")
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", library)
    with step_context(setup_for(rungs), "cuda"):
        assert library.current == inside
    assert library.calls == [inside, "default"]
    with pytest.raises(RuntimeError), step_context(setup_for(rungs), "cuda"):
        raise RuntimeError("a failed step")
    assert library.current == "default"


def test_off_cuda_the_library_is_left_alone(monkeypatch):
    library = Library("cublas")
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", library)
    with step_context(setup_for(["cublaslt"]), "cpu"):
        pass
    assert library.calls == []
