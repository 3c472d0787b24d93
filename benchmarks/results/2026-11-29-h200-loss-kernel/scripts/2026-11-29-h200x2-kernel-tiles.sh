# One command on 2 H200s: tile shapes for the loss kernels (GPU 0), and where inductor's coordinate-descent
# tuning (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1) gains its 1.4 ms and loses its loss to NaN (GPU 1,
# and GPU 0 after the sweep): the top rung without the loss kernel, without the fused loss, and profiled.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
CDT="env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1"
NO_KERNEL="baseline,tf32,bf16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,cuda_graph"
PLAIN="baseline,tf32,bf16,compile,flash,vocab,fused_adamw,cuda_graph"
( job loss-kernel-micro 0 200 python3 benchmarks/scripts/loss_kernel_micro.py
  job cdt-plain 0 200 $CDT $G bench $B --rungs $PLAIN --last-only --out $R/cdt-plain ) &
P0=$!
( job cdt-nokernel 1 200 $CDT $G bench $B --rungs $NO_KERNEL --last-only --out $R/cdt-nokernel
  job cdt-profile 1 200 $CDT $G profile $B --rungs auto --last-only --out $R/cdt-profile ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; cat $R/loss-kernel-micro.log; tail -n 2 $R/cdt-*.log
