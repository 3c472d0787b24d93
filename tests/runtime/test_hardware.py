"""Device choice and detection: real on this machine, simulated (monkeypatched) for CUDA and Apple MPS."""

import pytest
import torch

from gpt2ladder.errors import UsageError
from gpt2ladder.runtime import hardware
from gpt2ladder.runtime.hardware import (
    WINDOWS_TRITON_INSTALL,
    Capabilities,
    compile_problem,
    detect,
    fp8_rowwise_problem,
    probe_sdpa,
    resolve_device,
)

CPU = torch.device("cpu")


@pytest.fixture
def no_accelerator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "_mps_available", lambda: False)


def test_auto_picks_cuda_then_mps_then_cpu(monkeypatch, no_accelerator):
    assert resolve_device("auto") == CPU
    monkeypatch.setattr(hardware, "_mps_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_explicit_devices(monkeypatch, no_accelerator):
    assert resolve_device("cpu") == CPU
    monkeypatch.setattr(hardware, "_mps_available", lambda: True)
    assert resolve_device("mps") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")


@pytest.mark.parametrize("spec,words", [
    ("cuda", "no CUDA GPU"), ("cuda:0", "no CUDA GPU"), ("mps", "no usable Apple GPU"), ("gpu", "unknown device"),
])
def test_missing_or_unknown_device_is_a_usage_error(no_accelerator, spec, words):
    with pytest.raises(UsageError, match=words):
        resolve_device(spec)


def test_cuda_index_past_the_last_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UsageError, match=r"no such GPU; this machine has 2 \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")
    with pytest.raises(UsageError, match="no such GPU"):
        resolve_device("cuda:x")


def test_detect_cpu_reads_versions_and_compiler():
    caps = detect(CPU)
    assert caps.device_type == "cpu" and caps.capability == (0, 0)
    assert caps.torch_version == torch.__version__ and caps.python_version
    assert caps.host_memory > 0
    assert caps.sdpa == ()  # probing is only done when asked
    assert (caps.compile_problem is None) == (caps.cxx_compiler is not None)


def test_detect_simulated_mps(monkeypatch):
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 16 * 2**30, raising=False)
    caps = detect(torch.device("mps"))
    assert caps.device_type == "mps" and "Apple" in caps.name
    assert caps.total_memory == 16 * 2**30 and caps.compile_problem is None
    assert not caps.bf16_supported


def test_detect_mps_without_a_metal_device_still_answers(monkeypatch):
    def no_device():
        raise RuntimeError("MPS backend is not available")

    monkeypatch.setattr(torch.mps, "recommended_max_memory", no_device, raising=False)
    assert detect(torch.device("mps")).total_memory == 0


@pytest.mark.parametrize("args,kwargs,words", [
    (("cuda", "Linux", None), {}, "pip install triton"),
    (("cuda", "Windows", None), {}, WINDOWS_TRITON_INSTALL),
    (("cuda", "Linux", "3.1.0"), {"capability": (6, 0), "cc": "gcc"}, "compute capability 7.0"),
    (("cuda", "Linux", "3.6.0"), {"capability": (9, 0), "cc": None}, "C compiler"),
    (("cpu", "Linux", None, None), {}, "C++ compiler"),
])
def test_compile_problems(args, kwargs, words):
    problem = compile_problem(*args, **kwargs)
    assert words in problem and len(problem.splitlines()) == 1


@pytest.mark.parametrize("args,kwargs", [
    (("cuda", "Linux", "3.6.0"), {"capability": (9, 0), "cc": "gcc"}),
    (("cuda", "Windows", "3.8.0"), {"capability": (12, 0), "cc": None}),  # triton-windows brings its own
    (("cpu", "Linux", None, "g++"), {}), (("cpu", "Windows", None, "cl"), {}), (("mps", "Darwin", None, None), {}),
])
def test_compile_works(args, kwargs):
    assert compile_problem(*args, **kwargs) is None


def test_triton_looks_for_gcc_clang_or_cc(monkeypatch):
    monkeypatch.setattr(hardware.shutil, "which", lambda exe: None)  # a slim image: no compiler at all
    monkeypatch.delenv("CC", raising=False)
    assert "C compiler" in compile_problem("cuda", "Linux", "3.6.0", capability=(9, 0))
    monkeypatch.setenv("CC", "/opt/bin/my-cc")
    assert compile_problem("cuda", "Linux", "3.6.0", capability=(9, 0)) is None


def test_the_windows_install_line_is_exact():
    assert WINDOWS_TRITON_INSTALL == 'pip install -U "triton-windows>=3.8,<3.9"'


@pytest.mark.parametrize("caps,bf16", [
    (Capabilities("cuda", "Tesla T4", (7, 5)), False), (Capabilities("cuda", "Tesla V100", (7, 0)), False),
    (Capabilities("cuda", "A100", (8, 0)), True), (Capabilities("cuda", "H200", (9, 0)), True),
    (Capabilities("cpu", "cpu"), False), (Capabilities("mps", "Apple"), False),
])
def test_bf16_supported(caps, bf16):
    assert caps.bf16_supported is bf16


