"""cublaslt's wiring, on the CPU: the engine's step context asks PyTorch for cuBLASLt with the rung on a CUDA device
only, and hands back whatever library was chosen before, also when the step raises; without the rung it leaves the
library alone. The library itself is exercised on a GPU (test_cublaslt_gpu.py)."""

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


def test_the_step_runs_through_cublaslt_and_restores_the_library_before(monkeypatch):
    library = Library("cublas")
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", library)
    with step_context(setup_for(["tf32", "cuda_graph", "cublaslt"]), "cuda"):
        assert library.current == "cublaslt" and torch.get_float32_matmul_precision() == "high"
    assert library.calls == ["cublaslt", "cublas"] and torch.get_float32_matmul_precision() == "highest"
    with pytest.raises(RuntimeError), step_context(setup_for(["tf32", "cublaslt"]), "cuda"):
        raise RuntimeError("a failed step")
    assert library.current == "cublas" and torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("rungs,device", [(["cuda_graph"], "cuda"), (["cublaslt"], "cpu")])
def test_without_the_rung_or_off_cuda_the_library_is_left_alone(monkeypatch, rungs, device):
    library = Library("cublaslt")  # e.g. chosen by the user, TORCH_BLAS_PREFER_CUBLASLT=1
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", library)
    with step_context(setup_for(rungs), device):
        assert library.current == "cublaslt"
    assert library.calls == []


def test_a_library_that_cannot_be_chosen_still_restores_the_matmul_precision(monkeypatch):
    def refuses(backend=None):
        if backend is not None:
            raise RuntimeError("Cannot set preferred backend to cuBLASLt")
        return "cublas"

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", refuses)
    with pytest.raises(RuntimeError, match="cuBLASLt"), step_context(setup_for(["tf32", "cublaslt"]), "cuda"):
        pass
    assert torch.get_float32_matmul_precision() == "highest"


def test_rocm_and_windows_keep_their_own_library():
    import dataclasses

    from gpt2ladder.ladder import resolve_rungs, why_unavailable
    from gpt2ladder.runtime.hardware import Capabilities

    gpu = Capabilities("cuda", "NVIDIA H200", (9, 0), triton_version="3.6.0")
    assert why_unavailable("cublaslt", gpu) is None and "cublaslt" in resolve_rungs("auto", gpu)
    assert "Windows" in why_unavailable("cublaslt", Capabilities("cuda", "NVIDIA RTX 5070", (12, 0), os="Windows"))
    rocm = dataclasses.replace(gpu, name="AMD Instinct MI300X", hip_version="6.4.0")
    assert "ROCm" in why_unavailable("cublaslt", rocm) and "cublaslt" not in resolve_rungs("auto", rocm)
