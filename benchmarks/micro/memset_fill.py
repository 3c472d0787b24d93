"""cuBLAS's memsets in a captured graph against the fill kernels memset_fill puts in their place.

    python3 benchmarks/micro/memset_fill.py [--layers 12] [--rounds 15]

Captures GPT-2 124M's forward and backward matmuls at batch 16 x 1024 (bf16; the weight gradients written in fp32,
as fp32_wgrad does) twice, rewrites the second graph's memsets as fill kernels, and replays the two in turns, each
round 20 replays of one then 20 of the other, timed by CUDA events. Prints how many memsets each graph has and the
median ms per replay of each, with the spread over the rounds.
"""

import argparse
import statistics

import torch

from gpt2ladder.runtime import graph_fills


def matmuls(layers: int, n: int = 16384, c: int = 768):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, c, device="cuda", dtype=torch.bfloat16, generator=g)
    h = torch.randn(n, 4 * c, device="cuda", dtype=torch.bfloat16, generator=g)
    weights = {k: torch.randn(k_in, k_out, device="cuda", dtype=torch.bfloat16, generator=g) / 30
               for k, k_in, k_out in (("qkv", c, 3 * c), ("o", c, c), ("fc", c, 4 * c), ("proj", 4 * c, c))}
    inputs = {"qkv": x, "o": x, "fc": x, "proj": h}
    outputs = {k: torch.empty(n, w.shape[1], device="cuda", dtype=torch.bfloat16) for k, w in weights.items()}
    grads = {k: torch.empty_like(v) for k, v in inputs.items()}

    def run():
        for _ in range(layers):
            for k, w in weights.items():  # forward, input gradient, weight gradient (in fp32)
                torch.mm(inputs[k], w, out=outputs[k])
                torch.mm(outputs[k], w.t(), out=grads[k])
                torch.mm(inputs[k].t(), outputs[k], out_dtype=torch.float32)

    return run


def capture(run, rewrite: bool):
    run()  # cuBLAS's workspace and heuristics before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        run()
    found = len(graph_fills.memsets(graph.raw_cuda_graph()))
    filled = graph_fills.rewrite_memsets(graph.raw_cuda_graph()) if rewrite else 0
    graph.instantiate()
    return graph, found, filled


def timed(graph, replays: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    run = matmuls(args.layers)
    plain, found, _ = capture(run, rewrite=False)
    filled, found2, rewritten = capture(run, rewrite=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {3 * 4 * args.layers} matmuls; memsets: "
          f"{found} in the plain graph, {found2} in the other, {rewritten} of them rewritten as fill kernels")
    for g in (plain, filled):
        timed(g, 5)
    times = {"memsets": [], "fills": []}
    for r in range(args.rounds):
        order = (("memsets", plain), ("fills", filled)) if r % 2 == 0 else (("fills", filled), ("memsets", plain))
        for name, g in order:
            times[name].append(timed(g))
    for name, t in times.items():
        q = statistics.quantiles(t, n=10)
        print(f"{name:8s} median {statistics.median(t):.4f} ms a replay (p10-p90 {q[0]:.4f}-{q[-1]:.4f})")
    diffs = [a - b for a, b in zip(times["memsets"], times["fills"])]
    per = statistics.median(diffs) / max(rewritten, 1) * 1000
    print(f"memsets - fills: median {statistics.median(diffs):.4f} ms a replay over {args.rounds} rounds "
          f"(min {min(diffs):.4f}, max {max(diffs):.4f}); {per:.2f} us per rewritten memset")


if __name__ == "__main__":
    main()
