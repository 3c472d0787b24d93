"""Weight-gradient matmuls of GPT-2 124M (B=16 x 1024): bf16 output then a cast to fp32, against
`torch.mm(..., out_dtype=torch.float32)` writing fp32 straight from the matmul; eager and compiled.

    python3 benchmarks/micro/mm_out_dtype.py
"""

import torch

N = 16 * 1024
SHAPES = {"c_attn": (2304, 768), "attn.c_proj": (768, 768), "c_fc": (3072, 768), "mlp.c_proj": (768, 3072)}


def timed(fn, reps=50):
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def cast_after(g, x):
    return (g.t() @ x).float()


def out_fp32(g, x):
    return torch.mm(g.t(), x, out_dtype=torch.float32)


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name())
    compiled_cast, compiled_out = torch.compile(cast_after), torch.compile(out_fp32)
    total = {}
    for name, (out_f, in_f) in SHAPES.items():
        g = torch.randn(N, out_f, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(N, in_f, device="cuda", dtype=torch.bfloat16)
        ref = g.float().t() @ x.float()
        row = {}
        for label, fn in (("bf16+cast", cast_after), ("out_dtype", out_fp32), ("compiled bf16+cast", compiled_cast),
                          ("compiled out_dtype", compiled_out)):
            err = ((fn(g, x) - ref).abs().max() / ref.abs().max()).item()
            row[label] = timed(lambda: fn(g, x))
            total[label] = total.get(label, 0.0) + row[label]
            print(f"{name:12s} {label:20s} {row[label]:.4f} ms  rel err {err:.1e}")
    print("sum over the 4 Linears of a Block, x12 layers (ms):",
          {k: round(12 * v, 3) for k, v in total.items()})
