"""The matmuls of a GPT-2 124M Block at B=16 x 1024 under each BLAS library PyTorch can call on CUDA: cuBLAS (the
default) and cuBLASLt (`torch.backends.cuda.preferred_blas_library("cublaslt")`, the `cublaslt` rung).

    python3 benchmarks/micro/blas_backend.py [--tokens 16384] [--reps 40]

For each Linear of a Block: the forward product x W^T and the input gradient dY W in bf16, and the weight gradient
dY^T X written in fp32 (`out_dtype`, as fp32_wgrad runs it). Each is timed by CUDA events over --reps calls, the
median of three such runs, under each library, with the kernels one call launched (from the profiler) and the
largest difference between the two libraries' results relative to the result's largest magnitude. Last, the sums
over a Block and over twelve.
"""

import argparse
import contextlib
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from wgrad_algos import timed  # CUDA events around --reps calls, after three untimed

SHAPES = {"c_attn": (2304, 768), "attn.c_proj": (768, 768), "c_fc": (3072, 768), "mlp.c_proj": (768, 3072)}
LIBRARIES = ("cublas", "cublaslt")


def start(doc: str, shape: str = "") -> argparse.Namespace:
    """A micro-benchmark's --tokens and --reps parsed, CUDA started, and its first line: the GPU, torch, the tokens
    and `shape`."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args()
    torch.cuda.init()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.tokens} tokens{shape}")
    return args


def median_ms(fn, reps: int) -> float:
    """Milliseconds a call: the median of three timings over `reps` calls each."""
    return statistics.median(timed(fn, reps) for _ in range(3))


@contextlib.contextmanager
def library(lib: str):
    """PyTorch's matmuls through `lib` ("cublas" or "cublaslt") inside, the library before restored after."""
    before = torch.backends.cuda.preferred_blas_library()
    try:
        torch.backends.cuda.preferred_blas_library(lib)
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def kernels(fn) -> list[str]:
    """The names (shortened) of the GPU kernels one call launches."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [n if len(n) <= 60 else n[:57] + "..." for n in names]


def products(out_features: int, in_features: int, tokens: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, in_features, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    dy = torch.randn(tokens, out_features, device="cuda", dtype=torch.bfloat16, generator=g)
    return {"forward": lambda: x @ w.t(), "input grad": lambda: dy @ w,
            "weight grad": lambda: torch.mm(dy.t(), x, out_dtype=torch.float32)}


def main() -> None:
    args = start(__doc__)
    totals = {lib: {} for lib in LIBRARIES}
    for name, (out_features, in_features) in SHAPES.items():
        for what, fn in products(out_features, in_features, args.tokens).items():
            results, line = {}, []
            for lib in LIBRARIES:
                with library(lib):
                    results[lib] = fn().float()
                    ms = median_ms(fn, args.reps)
                    line.append(f"{lib} {ms * 1000:6.1f} us [{', '.join(kernels(fn))}]")
                totals[lib][what] = totals[lib].get(what, 0.0) + ms
            gap = ((results["cublaslt"] - results["cublas"]).abs().max() / results["cublas"].abs().max()).item()
            print(f"{name:12s} {what:12s} " + "  ".join(line) + f"  gap {gap:.1e}")
    for what in totals["cublas"]:
        a, b = totals["cublas"][what], totals["cublaslt"][what]
        print(f"a Block's {what:12s}: cublas {a * 1000:6.1f} us, cublaslt {b * 1000:6.1f} us; "
              f"x12 cublas - cublaslt = {(a - b) * 12:.3f} ms")


if __name__ == "__main__":
    main()
