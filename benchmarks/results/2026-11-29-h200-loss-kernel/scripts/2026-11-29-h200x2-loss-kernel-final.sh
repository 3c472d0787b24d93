# One command on 2 H200s with the loss kernels' chosen tiles and graph capture without gradient memsets:
# GPU 0 climbs the ladder with --rungs best (B=16, the README headline); GPU 1 searches the batch size
# for the top rung of `auto`, then profiles that rung at B=16.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
( job bench-best 0 420 $G bench $B --rungs best --out $R/bench-best ) &
P0=$!
( job bench-best-batch 1 280 $G bench --preset gpt2 --batch-size best --seq-len 1024 --no-progress --rungs auto \
      --last-only --out $R/bench-best-batch
  job profile-auto 1 100 $G profile $B --rungs auto --last-only --out $R/profile-auto ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; grep -A16 "^rung " $R/bench-best.log | tail -17; tail -n 2 $R/bench-best-batch.log; grep -A2 "^rung" $R/profile-auto.log
