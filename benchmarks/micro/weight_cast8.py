"""The weight cast kernel (src/gpt2ladder/kernels/weight8.py) at GPT-2 124M's two float8-input-gradient weights
(c_attn's 2304 x 768, the MLP's c_proj 768 x 3072) and GPT-2 medium's (3072 x 1024, 1024 x 4096), bf16, on one GPU:
the compiled PyTorch expression it replaces (fp8_dgrad's `rows_to_fp8(w.t())`, made contiguous: a column amax and
a transposing cast, two kernels) against the kernel at several tiles, with each one's bandwidth (the weight read
once, its float8 copy and scales written once) and whether its bytes and scales equal the compiled ones.
Each is timed twice: launched alone from a cold L2 (do_bench), and replayed in a CUDA graph, as the step runs it.
Run on a GPU: python benchmarks/micro/weight_cast8.py [--gpt2] (--gpt2: GPT-2 124M's two shapes only); the last line
names the tile fastest in a CUDA graph over GPT-2 124M's two weights together, one of each (the module's TILE serves
both)."""

import sys

import torch
import triton

from gpt2ladder.kernels import weight8 as wk

SHAPES = {"gpt2 c_attn": (2304, 768), "gpt2 c_proj": (768, 3072), "medium c_attn": (3072, 1024),
          "medium c_proj": (1024, 4096)}
# (columns per program, rows per step, warps); the module's own first. Each compiles its row steps unrolled, about
# 10 s a tile at c_attn's weight, so the list keeps to the neighbourhood of the fastest found there
# (its sweep at c_attn's weight, benchmarks/records/2026-12-04_weight-cast-kernel) and a few with more programs.
TILES = list(dict.fromkeys([wk.TILE, (8, 128, 4), (8, 256, 8), (16, 128, 8), (16, 512, 8), (32, 256, 8), (4, 256, 4),
                            (4, 512, 8)]))


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40)


def graphed(fn):
    """fn's time replayed in a CUDA graph, as the step runs it: no launch from the host, and the weight's bytes warm
    in L2 from the replay before (do_bench's figure launches each call alone from a cold L2)."""
    return triton.testing.do_bench_cudagraph(fn, rep=40)


def sweep(name: str, shape: tuple[int, int]) -> dict:
    n_out, n_in = shape
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(shape, generator=gen) * 0.02).to("cuda", torch.bfloat16)
    moved = n_out * n_in * (2 + 1) + n_in * 4  # read bf16, write float8 and the scales
    compiled = torch.compile(wk.weight8_reference, dynamic=False)  # rows_to_fp8(w.t()), made contiguous
    ref8, ref_s = compiled(w)
    ms = bench(lambda: compiled(w))
    print(f"\n{name} {shape}: compiled expression {ms:.4f} ms alone ({moved / ms / 1e6:.0f} GB/s), "
          f"{graphed(lambda: compiled(w)):.4f} ms in a CUDA graph")
    print(f"  the op as the step would call it (default tile {wk.TILE}): {bench(lambda: wk.weight8(w)):.4f} ms alone")
    print("  kernel (columns per program, rows per step, warps): ms alone, GB/s, ms in a CUDA graph, bytes equal, "
          "scales equal")
    best = []
    for tile in TILES:
        out = torch.empty(n_in, n_out, device="cuda", dtype=torch.float8_e4m3fn)
        scale = torch.empty(n_in, device="cuda")
        run = lambda: wk.launch(w, out, scale, tile=tile)  # noqa: E731
        run()
        same = (torch.equal(out.view(torch.uint8), ref8.view(torch.uint8)), torch.equal(scale, ref_s))
        ms, in_graph = bench(run), graphed(run)
        print(" ", tile, f"{ms:.4f} ms", f"{moved / ms / 1e6:.0f} GB/s", f"{in_graph:.4f} ms", *same)
        best.append((in_graph, tile))
    print("  fastest in a CUDA graph:", min(best))
    return {tile: ms for ms, tile in best}


print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
times = {name: sweep(name, shape) for name, shape in SHAPES.items() if "--gpt2" not in sys.argv or "gpt2" in name}
both = {tile: times["gpt2 c_attn"][tile] + times["gpt2 c_proj"][tile] for tile in TILES}
print("\nfastest for gpt2 c_attn and c_proj together:", min((ms, tile) for tile, ms in both.items()))
