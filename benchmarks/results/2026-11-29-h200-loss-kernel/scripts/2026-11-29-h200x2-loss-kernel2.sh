# One command on 2 H200s for the loss_kernel rung (two Triton kernels for the fused loss's pass over
# the logits): its CUDA tests, the top rung with and without it side by side, a profile of the new top
# rung, inductor's coordinate-descent tuning on top, and the batch-size search.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
NO_KERNEL="baseline,tf32,bf16,fp16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,cuda_graph"
( job test-gpu 0 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "loss_kernel or fp8_head or graph"
  job bench-auto 0 110 $G bench $B --rungs auto --last-only --out $R/bench-auto
  job profile-auto 0 150 $G profile $B --rungs auto --last-only --out $R/profile-auto
  job bench-auto-batch 0 260 $G bench --preset gpt2 --batch-size best --seq-len 1024 --no-progress --rungs auto \
      --last-only --out $R/bench-auto-batch ) &
P0=$!
( job bench-nokernel 1 110 $G bench $B --rungs $NO_KERNEL --last-only --out $R/bench-nokernel
  job bench-auto-cdt 1 240 env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 $G bench $B --rungs auto --last-only \
      --out $R/bench-auto-cdt ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 4 $R/test-gpu.log; tail -n 3 $R/bench-*.log; grep -A3 "ms/step" $R/profile-auto.log | head
