"""What this machine can do: one `Capabilities` record that every rung check and `doctor` reads.

Detection (this module) is kept apart from decisions (`ladder.py`, `measure/doctor.py`), so the decisions are
pure functions of a `Capabilities` record and can be tested with simulated machines (CPU only,
pre-Ampere, Hopper, no Triton, Windows, Apple MPS) on a CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import platform
import shutil
import time
import warnings
from dataclasses import dataclass

import torch

from gpt2ladder.errors import UsageError
from gpt2ladder.runtime import graph_fills

# The kernels behind F.scaled_dot_product_attention, in the names of torch.backends.cuda's flags
# (flash_sdp_enabled, mem_efficient_sdp_enabled, ...) mapped to torch.nn.attention.SDPBackend.
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "mem_efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
# How PyTorch's "<kernel> kernel not used because:" warnings name each kernel, lower-cased.
SDPA_WARNING_NAMES = {"flash": "flash attention", "mem_efficient": "memory efficient", "cudnn": "cudnn",
                      "math": "math"}
GPT2_HEAD_SIZE = 64  # n_embd / n_head in every GPT-2 size (768/12 ... 1600/25)
GiB = 2**30
# What a card keeps outside PyTorch's allocator: the CUDA context, with the driver's and the libraries'
# code and handles; about 0.5 GiB with a current driver and CUDA.
CUDA_CONTEXT_BYTES = GiB // 2
WINDOWS_TRITON_INSTALL = 'pip install -U "triton-windows>=3.8,<3.9"'


@dataclass(frozen=True)
class Capabilities:
    device_type: str  # "cuda", "cpu" or "mps"
    name: str  # e.g. "NVIDIA H200", or the CPU's architecture
    capability: tuple[int, int] = (0, 0)  # CUDA compute capability; (0, 0) off CUDA
    total_memory: int = 0  # bytes of device memory, as the device reports them; 0 when unknown
    compile_problem: str | None = None  # why torch.compile cannot run here, None when it can
    os: str = "Linux"
    triton_version: str | None = None
    cxx_compiler: str | None = None  # what Inductor's CPU backend would compile with
    host_memory: int = 0  # bytes of RAM; 0 when unknown
    torch_version: str = ""
    cuda_version: str | None = None  # the CUDA this PyTorch was built with
    hip_version: str | None = None  # the ROCm (HIP) this PyTorch was built with, where "cuda" devices are AMD GPUs
    cudnn_version: int | None = None
    python_version: str = ""
    # (backend, None if a causal attention forward+backward ran with it here, else why not);
    # empty until `probe_sdpa` has run, which only `doctor` asks for (it costs a few kernel launches).
    sdpa: tuple[tuple[str, str | None], ...] = ()
    sdpa_probe: str = ""  # the shapes and dtype the probe used, e.g. "bfloat16, head size 64"
    memory_cap: int = 0  # bytes of the card --gpu-memory stands in for; 0 when not capped
    # bytes this process's allocator could hold when detected: CUDA's free memory plus what the allocator
    # already held; 0 when unknown (off CUDA, or a card described by hand)
    free_memory: int = 0
    # why a float8 matmul with a scale per row of each operand cannot run here (tried on CUDA GPUs of compute
    # capability 8.9 and newer, `fp8_rowwise_problem`); None where it ran, or where it was not tried
    fp8_rowwise: str | None = None
    # Why a captured CUDA graph cannot be edited before it is instantiated here (PyTorch's keep_graph, the driver's
    # graph calls: `graph_edit_problem`), None where it can or off CUDA
    graph_edits: str | None = None

    @property
    def bf16_supported(self) -> bool:
        """bfloat16 on tensor cores: CUDA compute capability 8.0 (Ampere) or newer."""
        return self.device_type == "cuda" and self.capability >= (8, 0)

    @property
    def usable_memory(self) -> int:
        """The memory every decision plans against: what this card's allocator can hold (`allocator_memory`);
        off CUDA, what the device reports."""
        if self.device_type != "cuda":
            return self.total_memory
        return allocator_memory(self.total_memory, self.free_memory, self.memory_cap)

    @property
    def card_memory(self) -> int:
        """Bytes of the card: the one --gpu-memory stands in for, else what the device reports."""
        return self.memory_cap or self.total_memory

    @property
    def capability_text(self) -> str:
        return "%d.%d" % self.capability


def resolve_device(spec: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit device that is missing is a usage error."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if spec not in ("cpu", "cuda", "mps") and not spec.startswith("cuda:"):
        raise UsageError(f"unknown device {spec!r}; choose auto, cpu, cuda, cuda:N or mps")
    if spec.startswith("cuda"):
        return _cuda_device(spec)
    if spec == "mps" and not _mps_available():
        raise UsageError("--device mps was asked for, but this PyTorch has no usable Apple GPU (try --device auto)")
    return torch.device(spec)


def _cuda_device(spec: str) -> torch.device:
    if not torch.cuda.is_available():
        raise UsageError(f"--device {spec} was asked for, but PyTorch sees no CUDA GPU (try --device auto)")
    index = spec.partition(":")[2]
    if index and not (index.isdigit() and int(index) < torch.cuda.device_count()):
        raise UsageError(f"--device {spec}: no such GPU; this machine has {torch.cuda.device_count()} "
                         f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return torch.device(spec)


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def detect(device: torch.device, probe: bool = False) -> Capabilities:
    """Read this machine's facts; with `probe`, also try each attention kernel on the device."""
    os_name = platform.system()
    triton, cxx = _triton_version(), _cxx_compiler()
    facts = _cuda_facts(device) if device.type == "cuda" else _other_facts(device)
    caps = Capabilities(
        **facts,
        compile_problem=compile_problem(device.type, os_name, triton, cxx, capability=facts.get("capability")),
        os=os_name, triton_version=triton, cxx_compiler=cxx, host_memory=_host_memory(),
        torch_version=torch.__version__, cuda_version=torch.version.cuda, hip_version=torch.version.hip,
        cudnn_version=_cudnn_version(), python_version=platform.python_version(),
    )
    if caps.device_type == "cuda" and caps.capability >= (8, 9):
        caps = dataclasses.replace(caps, fp8_rowwise=fp8_rowwise_problem(device))
    if caps.device_type == "cuda":
        caps = dataclasses.replace(caps, graph_edits=graph_edit_problem())
    if not probe:
        return caps
    dtype = sdpa_probe_dtype(caps)
    return dataclasses.replace(caps, sdpa=probe_sdpa(device, dtype, GPT2_HEAD_SIZE),
                               sdpa_probe=f"causal, {str(dtype).replace('torch.', '')}, head size {GPT2_HEAD_SIZE}")