def test_sdpa_probe_on_cpu():
    result = dict(probe_sdpa(CPU, torch.float32))
    assert list(result) == ["flash", "mem_efficient", "cudnn", "math"]
    assert result["math"] is None and result["flash"] is None
    assert "CUDA-only" in result["mem_efficient"] and "CUDA-only" in result["cudnn"]


def test_sdpa_probe_sees_a_backend_turned_off():
    assert torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        result = dict(probe_sdpa(CPU, torch.float32))
    finally:
        torch.backends.cuda.enable_flash_sdp(True)
    assert "enable_flash_sdp(False)" in result["flash"] and result["math"] is None


def test_sdpa_probe_failure_is_one_line(monkeypatch):
    """A kernel that declines says why in a warning; the reason keeps that warning, on one line."""
    import warnings

    def declines(*args, **kwargs):
        if not torch.backends.cuda.flash_sdp_enabled():  # sdpa_kernel([MATH]) leaves only math on
            raise RuntimeError("No available kernel.\nAborting execution.")
        warnings.warn("Memory efficient kernel not used because:")
        warnings.warn("Memory Efficient attention has been runtime disabled.")
        warnings.warn("Flash attention kernel not used because:")
        warnings.warn("Flash attention only supports gpu architectures\n in the range [sm80, sm90]. "
                      "(Triggered internally at sdp_utils.cpp:123.)")
        warnings.warn("CuDNN attention kernel not used because:")
        warnings.warn("cuDNN needs head size <= 128")
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", declines)
    result = dict(probe_sdpa(CPU, torch.float32))
    assert result["flash"] == "Flash attention only supports gpu architectures in the range [sm80, sm90]."
    assert result["math"] == "No available kernel. Aborting execution."


def test_fp8_rowwise_probe_makes_the_rungs_product():
    """Off CUDA the product is the fp32 stand-in, which runs: no problem to report."""
    assert fp8_rowwise_problem(CPU) is None


def test_fp8_rowwise_probe_failure_is_one_line(monkeypatch):
    import gpt2ladder.speedups.common as common

    def unsupported(*args, **kwargs):
        raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling\n"
                           "  `cublasLtMatmulAlgoGetHeuristic(...)`")

    monkeypatch.setattr(common, "scaled_matmul", unsupported)
    assert fp8_rowwise_problem(CPU) == ("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling "
                                        "`cublasLtMatmulAlgoGetHeuristic(...)`")


@pytest.mark.parametrize("capability,tried", [((12, 0), True), ((8, 9), True), ((8, 0), False)])
def test_detect_tries_the_row_scaled_product_on_float8_gpus_only(monkeypatch, capability, tried):
    import gpt2ladder.runtime.hardware as hardware

    calls = []
    monkeypatch.setattr(hardware, "_cuda_facts", lambda device: {
        "device_type": "cuda", "name": "a GPU", "capability": capability, "total_memory": 8 << 30})
    monkeypatch.setattr(hardware, "fp8_rowwise_problem", lambda device: calls.append(device) or "not supported")
    caps = detect(torch.device("cuda"))
    assert bool(calls) == tried
    assert caps.fp8_rowwise == ("not supported" if tried else None)


def test_graph_edit_problem_names_what_is_missing(monkeypatch):
    """memset_fill's check: a PyTorch that cannot keep a captured graph, or no driver with the graph calls, each in
    one line; the driver's own words kept."""
    from gpt2ladder.runtime import graph_fills
    from gpt2ladder.runtime.hardware import graph_edit_problem

    def no_driver():
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(graph_fills, "driver", no_driver)
    assert graph_edit_problem() == ("editing a captured CUDA graph needs the CUDA driver's graph calls: "
                                    "libcuda.so.1: cannot open shared object file: No such file or directory")
    monkeypatch.setattr(graph_fills, "driver", lambda: None)
    assert graph_edit_problem() is None
    monkeypatch.setattr(torch.cuda, "CUDAGraph", type("CUDAGraph", (), {}))
    assert "raw_cuda_graph" in graph_edit_problem() and torch.__version__ in graph_edit_problem()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_detect_and_probe_a_real_gpu():
    caps = detect(torch.device("cuda"), probe=True)
    assert caps.device_type == "cuda" and caps.capability >= (3, 0) and caps.total_memory > 0
    assert caps.cuda_version == torch.version.cuda
    sdpa = dict(caps.sdpa)
    assert sdpa["math"] is None
    if caps.capability in ((8, 0), (9, 0)):  # flash attention's home architectures
        assert sdpa["flash"] is None
    if caps.capability == (9, 0):  # Hopper: the row-scaled float8 product the float8 rungs make runs
        assert caps.fp8_rowwise is None
    assert caps.graph_edits is None  # memset_fill can edit graphs: a PyTorch that keeps them, a driver that edits
