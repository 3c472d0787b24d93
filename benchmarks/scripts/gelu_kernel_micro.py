"""The GELU kernel (src/gpt2ladder/gelu_kernel.py) at GPT-2 124M's MLP shape (16384 x 3072, bf16) on
one GPU: the compiled PyTorch expressions it replaces (input gradient, then the bias gradient as a
column sum) against the kernel at several tile shapes, with each one's error and bandwidth.
Run on a GPU: python benchmarks/scripts/gelu_kernel_micro.py"""

import torch
import triton

from gpt2ladder import gelu_kernel as gk

N, C = 16384, 3072
gen = torch.Generator().manual_seed(0)
h0 = (torch.randn(N, C, generator=gen) * 2).to("cuda", torch.bfloat16)
grad = (torch.randn(N, C, generator=gen) * 1e-3).to("cuda", torch.bfloat16)
bias = (torch.randn(C, generator=gen) * 0.1).cuda()
ref_dh, ref_db = gk.gelu_grad_reference(grad, h0, bias)
moved = 3 * N * C * 2  # read grad and h0, write dh (bf16)
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")

compiled = torch.compile(gk.gelu_grad_reference)
compiled(grad, h0, bias)
ms = triton.testing.do_bench(lambda: compiled(grad, h0, bias), warmup=25, rep=200)
print(f"compiled expressions: {ms:.4f} ms ({moved / ms / 1e6:.0f} GB/s for the one pass the kernel makes)")

print("kernel (rows, columns, warps): ms, GB/s, max rel. error of dh, max abs error of the bias gradient")
best = []
for tile in [(64, 128, 4), (32, 128, 4), (64, 64, 4), (128, 64, 4), (32, 256, 4), (64, 256, 8), (128, 128, 8),
             (16, 256, 4), (32, 64, 2)]:
    dh = torch.empty_like(h0)
    partial = torch.empty((triton.cdiv(N, tile[0]), C), device="cuda", dtype=torch.float32)

    def run():
        gk.launch(grad, h0, bias, dh, partial, tile=tile)
        return partial.sum(0)

    db = run()
    rel = ((dh.float() - ref_dh.float()).abs() / ref_dh.float().abs().clamp(min=1e-30)).max().item()
    err = (db - ref_db).abs().max().item()
    ms = triton.testing.do_bench(run, warmup=25, rep=200)
    print(tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s", f"{rel:.1e}", f"{err:.1e}")
    best.append((ms, tile))
print("fastest:", min(best))
