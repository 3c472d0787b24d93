"""The weight-gradient matmuls of a GPT-2 124M Block (bf16 in, fp32 out, as fp32_wgrad runs them): PyTorch's product
against every algorithm cuBLASLt's heuristic offers, with split-K's separate reduction kernel and without.

    python3 benchmarks/micro/wgrad_algos.py [--tokens 16384] [--algos 12] [--reps 40]

In the top step three of a Block's four weight gradients run split-K with a reduction kernel after them
(`cublasLt::splitKreduce_kernel`: 0.30 ms a step over 36 launches in the trace of 2026-12-03-h200-beside). For each
shape: `torch.mm(dY.T, X, out_dtype=float32)`'s time, then, for each reduction-scheme mask the heuristic is asked
with (any, none, in place), each algorithm it returns with its tile, split-K count and reduction scheme, its time
(CUDA events over --reps calls, the reduction kernel included) and its largest difference from PyTorch's product
relative to that product's largest magnitude. Uses the libcublasLt PyTorch loaded (cublaslt.py).
"""

import argparse
import ctypes
import statistics

import torch

import cublaslt as lt

_CONFIG_TILE_ID, _CONFIG_SPLITK_NUM, _CONFIG_REDUCTION_SCHEME = 1, 2, 3
_PREF_REDUCTION_SCHEME_MASK = 3
MASKS = {"any": 7, "none": 0, "inplace": 1}  # cublasLtReductionScheme_t: INPLACE 1, COMPUTE_TYPE 2, OUTPUT_TYPE 4
SCHEMES = {0: "none", 1: "inplace", 2: "compute", 4: "output"}
SHAPES = {"c_attn": (2304, 768), "attn.c_proj": (768, 768), "c_fc": (3072, 768), "mlp.c_proj": (768, 3072)}


def _config(algo, attr: int) -> int:
    value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
    fn = lt._library().cublasLtMatmulAlgoConfigGetAttribute
    fn.argtypes = [ctypes.POINTER(ctypes.c_uint64 * 8), ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.POINTER(ctypes.c_size_t)]
    lt._check(fn(ctypes.byref(algo), attr, ctypes.byref(value), ctypes.sizeof(value), ctypes.byref(written)),
              f"cublasLtMatmulAlgoConfigGetAttribute({attr})")
    return value.value


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def algos(d, layouts, mask: int, count: int, device: int) -> list:
    """The heuristic's algorithms for these descriptors with reduction schemes in `mask`."""
    lib = lt._library()
    pref = ctypes.c_void_p()
    lt._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    try:
        for attr, value in ((lt._PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(lt.WORKSPACE_BYTES)),
                            (_PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(mask))):
            lt._check(lib.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(value), ctypes.sizeof(value)),
                      f"cublasLtMatmulPreferenceSetAttribute({attr})")
        results, found = (lt._AlgoResult * count)(), ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(lt._handle(device), d.desc, *layouts, layouts[2], pref, count,
                                                    results, ctypes.byref(found))
        if status != 0:
            return []
        return [results[i] for i in range(found.value) if results[i].state == 0]
    finally:
        lib.cublasLtMatmulPreferenceDestroy(pref)


def shape(name: str, out_features: int, in_features: int, tokens: int, args) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, in_features, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = torch.randn(tokens, out_features, device="cuda", dtype=torch.bfloat16, generator=g)
    ref = torch.mm(dy.t(), x, out_dtype=torch.float32)
    scale = ref.abs().max().item()
    torch_ms = statistics.median(timed(lambda: torch.mm(dy.t(), x, out_dtype=torch.float32), args.reps)
                                 for _ in range(3))
    print(f"{name}: weight {out_features} x {in_features}, {tokens} tokens; torch.mm {torch_ms * 1000:.1f} us")
    lib = lt._library()
    out = torch.empty(out_features, in_features, device="cuda", dtype=torch.float32)
    workspace = torch.empty(lt.WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    device = torch.cuda.current_device()
    with lt._Desc(lib) as d:
        lt._check(lib.cublasLtMatmulDescCreate(ctypes.byref(d.desc), lt._COMPUTE_32F, lt._CUDA_DTYPES[torch.float32]),
                  "cublasLtMatmulDescCreate")
        # Column-major: out as stored is D (in x out) = X-as-stored (in x tokens) . (dY-as-stored (out x tokens))^T.
        d.set(lt._DESC_TRANSA, ctypes.c_int32(lt._OP_N))
        d.set(lt._DESC_TRANSB, ctypes.c_int32(lt._OP_T))
        layouts = (d.layout(torch.bfloat16, in_features, tokens, in_features),
                   d.layout(torch.bfloat16, out_features, tokens, out_features),
                   d.layout(torch.float32, in_features, out_features, in_features))
        seen = set()
        for label, mask in MASKS.items():
            found = algos(d, layouts, mask, args.algos, device)
            fresh = [r for r in found if tuple(r.algo) not in seen]
            print(f"  reduction mask {label}: {len(found)} algorithms, {len(fresh)} not listed above")
            rows = []
            for result in fresh:
                algo = result.algo
                seen.add(tuple(algo))

                def run(algo=algo):
                    lt._check(lib.cublasLtMatmul(lt._handle(device), d.desc, ctypes.byref(alpha), x.data_ptr(),
                                                 layouts[0], dy.data_ptr(), layouts[1], ctypes.byref(beta),
                                                 out.data_ptr(), layouts[2], out.data_ptr(), layouts[2],
                                                 ctypes.byref(algo), workspace.data_ptr(), lt.WORKSPACE_BYTES,
                                                 torch.cuda.current_stream().cuda_stream), "cublasLtMatmul")
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                error = ((out - ref).abs().max() / scale).item()
                ms = statistics.median(timed(run, args.reps) for _ in range(3))
                rows.append((ms, _config(algo, _CONFIG_TILE_ID), _config(algo, _CONFIG_SPLITK_NUM),
                             SCHEMES.get(_config(algo, _CONFIG_REDUCTION_SCHEME), "?"), result.waves, error))
            for ms, tile, splits, scheme, waves, error in sorted(rows):
                print(f"    {ms * 1000:7.1f} us  tile {tile:3d}  split-K {splits}  reduction {scheme:8s} "
                      f"waves {waves:5.2f}  error {error:.1e}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--algos", type=int, default=12)
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args()
    torch.cuda.init()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, (out_features, in_features) in SHAPES.items():
        shape(name, out_features, in_features, args.tokens, args)


if __name__ == "__main__":
    main()
