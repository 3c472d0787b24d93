"""A large shard set in llm.c's format for timing `train --data DIR` against Tiny Shakespeare in memory:
uniform random GPT-2 tokens (step time does not depend on what the tokens say), written with numpy in
seconds, not tokenized. Not a corpus to learn from, and not committed: make it on the machine that times.

  PYTHONPATH=src python benchmarks/micro/make_shards.py /tmp/random1B --tokens 1B
  gpt2ladder train --data /tmp/random1B --steps 300 --out runs/shards    # and the same without --data

Writes NAME_val_000000.bin (--val-tokens) and NAME_train_000001.bin, ... of --shard-tokens each; the
loader checks their tokens once (a few seconds for 2 GB) and remembers the check.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from gpt2ladder.data import shards as fmt
from gpt2ladder.model.config import GPT2_VOCAB_SIZE


def count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the folder to write (created; there is no default)")
    ap.add_argument("--tokens", type=count, default=10**9, help="training tokens in all (default: 1B)")
    ap.add_argument("--shard-tokens", type=count, default=10**8, help="tokens per training shard (default: 100M)")
    ap.add_argument("--val-tokens", type=count, default=10**7, help="tokens in the validation shard (default: 10M)")
    ap.add_argument("--name", default="random", help="the shards' name (default: random)")
    ap.add_argument("--seed", type=int, default=0, help="the random tokens' seed (default: 0)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    sizes = [args.val_tokens] + [min(args.shard_tokens, args.tokens - at)
                                 for at in range(0, args.tokens, args.shard_tokens)]
    t0 = time.perf_counter()
    for index, n in enumerate(sizes):
        path = args.out / fmt.shard_name(args.name, "val" if index == 0 else "train", index)
        fmt.write_shard(path, rng.integers(0, GPT2_VOCAB_SIZE, size=n, dtype=np.uint16))
        print(f"{path.name}: {n:,} tokens ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"wrote {sum(sizes):,} tokens in {len(sizes)} shards to {args.out} in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
