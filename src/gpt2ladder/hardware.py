"""What this machine can do: one `Capabilities` record that every rung check and `doctor` reads.

Detection is kept apart from decisions so the decisions can be tested with simulated machines
(pre-Ampere, Hopper, no Triton, Windows) on a CPU.
"""

from __future__ import annotations

import importlib.util
import platform
import shutil
from dataclasses import dataclass

import torch

from gpt2ladder.errors import UsageError


@dataclass(frozen=True)
class Capabilities:
    device_type: str  # "cuda", "cpu" or "mps"
    name: str  # e.g. "NVIDIA H200", or the CPU's architecture
    capability: tuple[int, int] = (0, 0)  # CUDA compute capability; (0, 0) off CUDA
    total_memory: int = 0  # bytes of device memory; 0 when unknown
    compile_problem: str | None = None  # why torch.compile cannot run here, None when it can
    os: str = "Linux"
    triton_version: str | None = None


def resolve_device(spec: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit device that is missing is a usage error."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if spec not in ("cpu", "cuda", "mps") and not spec.startswith("cuda:"):
        raise UsageError(f"unknown device {spec!r}; choose auto, cpu, cuda or mps")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but PyTorch sees no CUDA GPU (try --device auto)")
    if spec == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UsageError("--device mps was asked for, but this PyTorch has no usable Apple GPU")
    return torch.device(spec)


def detect(device: torch.device) -> Capabilities:
    os_name = platform.system()
    triton = _triton_version()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return Capabilities(
            device_type="cuda",
            name=props.name,
            capability=(props.major, props.minor),
            total_memory=props.total_memory,
            compile_problem=compile_problem("cuda", os_name, triton),
            os=os_name,
            triton_version=triton,
        )
    name = platform.machine() or "cpu"
    return Capabilities(
        device_type=device.type,
        name=f"{device.type} ({name})",
        compile_problem=compile_problem(device.type, os_name, triton),
        os=os_name,
        triton_version=triton,
    )


def compile_problem(device_type: str, os_name: str, triton: str | None, cxx: str | None = "detect") -> str | None:
    """Why torch.compile's default backend (Inductor) cannot generate code here, or None."""
    if device_type == "cuda" and triton is None:
        if os_name == "Windows":
            return 'torch.compile on Windows needs Triton: pip install -U "triton-windows>=3.8,<3.9"'
        return "torch.compile on CUDA needs Triton, which is not installed (pip install triton)"
    if device_type == "cpu":
        cxx = _cxx_compiler() if cxx == "detect" else cxx
        if cxx is None:
            return "torch.compile on CPU needs a C++ compiler (g++, clang++ or cl) on PATH"
    return None


def _triton_version() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton

        return triton.__version__
    except Exception:  # a broken install is as good as none for compile
        return None


def _cxx_compiler() -> str | None:
    for exe in ("g++", "clang++", "c++", "cl"):
        if shutil.which(exe):
            return exe
    return None
