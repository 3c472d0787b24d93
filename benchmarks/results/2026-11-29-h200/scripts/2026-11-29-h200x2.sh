# One command on 2 H200s: single-GPU jobs in parallel, one chain per GPU.
source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs seed --steps 300 --eval-every 25 --out $R/parity-shards"
( job bench-best 0 300 $G bench $B --rungs best --out $R/bench-best
  job parity-2 0 130 $G $P --shard 2/3
  job profile 0 110 $G profile --preset gpt2 --batch-size 16 --seq-len 1024 --rungs all --steps 3 --warmup 3 --no-progress --out $R/profile
  CUDA_VISIBLE_DEVICES=0 $G doctor > $R/doctor.txt 2>&1; CUDA_VISIBLE_DEVICES=0 $G doctor --json > $R/doctor.json 2>&1 ) &
P0=$!
( job parity-0 1 250 $G $P --shard 0/3
  job train 1 120 $G train --preset gpt2 --batch-size 16 --seq-len 1024 --steps 300 --eval-every 25 --ckpt-every 150 --out $R/train --no-progress
  job sample 1 40 $G sample $R/train --prompt "ROMEO:" --num-tokens 200 --num-samples 2
  job parity-1 1 200 $G $P --shard 1/3 ) &
P1=$!
wait $P0 $P1
finish
ls -la $OUT; cat $R/timeline.txt; tail -n 3 $R/*.log
