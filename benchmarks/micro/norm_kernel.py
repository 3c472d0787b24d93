"""The add + layer norm kernels (src/gpt2ladder/kernels/norm.py) at GPT-2 124M's residual shape (16384 x 768,
bf16) on one GPU: the compiled PyTorch expressions they replace against the kernels at several tile shapes,
forward (s = h + p, y = layer_norm(s)) and backward (d(h + p), weight and bias gradients), each timed as a
CUDA graph of the call (so launch gaps count, as in the step), with its error against the reference; then the
backward without and with its loop loading the next row block ahead, the branch bias's gradient summed as the step
runs it. Run on a GPU: python benchmarks/micro/norm_kernel.py [--variants]
(--variants: only the last part).
"""

import sys

import torch
import triton

from gpt2ladder.kernels import norm as nk

N, C, EPS = 16384, 768, 1e-5
gen = torch.Generator().manual_seed(0)
h = (torch.randn(N, C, generator=gen) * 2).to("cuda", torch.bfloat16)
p = torch.randn(N, C, generator=gen).to("cuda", torch.bfloat16)
w, b = (1 + 0.1 * torch.randn(C, generator=gen)).cuda(), (0.1 * torch.randn(C, generator=gen)).cuda()
dy = (torch.randn(N, C, generator=gen) * 1e-3).to("cuda", torch.bfloat16)
ds = (torch.randn(N, C, generator=gen) * 1e-3).to("cuda", torch.bfloat16)
SMS = torch.cuda.get_device_properties(0).multi_processor_count
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}, {SMS} SMs")


def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=200)


