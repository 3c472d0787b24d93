"""Where the idle time inside a step goes: from a Chrome trace that `gpt2ladder profile --trace` wrote, the
kernels of one profiled step in order, the gap before each, summed by the kernel that follows it, and the
kernels on either side of every memset. No GPU needed.

    python benchmarks/micro/trace_gaps.py runs/profile/trace-RUNG.json [STEP]   (STEP: 0-based, default 1)
"""

import collections
import gzip
import json
import sys


def short(name: str, width: int = 70) -> str:
    return name.replace("void ", "")[:width]


def main(path: str, step: int = 1) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    marks = sorted((e for e in events if e.get("name") == "gpt2ladder.step" and e.get("cat") == "gpu_user_annotation"),
                   key=lambda e: e["ts"])
    start, end = marks[step]["ts"], marks[step]["ts"] + marks[step]["dur"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
                      and start <= e["ts"] < end), key=lambda e: e["ts"])
    busy, gaps, ends = 0.0, collections.defaultdict(list), kernels[0]["ts"]
    for k in kernels:
        gaps[short(k["name"])].append(max(0.0, k["ts"] - ends))
        ends = max(ends, k["ts"] + k["dur"])
        busy += k["dur"]
    span = (ends - kernels[0]["ts"]) / 1e3
    total_gap = sum(sum(v) for v in gaps.values()) / 1e3
    print(f"step {step}: {len(kernels)} kernels, memsets and copies; {span:.2f} ms from the first to the last, "
          f"{busy / 1e3:.2f} ms busy, {total_gap:.2f} ms of gaps between them")
    print("gap before each kernel, summed by that kernel (us, count, us each):")
    for name, v in sorted(gaps.items(), key=lambda kv: -sum(kv[1]))[:20]:
        print(f"{sum(v):8.1f} {len(v):4d} {sum(v) / len(v):6.2f}  {name}")
    around = collections.Counter()
    for i, k in enumerate(kernels):
        if k.get("cat") == "gpu_memset" and 0 < i < len(kernels) - 1:
            around[(short(kernels[i - 1]["name"], 50), short(kernels[i + 1]["name"], 50),
                    k.get("args", {}).get("bytes"))] += 1
    print("memsets: count, the kernel before, the kernel after, bytes")
    for (before, after, nbytes), n in around.most_common(12):
        print(f"{n:4d}  {before} | {after} | {nbytes}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
