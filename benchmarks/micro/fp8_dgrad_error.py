"""How far fp8_dgrad's float8 input gradient on a GPU lies from the same float8 operands multiplied in fp32 on the
CPU, at the GPU test's shapes (tests/speedups/test_speedups_gpu.py): whether both sides cast to the same float8
bytes, and the error per element against the sum of its terms' magnitudes, overall and where it is largest.
Run on a GPU: python benchmarks/micro/fp8_dgrad_error.py"""

import torch

from gpt2ladder.kernels.norm import rows_to_fp8
from gpt2ladder.speedups.fp32_wgrad import input_grad

gen = torch.Generator().manual_seed(2)
g = (torch.randn(512, 768, generator=gen) * torch.linspace(0.01, 10, 512)[:, None]).bfloat16()
w = (torch.randn(768, 3072, generator=gen) * torch.linspace(0.001, 0.1, 3072)).bfloat16()  # (out, in)
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
for name, x in (("output gradient rows", g), ("weight columns", w.t())):
    a8, a_s = rows_to_fp8(x.float())
    b8, b_s = rows_to_fp8(x.cuda())
    same = torch.equal(a8.view(torch.uint8), b8.cpu().view(torch.uint8)), torch.equal(a_s, b_s.cpu())
    print(f"{name}: float8 bytes and scales equal on the CPU and the GPU: {same}")
got = input_grad(g.cuda(), w.cuda(), float8=True).cpu().float()
want = input_grad(g.float(), w.float(), float8=True)
terms = input_grad(g.float().abs(), w.float().abs())
bf16 = (got - want).abs() <= 2**-7 * want.abs()
rel = (got - want).abs() / terms
print(f"elements within bf16's rounding of the fp32 product: {bf16.float().mean().item():.6f}")
for q in (0.5, 0.9, 0.99, 0.999, 1.0):
    print(f"error / terms, quantile {q}: {rel.quantile(q).item() if q < 1 else rel.max().item():.3e}")
print(f"over 2^-9 of the terms: {(rel > 2**-9).sum().item()} of {rel.numel()}")
i, j = divmod(rel.argmax().item(), rel.shape[1])
print(f"largest at row {i}, column {j}: got {got[i, j].item():.6e}, want {want[i, j].item():.6e}, "
      f"terms {terms[i, j].item():.6e}")
by_col = rel.amax(0)
print("largest error / terms by eighth of the columns (scaled 0.001 .. 0.1):",
      " ".join(f"{v:.1e}" for v in by_col.view(8, -1).amax(1).tolist()))
by_row = rel.amax(1)
print("largest error / terms by eighth of the rows (scaled 0.01 .. 10):",
      " ".join(f"{v:.1e}" for v in by_row.view(8, -1).amax(1).tolist()))
