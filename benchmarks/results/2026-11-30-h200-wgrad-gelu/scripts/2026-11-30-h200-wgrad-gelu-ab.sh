# Same-GPU A/B of the two new rungs on one H200 (the two-GPU kind was not lent; the previous command
# ran its variants on different GPUs, which differ by up to 0.3 ms): after the GELU micro-benchmark
# (backward kernel without the row loop), the top of the ladder with --last-only ending at
# bf16_residual (A), + fp32_wgrad (B), + fp32_wgrad + gelu_kernel (C), in the order A B C C B A.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress --last-only"
A="baseline,tf32,bf16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,loss_kernel,cuda_graph,bf16_residual"
run() { job $1-$2 0 80 $G bench $B --rungs $3 --out $R/$1-$2; }
job gelu-micro 0 80 python3 benchmarks/scripts/gelu_kernel_micro.py
run A 1 $A; run B 1 $A,fp32_wgrad; run C 1 $A,fp32_wgrad,gelu_kernel
run C 2 $A,fp32_wgrad,gelu_kernel; run B 2 $A,fp32_wgrad; run A 2 $A
finish
cat $R/timeline.txt; sed -n '/^backward, compiled/,$p' $R/gelu-micro.log
for f in A-1 B-1 C-1 C-2 B-2 A-2; do echo "== $f $(grep -E "^  [a-z_0-9]+ +[0-9]" $R/$f.log | tail -1)"; grep -iE "error" $R/$f.log | head -2; done
