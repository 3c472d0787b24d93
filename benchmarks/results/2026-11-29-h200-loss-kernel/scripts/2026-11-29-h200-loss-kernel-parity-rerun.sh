# One command on one H200: shard 2 of the loss_kernel parity again (units bf16 and loss_kernel, 300 steps)
# with the final tiles, to be merged with shards 0 and 1 (the fp32 baselines) of the first run. The
# eager bf16 unit must repeat the first run bit for bit for that merge to be fair.
SNAP_EVERY=5 source "$(dirname "$0")/lib.sh"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs bf16,compile,fp8_head,loss_kernel --steps 300 --eval-every 25 --out $R/parity-rerun"
job parity-2 0 175 $G $P --shard 2/3
finish
cat $R/timeline.txt; tail -n 2 $R/parity-2.log
