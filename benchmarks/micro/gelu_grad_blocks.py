"""fp8_dgrad on c_fc from the GELU backward's float8 copy, on one GPU: what each part costs at GPT-2 124M's MLP.

c_fc's input gradient is dh (16384 x 3072, the GELU's input gradient) times c_fc's weight (3072 x 768). Cast to float8
by compile in a pass of its own, dh's copy cost more than the float8 product saved. Here the GELU backward kernel
writes the copy beside dh, one scale per 128 columns of a row (`kernels/gelu.py`), and the product multiplies it by
the weight cast per 128 x 128 tile. This times:
  1. the GELU backward: plain, and with the block-scaled copy at several tiles;
  2. c_fc's input gradient: bf16, and float8 from the block-scaled copy (with and without the weight's cast), each
     with its error against the fp32 product.
Run on a GPU: PYTHONPATH=src python3 benchmarks/micro/gelu_grad_blocks.py"""

import torch
import triton

from gpt2ladder.kernels import gelu as gk
from gpt2ladder.kernels.norm import E4M3, tiles_to_fp8
from gpt2ladder.speedups.fp8_forward import scaled_matmul_blocks

N, C, IN = 16384, 3072, 768
BLOCK = gk.FP8_BLOCK
gen = torch.Generator().manual_seed(0)
h0 = (torch.randn(N, C, generator=gen) * 2).to("cuda", torch.bfloat16)
grad = (torch.randn(N, C, generator=gen) * 1e-3).to("cuda", torch.bfloat16)
bias = (torch.randn(C, generator=gen) * 0.1).cuda()
w16 = (torch.randn(C, IN, generator=gen) * 0.02).to("cuda", torch.bfloat16)  # c_fc's (out, in) weight
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}, "
      f"{torch.cuda.get_device_name()}")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


# 1. The GELU backward: read grad and h0, write dh (bf16) and the bias gradient, for the copy e4m3 and the scales.
plain_bytes, copy_bytes = 3 * N * C * 2, N * C
dh, dbias = torch.empty_like(h0), torch.zeros(C, device="cuda")
plain = bench(lambda: gk.launch(grad, h0, bias, dh, dbias))
print(f"GELU backward, plain (tile {gk.BWD_TILE}): {plain:.4f} ms ({plain_bytes / plain / 1e6:.0f} GB/s)")
q, qs = torch.empty(N, C, device="cuda", dtype=E4M3), torch.empty(C // BLOCK, N, device="cuda")
_, _, ref_q, ref_qs = gk.gelu_grad_fp8_blocks_reference(grad, h0, bias)
print("GELU backward with the block-scaled copy (rows, columns, warps, row blocks): ms, GB/s, over plain, "
      "scales' max rel. error, share of float8 values that differ from the reference's")
found = []
for tile in [(32, 128, 4, 1), (16, 128, 4, 1), (32, 128, 8, 1), (64, 128, 8, 1), (16, 256, 4, 1), (32, 256, 8, 1),
             (8, 128, 2, 1), (16, 128, 2, 1), (32, 128, 4, 2), (32, 128, 2, 1), (64, 128, 4, 1), (8, 128, 1, 1),
             (16, 128, 1, 1), (16, 256, 2, 1), (32, 256, 4, 1), (16, 128, 2, 2), (64, 128, 2, 1)]:
    try:
        gk.launch(grad, h0, bias, dh, dbias, tile=tile, q=q, qs=qs)
    except Exception as e:  # a tile this GPU cannot run (registers, shared memory): say so, go on
        print(tile, f"failed: {(str(e).splitlines() or [type(e).__name__])[0][:200]}")
        continue
    scale_err = ((qs.t() - ref_qs).abs() / ref_qs).max().item()
    differ = (q.float() != ref_q.float()).float().mean().item()
    ms = bench(lambda: gk.launch(grad, h0, bias, dh, dbias, tile=tile, q=q, qs=qs))
    print(tile, f"{ms:.4f} ms", f"{(plain_bytes + copy_bytes) / ms / 1e6:.0f} GB/s", f"+{ms - plain:.4f}",
          f"{scale_err:.1e}", f"{differ:.1e}")
    found.append((ms, tile))
best_ms, best_tile = min(found)
print(f"fastest backward with the copy: {best_tile}, {best_ms:.4f} ms, +{best_ms - plain:.4f} over plain")

# 2. c_fc's input gradient dx = dh @ W, M = N tokens, K = C, N = IN.
gk.launch(grad, h0, bias, dh, dbias, tile=best_tile, q=q, qs=qs)
exact = dh.float() @ w16.float()


def report(name, fn):
    y = fn()
    err = ((y.float() - exact).norm() / exact.norm()).item()
    ms = bench(fn)
    print(f"{name}: {ms:.4f} ms, {2 * N * C * IN / ms / 1e9:.0f} TFLOP/s, rel. error {err:.2e}")
    return ms


bf16 = report("bf16", lambda: dh @ w16)
wt8, swt = tiles_to_fp8(w16.t())
f8 = report("float8, 1 x 128 gradient, 128 x 128 weight", lambda: scaled_matmul_blocks(q, qs, wt8, swt, None,
                                                                                         torch.bfloat16))
cast = torch.compile(lambda w: tiles_to_fp8(w.t()))
cast(w16)
cast_ms = bench(lambda: cast(w16))
print(f"the weight's tile cast (compiled): {cast_ms:.4f} ms")
print(f"per Block: float8 product + cast + the copy's cost over the plain backward "
      f"{f8 + cast_ms + best_ms - plain:.4f} ms against bf16's {bf16:.4f}")