def graph_edit_problem() -> str | None:
    """Why memset_fill cannot edit a captured graph here: a PyTorch that cannot keep the graph for editing
    (torch.cuda.CUDAGraph.raw_cuda_graph), or a driver without the graph calls it makes. None where it can."""
    if not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph"):
        return (f"editing a captured CUDA graph needs a PyTorch that keeps it for editing "
                f"(torch.cuda.CUDAGraph.raw_cuda_graph); this is {torch.__version__}")
    return graph_fills.problem()


def _cuda_facts(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    free, _ = torch.cuda.mem_get_info(device)  # the context (and any other process) already taken off
    return {"device_type": "cuda", "name": props.name, "capability": (props.major, props.minor),
            "total_memory": props.total_memory, "free_memory": free + torch.cuda.memory_reserved(device)}


def _other_facts(device: torch.device) -> dict:
    arch = platform.machine() or "unknown"
    if device.type != "mps":
        return {"device_type": device.type, "name": f"{device.type} ({arch})"}
    memory = 0
    with contextlib.suppress(Exception):  # older PyTorch, or no Metal device to ask
        memory = int(torch.mps.recommended_max_memory())
    return {"device_type": "mps", "name": f"Apple GPU, mps ({arch})", "total_memory": memory}


def compile_problem(device_type: str, os_name: str, triton: str | None, cxx: str | None = "detect",
                    capability: tuple[int, int] | None = None, cc: str | None = "detect") -> str | None:
    """Why torch.compile's default backend (Inductor) cannot generate code here, or None."""
    if device_type == "cuda" and triton is None:
        if os_name == "Windows":
            return f"torch.compile on Windows needs Triton, which is not installed: {WINDOWS_TRITON_INSTALL}"
        return "torch.compile on CUDA needs Triton, which is not installed (pip install triton)"
    if device_type == "cuda" and capability is not None and capability < (7, 0):
        return "torch.compile's Triton kernels need compute capability 7.0 or newer; this GPU is %d.%d" % capability
    # Triton builds a small C launcher per kernel with the system compiler (triton-windows ships its own).
    if device_type == "cuda" and os_name != "Windows" and (_c_compiler() if cc == "detect" else cc) is None:
        return "Triton needs a C compiler to build its kernel launchers: install gcc or clang, or set $CC"
    if device_type == "cpu":
        cxx = _cxx_compiler() if cxx == "detect" else cxx
        if cxx is None:
            return "torch.compile on CPU needs a C++ compiler (g++, clang++ or cl) on PATH"
    return None


def fp8_rowwise_problem(device: torch.device) -> str | None:
    """Why a float8 matmul with one scale per row of each operand cannot run on `device`, or None when a small one
    ran: the product the float8 forward and input-gradient rungs make (`speedups.common.scaled_matmul`, a bias added
    in the same call). PyTorch and cuBLAS cover it on some architectures and builds only (an sm_120 card with
    PyTorch 2.10 got CUBLAS_STATUS_NOT_SUPPORTED from it, github.com/pytorch/pytorch/issues/192707, where the
    one-scale-per-tensor product ran), so it is tried rather than read off the compute capability."""
    from gpt2ladder.speedups.common import scaled_matmul

    try:
        x8 = torch.full((32, 64), 1.0, device=device).to(torch.float8_e4m3fn)
        w8 = torch.full((48, 64), 1.0, device=device).to(torch.float8_e4m3fn)
        bias = torch.zeros(48, device=device, dtype=torch.bfloat16)
        scaled_matmul(x8, torch.ones(32, device=device), w8, torch.ones(48, device=device), bias, torch.bfloat16)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return None
    except Exception as err:  # any failure is the answer we are after, as one line
        return _one_line(str(err) or type(err).__name__)


def sdpa_probe_dtype(caps: Capabilities) -> torch.dtype:
    """The dtype attention runs in when training here: bf16, else fp16 on an older GPU, else fp32."""
    if caps.device_type != "cuda":
        return torch.float32
    return torch.bfloat16 if caps.bf16_supported else torch.float16


def probe_sdpa(device: torch.device, dtype: torch.dtype,
               head_size: int = GPT2_HEAD_SIZE) -> tuple[tuple[str, str | None], ...]:
    """Run a tiny causal attention forward+backward with each kernel alone; record why one cannot run.

    GPT-2's heads are 64 wide in every preset but `tiny`; the kernels' limits are on head size,
    dtype and architecture, so a short sequence answers for the model's shapes.
    """
    return tuple((name, _sdpa_problem(name, device, dtype, head_size)) for name in SDPA_BACKENDS)


def _sdpa_problem(name: str, device: torch.device, dtype: torch.dtype, head_size: int) -> str | None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    flag = getattr(torch.backends.cuda, f"{name}_sdp_enabled", None)
    if flag is not None and not flag():
        return f"turned off in this process (torch.backends.cuda.enable_{name}_sdp(False))"
    if name in ("mem_efficient", "cudnn") and device.type != "cuda":
        return f"a CUDA-only kernel; this is {device.type}"
    backend = getattr(SDPBackend, SDPA_BACKENDS[name], None)
    if backend is None:
        return f"PyTorch {torch.__version__} has no {name} attention backend"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the kernels say why they decline as warnings
        try:
            # constant inputs: the kernels' limits are on shape and dtype, and the global RNG stays untouched
            q = torch.full((1, 2, 64, head_size), 0.5, device=device, dtype=dtype, requires_grad=True)
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return None
        except Exception as err:  # any failure is the answer we are after, as one line
            return _one_line_reason(name, [str(w.message) for w in caught], err)


def _one_line_reason(name: str, messages: list[str], err: Exception) -> str:
    """The kernel's own complaint if it gave one, else the error, on one short line.

    PyTorch warns in groups, "<kernel> kernel not used because:" then the causes, for every kernel it
    considered, and "<kernel> has been runtime disabled" for the ones sdpa_kernel switched off; keep
    the causes under this kernel's own header.
    """
    mine, ours = [], None  # ours: whether the last header named this kernel (None before any header)
    for message in messages:
        low = message.lower()
        if "not used because" in low:
            ours = SDPA_WARNING_NAMES[name] in low
        elif "runtime disabled" not in low and ours is not False:
            mine.append(message)
    text = mine[0] if mine else (str(err) or type(err).__name__)
    return _one_line(text.split("(Triggered internally")[0])


def _one_line(text: str) -> str:
    """An error or warning as one short line: its whitespace collapsed, at most 240 characters."""
    return " ".join(text.split())[:240]


def _triton_version() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton

        return triton.__version__
    except Exception:  # a broken install is as good as none for compile
        return None


def _c_compiler() -> str | None:
    """The compiler Triton would pick: $CC, else gcc, else clang."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")


def _cxx_compiler() -> str | None:
    for exe in ("g++", "clang++", "c++", "cl"):
        if shutil.which(exe):
            return exe
    return None


def _cudnn_version() -> int | None:
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a CPU build or a broken cuDNN: report it as absent
        return None


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return 0


def allocator_memory(total: int, free: int = 0, card: int = 0) -> int:
    """The bytes PyTorch's caching allocator can hold on this card: what every memory plan uses.

    `card` (--gpu-memory): a card of that many bytes keeps CUDA_CONTEXT_BYTES for the context, so its
    allocator gets the rest (and never more than this card has free). Else `free`, what CUDA reported
    free plus what the allocator already held: the context and other processes are already off it.
    Else (a card described by hand) the card's `total` less the context. 0 when nothing is known.
    """
    if card:
        rest = max(0, card - CUDA_CONTEXT_BYTES)
        return min(rest, free) if free else rest
    if free:
        return free
    return max(0, total - CUDA_CONTEXT_BYTES) if total else 0


def cap_memory(device: torch.device, caps: Capabilities, gib: float | None) -> Capabilities:
    """Make this process's CUDA allocator hold what a card of `gib` GiB would give it (--gpu-memory), so a
    big card stands in for a smaller one; the returned capabilities plan for that card. None: no cap."""
    if gib is None:
        return caps
    if device.type != "cuda":
        raise UsageError(f"--gpu-memory caps a CUDA GPU's memory; this is {device.type}")
    card = int(gib * GiB)
    if not CUDA_CONTEXT_BYTES < card <= caps.total_memory:
        raise UsageError(f"--gpu-memory {gib:g} must be above {CUDA_CONTEXT_BYTES / GiB:g} (what a card keeps for "
                         f"the CUDA context) and at most this GPU's {caps.total_memory / GiB:.1f} GiB")
    capped = dataclasses.replace(caps, memory_cap=card)
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(memory_fraction(capped), index)
    return capped


def memory_fraction(caps: Capabilities) -> float:
    """The share of what the device reports that the allocator is capped at (set_per_process_memory_fraction's
    argument) for these capabilities' allocator memory."""
    return min(1.0, caps.usable_memory / caps.total_memory)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work: a clock read after this measures the work, not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def matmul_rate(device: torch.device, n: int = 1024, repeats: int = 3) -> float:
    """FLOP/s of an (n x n) @ (n x n) fp32 matmul on this device, the best of a few: a ceiling for a step."""
    a = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first call warms up
        synchronize(device)
        t0 = time.perf_counter()
        a @ a
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def free_memory(device: torch.device) -> None:
    """Release what the last model left behind before the next one is built (between rungs)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
