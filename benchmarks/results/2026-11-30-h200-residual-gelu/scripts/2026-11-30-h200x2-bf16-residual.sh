# One command on 2 H200s with the new bf16_residual rung: GPU 0 climbs the ladder with --rungs best
# (B=16) and then runs the CUDA tests; GPU 1 runs the SDPA backend micro-benchmark and three of the
# seven units of a 300-step parity on the path bf16, compile, fp8_head, loss_kernel, bf16_residual
# (shard 6 = bf16_residual, shards 0 and 1 = the fp32 baselines; shards 2-5 follow in the next command).
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs bf16,compile,fp8_head,loss_kernel,bf16_residual --steps 300 --eval-every 25 --out $R/parity-shards"
( job bench-best 0 400 $G bench $B --rungs best --out $R/bench-best
  job test-gpu 0 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py ) &
P0=$!
( job parity-6 1 150 $G $P --shard 6/7
  job sdpa-micro 1 60 python3 benchmarks/scripts/sdpa_micro.py
  job parity-0 1 170 $G $P --shard 0/7
  job parity-1 1 170 $G $P --shard 1/7 ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; grep -A18 "^rung " $R/bench-best.log | tail -19; tail -n 3 $R/test-gpu.log; cat $R/sdpa-micro.log
tail -n 2 $R/parity-*.log
