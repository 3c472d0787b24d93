"""Float8 for c_proj's forward product with block scales, on one GPU: what the fp8_proj rung would cost with one
scale per 128 columns of a row in place of one per row.

fp8_proj's GELU kernel holds whole rows to find each row's scale and ran 0.059 ms a Block slower than the plain
GELU forward on an H200, more than the float8 product saved. With 1 x 128 block scales (PyTorch's block-wise
scaling of `torch.nn.functional.scaled_mm`, cuBLAS 12.9 and newer on Hopper) the kernel keeps the plain forward's
tile. This times, at GPT-2 124M's MLP (16384 x 3072 -> 768, bf16):
  1. the GELU forward: plain, with its row-scaled float8 copy, with its block-scaled copy at several tiles;
  2. c_proj's product: bf16, float8 with row scales (as fp8_fc), float8 with 1 x 128 scales on the activation and
     1 x 128 or 128 x 128 scales on the weight, each with its error against the fp32 product.
A combination the installed PyTorch or cuBLAS refuses is printed with its one-line reason. Run on a GPU:
PYTHONPATH=src python3 benchmarks/micro/fp8_blockwise.py"""

import torch
import torch.nn.functional as F
import triton

from gpt2ladder.kernels import gelu as gk
from gpt2ladder.kernels.norm import E4M3, E4M3_MAX

N, C, OUT = 16384, 3072, 768
BLOCK = gk.FP8_BLOCK
gen = torch.Generator().manual_seed(0)
h0 = (torch.randn(N, C, generator=gen) * 2).to("cuda", torch.bfloat16)
bias = (torch.randn(C, generator=gen) * 0.1).cuda()
weight = (torch.randn(OUT, C, generator=gen) * 0.02).cuda()  # c_proj's (out, in), fp32 as trained
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}, "
      f"{torch.cuda.get_device_name()}")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


