# One short command on 2 H200s: the DDP step of GPT-2 124M (B=16 per GPU, rungs to fp8_head) with one
# compiled graph instead of dynamo's split at the gradient buckets, and with 200 MB buckets.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
BASE=benchmarks/results/2026-11-29-h200-fp8-linears/bench-best/ladder.json
A="bench --no-progress --seq-len 1024 --preset gpt2 --batch-size 16 --rungs auto --last-only --baseline-json $BASE"
TR="torchrun --standalone --nproc_per_node=2 benchmarks/scripts/ddp_variant.py"
job ddp-one-graph 0,1 110 $TR one-graph $A --out $R/ddp-one-graph
job ddp-bucket200 0,1 110 $TR bucket200 $A --out $R/ddp-bucket200
finish
cat $R/timeline.txt; grep -h "^| fp8\|^  fp8" $R/ddp-*.log
