# A last short command on 2 H200s with the GELU kernel's swept tile (64 x 64), sized to the device
# time left: the top rung of `auto` (ending at gelu_kernel) and the same path without the GELU kernel
# (ending at bf16_residual), each with --last-only on GPU 0, one after the other; on GPU 1 the GELU
# kernel's CUDA tests again (the size test's error bound was corrected) and the top rung once more.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress --last-only"
NOGELU="baseline,tf32,bf16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,loss_kernel,cuda_graph,bf16_residual"
( job top-0 0 80 $G bench $B --rungs auto --out $R/top-gpu0
  job nogelu-0 0 80 $G bench $B --rungs $NOGELU --out $R/nogelu-gpu0 ) &
P0=$!
( job test-gpu 1 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu"
  job top-1 1 80 $G bench $B --rungs auto --out $R/top-gpu1 ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -qn 3 $R/top-0.log $R/nogelu-0.log $R/top-1.log; tail -n 2 $R/test-gpu.log
