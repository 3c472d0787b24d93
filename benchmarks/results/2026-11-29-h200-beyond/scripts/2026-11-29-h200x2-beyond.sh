# One command on 2 H200s for the rungs beyond the five: the full ladder, a variant, the profile,
# the auto batch size and the CUDA-only tests, as two parallel job chains (one per GPU).
source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
UPTO_GRAPH="baseline,tf32,bf16,fp16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,cuda_graph"
( job bench-all 0 400 $G bench $B --rungs all --out $R/bench-all
  job profile 0 170 $G profile $B --rungs all --steps 3 --warmup 3 --out $R/profile ) &
P0=$!
( job test-gpu 1 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
  TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 job bench-cdt 1 150 $G bench $B --rungs $UPTO_GRAPH --last-only --out $R/bench-cdt
  job bench-auto 1 310 $G bench --preset gpt2 --batch-size auto --seq-len 1024 --no-progress --rungs all --last-only --out $R/bench-auto ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 16 $R/bench-all.log; tail -n 4 $R/bench-cdt.log $R/bench-auto.log $R/test-gpu.log
