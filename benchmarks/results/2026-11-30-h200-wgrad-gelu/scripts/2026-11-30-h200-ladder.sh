# The whole ladder on one H200 with the new rungs (gelu_kernel now in `auto`, then fp32_wgrad; loss
# kernels with 32-bit offsets): first the CUDA tests of the kernels, then `bench --rungs auto` (the
# README's headline), then the profile of its top rung.
SNAP_EVERY=10 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
job test-gpu 0 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu or wgrad or loss_kernel"
job bench-auto 0 380 $G bench $B --rungs auto --out $R/bench-auto
job profile-auto 0 90 $G profile $B --rungs auto --last-only --out $R/profile-auto
finish
cat $R/timeline.txt; tail -n 3 $R/test-gpu.log; grep -A40 "^rung" $R/bench-auto.log | head -24
grep -A3 "^| rung" $R/profile-auto/profile.md | head -4
