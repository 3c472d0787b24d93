"""The q, k, v gradient kernel (src/gpt2ladder/kernels/qkv.py) at GPT-2 124M's attention shape (B=16, 12 heads,
T=1024, head size 64, bf16) on one GPU: the compiled PyTorch expressions it replaces (the copy into c_attn's output
gradient and the bias gradient's column sums) against the kernel at several tile shapes, on the gradients SDPA's own
backward returns (their strides as it makes them), with each one's bandwidth and whether it matches.
Run on a GPU: python benchmarks/micro/qkv_grad.py"""

import torch
import torch.nn.functional as F
import triton

from gpt2ladder.kernels import qkv as qk
from gpt2ladder.model.gpt import split_heads

B, NH, T, HS = 16, 12, 1024, 64
C = NH * HS
gen = torch.Generator().manual_seed(0)
qkv = torch.randn(B, T, 3 * C, generator=gen).to("cuda", torch.bfloat16)
q, k, v = (h.detach().requires_grad_() for h in split_heads(qkv, NH))
y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
y.backward(torch.randn(y.shape, generator=gen).to("cuda", torch.bfloat16))
dq, dk, dv = q.grad, k.grad, v.grad
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
print("strides of the gradients SDPA returned:", dq.stride(), dk.stride(), dv.stride())


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200)


def against_compile(reference, op, moved: int, what: str, op_note: str) -> None:
    """Time the reference expressions compiled, and the op as the step calls it, on the gradients above."""
    compiled = torch.compile(reference)
    compiled(dq, dk, dv, torch.float32)
    ms = bench(lambda: compiled(dq, dk, dv, torch.float32))
    print(f"compiled expressions ({what}): {ms:.4f} ms ({moved / ms / 1e6:.0f} GB/s for the one pass the kernel makes)")
    ms = bench(lambda: op(dq, dk, dv, torch.float32))
    print(f"the op as the step calls it ({op_note}): {ms:.4f} ms")


moved = 2 * B * T * 3 * C * 2  # read the three gradients, write c_attn's output gradient (bf16)
ref, ref_db = qk.qkv_grad_reference(dq, dk, dv, torch.float32)
against_compile(qk.qkv_grad_reference, qk.qkv_grad, moved, "copy and column sums", "its zeroed bias buffer included")
print("kernel (rows per tile, tiles per program, warps): ms, GB/s, output equal, max abs error of the bias gradient")
best = []
for tile in [(64, 4, 4), (64, 1, 4), (32, 4, 4), (128, 2, 4), (128, 4, 8), (64, 8, 4), (64, 16, 4), (32, 8, 2),
             (128, 8, 8), (256, 4, 8)]:
    out = torch.empty(B * T, 3 * C, device="cuda", dtype=torch.bfloat16)
    db = torch.zeros(3 * C, device="cuda")

    def run():
        db.zero_()
        qk.launch(dq, dk, dv, out, db, tile=tile)

    run()
    same = torch.equal(out.view(B, T, -1), ref)
    err = (db - ref_db).abs().max().item()
    ms = bench(run)
    print(tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s", same, f"{err:.1e}")
    best.append((ms, tile))
print("fastest:", min(best))
