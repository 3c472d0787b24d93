"""What the `bias_in_wgrad` rung trades, alone, at c_attn's shape of GPT-2 124M at B=16 x 1024: the weight-gradient
product over the input with 8 columns of ones after each row (its column 768 the bias gradient) against the product
over the plain input plus a separate column sum of the output gradient, and the copy of the weight gradient out of
the wider product.

    python3 benchmarks/micro/bias_in_wgrad.py [--tokens 16384] [--reps 40]

Under each BLAS library PyTorch can call on CUDA (cuBLAS, and cuBLASLt as the `cublaslt` rung has it), each piece is
timed by CUDA events over --reps calls (median of three runs), with the kernels one call launched, then the two
paths' sums. The column sum here reads a contiguous (tokens, 2304) gradient; in the step compile's sum reads the q, k,
v gradients where they lie, which this does not reproduce. Also printed: the bias gradient's largest error against a
float64 sum, both ways.
"""

import torch

from blas_backend import LIBRARIES, kernels, library, median_ms, start

OUT, IN, ONES = 2304, 768, 8


def main() -> None:
    args = start(__doc__, f", c_attn {OUT} x {IN}")
    g = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(args.tokens, OUT, device="cuda", dtype=torch.bfloat16, generator=g) * 1e-3
    x = torch.randn(args.tokens, IN, device="cuda", dtype=torch.bfloat16, generator=g)
    aug = torch.cat([x, x.new_ones(args.tokens, ONES)], 1)
    exact = dy.double().sum(0)
    wide = torch.mm(dy.t(), aug, out_dtype=torch.float32)
    pieces = {
        "product, plain": lambda: torch.mm(dy.t(), x, out_dtype=torch.float32),
        "column sum": lambda: dy.sum(0, dtype=torch.float32),
        "product, with ones": lambda: torch.mm(dy.t(), aug, out_dtype=torch.float32),
        "weight gradient copied out": lambda: wide[:, :IN].contiguous(),
    }
    for lib in LIBRARIES:
        with library(lib):
            ms = {}
            for name, fn in pieces.items():
                ms[name] = median_ms(fn, args.reps)
                print(f"  {lib:9s} {name:28s} {ms[name] * 1000:8.1f} us   {', '.join(kernels(fn))}")
            apart = ms["product, plain"] + ms["column sum"]
            ones = ms["product, with ones"] + ms["weight gradient copied out"]
            print(f"  {lib:9s} apart {apart * 1000:.1f} us, through the ones {ones * 1000:.1f} us: "
                  f"{(apart - ones) * 1000:+.1f} us a layer")
            err_ones = (torch.mm(dy.t(), aug, out_dtype=torch.float32)[:, IN].double() - exact).abs().max()
            err_sum = (dy.sum(0, dtype=torch.float32).double() - exact).abs().max()
            scale = exact.abs().max()
            print(f"  {lib:9s} bias gradient's largest error: through the ones {err_ones / scale:.2e}, "
                  f"summed apart {err_sum / scale:.2e}")


if __name__ == "__main__":
    main()
