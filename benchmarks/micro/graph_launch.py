"""How long the GPU waits for a graphed step's launch, and whether splitting the graph in two shortens the wait: the
top of `auto` with and without memset_fill at GPT-2's full size, and graphs of N tiny kernels; each replay timed three
ways.

    python3 benchmarks/micro/graph_launch.py [--preset gpt2] [--batch-size 16] [--seq-len 1024] [--rounds 6]
        [--variants plain,kept,fills,fills+upload,split:40] [--tiny 8,64,256,640]

- `wall`: as `bench` times a step (synchronize, the clock, the step, synchronize, the clock);
- `synced`: CUDA events around the graph's launch alone, the device idle before it;
- `ahead`: the same events, the launch enqueued behind a 20 ms sleep kernel, so that the host has launched the whole
  graph before the device reaches it: the graph's device time alone.

`synced - ahead` is the part of the launch the device waits for; `host` the host's time in the launch call. The
variants: `plain` (the graph as PyTorch instantiates it), `kept` (memset_fill's path, keep_graph and instantiate,
nothing rewritten), `fills` (memset_fill), `fills+upload` (memset_fill, the executable graph uploaded to the stream
before its first launch), `split:K` (memset_fill, then the graph's first K nodes in dependency order and the rest
instantiated as two graphs, launched one after the other on the stream). `--tiny` first times graphs of N one-block
kernels in a chain, and the largest split after its first 8. Rounds take the variants in a rotating order; medians
over all steps, and the spread of the per-round medians.
"""

import argparse
import collections
import ctypes
import heapq
import statistics
import time

import torch

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.model.config import PRESETS
from gpt2ladder.runtime import graph_fills
from gpt2ladder.runtime.engine import Engine
from gpt2ladder.runtime.hardware import detect

SLEEP_CYCLES = 40_000_000  # about 20 ms at the H200's clock
INSTANTIATE_FLAGS = 1 | 8  # auto-free on launch, node priorities: PyTorch's own


