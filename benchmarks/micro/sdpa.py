"""Which scaled_dot_product_attention kernel is fastest for GPT-2 124M's attention (B=16, 12 heads,
T=1024, head size 64, bf16, causal) on this GPU: forward and forward + backward per backend, with
q, k, v laid out as the model makes them (views of the c_attn output), against PyTorch's own choice.
Each backend's output and input gradients are checked against the math backend in fp32.
Run on a GPU: python benchmarks/micro/sdpa.py"""

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, T, D = 16, 12, 1024, 64
C = H * D
gen = torch.Generator().manual_seed(0)
qkv = torch.randn(B, T, 3 * C, generator=gen).to("cuda", torch.bfloat16).requires_grad_()
grad_out = torch.randn(B, H, T, D, generator=gen).to("cuda", torch.bfloat16)
# causal attention: 4 * B * H * T^2 * D multiply-adds in the forward, halved by the mask; backward 2.5x
fwd_flops = 4 * B * H * T * T * D / 2
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}")


def qkv_views(t):
    q, k, v = t.split(C, dim=2)
    return [x.view(B, T, H, D).transpose(1, 2) for x in (q, k, v)]


def attend(backends):
    if backends is None:  # PyTorch's own choice, as the model runs it
        return F.scaled_dot_product_attention(*qkv_views(qkv), is_causal=True)
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(*qkv_views(qkv), is_causal=True)


def step(backends):
    qkv.grad = None
    attend(backends).backward(grad_out)


ref32 = qkv.detach().float().requires_grad_()
with sdpa_kernel([SDPBackend.MATH]):
    ref = F.scaled_dot_product_attention(*qkv_views(ref32), is_causal=True)
ref.backward(grad_out.float())

CHOICES = {"default": None, "cudnn": [SDPBackend.CUDNN_ATTENTION],
           "flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION]}
print("\nbackend: forward ms (TFLOP/s), forward+backward ms (TFLOP/s), rel. error of output and of dqkv")
for name, backends in CHOICES.items():
    try:
        out = attend(backends)
        step(backends)
    except RuntimeError as e:
        print(f"{name}: cannot run here: {str(e).splitlines()[0][:120]}")
        continue
    out_err = ((out.float() - ref).norm() / ref.norm()).item()
    grad_err = ((qkv.grad.float() - ref32.grad).norm() / ref32.grad.norm()).item()
    with torch.no_grad():
        fwd = triton.testing.do_bench(lambda: attend(backends), warmup=25, rep=200)
    both = triton.testing.do_bench(lambda: step(backends), warmup=25, rep=200)
    print(f"{name}: {fwd:.3f} ms ({fwd_flops / fwd / 1e9:.0f}), {both:.3f} ms ({3.5 * fwd_flops / both / 1e9:.0f}),"
          f" {out_err:.1e}, {grad_err:.1e}")
