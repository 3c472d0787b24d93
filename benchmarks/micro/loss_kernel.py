"""Tile shapes for the loss kernels (src/gpt2ladder/kernels/loss.py) at GPT-2's B=16 x 1024 on one GPU:
times each statistics-pass and gradient-pass configuration with triton.testing.do_bench, checks its
outputs against the PyTorch expressions, and prints the bandwidth each reaches.
Run on a GPU: python benchmarks/micro/loss_kernel.py"""

import torch
import triton

from gpt2ladder.kernels import loss as lk
from gpt2ladder.speedups.fused_loss import E5M2, GRAD_SCALE, _logit_grad, _lse_and_loss

N, V, REAL = 16384, 50304, 50257
gen = torch.Generator().manual_seed(0)
logits = (torch.randn(N, V, generator=gen) * 3).to(torch.bfloat16).cuda()
targets = torch.randint(0, REAL, (N,), generator=gen).cuda()
ref_lse, ref_loss = _lse_and_loss(logits, targets, REAL)
ref_lse = ref_lse.squeeze(1)
ref8 = _logit_grad(logits, ref_lse[:, None], targets[:, None], REAL, GRAD_SCALE, E5M2)
lse, loss = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
g = torch.empty(N, V, device="cuda", dtype=E5M2)
gt = torch.empty(V, N, device="cuda", dtype=E5M2)
logit_bytes = N * V * 2
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")

STATS_CONFIGS = [(4, 1024, 4, 1), (1, 2048, 4, 1), (1, 4096, 4, 1), (1, 4096, 8, 1), (1, 8192, 8, 1), (2, 2048, 4, 1),
                 (1, 1024, 2, 1), (1, 2048, 2, 1), (1, 4096, 2, 1), (2, 1024, 2, 1), (1, 4096, 4, 2), (1, 4096, 4, 3),
                 (1, 2048, 4, 3), (2, 2048, 4, 3), (1, 1024, 1, 1)]
GRAD_CONFIGS = [(64, 128, 4), (128, 64, 4), (32, 128, 4), (64, 64, 4), (64, 64, 2), (32, 64, 2), (32, 64, 4),
                (64, 32, 2), (16, 128, 2), (32, 128, 2), (64, 64, 8), (128, 32, 4), (32, 32, 1), (128, 128, 4),
                (16, 64, 1), (64, 32, 1)]


def timed(run):
    try:
        return triton.testing.do_bench(run, warmup=20, rep=100)
    except Exception as e:  # a shape this GPU cannot run (registers, shared memory) is reported, not fatal
        print("  failed:", str(e).splitlines()[0][:100])
        return None


print("\nstatistics pass (rows, cols, warps, stages): ms, GB/s, max |lse - ref|")
best = []
for sm, sv, sw, ss in STATS_CONFIGS:
    ms = timed(lambda: lk._loss_stats_kernel[(triton.cdiv(N, sm),)](
        logits, targets, lse, loss, N, V, vocab_size=REAL, BLOCK_M=sm, BLOCK_V=sv, WIDE=False, num_warps=sw,
        num_stages=ss))
    if ms is None:
        continue
    err = (lse - ref_lse).abs().max().item()
    ok = err < 1e-3
    print((sm, sv, sw, ss), f"{ms:.3f} ms", f"{logit_bytes / ms / 1e6:.0f} GB/s", f"{err:.2e}", "OK" if ok else "WRONG")
    if ok:
        best.append((ms, (sm, sv, sw, ss)))
print("fastest statistics pass:", min(best))

lse.copy_(ref_lse)
print("\ngradient pass, both float8 layouts (rows, cols, warps, rows_fast): ms, GB/s, codes off by 1, layouts equal")
best = []
for gm, gv, gw in GRAD_CONFIGS:
    for rows_fast in (True, False):
        blocks = (triton.cdiv(N, gm), triton.cdiv(V, gv))
        ms = timed(lambda: lk._loss_grad_kernel[blocks if rows_fast else blocks[::-1]](
            logits, targets, lse, g, gt, N, V, REAL, GRAD_SCALE, WRITE_T=True, BLOCK_M=gm, BLOCK_V=gv,
            ROWS_FAST=rows_fast, WIDE=False, num_warps=gw))
        if ms is None:
            continue
        codes = (g.view(torch.uint8).int() - ref8.view(torch.uint8).int()).abs()
        same = torch.equal(gt.view(torch.uint8), g.t().contiguous().view(torch.uint8))
        ok = codes.max().item() <= 1 and same
        print((gm, gv, gw, rows_fast), f"{ms:.3f} ms", f"{2 * logit_bytes / ms / 1e6:.0f} GB/s",
              f"{(codes == 1).float().mean().item():.1e}", same, "OK" if ok else "WRONG")
        if ok:
            best.append((ms, (gm, gv, gw, rows_fast)))
print("fastest gradient pass:", min(best))

print("\nfor scale: a bf16 copy of the logits,", end=" ")
out = torch.empty_like(logits)
ms = triton.testing.do_bench(lambda: out.copy_(logits), warmup=20, rep=100)
print(f"{ms:.3f} ms, {2 * logit_bytes / ms / 1e6:.0f} GB/s")