def in_order(graph: int) -> list[int]:
    """The graph's nodes in dependency order, ties broken by the order the capture made them."""
    d = graph_fills.driver()
    nodes = d.nodes(ctypes.c_void_p(graph))
    index = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len(d.dependencies(n)[0]) for n in nodes}
    after = collections.defaultdict(list)
    for n in nodes:
        for p in d.dependencies(n)[0]:
            after[p].append(n)
    ready = [(index[n], n) for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for m in after[n]:
            waiting[m] -= 1
            if waiting[m] == 0:
                heapq.heappush(ready, (index[m], m))
    assert len(order) == len(nodes)
    return order


def split(graph: int, k: int) -> list[ctypes.c_void_p]:
    """Two executable graphs: the first k nodes in dependency order, and the rest (stream order keeps the edges
    between them)."""
    d = graph_fills.driver()
    order = in_order(graph)
    execs = []
    for drop in (order[k:], order[:k]):
        clone = ctypes.c_void_p()
        d("cuGraphClone", ctypes.byref(clone), ctypes.c_void_p(graph))
        for n in drop:
            twin = ctypes.c_void_p()
            d("cuGraphNodeFindInClone", ctypes.byref(twin), ctypes.c_void_p(n), clone)
            d.destroy(twin.value)
        ex = ctypes.c_void_p()
        d("cuGraphInstantiateWithFlags", ctypes.byref(ex), clone, ctypes.c_ulonglong(INSTANTIATE_FLAGS))
        execs.append(ex)
    return execs


def launcher(execs: list[ctypes.c_void_p]):
    d = graph_fills.driver()

    def launch():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for ex in execs:
            d("cuGraphLaunch", ex, stream)
    return launch


def build(name: str, names: list[str], x, y):
    """(step(x, y), launch()) for one variant of the top of auto."""
    fill = name != "plain"
    engine = Engine(PRESETS[ARGS.preset], setup_for(names + (["memset_fill"] if fill else [])), torch.device("cuda"))
    real = graph_fills.rewrite_memsets
    if name == "kept":
        graph_fills.rewrite_memsets = lambda graph, **kw: 0
    try:
        engine.step(x, y)
    finally:
        graph_fills.rewrite_memsets = real
    launch = engine._graph.replay
    if name == "fills+upload":
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        graph_fills.driver()("cuGraphUpload", ctypes.c_void_p(engine._graph.raw_cuda_graph_exec()), stream)
    if name.startswith("split:"):
        launch = launcher(split(engine._graph.raw_cuda_graph(), int(name.split(":")[1])))

    def step(x, y):
        engine._static_x.copy_(x, non_blocking=True)
        engine._static_y.copy_(y, non_blocking=True)
        launch()
    for _ in range(3):
        step(x, y)
    torch.cuda.synchronize()
    print(f"{name}: {engine.memsets_filled} memsets rewritten", flush=True)
    return step, launch


def tiny(n: int):
    """A graph of n one-block kernels in a chain: (step, launch), and the same split after its first 8."""
    buf = torch.zeros(256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        buf.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        for _ in range(n):
            buf.add_(1)
    graph.instantiate()
    parts = launcher(split(graph.raw_cuda_graph(), 8)) if n > 8 else None
    return graph, (lambda x, y: graph.replay(), graph.replay), (lambda x, y: parts(), parts) if parts else None


def measure(step, launch, x, y, steps: int) -> dict[str, list[float]]:
    out = {"wall": [], "synced": [], "ahead": [], "host": []}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(x, y)
        torch.cuda.synchronize()
        out["wall"].append((time.perf_counter() - t0) * 1000)
        for kind in ("synced", "ahead"):
            torch.cuda.synchronize()
            if kind == "ahead":
                torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            t0 = time.perf_counter()
            launch()
            host = (time.perf_counter() - t0) * 1000
            end.record()
            torch.cuda.synchronize()
            out[kind].append(start.elapsed_time(end))
            if kind == "synced":
                out["host"].append(host)
    return out


def compare(variants: dict, x, y, rounds: int, steps: int, title: str) -> None:
    names = list(variants)
    results = {v: collections.defaultdict(list) for v in names}
    per_round = {v: [] for v in names}
    for r in range(rounds):
        for v in names[r % len(names):] + names[:r % len(names)]:
            m = measure(*variants[v], x, y, steps)
            for k, vals in m.items():
                results[v][k] += vals
            per_round[v].append(statistics.median(m["synced"]) - statistics.median(m["ahead"]))
    print(title)
    print(f"{'variant':14s} {'wall':>8s} {'synced':>8s} {'ahead':>8s} {'waits':>8s} {'host':>8s}   waits per round")
    for v in names:
        med = {k: statistics.median(vals) for k, vals in results[v].items()}
        print(f"{v:14s} {med['wall']:8.3f} {med['synced']:8.3f} {med['ahead']:8.3f} "
              f"{med['synced'] - med['ahead']:8.3f} {med['host']:8.3f}   "
              f"{min(per_round[v]):.3f} to {max(per_round[v]):.3f}")
    print("(ms; waits = synced - ahead, the launch the device waits for; host = the host's time launching)",
          flush=True)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    shape = (ARGS.batch_size, ARGS.seq_len)
    x, y = (torch.randint(0, 50257, shape, generator=gen).cuda() for _ in range(2))
    if ARGS.tiny:
        variants, keep = {}, []
        for n in (int(v) for v in ARGS.tiny.split(",")):
            graph, whole, parts = tiny(n)
            keep.append(graph)
            variants[f"tiny:{n}"] = whole
            if parts and n == max(int(v) for v in ARGS.tiny.split(",")):
                variants[f"tiny:{n} split:8"] = parts
        compare(variants, x, y, ARGS.rounds, 20, f"{torch.cuda.get_device_name()}, torch {torch.__version__}: "
                f"graphs of N one-block kernels in a chain")
    names = [n for n in resolve_rungs("auto", detect(torch.device("cuda"))) if n != "memset_fill"]
    variants = {v: build(v, names, x, y) for v in ARGS.variants.split(",")}
    compare(variants, x, y, ARGS.rounds, ARGS.steps,
            f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {ARGS.preset} {shape}, rungs: "
            f"{', '.join(names)} (+ memset_fill but in plain); {ARGS.rounds} rounds of {ARGS.steps} steps a variant")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--variants", default="plain,kept,fills,fills+upload")
    p.add_argument("--tiny", default="", help="first, graphs of these many one-block kernels, e.g. 8,64,256,640")
    ARGS = p.parse_args()
    main()
