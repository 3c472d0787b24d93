# Parity of the two new rungs on one H200, as runs 7 and 8 of the path ending at fp32_wgrad (runs 0-6,
# the fp32 baselines to bf16_residual, were run by earlier commands on the same settings and are
# merged in), then the GELU forward kernel's CUDA test again (its error bound corrected).
SNAP_EVERY=10 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs bf16,compile,fp8_head,loss_kernel,bf16_residual,gelu_kernel,fp32_wgrad --steps 300 --eval-every 25"
job parity-7 0 130 $G $P --shard 7/9 --out $R/parity-shards
job parity-8 0 130 $G $P --shard 8/9 --out $R/parity-shards
job test-gpu 0 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu_forward or fp32_wgrad_gradients"
finish
cat $R/timeline.txt; tail -qn 2 $R/parity-7.log $R/parity-8.log; tail -n 3 $R/test-gpu.log
