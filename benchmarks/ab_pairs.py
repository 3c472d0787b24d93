"""Compare the top rung of two sets of bench runs, A and B (e.g. A B B A minutes apart on one GPU):

    python benchmarks/ab_pairs.py A1/ladder.json A2/ladder.json -- B1/ladder.json B2/ladder.json

Prints each run's median step, the median of each side's pooled steps, their difference (A - B, so positive
means B is faster) and a bootstrap 90% interval of that difference (4000 resamples of each side's steps,
seeded). An interval that holds 0 means the two are within noise."""

import json
import random
import statistics
import sys


def steps(path: str) -> list[float]:
    rung = json.load(open(path))["rungs"][-1]
    print(f"  {path}: {rung['name']}, median {statistics.median(rung['samples_ms']):.3f} ms "
          f"over {len(rung['samples_ms'])} steps")
    return rung["samples_ms"]


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit(__doc__)
    cut = argv.index("--")
    print("A:")
    a = [ms for path in argv[:cut] for ms in steps(path)]
    print("B:")
    b = [ms for path in argv[cut + 1:] for ms in steps(path)]
    rng = random.Random(0)
    diffs = sorted(statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
                   for _ in range(4000))
    print(f"pooled medians: A {statistics.median(a):.3f} ms, B {statistics.median(b):.3f} ms; "
          f"A - B = {statistics.median(a) - statistics.median(b):.3f} ms, "
          f"bootstrap 90% interval {diffs[200]:.3f} to {diffs[3799]:.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
