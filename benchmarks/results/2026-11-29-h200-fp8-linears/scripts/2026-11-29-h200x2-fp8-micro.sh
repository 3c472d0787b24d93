# One short command on 2 H200s: where the float8 Linears' time goes (fp8_linear_micro.py, GPU 0) and
# the top rung without them at the largest batch that fits (GPU 1).
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
UPTO_GRAPH="baseline,tf32,bf16,fp16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,cuda_graph"
( job micro 0 240 python3 benchmarks/scripts/fp8_linear_micro.py ) &
P0=$!
( job bench-auto 1 200 $G bench --preset gpt2 --batch-size auto --seq-len 1024 --no-progress --rungs $UPTO_GRAPH --last-only --out $R/bench-auto ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 3 $R/bench-auto.log; grep -h "==" $R/micro.log