def rel(a, ref):
    return ((a.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


# What compile makes of the same step: the add, the norm in fp32 out to bf16, and autograd's backward.
def compiled_step(h, p, w, b, dy, ds):
    hh, pp = h.detach().requires_grad_(), p.detach().requires_grad_()
    ww, bb = w.detach().requires_grad_(), b.detach().requires_grad_()
    s = hh + pp
    y = torch.nn.functional.layer_norm(s.float(), (C,), ww, bb, EPS).to(torch.bfloat16)
    return torch.autograd.grad((s, y), (hh, ww, bb), (ds, dy))


def compiled_fwd(h, p, w, b):
    s = h + p
    return s, torch.nn.functional.layer_norm(s.float(), (C,), w, b, EPS).to(torch.bfloat16)


VARIANTS_ONLY = "--variants" in sys.argv[1:]
rs, ry, rmean, rrstd = nk.add_norm_reference(h, p, w, b, EPS, torch.bfloat16)
rdsum, rdw, rdb = nk.add_norm_grad_reference(dy, ds, rs, w, rmean, rrstd)
moved = 4 * N * C * 2
if not VARIANTS_ONLY:
    cf, cs = torch.compile(compiled_fwd), torch.compile(compiled_step)
    cf(h, p, w, b), cs(h, p, w, b, dy, ds)
    fwd_ms = bench(lambda: cf(h, p, w, b))
    both_ms = bench(lambda: cs(h, p, w, b, dy, ds))
    print(f"compiled: forward {fwd_ms:.4f} ms, forward + backward {both_ms:.4f} ms, "
          f"backward ~{both_ms - fwd_ms:.4f} ms")

    print("forward kernel (rows, warps): ms, GB/s, max rel. error of y")
    best = []
    for tile in [(1, 4), (2, 4), (4, 4), (8, 4), (4, 8), (8, 8), (16, 8), (2, 2)]:
        s, y = torch.empty_like(h), torch.empty_like(h)
        mean, rstd = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
        nk.launch_fwd(h, p, w, b, EPS, s, y, mean, rstd, tile=tile)
        ms = bench(lambda: nk.launch_fwd(h, p, w, b, EPS, s, y, mean, rstd, tile=tile))
        print(tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s", f"{rel(y, ry):.1e}",
              f"s equal: {torch.equal(s, rs)}")
        best.append((ms, tile))
    print("fastest forward:", min(best))

    print("backward kernels (rows, warps, programs per SM[, Triton's num_stages]): ms, GB/s, max rel. error of d(h+p), "
          "dw, db")
    best = []
    for tile in [(4, 4, 2), (4, 4, 1), (4, 4, 4), (2, 4, 2), (8, 4, 2), (8, 8, 2), (1, 4, 4), (2, 2, 4), (4, 8, 1),
                 (16, 8, 1), (8, 4, 2, 1), (8, 4, 2, 2), (8, 4, 2, 4), (8, 4, 3), (8, 4, 4), (4, 4, 4, 2), (4, 2, 4),
                 (4, 2, 8), (2, 2, 8), (16, 8, 2), (16, 16, 1), (8, 8, 1), (4, 4, 3)]:
        dsum, dw, db = torch.empty_like(h), torch.empty_like(w), torch.empty_like(w)

        def run():
            nk.launch_bwd(dy, ds, rs, w, rmean, rrstd, dsum, dw, db, SMS * tile[2], tile=tile)

        run()
        ms = bench(run)
        print(tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s",
              f"{rel(dsum, rdsum):.1e} {rel(dw, rdw):.1e} {rel(db, rdb):.1e}")
        best.append((ms, tile))
    print("fastest backward:", min(best))

    # The column sums alone (the second kernel of the backward): their share, at the backward's best tile, over
    # several tiles of their own; then the whole backward with the fastest.
    bm, warps, per_sm, *stages = min(best)[1]
    programs = min(SMS * per_sm, triton.cdiv(N, bm))
    part = torch.randn(2, programs, C, device="cuda")
    dw, db = torch.empty_like(w), torch.empty_like(w)
    ref_w, ref_b = part[0].sum(0), part[1].sum(0)
    print(f"column sums of (2, {programs}, {C}) fp32 (parts per step, columns per program, warps): ms, max rel. error")
    sums = []
    for tile in [(32, 128, 4), (64, 64, 4), (32, 64, 4), (64, 32, 4), (32, 32, 2), (128, 32, 4), (16, 16, 1),
                 (64, 16, 2), (256, 16, 4)]:
        cp, cn, cw = tile

        def colsum():
            nk._colsum_kernel[(triton.cdiv(C, cn), 2)](part, dw, db, db, C, N_PARTS=programs, BLOCK_P=cp, BLOCK_N=cn,
                                                       num_warps=cw)

        colsum()
        ms = bench(colsum)
        print(tile, f"{ms:.4f} ms", f"{max(rel(dw, ref_w), rel(db, ref_b)):.1e}")
        sums.append((ms, tile))
    print("fastest column sums:", min(sums))
    dsum, dw, db = torch.empty_like(h), torch.empty_like(w), torch.empty_like(w)
    for colsum_tile in (nk.COLSUM_TILE, min(sums)[1]):
        def whole():
            nk.launch_bwd(dy, ds, rs, w, rmean, rrstd, dsum, dw, db, SMS * per_sm, tile=min(best)[1],
                          colsum=colsum_tile)

        whole()
        print(f"backward at {min(best)[1]} with column sums at {colsum_tile}: {bench(whole):.4f} ms, errors "
              f"{rel(dsum, rdsum):.1e} {rel(dw, rdw):.1e} {rel(db, rdb):.1e}")


# The backward's loop without and with loading its next row block ahead, each with the branch bias's gradient summed
# (the proj_bias rung's step), over tiles near the fastest.
rdsum, rdw, rdb, rdpb = nk.add_norm_grad_reference(dy, ds, rs, w, rmean, rrstd, with_pbias=True)
print(f"backward with the branch bias's sum, committed tile {nk.BWD_TILE}; prefetch, (rows, warps, programs "
      "per SM): ms, GB/s, max rel. error of d(h+p), dw, db, dpb")
found = []
for prefetch in (False, True):
    for tile in [(2, 4, 2), (2, 4, 4), (4, 4, 2), (4, 4, 3), (8, 4, 2), (4, 8, 2)]:
        dsum, dw, db, dpb = torch.empty_like(h), torch.empty_like(w), torch.empty_like(w), torch.empty_like(w)

        def run():
            nk.launch_bwd(dy, ds, rs, w, rmean, rrstd, dsum, dw, db, SMS * tile[2], tile=tile, dpb=dpb,
                          prefetch=prefetch)

        run()
        ms = bench(run)
        print(prefetch, tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s",
              f"{rel(dsum, rdsum):.1e} {rel(dw, rdw):.1e} {rel(db, rdb):.1e} {rel(dpb, rdpb):.1e}")
        found.append((ms, prefetch, tile))
    print(f"fastest with prefetch {prefetch}:", min(f for f in found if f[1] == prefetch))
print("fastest of all:", min(found))
