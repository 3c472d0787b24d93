"""Float8 for the Blocks' input gradients, on one GPU: what the fp8_dgrad rung's product costs against bf16's.

A Linear's input gradient is the (N, out) output gradient times the (out, in) weight. With fp8_dgrad the gradient is
cast to e4m3 with one scale per row and the weight with one per input feature (its transposed copy made contiguous),
and `torch._scaled_mm` multiplies them with fast accumulation (`speedups/fp32_wgrad.py`, `input_grad`). This times,
for each of the four Linears of a Block of GPT-2 124M and GPT-2 medium at 16 x 1024 tokens, bf16:
  1. the bf16 product g @ w;
  2. the whole float8 path, compiled as the step compiles it (the casts fused by Inductor, then the product);
  3. the float8 product alone, from operands cast beforehand, with fast accumulation and without;
  4. the gradient's cast alone (compiled), which in the step may fuse into the kernel that writes the gradient;
and each path's error against the fp32 product. Run on a GPU: PYTHONPATH=src python3 benchmarks/micro/fp8_dgrad.py
"""

import torch
import triton

from gpt2ladder.kernels.norm import rows_to_fp8
from gpt2ladder.speedups.common import scaled_matmul
from gpt2ladder.speedups.fp32_wgrad import input_grad

N = 16 * 1024
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}, "
      f"{torch.cuda.get_device_name()}")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def rel(y, exact):
    return ((y.float() - exact).norm() / exact.norm()).item()


print("model linear (out x in): bf16 ms | float8 path ms (saves) | product fast / exact-accum ms | gradient cast ms"
      " | error bf16, float8")
for model, c in (("gpt2", 768), ("gpt2-medium", 1024)):
    for name, out, inp in (("c_attn", 3 * c, c), ("attn.c_proj", c, c), ("c_fc", 4 * c, c), ("mlp.c_proj", c, 4 * c)):
        gen = torch.Generator().manual_seed(0)
        g = (torch.randn(N, out, generator=gen) * 1e-3).to("cuda", torch.bfloat16)
        w = (torch.randn(out, inp, generator=gen) * 0.02).to("cuda", torch.bfloat16)
        exact = g.float() @ w.float()
        torch._dynamo.reset()  # compiled for this shape alone, as the step compiles it (no dynamic-shape kernels)
        fp8_path = torch.compile(lambda g, w: input_grad(g, w, True), dynamic=False)
        cast = torch.compile(rows_to_fp8, dynamic=False)
        ms_bf16 = bench(lambda: g @ w)
        ms_path = bench(lambda: fp8_path(g, w))
        g8, gs = rows_to_fp8(g)
        wt8, ws = rows_to_fp8(w.t())
        wt8 = wt8.contiguous()
        ms_fast = bench(lambda: scaled_matmul(g8, gs, wt8, ws, None, torch.bfloat16))
        ms_exact = bench(lambda: torch._scaled_mm(g8, wt8.t(), scale_a=gs[:, None], scale_b=ws[None, :],
                                                  out_dtype=torch.bfloat16, use_fast_accum=False))
        ms_cast = bench(lambda: cast(g))
        err_bf16, err_fp8 = rel(g @ w, exact), rel(fp8_path(g, w), exact)
        print(f"{model} {name} ({out} x {inp}): {ms_bf16:.4f} | {ms_path:.4f} ({ms_bf16 - ms_path:+.4f}) | "
              f"{ms_fast:.4f} / {ms_exact:.4f} | {ms_cast:.4f} | {err_bf16:.1e}, {err_fp8:.1e}")
