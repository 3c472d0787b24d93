"""The GELU kernels (src/gpt2ladder/kernels/gelu.py) at GPT-2 124M's MLP shape (16384 x 3072, bf16) on
one GPU: the compiled PyTorch expressions they replace against the kernels at several tile shapes,
forward (gelu(h0 + bias)) and backward (input gradient and the bias gradient), with each one's error
and bandwidth; then the forward with its float8 copy (the fp8_proj rung) at several tiles. Run on a GPU:
python benchmarks/micro/gelu_kernel.py"""

import torch
import triton

from gpt2ladder.kernels import gelu as gk

N, C = 16384, 3072
gen = torch.Generator().manual_seed(0)
h0 = (torch.randn(N, C, generator=gen) * 2).to("cuda", torch.bfloat16)
grad = (torch.randn(N, C, generator=gen) * 1e-3).to("cuda", torch.bfloat16)
bias = (torch.randn(C, generator=gen) * 0.1).cuda()
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


# Forward: read h0, write a (bf16).
moved = 2 * N * C * 2
ref_a = gk.gelu_reference(h0, bias)
compiled_fwd = torch.compile(gk.gelu_reference)
compiled_fwd(h0, bias)
ms = bench(lambda: compiled_fwd(h0, bias))
print(f"forward, compiled expressions: {ms:.4f} ms ({moved / ms / 1e6:.0f} GB/s)")
print("forward kernel (rows, columns, warps): ms, GB/s, share of bf16 outputs that differ")
best = []
for tile in [(8, 256, 4), (4, 512, 4), (16, 256, 8), (8, 512, 8), (2, 1024, 4), (16, 128, 4), (32, 128, 8),
             (1, 1024, 4), (4, 256, 2)]:
    a = torch.empty_like(h0)
    gk.launch_fwd(h0, bias, a, tile=tile)
    diff = (a != ref_a).float().mean().item()
    ms = bench(lambda: gk.launch_fwd(h0, bias, a, tile=tile))
    print(tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s", f"{diff:.1e}")
    best.append((ms, tile))
print("fastest forward:", min(best))
best_fwd = best

# Backward: read grad and h0, write dh (bf16); the bias gradient on top.
moved = 3 * N * C * 2
ref_dh, ref_db = gk.gelu_grad_reference(grad, h0, bias)
compiled = torch.compile(gk.gelu_grad_reference)
compiled(grad, h0, bias)
ms = bench(lambda: compiled(grad, h0, bias))
print(f"backward, compiled expressions: {ms:.4f} ms ({moved / ms / 1e6:.0f} GB/s for the one pass the kernel makes)")
print("backward kernel (rows, columns, warps, row blocks): ms, GB/s, max rel. error of dh, max abs error of db")
best = []
for tile in [(64, 64, 4, 1), (32, 64, 4, 1), (64, 128, 4, 1), (32, 128, 4, 1), (128, 64, 4, 1), (64, 64, 8, 1),
             (32, 64, 2, 1), (16, 64, 2, 1), (64, 64, 4, 2), (32, 64, 4, 4), (16, 64, 2, 16), (128, 128, 8, 1)]:
    dh = torch.empty_like(h0)
    db = torch.zeros(C, device="cuda")

    def run():
        db.zero_()
        gk.launch(grad, h0, bias, dh, db, tile=tile)

    run()
    rel = ((dh.float() - ref_dh.float()).abs() / ref_dh.float().abs().clamp(min=1e-30)).max().item()
    err = (db - ref_db).abs().max().item()
    ms = bench(run)
    print(tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s", f"{rel:.1e}", f"{err:.1e}")
    best.append((ms, tile))
print("fastest backward:", min(best))

# Forward with its float8 copy (the fp8_proj rung): read h0, write a (bf16), its e4m3 copy and a scale per row.
moved = N * C * (2 + 2 + 1)
print("forward kernel with the float8 copy (rows, warps): ms, GB/s, extra ms over the fastest plain forward")
plain = min(best_fwd)[0]
best = []
for tile in [(1, 4), (1, 8), (2, 4), (2, 8), (4, 8), (4, 16), (8, 16)]:
    a, q = torch.empty_like(h0), torch.empty(N, C, device="cuda", dtype=torch.float8_e4m3fn)
    qs = torch.empty(N, device="cuda")
    ms = bench(lambda: gk.launch_fwd_fp8(h0, bias, a, q, qs, tile=tile))
    print(tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s", f"{ms - plain:+.4f}")
    best.append((ms, tile))
print("fastest forward with the float8 copy:", min(best))
