#!/usr/bin/env bash
# The tiny preset's ladder of auto on a CPU, cold and after benchmarks/warm_compile.py, each with a fresh Inductor
# cache of its own: bash benchmarks/results/2026-12-03-cpu-warm-compile/run.sh (from the repository root).
set -eu
out=$(dirname "$0")
export GPT2LADDER_CACHE=${GPT2LADDER_CACHE:-/tmp/ci-cache}
cold=$(mktemp -d) warm=$(mktemp -d)
{ echo "cpus: $(nproc)"; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$out/env.txt"
s=$(date +%s.%N)
TORCHINDUCTOR_CACHE_DIR=$cold gpt2ladder bench --device cpu --rungs auto --steps 2 --warmup 1 --no-progress \
  --out "$cold/ladder" > "$out/cold-ladder.log" 2>&1
echo "cold ladder: $(python3 -c "print(round($(date +%s.%N) - $s, 1))") s" > "$out/times.txt"
s=$(date +%s.%N)
TORCHINDUCTOR_CACHE_DIR=$warm python3 benchmarks/warm_compile.py --device cpu --rungs auto --jobs 2 \
  > "$out/warm.log" 2>&1
echo "warm_compile.py, 2 at a time: $(python3 -c "print(round($(date +%s.%N) - $s, 1))") s" >> "$out/times.txt"
s=$(date +%s.%N)
TORCHINDUCTOR_CACHE_DIR=$warm gpt2ladder bench --device cpu --rungs auto --steps 2 --warmup 1 --no-progress \
  --out "$warm/ladder" > "$out/warm-ladder.log" 2>&1
echo "ladder after it: $(python3 -c "print(round($(date +%s.%N) - $s, 1))") s" >> "$out/times.txt"
