"""cuBLASLt matmuls with a GELU in their epilogue, called through ctypes, for benchmarks/micro/gelu_epilogue.py.

PyTorch runs the MLP's matmuls through cuBLAS but exposes none of cuBLASLt's GELU epilogues, so the GELU
is a pass of its own over the (N, 4C) activations in each direction (the `gelu_kernel` rung's Triton
kernels). cuBLASLt can do both inside the matmuls around it:

  - forward, CUBLASLT_EPILOGUE_GELU_AUX_BIAS on c_fc: h = x W^T + b is written as the "aux" matrix (what
    the backward needs) and a = gelu(h) as the output, so nobody reads h back to apply the GELU;
  - backward, CUBLASLT_EPILOGUE_DGELU_BGRAD on the matmul that forms c_proj's input gradient
    (dA = dY W_proj): the epilogue multiplies by gelu'(h), read from the aux matrix, and writes c_fc's
    bias gradient (the column sums of dh) as well.

Measured on an H200 at GPT-2 124M's shape (benchmarks/records/2026-12-02_gelu-epilogue) neither pays: the
forward epilogue is as fast as the matmul plus the Triton GELU kernel, the backward one twice as slow, and
cuBLASLt refuses an fp32 bias or bias gradient beside a bf16 output. So no rung uses this; it stays here as
the measurement's tool.

The library is the libcublasLt that PyTorch itself loaded (found in the process's memory map), so no
package is added. cuBLASLt is column-major: a row-major (rows, cols) tensor is, to it, the (cols, rows)
matrix with leading dimension cols, so y = x W^T (row-major, N x F) is D = W^T-as-stored (F x K,
transposed) times x-as-stored (K x N), and the bias and aux run along D's rows (the F features).
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from gpt2ladder.kernels.gelu import gelu_grad_reference

# From cublasLt.h / cublas_api.h / library_types.h (stable across CUDA 12 and 13).
_EPILOGUE_DEFAULT, _EPILOGUE_GELU_AUX_BIAS, _EPILOGUE_DGELU_BGRAD = 1, 32 | 128 | 4, 64 | 128 | 16
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_DESC_AUX_POINTER, _DESC_AUX_LD, _DESC_BIAS_DATA_TYPE = 11, 12, 26
_PREF_MAX_WORKSPACE_BYTES = 1
_OP_N, _OP_T = 0, 1
_COMPUTE_32F = 68
_CUDA_DTYPES = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 14}
WORKSPACE_BYTES = 32 * 1024 * 1024  # what cuBLAS recommends on Hopper


class CublasLtError(RuntimeError):
    pass


class _AlgoResult(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _loaded_library_path() -> str | None:
    """The libcublasLt that this process already has mapped (PyTorch's CUDA build links it), if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if "libcublasLt.so" in path:
                    return path
    except OSError:
        pass
    return None


@functools.cache
def _library() -> ctypes.CDLL:
    path = _loaded_library_path()
    if path is None:
        raise CublasLtError("PyTorch has not loaded a libcublasLt (a CPU build, or CUDA not initialised)")
    lib = ctypes.CDLL(path)
    vp, i32, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    for name, args in {
        "cublasLtCreate": [ctypes.POINTER(vp)],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(vp), i32, i32],
        "cublasLtMatmulDescDestroy": [vp],
        "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(vp), i32, u64, u64, i64],
        "cublasLtMatrixLayoutDestroy": [vp],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(vp)],
        "cublasLtMatmulPreferenceDestroy": [vp],
        "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, ctypes.POINTER(_AlgoResult),
                                           ctypes.POINTER(i32)],
        "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(ctypes.c_uint64 * 8),
                           vp, sz, vp],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} returned cublasStatus {status}")


