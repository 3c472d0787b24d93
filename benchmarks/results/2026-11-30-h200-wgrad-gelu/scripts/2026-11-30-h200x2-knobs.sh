# Inductor options on the top rung of `auto` (--last-only, B=16): programmatic dependent launch,
# the mix-order reduction's split size (layer-norm weight gradients finish in an aten column sum
# per split), mix-order reduction off, combo kernels; GPU 0 and GPU 1 take half each. Also the
# weight-gradient matmul with an fp32 output (mm_out_dtype_micro.py).
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="bench --preset gpt2 --batch-size 16 --seq-len 1024 --no-progress --last-only --rungs auto"
K="python3 benchmarks/scripts/inductor_knobs.py"
( job ctrl 0 100 $K -- $B --out $R/ctrl
  job pdl 0 100 $K triton.enable_pdl=True -- $B --out $R/pdl
  job split64 0 100 $K triton.mix_order_reduction_split_size=64 -- $B --out $R/split64
  job nomix 0 100 $K triton.mix_order_reduction=False -- $B --out $R/nomix ) &
P0=$!
( job mm-micro 1 100 python3 benchmarks/scripts/mm_out_dtype_micro.py
  job combo 1 100 $K combo_kernels=True -- $B --out $R/combo
  job split32 1 100 $K triton.mix_order_reduction_split_size=32 -- $B --out $R/split32
  job all3 1 100 $K triton.enable_pdl=True combo_kernels=True triton.mix_order_reduction_split_size=64 -- $B --out $R/all3 ) &
P1=$!
wait $P0 $P1
finish
cat $R/timeline.txt; for f in ctrl pdl split64 nomix combo split32 all3; do echo "== $f"; grep -E "^(inductor|  [a-z_0-9]+ +[0-9])" $R/$f.log | tail -4; done; cat $R/mm-micro.log | tail -25
