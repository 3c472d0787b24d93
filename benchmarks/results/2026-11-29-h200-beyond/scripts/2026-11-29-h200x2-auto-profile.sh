# One command on 2 H200s: the top rung at the largest batch that fits (--batch-size auto), the profile
# of every rung, and whether coordinate-descent tuning (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1)
source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
UPTO_FP8="baseline,tf32,bf16,fp16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head"
( job bench-auto 0 260 $G bench --preset gpt2 --batch-size auto --seq-len 1024 --no-progress --rungs all --last-only --out $R/bench-auto
  TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 job bench-cdt-nograph 0 200 $G bench $B --rungs $UPTO_FP8 --last-only --out $R/bench-cdt-nograph ) &
P0=$!
( job profile 1 440 $G profile $B --rungs all --steps 3 --warmup 3 --out $R/profile ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; tail -n 5 $R/bench-auto.log $R/bench-cdt-nograph.log; grep -A14 "^| rung" $R/profile/profile.md | head -16