# 1. The GELU forward: read h0, write a (bf16), and for the copies e4m3 and the scales.
plain_bytes, copy_bytes = 2 * N * C * 2, N * C
a = torch.empty_like(h0)
plain = bench(lambda: gk.launch_fwd(h0, bias, a))
print(f"GELU forward, plain: {plain:.4f} ms ({plain_bytes / plain / 1e6:.0f} GB/s)")
q, qs_rows = torch.empty(N, C, device="cuda", dtype=E4M3), torch.empty(N, device="cuda")
ms = bench(lambda: gk.launch_fwd_fp8(h0, bias, a, q, qs_rows))
print(f"GELU forward with the row-scaled copy (tile {gk.FP8_FWD_TILE}): {ms:.4f} ms, +{ms - plain:.4f}")
qs = torch.empty(C // BLOCK, N, device="cuda")  # block-major: qs.t() is the (N, C / 128) scale tensor
ref_a, ref_q, ref_qs = gk.gelu_fp8_blocks_reference(h0, bias)
print("GELU forward with the block-scaled copy (rows, columns, warps): ms, GB/s, over plain, "
      "scales' max rel. error, share of float8 values that differ from the reference's")
found = []
for tile in [(8, 256, 4), (4, 512, 4), (16, 256, 8), (8, 512, 8), (16, 128, 4), (32, 128, 8), (2, 1024, 4), (4, 128, 1),
             (8, 128, 1), (16, 128, 1), (8, 128, 2), (16, 128, 2), (32, 128, 2), (8, 256, 2), (32, 128, 4)]:
    try:
        gk.launch_fwd_fp8_blocks(h0, bias, a, q, qs, tile=tile)
    except Exception as e:  # a tile this GPU cannot run (registers, shared memory): say so, go on
        print(tile, f"failed: {(str(e).splitlines() or [type(e).__name__])[0][:200]}")
        continue
    scale_err = ((qs.t() - ref_qs).abs() / ref_qs).max().item()
    differ = (q.float() != ref_q.float()).float().mean().item()
    ms = bench(lambda: gk.launch_fwd_fp8_blocks(h0, bias, a, q, qs, tile=tile))
    print(tile, f"{ms:.4f} ms", f"{(plain_bytes + copy_bytes) / ms / 1e6:.0f} GB/s", f"+{ms - plain:.4f}",
          f"{scale_err:.1e}", f"{differ:.1e}")
    found.append((ms, tile))
best_ms, best_tile = min(found)
print(f"fastest block-scaled forward: {best_tile}, {best_ms:.4f} ms, +{best_ms - plain:.4f} over plain")

# 2. c_proj's product y = a @ W^T, M = N tokens, K = C, N = OUT.
gk.launch_fwd_fp8_blocks(h0, bias, a, q, qs, tile=best_tile)
exact = a.float() @ weight.t()


def report(name, fn):
    try:
        y = fn()
        err = ((y.float() - exact).norm() / exact.norm()).item()
        ms = bench(fn)
    except Exception as e:  # a refused combination: its reason, then the next
        print(f"{name}: refused: {(str(e).splitlines() or [type(e).__name__])[0][:200]}")
        return
    print(f"{name}: {ms:.4f} ms, {2 * N * C * OUT / ms / 1e9:.0f} TFLOP/s, rel. error {err:.2e}")


w16 = weight.to(torch.bfloat16)
report("bf16", lambda: a @ w16.t())

# row scales, as fp8_fc's product: activation per row, weight per output feature
sa_rows = a.float().abs().amax(1).clamp(min=1e-12) / E4M3_MAX
qa_rows = (a.float() / sa_rows[:, None]).to(E4M3)
sw_rows = weight.abs().amax(1).clamp(min=1e-12) / E4M3_MAX
w8_rows = (weight / sw_rows[:, None]).to(E4M3)
report("float8, row scales", lambda: torch._scaled_mm(qa_rows, w8_rows.t(), scale_a=sa_rows[:, None],
                                                       scale_b=sw_rows[None, :], out_dtype=torch.bfloat16))

# the weight with one scale per 128 of its input columns (1 x 128 along K), and per 128 x 128 tile
kb = C // BLOCK
w_blocks = weight.reshape(OUT, kb, BLOCK)
sw_1x128 = w_blocks.abs().amax(-1).clamp(min=1e-12) / E4M3_MAX  # (OUT, K / 128)
w8_1x128 = (w_blocks / sw_1x128[..., None]).reshape(OUT, C).to(E4M3)
w_tiles = weight.reshape(OUT // BLOCK, BLOCK, kb, BLOCK)
sw_128 = w_tiles.abs().amax((1, 3)).clamp(min=1e-12) / E4M3_MAX  # (OUT / 128, K / 128)
w8_128 = (w_tiles / sw_128[:, None, :, None]).reshape(OUT, C).to(E4M3)
sa_blocks = qs.t()  # (N, K / 128), rows adjacent, as the GELU kernel wrote it
sb_1x128 = sw_1x128.t().contiguous().t()  # (OUT, K / 128), output features adjacent
sb_128 = sw_128.contiguous().t()  # (K / 128, OUT / 128), K blocks adjacent

if hasattr(F, "scaled_mm"):
    from torch.nn.functional import ScalingType, SwizzleType

    def v2(scale_b, recipe_b, w8):
        return lambda: F.scaled_mm(q, w8.t(), scale_a=sa_blocks, scale_recipe_a=ScalingType.BlockWise1x128,
                                   scale_b=scale_b, scale_recipe_b=recipe_b, swizzle_a=SwizzleType.NO_SWIZZLE,
                                   swizzle_b=SwizzleType.NO_SWIZZLE, output_dtype=torch.bfloat16)

    report("float8, 1 x 128 activation, 1 x 128 weight (scaled_mm)",
           v2(sb_1x128, ScalingType.BlockWise1x128, w8_1x128))
    report("float8, 1 x 128 activation, 128 x 128 weight (scaled_mm)",
           v2(sb_128, ScalingType.BlockWise128x128, w8_128))
else:
    print("torch.nn.functional.scaled_mm: not in this PyTorch")
# the older entry point infers the block-wise recipe from the scales' shapes
report("float8, 1 x 128 activation, 1 x 128 weight (_scaled_mm)",
       lambda: torch._scaled_mm(q, w8_1x128.t(), scale_a=sa_blocks, scale_b=sb_1x128.t(), out_dtype=torch.bfloat16))
report("float8, 1 x 128 activation, 128 x 128 weight (_scaled_mm)",
       lambda: torch._scaled_mm(q, w8_128.t(), scale_a=sa_blocks, scale_b=sb_128, out_dtype=torch.bfloat16))
