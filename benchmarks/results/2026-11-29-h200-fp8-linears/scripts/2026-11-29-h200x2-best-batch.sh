# One command on 2 H200s: the whole ladder with --rungs best (every rung, the float8 Linears too, then
# the combination that paid) at B=16 on GPU 0, and --batch-size best (the fastest of five sizes up to
# the largest that fits, at the top rung of `auto`) on GPU 1.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
( job bench-best 0 470 $G bench $B --rungs best --out $R/bench-best ) &
P0=$!
( job bench-best-batch 1 470 $G bench --preset gpt2 --batch-size best --seq-len 1024 --no-progress --rungs auto --last-only --out $R/bench-best-batch ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; grep -h "^  " $R/bench-best.log | tail -16; grep -h "best\|^  [0-9]" $R/bench-best-batch.log
