# One command on 2 H200s: 300-step parity of the float8 Linears (on the path bf16, compile, flash, vocab,
# fp8_mlp, fp8_attn: four shards, two at a time per GPU), then the DDP step again with the adopted
# 200 MB buckets (B=16 per GPU, the top rung of `auto` under torchrun).
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs bf16,compile,flash,vocab,fp8_mlp,fp8_attn --steps 300 --eval-every 25 --out $R/parity-shards"
PIDS=""
for k in 0 1 2 3; do job parity-$k $((k % 2)) 270 $G $P --shard $k/4 & PIDS="$PIDS $!"; done
wait $PIDS
BASE=benchmarks/results/2026-11-29-h200-fp8-linears/bench-best/ladder.json
job ddp-auto 0,1 100 torchrun --standalone --nproc_per_node=2 -m gpt2ladder bench $B --rungs auto --last-only \
    --baseline-json $BASE --out $R/ddp-auto
finish
cat $R/timeline.txt; grep -h "^| fp8" $R/ddp-auto.log; ls $R/parity-shards
