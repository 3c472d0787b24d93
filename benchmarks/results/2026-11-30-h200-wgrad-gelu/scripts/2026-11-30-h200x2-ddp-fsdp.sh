# The new top of `auto` (gelu_kernel, fp32_wgrad) under torchrun on 2 H200s: DDP at B=16 per GPU with
# the scaling efficiency against the one-GPU ladder of results/2026-11-30-h200-wgrad-gelu, then FSDP2
# on the same model. Under either, `auto` has no CUDA graph (see distributed.py).
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
BASE=benchmarks/results/2026-11-30-h200-wgrad-gelu/bench-auto/ladder.json
TR="torchrun --standalone --nproc_per_node=2 -m gpt2ladder bench --no-progress --seq-len 1024 --preset gpt2"
job ddp-auto 0,1 100 $TR --batch-size 16 --rungs auto --last-only --baseline-json $BASE --out $R/ddp-auto
job fsdp-auto 0,1 100 $TR --batch-size 16 --rungs auto --last-only --strategy fsdp --out $R/fsdp-auto
finish
cat $R/timeline.txt; tail -n 6 $R/ddp-auto.log $R/fsdp-auto.log
