"""Fill the compile caches for every compiled rung of a ladder, several rungs at once, before the ladder is timed.

    python3 benchmarks/warm_compile.py --rungs auto --jobs 6 -- --preset gpt2 --batch-size 16 --seq-len 1024

A ladder on a GPU spends most of its time compiling, one rung after another (GPT-2 124M's 22 rungs of `auto` need
more than ten minutes on an H200, under a minute of it timing steps). Inductor and Triton keep what they compile on
disk (TORCHINDUCTOR_CACHE_DIR, Triton's cache), so a second process that compiles the same step finds it there. This
script starts, for each rung whose setup compiles, `gpt2ladder bench --last-only` of the rungs up to it for one
step, --jobs of them at a time, each with its share of the CPU's cores for compiling; then `bench` itself, run with
the same model, batch and sequence length, takes its compiled steps from the caches. No figure of these runs is
kept: they are not timed one at a time, and the GPU is shared while they run, which is also why Inductor keeps no
choice of kernel configuration from them (BENCH_WITHOUT_TUNING_CACHE).

On a GPU give bench's --batch-size and --seq-len after `--`, as the ladder will run: a run left to plan its batch
from the memory free on a GPU the other runs share could plan a smaller one, and compile a step the ladder never
takes (given, a batch that does not fit fails that run, in one line).

Each line it prints is one rung's run: its wall time and exit status. Its own exit status is the number of runs
that failed.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

from gpt2ladder.ladder import resolve_rungs, setup_for
from gpt2ladder.runtime.hardware import detect, resolve_device


# bench, with Inductor's cache of which kernel configuration ran fastest switched off: those races run here on a
# GPU shared by several runs, so their winners are not kept; the ladder races them again on a quiet GPU (a few
# kernel launches each), and takes only the compiled code from the caches.
BENCH_WITHOUT_TUNING_CACHE = ("import sys, torch._inductor.config as c; c.autotune_local_cache = False; "
                              "from gpt2ladder.cli import main; sys.exit(main(sys.argv[1:]))")


def compiled_prefixes(names: list[str]) -> list[list[str]]:
    """For each rung whose setup compiles, the rungs up to and including it."""
    return [names[: i + 1] for i in range(len(names)) if setup_for(names[: i + 1]).compile]


def command(rungs: list[str], device: str, out: str, bench_args: list[str]) -> list[str]:
    """The command line of one run: one step of the rungs' setup, compiled, its kernel races not kept."""
    return [sys.executable, "-c", BENCH_WITHOUT_TUNING_CACHE, "bench", "--device", device, "--rungs", ",".join(rungs),
            "--last-only", "--steps", "1", "--warmup", "1", "--no-progress", "--out", out, *bench_args]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rungs", default="auto", help="the ladder's rungs, as bench takes them (default: auto)")
    p.add_argument("--jobs", type=int, default=4, help="runs at once (default: 4)")
    p.add_argument("--device", default="auto")
    p.add_argument("bench_args", nargs="*", help="after --: bench's own options (model, batch, sequence length)")
    args = p.parse_args()
    if args.jobs < 1:
        p.error("--jobs must be 1 or more")
    device = resolve_device(args.device)
    names = resolve_rungs(args.rungs, detect(device))
    prefixes = compiled_prefixes(names)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(threads))
    scratch = tempfile.mkdtemp(prefix="warm-compile-")
    waiting, running, failed = list(prefixes), {}, 0
    print(f"{len(prefixes)} compiled rungs of {len(names)}, {args.jobs} at a time, {threads} compile threads each",
          flush=True)
    while waiting or running:
        while waiting and len(running) < args.jobs:
            rungs = waiting.pop(0)
            cmd = command(rungs, args.device, os.path.join(scratch, rungs[-1]), args.bench_args)
            log = open(os.path.join(scratch, rungs[-1] + ".log"), "w")
            running[rungs[-1]] = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), time.time(),
                                  log)
        time.sleep(0.5)
        for rung, (proc, start, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[rung]
            failed += proc.returncode != 0
            print(f"{rung:16s} {time.time() - start:6.1f} s  exit {proc.returncode}"
                  + ("" if proc.returncode == 0 else f"  (log: {log.name})"), flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
