# One command on 2 H200s for the float8 Linears (fp8_mlp, fp8_attn): the whole ladder at B=16 on
# GPU 0; on GPU 1 the CUDA-only tests, then the top rung at the largest batch that fits, with and
# without fp8_attn.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
A="--preset gpt2 --batch-size auto --seq-len 1024 --no-progress --last-only"
NO_ATTN="baseline,tf32,bf16,fp16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,fp8_mlp,cuda_graph"
( job bench-all 0 430 $G bench $B --rungs all --out $R/bench-all ) &
P0=$!
( job test-gpu 1 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
  job bench-auto 1 170 $G bench $A --rungs all --out $R/bench-auto
  job bench-auto-mlp 1 150 $G bench $A --rungs $NO_ATTN --out $R/bench-auto-mlp ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 3 $R/test-gpu.log; grep -h "^  \|ms\b" $R/bench-all.log | tail -14; tail -n 4 $R/bench-auto*.log
