"""The loss gradient pass split in two at GPT-2's B=16 x 1024 on one GPU: the gradient kernel of
src/gpt2ladder/kernels/loss.py writing only the row-major float8 gradient, then a transpose of those bytes into
the (V, N) copy the classifier's weight-gradient matmul needs, against the one kernel that writes both (the
`loss_kernel` rung). The one kernel moves 3.3 GB and reaches about 2.5-2.7 TB/s where a plain copy of the logits
reaches 4.3; if the transposed store is what holds it back, the split moves 0.8 GB more but each part may run
near the copy's rate. Each variant's output is checked byte for byte against the one kernel's.
Run on a GPU: PYTHONPATH=src python benchmarks/micro/loss_transpose.py"""

import torch
import triton
import triton.language as tl

from gpt2ladder.kernels import loss as lk
from gpt2ladder.speedups.fused_loss import E5M2, GRAD_SCALE, _lse_and_loss


@triton.jit
def transpose_kernel(src_ptr, dst_ptr, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst (n_cols, n_rows) = src (n_rows, n_cols) transposed, one (BLOCK_R x BLOCK_C) tile per program."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    tile = tl.load(src_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask)
    tl.store(dst_ptr + cols[:, None] * n_rows + rows[None, :], tl.trans(tile), mask=tl.trans(mask))


def transpose(src: torch.Tensor, dst: torch.Tensor, tile, warps) -> None:
    n, v = src.shape
    transpose_kernel[(triton.cdiv(n, tile[0]), triton.cdiv(v, tile[1]))](src, dst, n, v, BLOCK_R=tile[0],
                                                                      BLOCK_C=tile[1], num_warps=warps)


def timed(run):
    try:
        return triton.testing.do_bench(run, warmup=20, rep=100)
    except Exception as e:  # a shape this GPU cannot run is reported, not fatal
        print("  failed:", str(e).splitlines()[0][:100])
        return None


def grad_pass(logits, targets, lse, g, gt, tile):
    gm, gv, gw = tile
    lk._loss_grad_kernel[(triton.cdiv(N, gm), triton.cdiv(V, gv))](
        logits, targets, lse, g, g if gt is None else gt, N, V, REAL, GRAD_SCALE, WRITE_T=gt is not None,
        BLOCK_M=gm, BLOCK_V=gv, ROWS_FAST=True, WIDE=False, num_warps=gw)


if __name__ == "__main__":
    N, V, REAL = 16384, 50304, 50257
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(N, V, generator=gen) * 3).to(torch.bfloat16).cuda()
    targets = torch.randint(0, REAL, (N,), generator=gen).cuda()
    lse = _lse_and_loss(logits, targets, REAL)[0].squeeze(1).contiguous()
    g_ref = torch.empty(N, V, device="cuda", dtype=E5M2)
    gt_ref = torch.empty(V, N, device="cuda", dtype=E5M2)
    g, gt = torch.empty_like(g_ref), torch.empty_like(gt_ref)
    gb = N * V  # bytes of one float8 layout; the logits are twice that
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")

    base_tile = lk.GRAD_BOTH[:3]
    one = timed(lambda: grad_pass(logits, targets, lse, g_ref, gt_ref, base_tile))
    print(f"one kernel, both layouts {base_tile}: {one:.3f} ms ({(2 * gb + 2 * gb) / one / 1e6:.0f} GB/s)")

    print("gradient kernel, row-major only (rows, cols, warps): ms, GB/s, equal to the one kernel's")
    rows_only = []
    for tile in [(32, 64, 4), (64, 64, 4), (16, 128, 4), (8, 256, 4), (4, 512, 4), (8, 512, 8), (2, 1024, 4)]:
        ms = timed(lambda: grad_pass(logits, targets, lse, g, None, tile))
        if ms is None:
            continue
        same = torch.equal(g.view(torch.uint8), g_ref.view(torch.uint8))
        print(tile, f"{ms:.3f} ms", f"{(2 * gb + gb) / ms / 1e6:.0f} GB/s", same)
        if same:
            rows_only.append((ms, tile))

    print("transpose of the float8 gradient (rows, cols, warps): ms, GB/s, equal to the one kernel's copy")
    src, dst = g_ref.view(torch.uint8), gt.view(torch.uint8)
    transposes = []
    for tile, warps in [((64, 64), 4), ((128, 64), 4), ((64, 128), 4), ((128, 128), 8), ((256, 64), 8),
                        ((32, 128), 4), ((128, 32), 4), ((256, 128), 8)]:
        ms = timed(lambda: transpose(src, dst, tile, warps))
        if ms is None:
            continue
        same = torch.equal(dst, gt_ref.view(torch.uint8))
        print(tile, warps, f"{ms:.3f} ms", f"{2 * gb / ms / 1e6:.0f} GB/s", same)
        if same:
            transposes.append((ms, (tile, warps)))
    ms = timed(lambda: dst.copy_(src.t()))
    print(f"torch copy_ of the transposed view: {ms:.3f} ms, {2 * gb / ms / 1e6:.0f} GB/s")

    if rows_only and transposes:
        (a, ta), (b, tb) = min(rows_only), min(transposes)
        print(f"split: {a:.3f} + {b:.3f} = {a + b:.3f} ms ({ta}, {tb}) against {one:.3f} ms for the one kernel: "
              f"{one - (a + b):+.3f} ms per step")
