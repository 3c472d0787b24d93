"""cuBLASLt's GELU epilogues (benchmarks/micro/cublaslt.py) at GPT-2 124M's MLP shape (B=16 x 1024,
768 -> 3072 -> 768, bf16) on one GPU, against what the gelu_kernel rung runs: c_fc's matmul and the Triton
GELU forward kernel; the matmul forming c_proj's input gradient and the Triton GELU backward kernel.
Each one's error against fp32 expressions, times as CUDA graphs (so launch gaps do not count).
Run on a GPU: python benchmarks/micro/gelu_epilogue.py [N]"""

import sys

import torch
import triton
import torch.nn.functional as F

import cublaslt as lt
from gpt2ladder.kernels import gelu as gk

N = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
C, M = 768, 3072
gen = torch.Generator().manual_seed(0)
bf = torch.bfloat16
x = torch.randn(N, C, generator=gen).to("cuda", bf)
w_fc = (torch.randn(M, C, generator=gen) * 0.02).to("cuda", bf)
b_fc = (torch.randn(M, generator=gen) * 0.1).cuda()
w_proj = (torch.randn(C, M, generator=gen) * 0.02).to("cuda", bf)
g = (torch.randn(N, C, generator=gen) * 1e-3).to("cuda", bf)
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.get_device_name()}, cuBLASLt from "
      f"{lt._loaded_library_path()}; N={N}")


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_ms(fn, reps=5):
    graph = graphed(fn)
    runs = sorted(triton.testing.do_bench(graph.replay, warmup=25, rep=200) for _ in range(reps))
    return runs[len(runs) // 2], runs[0], runs[-1]


def show(name, fn):
    med, lo, hi = time_ms(fn)
    print(f"  {name:<58} {med:.4f} ms (min {lo:.4f}, max {hi:.4f})")
    return med


def attempt(name, fn):
    """show(name, fn), or inf where cuBLASLt refuses the combination (said, not fatal)."""
    try:
        return show(name, fn)
    except lt.CublasLtError as e:
        print(f"  {name}: {e}")
        return float("inf")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


# Forward: h = x W^T + b, a = gelu(h).
h_ref = x.float() @ w_fc.float().t() + b_fc
a_ref = F.gelu(h_ref, approximate="tanh")
a_erf = F.gelu(h_ref)
a, h = torch.ops.micro.gelu_linear(x, w_fc, b_fc.to(bf))
print("forward, error against fp32 (relative norm): "
      f"a {rel(a, a_ref):.2e} (vs the erf GELU {rel(a, a_erf):.2e}), h {rel(h, h_ref):.2e}")
h0 = torch.empty(N, M, device="cuda", dtype=bf)
out = torch.empty_like(h0)
print("forward times:")
t_mm = show("torch.mm (c_fc without bias)", lambda: torch.mm(x, w_fc.t(), out=h0))
t_old = show("torch.mm + Triton GELU forward (gelu_kernel rung)",
             lambda: (torch.mm(x, w_fc.t(), out=h0), gk.launch_fwd(h0, b_fc, out)))
t_plain = show("cuBLASLt, default epilogue", lambda: lt.matmul_t(x, w_fc, out, b_transposed=True, epilogue=1))
b_bf = b_fc.to(bf)
t_new = show("cuBLASLt, GELU_AUX_BIAS (bf16 bias)", lambda: lt.matmul_t(
    x, w_fc, out, b_transposed=True, epilogue=lt._EPILOGUE_GELU_AUX_BIAS, bias=b_bf, aux=h0))
t_new32 = attempt("cuBLASLt, GELU_AUX_BIAS (fp32 bias)", lambda: lt.matmul_t(
    x, w_fc, out, b_transposed=True, epilogue=lt._EPILOGUE_GELU_AUX_BIAS, bias=b_fc, aux=h0))
print(f"  forward saving per layer: {t_old - min(t_new, t_new32):.4f} ms")

# Backward: dA = g W_proj, dh = dA * gelu'(h), db = colsum(dh).
hf = h.float().requires_grad_(True)
da_ref = g.float() @ w_proj.float()
(dh_ref,) = torch.autograd.grad(F.gelu(hf, approximate="tanh"), hf, da_ref)
db_ref = dh_ref.sum(0)
dh, db = torch.ops.micro.dgelu_matmul(g, w_proj, h)
print(f"backward, error against fp32: dh {rel(dh, dh_ref):.2e}, bias gradient {rel(db, db_ref):.2e}")
da = torch.empty(N, M, device="cuda", dtype=bf)
dh2 = torch.empty_like(da)
dbias = torch.zeros(M, device="cuda")
db_bf = torch.empty(M, device="cuda", dtype=bf)
print("backward times:")
show("torch.mm (dA = g W_proj)", lambda: torch.mm(g, w_proj, out=da))
h0.copy_(h)
b_zero = torch.zeros_like(b_fc)
t_old_b = show("torch.mm + Triton GELU backward with bias gradient (gelu_kernel)",
               lambda: (torch.mm(g, w_proj, out=da), dbias.zero_(), gk.launch(da, h0, b_zero, dh2, dbias)))
t_new_b = attempt("cuBLASLt, DGELU_BGRAD (fp32 bias gradient)", lambda: lt.matmul_t(
    g, w_proj, dh2, b_transposed=False, epilogue=lt._EPILOGUE_DGELU_BGRAD, bias=dbias, aux=h))
t_new_b16 = attempt("cuBLASLt, DGELU_BGRAD (bf16 bias gradient)", lambda: lt.matmul_t(
    g, w_proj, dh2, b_transposed=False, epilogue=lt._EPILOGUE_DGELU_BGRAD, bias=db_bf, aux=h))
if t_new_b16 < float("inf"):
    print(f"  bf16 bias gradient error: {rel(db_bf, db_ref):.2e}")
print(f"  backward saving per layer: {t_old_b - min(t_new_b, t_new_b16):.4f} ms")
print(f"per step (12 layers): {12 * (t_old - min(t_new, t_new32) + t_old_b - min(t_new_b, t_new_b16)):.3f} ms")
