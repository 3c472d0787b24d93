# One command on 2 H200s: the CUDA tests (loss kernels, CUDA-graph replay with gradients set to None),
# the second tile sweep of the loss kernels, and a 300-step parity of the loss_kernel rung on the path
# bf16, compile, fp8_head, loss_kernel (three shards: GPU 0 runs shard 0 after the tests and the
# sweep, GPU 1 runs shards 1 and 2).
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs bf16,compile,fp8_head,loss_kernel --steps 300 --eval-every 25 --out $R/parity-shards"
( job test-gpu 0 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
  job loss-kernel-micro 0 120 python3 benchmarks/scripts/loss_kernel_micro.py
  job parity-0 0 300 $G $P --shard 0/3 ) &
P0=$!
( job parity-1 1 280 $G $P --shard 1/3
  job parity-2 1 250 $G $P --shard 2/3 ) &
P1=$!
wait $P0 $P1
job parity-merge "" 60 $G parity --merge $R/parity-shards --out $R/parity
finish
cat $R/timeline.txt; tail -n 3 $R/test-gpu.log; grep -E "fastest|copy" $R/loss-kernel-micro.log; tail -n 12 $R/parity-merge.log
