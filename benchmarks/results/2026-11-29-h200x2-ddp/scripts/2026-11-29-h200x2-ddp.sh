# One command on 2 H200s: GPT-2 124M under torchrun (DDP, B=16 per GPU) at the top rung of `auto`,
# with the scaling efficiency against the one-GPU ladder measured minutes before on the same kind of
# machine; if that rung fails under DDP, the rungs below CUDA graphs; then gpt2-xl under FSDP2.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
BASE=benchmarks/results/2026-11-29-h200-fp8-linears/bench-best/ladder.json
TR="torchrun --standalone --nproc_per_node=2 -m gpt2ladder bench --no-progress --seq-len 1024"
job ddp-auto 0,1 150 $TR --preset gpt2 --batch-size 16 --rungs auto --last-only --baseline-json $BASE --out $R/ddp-auto
if ! grep -q '"status": "ok"' $R/ddp-auto/ladder.json 2>/dev/null; then
  job ddp-nograph 0,1 130 $TR --preset gpt2 --batch-size 16 --last-only --baseline-json $BASE \
      --rungs baseline,tf32,bf16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head --out $R/ddp-nograph
fi
job xl-fsdp 0,1 230 $TR --preset gpt2-xl --batch-size 16 --rungs seed --last-only --strategy fsdp --steps 10 --out $R/xl-fsdp
finish
cat $R/timeline.txt; tail -n 12 $R/ddp-*.log $R/xl-fsdp.log