@functools.cache
def _handle(device_index: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    with torch.cuda.device(device_index):
        _check(_library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    return handle


@functools.cache
def problem() -> str | None:
    """Why the epilogue matmuls cannot run here (None when they can: a CUDA build with cuBLASLt loaded)."""
    if not torch.cuda.is_available():
        return "cuBLASLt's GELU epilogues need a CUDA GPU"
    try:
        torch.cuda.init()
        _library()
    except (CublasLtError, OSError, AttributeError) as e:
        return f"cuBLASLt could not be loaded from PyTorch's CUDA libraries ({e})"
    return None


class _Desc:
    """The descriptors of one cublasLtMatmul call, destroyed together."""

    def __init__(self, lib):
        self.lib, self.layouts, self.desc, self.pref = lib, [], ctypes.c_void_p(), ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for layout in self.layouts:
            self.lib.cublasLtMatrixLayoutDestroy(layout)
        if self.desc:
            self.lib.cublasLtMatmulDescDestroy(self.desc)
        if self.pref:
            self.lib.cublasLtMatmulPreferenceDestroy(self.pref)

    def layout(self, dtype: torch.dtype, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), _CUDA_DTYPES[dtype], rows, cols, ld),
               "cublasLtMatrixLayoutCreate")
        self.layouts.append(layout)
        return layout

    def set(self, attr: int, value: ctypes._SimpleCData) -> None:
        _check(self.lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
               f"cublasLtMatmulDescSetAttribute({attr})")


_ALGOS: dict[tuple, ctypes.Array] = {}  # heuristic's first choice per problem, so a step asks once


