# One short command on 2 H200s for the Triton loss kernel: its GPU tests, the top rung with and
# without it (GPT2LADDER_LOSS_KERNEL=0) at B=16, and the top rung at the largest batch that fits.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress --rungs all --last-only"
( job test-kernel 0 40 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k loss_kernel_equals
  job bench-auto 0 90 $G bench --preset gpt2 --batch-size auto --seq-len 1024 --no-progress --rungs all --last-only --out $R/bench-auto
  job test-gpu 0 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "not loss_kernel_equals" ) &
P0=$!
( job bench-kernel 1 85 $G bench $B --out $R/bench-kernel
  GPT2LADDER_LOSS_KERNEL=0 job bench-nokernel 1 85 $G bench $B --out $R/bench-nokernel ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 3 $R/test-kernel.log $R/test-gpu.log; grep -h "^  " $R/bench-*.log
