"""cuBLAS's memsets in a captured graph against the fill kernels memset_fill puts in their place, in place and
hung off the last cuBLAS kernel before them (graph_fills.rewrite_memsets's `beside`).

    python3 benchmarks/micro/memset_fill.py [--layers 12] [--tokens 16384] [--between 2] [--rounds 15]

Captures GPT-2 124M's forward and backward matmuls (bf16; the weight gradients written in fp32, as fp32_wgrad does)
at `--tokens` rows, with `--between` elementwise kernels after each matmul as in the step, three times: as captured,
its memsets rewritten as fill kernels in place, and rewritten beside. Replays the three in turns, each round 20
replays of each in a rotating order, timed by CUDA events. Prints how many memsets each graph has and the median ms
a replay of each, with the spread over the rounds, and the median differences. At fewer tokens the matmuls are
shorter and the gaps a larger part of a replay.
"""

import argparse
import statistics

import torch

from gpt2ladder.runtime import graph_fills


def step(layers: int, n: int, between: int, c: int = 768):
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
                for _ in range(between):
                    outputs[k].mul_(0.5)
                torch.mm(outputs[k], w.t(), out=grads[k])
                for _ in range(between):
                    grads[k].mul_(0.5)
                torch.mm(inputs[k].t(), outputs[k], out_dtype=torch.float32)

    return run


def capture(run, rewrite: bool, beside: bool = False):
    run()  # cuBLAS's workspace and heuristics before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        run()
    found = len(graph_fills.memsets(graph.raw_cuda_graph()))
    filled = graph_fills.rewrite_memsets(graph.raw_cuda_graph(), beside=beside) if rewrite else 0
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
    p.add_argument("--tokens", type=int, default=16384, help="rows of each matmul (batch x sequence)")
    p.add_argument("--between", type=int, default=2, help="elementwise kernels after each matmul")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    run = step(args.layers, args.tokens, args.between)
    arms = {}
    for name, rewrite, beside in (("memsets", False, False), ("fills", True, False), ("beside", True, True)):
        graph, found, filled = capture(run, rewrite, beside)
        arms[name] = graph
        print(f"{name:8s} {found} memsets captured, {filled} rewritten as fill kernels")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {3 * 4 * args.layers} matmuls of "
          f"{args.tokens} rows, {args.between} elementwise kernels after each of the first two of a layer's three")
    for g in arms.values():
        timed(g, 5)
    times = {name: [] for name in arms}
    names = list(arms)
    for r in range(args.rounds):
        for name in names[r % 3:] + names[: r % 3]:
            times[name].append(timed(arms[name]))
    for name, t in times.items():
        q = statistics.quantiles(t, n=10)
        print(f"{name:8s} median {statistics.median(t):.4f} ms a replay (p10-p90 {q[0]:.4f}-{q[-1]:.4f})")
    for a, b in (("memsets", "fills"), ("fills", "beside")):
        diffs = [x - y for x, y in zip(times[a], times[b])]
        print(f"{a} - {b}: median {statistics.median(diffs):.4f} ms a replay over {args.rounds} rounds "
              f"(min {min(diffs):.4f}, max {max(diffs):.4f})")


if __name__ == "__main__":
    main()