def matmul_t(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, b_transposed: bool, epilogue: int,
             bias: torch.Tensor | None = None, aux: torch.Tensor | None = None) -> None:
    """out = a @ op(b) in row-major terms, with `epilogue` applied; a (N, K), out (N, M), b (M, K) when
    `b_transposed` (out = a @ b.T, a Linear's forward) else (K, M). All contiguous, same dtype.
    `bias` (M,): added before the GELU, or written with the bias gradient; `aux` (N, M): the GELU's input."""
    n, k = a.shape
    m = out.shape[1]
    lib = _library()
    with _Desc(lib) as d:
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(d.desc), _COMPUTE_32F, _CUDA_DTYPES[torch.float32]),
               "cublasLtMatmulDescCreate")
        # Column-major: D (m x n) = op(A) (m x k) . B (k x n), A = b as stored, B = a as stored.
        d.set(_DESC_TRANSA, ctypes.c_int32(_OP_T if b_transposed else _OP_N))
        d.set(_DESC_TRANSB, ctypes.c_int32(_OP_N))
        d.set(_DESC_EPILOGUE, ctypes.c_int32(epilogue))
        if bias is not None:
            d.set(_DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
            d.set(_DESC_BIAS_DATA_TYPE, ctypes.c_int32(_CUDA_DTYPES[bias.dtype]))
        if aux is not None:
            d.set(_DESC_AUX_POINTER, ctypes.c_void_p(aux.data_ptr()))
            d.set(_DESC_AUX_LD, ctypes.c_int64(m))
        layout_a = d.layout(b.dtype, k, m, k) if b_transposed else d.layout(b.dtype, m, k, m)
        layout_b = d.layout(a.dtype, k, n, k)
        layout_d = d.layout(out.dtype, m, n, m)
        key = (a.device.index, n, k, m, b_transposed, epilogue, a.dtype, out.dtype,
               None if bias is None else bias.dtype, aux is not None,
               tuple(t.data_ptr() % 256 == 0 for t in (a, b, out) + tuple(x for x in (bias, aux) if x is not None)))
        algo = _ALGOS.get(key)
        if algo is None:
            _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(d.pref)), "cublasLtMatmulPreferenceCreate")
            ws = ctypes.c_uint64(WORKSPACE_BYTES)
            _check(lib.cublasLtMatmulPreferenceSetAttribute(d.pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                            ctypes.sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute")
            result, found = _AlgoResult(), ctypes.c_int(0)
            _check(lib.cublasLtMatmulAlgoGetHeuristic(_handle(a.device.index), d.desc, layout_a, layout_b, layout_d,
                                                      layout_d, d.pref, 1, ctypes.byref(result), ctypes.byref(found)),
                   "cublasLtMatmulAlgoGetHeuristic")
            if found.value < 1 or result.state != 0:
                raise CublasLtError(f"cuBLASLt has no algorithm for epilogue {epilogue} at {n}x{k}x{m}")
            algo = _ALGOS[key] = result.algo
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=a.device)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        stream = torch.cuda.current_stream(a.device).cuda_stream
        _check(lib.cublasLtMatmul(_handle(a.device.index), d.desc, ctypes.byref(alpha), b.data_ptr(), layout_a,
                                  a.data_ptr(), layout_b, ctypes.byref(beta), out.data_ptr(), layout_d,
                                  out.data_ptr(), layout_d, ctypes.byref(algo), workspace.data_ptr(),
                                  WORKSPACE_BYTES, stream), "cublasLtMatmul")


# Reference expressions: what the epilogue matmuls compute, in PyTorch (off CUDA, and the yardstick).

def gelu_linear_reference(x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gelu(h), h) for h = x W^T + b, in x's dtype (the matmul in fp32 inside)."""
    h = (x.float() @ weight.float().t() + bias.float())
    return F.gelu(h, approximate="tanh").to(x.dtype), h.to(x.dtype)


def dgelu_matmul_reference(grad: torch.Tensor, weight: torch.Tensor,
                           h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, its column sums in fp32) for dh = (grad @ W) * gelu'(h): grad (N, C), W (C, M), h (N, M)."""
    zero_bias = torch.zeros(h.shape[-1], dtype=torch.float32, device=h.device)
    return gelu_grad_reference(grad.float() @ weight.float(), h, zero_bias)


def use_cublaslt(t: torch.Tensor) -> bool:
    return t.is_cuda and problem() is None


@torch.library.custom_op("micro::gelu_linear", mutates_args=())
def gelu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gelu(h), h), h = x W^T + b: one cuBLASLt matmul with the GELU_AUX_BIAS epilogue. x (N, K), W (M, K),
    b (M,) in x's dtype (cuBLASLt refuses an fp32 bias beside a bf16 output)."""
    if not use_cublaslt(x):
        return gelu_linear_reference(x, weight, bias)
    x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
    out = x.new_empty((x.shape[0], weight.shape[0]))
    h = torch.empty_like(out)
    matmul_t(x, weight, out, b_transposed=True, epilogue=_EPILOGUE_GELU_AUX_BIAS, bias=bias, aux=h)
    return out, h


@gelu_linear.register_fake
def _(x, weight, bias):
    out = x.new_empty((x.shape[0], weight.shape[0]))
    return out, torch.empty_like(out)


@torch.library.custom_op("micro::dgelu_matmul", mutates_args=())
def dgelu_matmul(grad: torch.Tensor, weight: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, bias gradient in fp32), dh = (grad @ W) * gelu'(h): one cuBLASLt matmul with the DGELU_BGRAD
    epilogue. grad (N, C), W (C, M) (c_proj's weight), h (N, M)."""
    if not use_cublaslt(grad):
        return dgelu_matmul_reference(grad, weight, h)
    grad, weight, h = grad.contiguous(), weight.contiguous(), h.contiguous()
    dh = torch.empty_like(h)
    dbias = torch.empty(h.shape[1], device=h.device, dtype=h.dtype)  # cuBLASLt refuses fp32 for a bf16 output
    matmul_t(grad, weight, dh, b_transposed=False, epilogue=_EPILOGUE_DGELU_BGRAD, bias=dbias, aux=h)
    return dh, dbias.float()


@dgelu_matmul.register_fake
def _(grad, weight, h):
    return torch.empty_like(h), h.new_empty((h.shape[1],), dtype=torch.float32)
