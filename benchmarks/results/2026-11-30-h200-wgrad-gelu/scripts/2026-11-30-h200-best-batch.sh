# The GELU forward kernel's CUDA test once more (its fp64 reference now in the sigmoid form: the tanh
# form rounds to 0 below h = -7 even in fp64), then the top rung of `auto` at the batch size
# `--batch-size best` finds, on one H200.
SNAP_EVERY=10 source "$(dirname "$0")/lib.sh"
job test-gpu 0 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu_forward"
job bench-best-batch 0 260 $G bench --preset gpt2 --batch-size best --seq-len 1024 --no-progress --rungs auto \
    --last-only --out $R/bench-best-batch
finish
cat $R/timeline.txt; tail -n 3 $R/test-gpu.log; tail -n 6 $R/bench-best-batch.log
