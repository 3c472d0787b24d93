"""How long the GPU waits for a graphed step's launch: the top of `auto` with and without memset_fill, at GPT-2's
full size, each step timed three ways.

    python3 benchmarks/micro/graph_launch.py [--preset gpt2] [--batch-size 16] [--seq-len 1024] [--rounds 10]

- `wall`: as `bench` times a step (synchronize, the clock, `Engine.step`, synchronize, the clock);
- `synced`: CUDA events around the graph's replay alone, the device idle before it;
- `ahead`: the same events, the replay enqueued behind a 20 ms sleep kernel, so that the host has launched the whole
  graph before the device reaches it: the graph's device time alone.

`synced - ahead` is the part of the launch the device waits for. Also the host's time in `replay()` itself. The
variants: `plain` (the graph as PyTorch instantiates it), `kept` (memset_fill's path, keep_graph and instantiate,
nothing rewritten), `fills` (memset_fill), `fills+upload` (memset_fill, the executable graph uploaded to the stream
before its first launch). Rounds take the variants in a rotating order; medians over all steps, and the spread of
the per-round medians.
"""

import argparse
import ctypes
import statistics
import time

import torch

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime import graph_fills
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect

SLEEP_CYCLES = 40_000_000  # about 20 ms at the H200's clock


def build(name: str, names: list[str], x, y) -> Engine:
    fill = name != "plain"
    engine = Engine(PRESETS[ARGS.preset], setup_for(names + (["memset_fill"] if fill else [])), torch.device("cuda"))
    real = graph_fills.rewrite_memsets
    if name == "kept":
        graph_fills.rewrite_memsets = lambda graph, **kw: 0
    try:
        engine.step(x, y)
    finally:
        graph_fills.rewrite_memsets = real
    if name == "fills+upload":
        lib = graph_fills.driver().lib
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        assert lib.cuGraphUpload(ctypes.c_void_p(engine._graph.raw_cuda_graph_exec()), stream) == 0
    for _ in range(3):
        engine.step(x, y)
    torch.cuda.synchronize()
    print(f"{name}: {engine.memsets_filled} memsets rewritten", flush=True)
    return engine


def measure(engine: Engine, x, y, steps: int) -> dict[str, list[float]]:
    out = {"wall": [], "synced": [], "ahead": [], "host": []}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.step(x, y)
        torch.cuda.synchronize()
        out["wall"].append((time.perf_counter() - t0) * 1000)
        for kind in ("synced", "ahead"):
            engine._static_x.copy_(x)
            engine._static_y.copy_(y)
            torch.cuda.synchronize()
            if kind == "ahead":
                torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            t0 = time.perf_counter()
            engine._graph.replay()
            host = (time.perf_counter() - t0) * 1000
            end.record()
            torch.cuda.synchronize()
            out[kind].append(start.elapsed_time(end))
            if kind == "synced":
                out["host"].append(host)
    return out


def main() -> None:
    names = [n for n in resolve_rungs("auto", detect(torch.device("cuda"))) if n != "memset_fill"]
    gen = torch.Generator().manual_seed(0)
    shape = (ARGS.batch_size, ARGS.seq_len)
    x, y = (torch.randint(0, 50257, shape, generator=gen).cuda() for _ in range(2))
    variants = ["plain", "kept", "fills", "fills+upload"]
    engines = {v: build(v, names, x, y) for v in variants}
    results = {v: {k: [] for k in ("wall", "synced", "ahead", "host")} for v in variants}
    per_round = {v: [] for v in variants}
    for r in range(ARGS.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            m = measure(engines[v], x, y, ARGS.steps)
            for k, vals in m.items():
                results[v][k] += vals
            per_round[v].append(statistics.median(m["synced"]) - statistics.median(m["ahead"]))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {ARGS.preset} {shape}, rungs: "
          f"{', '.join(names)} (+ memset_fill but in plain); {ARGS.rounds} rounds of {ARGS.steps} steps a variant")
    print(f"{'variant':14s} {'wall':>8s} {'synced':>8s} {'ahead':>8s} {'waits':>8s} {'host':>8s}   waits per round")
    for v in variants:
        med = {k: statistics.median(vals) for k, vals in results[v].items()}
        rounds = per_round[v]
        print(f"{v:14s} {med['wall']:8.3f} {med['synced']:8.3f} {med['ahead']:8.3f} "
              f"{med['synced'] - med['ahead']:8.3f} {med['host']:8.3f}   "
              f"{min(rounds):.3f} to {max(rounds):.3f}")
    print("(ms; waits = synced - ahead, the launch the device waits for; host = the host's time in replay())")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    ARGS = p.parse_args()
    main()
