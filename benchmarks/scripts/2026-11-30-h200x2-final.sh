# A last short command on 2 H200s with the GELU kernel's swept tile (64 x 64): GPU 0 climbs the
# ladder with --rungs auto (B=16; no opt-in rungs, so it fits the little device time left); GPU 1
# runs the GELU kernel's CUDA tests again (the size test's error bound was corrected).
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
( job bench-auto 0 235 $G bench $B --rungs auto --out $R/bench-auto ) &
P0=$!
( job test-gpu 1 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu" ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 16 $R/bench-auto.log; tail -n 3 $R/test-gpu.log
