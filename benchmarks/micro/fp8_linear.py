"""Where the float8 Linears' time goes on one GPU: an MLP (layer norm, c_fc, GELU, c_proj) and an
attention projection, forward + backward, compiled, bf16 autocast against `Float8Linear`, with the
profiler's kernel table for each. Run on a GPU: python benchmarks/micro/fp8_linear.py"""

import sys

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from gpt2ladder.speedups.common import linear_like, replace_modules
from gpt2ladder.speedups.float8 import Float8Linear

N, C = 16 * 1024, 768


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc, self.proj = nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return x + self.proj(nn.functional.gelu(self.fc(self.ln(x)), approximate="tanh"))


class Proj(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(C, C)

    def forward(self, x):  # x: bf16 (the attention output)
        return self.proj(x)


def timed(module, x, steps=50):
    f = torch.compile(module)
    dy = torch.randn(N, C, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = f(x)
        y.backward(dy.to(y.dtype))

    for _ in range(5):
        step()
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    return times[len(times) // 2], times[len(times) // 10], times[-len(times) // 10], prof


def main():
    torch.manual_seed(0)
    for name, make, dtype in (("mlp", MLP, torch.float32), ("attn_proj", Proj, torch.bfloat16)):
        for fp8 in (False, True):
            m = make().cuda()
            if fp8:
                replace_modules(m, lambda _, mod: type(mod) is nn.Linear, lambda mod: linear_like(Float8Linear, mod))
            x = torch.randn(N, C, device="cuda", dtype=dtype, requires_grad=True)
            med, p10, p90, prof = timed(m, x)
            print(f"== {name} {'fp8' if fp8 else 'bf16'}: {med:.3f} ms (p10 {p10:.3f}, p90 {p90:.3f}) fwd+bwd", flush=True)
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=90))
            torch._dynamo.reset()


if __name__ == "__main__":
    sys.exit(main())
