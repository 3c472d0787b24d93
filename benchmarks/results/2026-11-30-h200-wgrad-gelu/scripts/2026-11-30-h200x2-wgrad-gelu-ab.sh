# Same-GPU A/B of the two new rungs (the previous command ran its variants on different GPUs, which
# differ by up to 0.3 ms): the top of the ladder with --last-only ending at bf16_residual (A),
# + fp32_wgrad (B), + fp32_wgrad + gelu_kernel (C), + gelu_kernel (D); GPU 0 in the order A B C D after
# the GELU micro-benchmark (backward kernel without the row loop), GPU 1 in the order D C B A after
# the CUDA tests of the GELU kernels and fp32_wgrad.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress --last-only"
A="baseline,tf32,bf16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,loss_kernel,cuda_graph,bf16_residual"
run() { job $1-$2 $2 90 $G bench $B --rungs $3 --out $R/$1-gpu$2; }
( job gelu-micro 0 90 python3 benchmarks/scripts/gelu_kernel_micro.py
  run A 0 $A; run B 0 $A,fp32_wgrad; run C 0 $A,fp32_wgrad,gelu_kernel; run D 0 $A,gelu_kernel ) &
P0=$!
( job test-gpu 1 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "gelu or wgrad"
  run D 1 $A,gelu_kernel; run C 1 $A,fp32_wgrad,gelu_kernel; run B 1 $A,fp32_wgrad; run A 1 $A ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; sed -n '/^backward, compiled/,$p' $R/gelu-micro.log; tail -n 3 $R/test-gpu.log
for f in A-0 B-0 C-0 D-0 A-1 B-1 C-1 D-1; do echo "== $f $(grep -E "^  [a-z_0-9]+ +[0-9]" $R/$f.log | tail -1)"; grep -iE "error" $R/$f.log | head -2; done
