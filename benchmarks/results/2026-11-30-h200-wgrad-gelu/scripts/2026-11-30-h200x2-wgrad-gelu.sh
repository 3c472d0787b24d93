# The fp32_wgrad rung and the GELU kernels rewritten (forward kernel added; sigmoid form, int32
# offsets, bias gradient by atomics): the GELU micro-benchmark and the CUDA tests of both; the top of
# the ladder with --last-only, without fp32_wgrad (ending at bf16_residual), with it (auto), and with
# gelu_kernel on top; a profile of that last one.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress --last-only"
AUTO="baseline,tf32,bf16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,loss_kernel,cuda_graph,bf16_residual"
( job gelu-micro 0 120 python3 benchmarks/scripts/gelu_kernel_micro.py
  job wgrad 0 90 $G bench $B --rungs $AUTO,fp32_wgrad --out $R/wgrad
  job wgrad-gelu 0 90 $G bench $B --rungs $AUTO,fp32_wgrad,gelu_kernel --out $R/wgrad-gelu ) &
P0=$!
( job test-gpu 1 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu or wgrad"
  job ctrl 1 90 $G bench $B --rungs $AUTO --out $R/ctrl
  job profile 1 100 $G profile $B --rungs $AUTO,fp32_wgrad,gelu_kernel --out $R/profile ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; cat $R/gelu-micro.log; tail -n 3 $R/test-gpu.log
for f in ctrl wgrad wgrad-gelu; do echo "== $f"; grep -E "^  [a-z_0-9]+ +[0-9]" $R/$f.log | tail -2; grep -iE "error|failed" $R/$f.log | head -3; done
grep -A3 "^| rung" $R/profile/profile.md | head -4
