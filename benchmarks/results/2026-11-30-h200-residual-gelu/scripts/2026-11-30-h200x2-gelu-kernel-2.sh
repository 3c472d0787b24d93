# One command on 2 H200s after the GELU kernel's fix (its constants as constexpr globals, which the
# CPU interpreter had accepted and the GPU compiler did not): GPU 0 climbs the ladder with --rungs
# best (B=16, the README headline); GPU 1 runs the GELU kernel's CUDA tests and micro-benchmark, the
# parity run of gelu_kernel again (run 7 of 8; the previous command's failed), the profile of the top
# rung of `auto`, and the batch-size search for it.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs bf16,compile,fp8_head,loss_kernel,bf16_residual,gelu_kernel --steps 300 --eval-every 25"
( job bench-best 0 420 $G bench $B --rungs best --out $R/bench-best ) &
P0=$!
( job test-gpu 1 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu"
  job gelu-micro 1 60 python3 benchmarks/scripts/gelu_kernel_micro.py
  job parity-7 1 110 $G $P --shard 7/8 --out $R/parity-shards-3
  job profile-auto 1 80 $G profile $B --rungs auto --last-only --out $R/profile-auto
  job bench-best-batch 1 240 $G bench --preset gpt2 --batch-size best --seq-len 1024 --no-progress --rungs auto \
      --last-only --out $R/bench-best-batch ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; grep -A19 "^rung " $R/bench-best.log | tail -20; tail -n 3 $R/test-gpu.log
cat $R/gelu-micro.log; tail -qn 1 $R/parity-7.log; grep -A2 "^rung" $R/profile-auto.log; tail -n 4 $R/bench-best-batch.log
