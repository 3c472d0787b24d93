"""The AdamW kernel (src/gpt2ladder/kernels/adamw.py) at GPT-2 124M's parameters (the preset "gpt2" with the ladder's
50304-row vocabulary, its parameter groups as the engine makes them) on one GPU: PyTorch's fused AdamW as the
graphed step runs it (capturable, a tensor learning rate) against the kernel at several tiles, each step timed as a
CUDA graph, without a gradient scale (28 bytes moved per parameter) and with one (32: the divided gradient is
stored), as clipping runs it; then, from the same parameters and gradients, the largest difference of the parameters
after one step of each against fused AdamW's, relative to the largest parameter. Ends with the fastest tile, the
one kernels/adamw.py's TILE should be. A plain copy of one fp32 tensor of the same size gives the card's bandwidth.
Last, with the weight_cast rung's bf16 copies of the Blocks' Linears: fused AdamW followed by that rung's
multi-tensor copy, against the kernel at the fastest tile writing the copies itself (KernelAdamW's
`casts` in speedups/kernel_adamw.py). Run on a GPU: python benchmarks/micro/adamw.py
"""

import dataclasses

import torch
import triton

from gpt2ladder.kernels import adamw as ka
from gpt2ladder.model.config import preset
from gpt2ladder.model.gpt import GPT, init_weights
from gpt2ladder.speedups.kernel_adamw import KernelAdamW

TILES = [(1024, 1, 4), (1024, 4, 4), (1024, 8, 4), (512, 8, 4), (2048, 2, 8), (2048, 4, 8), (4096, 1, 8),
         (4096, 2, 8), (8192, 1, 16)]
model = init_weights(GPT(dataclasses.replace(preset("gpt2"), vocab_multiple=128)), 0).cuda()
SOURCE = [p.detach() for p in model.parameters()]
BLOCK_LINEARS = [i for i, (name, _) in enumerate(model.named_parameters()) if ".attn." in name or ".mlp." in name]
N = sum(p.numel() for p in SOURCE)
gen = torch.Generator(device="cuda").manual_seed(0)
GRADS = [torch.randn(p.shape, device="cuda", generator=gen) * 1e-3 for p in SOURCE]
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}, "
      f"{len(SOURCE)} tensors, {N / 1e6:.1f}M parameters, kernel tile now {ka.TILE}")


def bench(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=200)


def optimizer(cls, **kw):
    """Fresh parameters (copies of the model's), their gradients, and an optimizer over them as the engine's."""
    params = [torch.nn.Parameter(p.clone()) for p in SOURCE]
    for p, g in zip(params, GRADS):
        p.grad = g.clone()
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    lr = torch.tensor(6e-4, device="cuda")
    return params, cls(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True, capturable=True, **kw)


def step(opt, scale):
    if scale is not None:
        opt.grad_scale = scale
    opt.step()
    if scale is not None:
        del opt.grad_scale


def timings(cls, **kw) -> tuple[float, float]:
    """ms of a step without and with a gradient scale (1.0, so the gradients stay as they are replay after replay)."""
    _, opt = optimizer(cls, **kw)
    one = torch.ones((), device="cuda")
    return bench(lambda: step(opt, None)), bench(lambda: step(opt, one))


def after_one_step(cls, **kw) -> list[torch.Tensor]:
    params, opt = optimizer(cls, **kw)
    step(opt, torch.full((), 2.0, device="cuda"))
    return params


def rel_diff(params, ref) -> float:
    return max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(params, ref))


copy_src, copy_dst = torch.empty(N, device="cuda"), torch.empty(N, device="cuda")
ms = bench(lambda: copy_dst.copy_(copy_src))
print(f"copy of {N / 1e6:.1f}M fp32: {ms:.4f} ms, {8 * N / ms / 1e6:.0f} GB/s")
ref = after_one_step(torch.optim.AdamW)
plain, scaled = timings(torch.optim.AdamW)
print(f"fused AdamW: {plain:.4f} ms, {28 * N / plain / 1e6:.0f} GB/s; with grad_scale {scaled:.4f} ms, "
      f"{32 * N / scaled / 1e6:.0f} GB/s")
print("kernel (elements per block, blocks per program, warps): ms, GB/s; with grad_scale ms, GB/s; max rel. "
      "difference of the parameters after one step")
found = []
for tile in TILES:
    plain, scaled = timings(KernelAdamW, tile=tile)
    diff = rel_diff(after_one_step(KernelAdamW, tile=tile), ref)
    print(tile, f"{plain:.4f} ms, {28 * N / plain / 1e6:.0f} GB/s; {scaled:.4f} ms, {32 * N / scaled / 1e6:.0f} GB/s; "
          f"{diff:.1e}")
    found.append((scaled, plain, tile))
    torch.cuda.empty_cache()
print("fastest (with grad_scale, without):", min(found))


class Copies:
    """bf16 copies of the Block Linears' weights and biases, as KernelAdamW reads the weight_cast rung's."""

    def __init__(self, params):
        self.sources = [params[i] for i in BLOCK_LINEARS]
        self.copies = [torch.empty_like(s, dtype=torch.bfloat16) for s in self.sources]

    def pairs(self):
        return self.copies, self.sources

    def written(self, sources):
        pass


tile = min(found)[2]
params, opt = optimizer(torch.optim.AdamW)
copies = Copies(params)


def fused_then_copy():
    step(opt, None)
    torch._foreach_copy_(copies.copies, [s.detach() for s in copies.sources])


moved = sum(s.numel() for s in copies.sources)
ms = bench(fused_then_copy)
print(f"with bf16 copies of {moved / 1e6:.1f}M Block parameters: fused AdamW and the multi-tensor copy {ms:.4f} ms")
params, opt = optimizer(KernelAdamW, tile=tile)
opt.casts = Copies(params)
ms = bench(lambda: step(opt, None))
print(f"the kernel at {tile} writing them: {ms:.4f} ms")
