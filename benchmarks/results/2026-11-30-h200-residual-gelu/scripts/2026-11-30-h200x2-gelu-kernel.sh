# One command on 2 H200s with the gelu_kernel rung and the ladder reordered (bf16_residual and
# gelu_kernel after cuda_graph): GPU 0 climbs the ladder with --rungs best (B=16) and then runs one
# parity unit; GPU 1 runs the new CUDA tests, the GELU-kernel and SDPA micro-benchmarks and four
# parity units. The parity path bf16, compile, fp8_head, loss_kernel, bf16_residual, gelu_kernel has
# eight runs; runs 0, 1 and 6 (the fp32 baselines, bf16_residual) come from the previous command's
# shards of the path that ends at bf16_residual, merged afterwards.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs bf16,compile,fp8_head,loss_kernel,bf16_residual,gelu_kernel --steps 300 --eval-every 25"
P="$P --out $R/parity-shards-2"
( job bench-best 0 440 $G bench $B --rungs best --out $R/bench-best
  job parity-5 0 110 $G $P --shard 5/8 ) &
P0=$!
( job test-gpu 1 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu or residual"
  job gelu-micro 1 60 python3 benchmarks/scripts/gelu_kernel_micro.py
  job sdpa-micro 1 40 python3 benchmarks/scripts/sdpa_micro.py
  job parity-7 1 110 $G $P --shard 7/8
  job parity-2 1 110 $G $P --shard 2/8
  job parity-3 1 110 $G $P --shard 3/8
  job parity-4 1 110 $G $P --shard 4/8 ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; grep -A19 "^rung " $R/bench-best.log | tail -20; tail -n 3 $R/test-gpu.log
cat $R/gelu-micro.log $R/sdpa-micro.log; tail -qn 1 $R/parity-*.log
