# One command on 2 H200s: the whole ladder (to cuda_graph) at B=16 and a 300-step parity run of every
# rung, its units spread as four shards over the two GPUs (merged afterwards with `parity --merge`).
source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs all --steps 300 --eval-every 25 --out $R/parity-shards"
( job bench-all 0 260 $G bench $B --rungs all --out $R/bench-all
  job parity-2 0 170 $G $P --shard 2/4
  job parity-3 0 130 $G $P --shard 3/4 ) &
P0=$!
( job parity-0 1 275 $G $P --shard 0/4
  job parity-1 1 275 $G $P --shard 1/4 ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 14 $R/bench-all.log; grep -h "val\|rc=" $R/parity-*.log | tail -n 20
