"""Float8 for the forward matmuls of GPT-2's Blocks, one scale per row: is the matmul faster than bf16's at
GPT-2's shapes, and by how much, once the weight's cast is counted?

For each Linear of a Block at B=16 x 1024 (N = 16384 rows) it times, as CUDA graphs (median of Triton's
`do_bench_cudagraph`):
  - bf16: `addmm(bias, x, w.T)`, what the compiled step runs for the Linear's forward;
  - fp8 rowwise: `torch._scaled_mm` of e4m3 operands with one scale per row of x and one per row of w (per
    output feature), the bias in its epilogue, with and without fast accumulation;
  - fp8 tensorwise: one scale per operand, the bias in the epilogue;
  - the weight's rowwise cast (amax per output feature, then the cast), compiled, as each step would run it.
The input's cast is not timed: the producing kernel (the layer norm) would write it beside its bf16 output.
Errors are relative Frobenius norms against the fp32 product of the unrounded operands.
Run on a GPU: PYTHONPATH=src python benchmarks/micro/fp8_forward.py"""

import torch
import triton

E4M3 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(E4M3).max


def rowwise(t: torch.Tensor):
    """(t / scale in e4m3, scale): one fp32 scale per row, the row's amax mapped to e4m3's max."""
    scale = t.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (t.float() / scale).to(E4M3), scale


def tensorwise(t: torch.Tensor):
    scale = t.float().abs().amax().clamp(min=1e-12) / FP8_MAX
    return (t.float() / scale).to(E4M3), scale


def timed(run):
    try:
        run()
        return triton.testing.do_bench_cudagraph(run, rep=200)
    except Exception as e:  # a combination this GPU or build refuses is reported, not fatal
        print(f"    refused: {str(e).splitlines()[0][:140]}")
        return None


def rel_err(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def one_shape(n: int, k: int, out: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    # a layer norm's output (unit rows, times a weight near 1) and a GPT-2-like weight (std 0.02)
    x32 = torch.randn(n, k, device="cuda", generator=gen)
    w32 = torch.randn(out, k, device="cuda", generator=gen) * 0.02
    b32 = torch.randn(out, device="cuda", generator=gen) * 0.02
    ref = torch.addmm(b32, x32, w32.t())
    x, w, b = x32.bfloat16(), w32.bfloat16(), b32.bfloat16()
    flop = 2 * n * k * out

    def report(name, ms, y):
        if ms is None:
            return
        print(f"  {name:34s} {ms:7.4f} ms  {flop / ms / 1e9:6.0f} TFLOP/s  err {rel_err(y, ref):.2e}")

    print(f"N={n} K={k} out={out} ({flop / 1e9:.1f} GFLOP)")
    report("bf16 addmm", timed(lambda: torch.addmm(b, x, w.t())), torch.addmm(b, x, w.t()))
    x8, sx = rowwise(x32)
    w8, sw = rowwise(w32)
    sw_t = sw.t().contiguous()  # (1, out)
    for fast in (True, False):
        def run(fast=fast):
            return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw_t, bias=b, out_dtype=torch.bfloat16,
                                    use_fast_accum=fast)
        ms = timed(run)
        report(f"fp8 rowwise + bias, fast_accum={fast}", ms, run() if ms is not None else None)

    def run_nobias():
        return torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw_t, out_dtype=torch.bfloat16, use_fast_accum=True)
    ms = timed(run_nobias)
    report("fp8 rowwise, no bias", ms, (run_nobias().float() + b32) if ms is not None else None)

    xt8, sxt = tensorwise(x32)
    wt8, swt = tensorwise(w32)

    def run_tensor():
        return torch._scaled_mm(xt8, wt8.t(), scale_a=sxt, scale_b=swt, bias=b, out_dtype=torch.bfloat16,
                                use_fast_accum=True)
    ms = timed(run_tensor)
    report("fp8 tensorwise + bias", ms, run_tensor() if ms is not None else None)

    cast = torch.compile(rowwise)
    ms = timed(lambda: cast(w32))
    if ms is not None:
        print(f"  {'weight rowwise cast (compiled)':34s} {ms:7.4f} ms")


if __name__ == "__main__":
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    n = 16 * 1024
    for c in (768, 1024):  # GPT-2 124M, GPT-2 medium
        for k, out in ((c, 3 * c), (c, 4 * c), (4 * c, c), (c, c)):
            one_shape(n, k, out)
