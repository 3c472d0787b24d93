# One command on 2 H200s: the top rung at the largest batch that fits (--batch-size auto), the profile
# of every rung, and whether coordinate-descent tuning (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1)
# keeps the loss finite without CUDA graphs. Results are tarred into $OUT every few seconds.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
export GPT2LADDER_CACHE=/tmp/cache; mkdir -p $GPT2LADDER_CACHE/tinyshakespeare
cp .devdata/input.txt $GPT2LADDER_CACHE/tinyshakespeare/
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
export GPT2LADDER_GIT_SHA=$(cat .devdata/GIT_SHA)
R=/tmp/res; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $R/timeline.txt; }
snap() { tar czf $OUT/.r.tgz -C /tmp res 2>/dev/null && mv $OUT/.r.tgz $OUT/results.tgz; }
( while true; do snap; sleep 10; done ) &
TAR=$!
python3 -c "import matplotlib.pyplot" &
G="python3 -m gpt2ladder"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
UPTO_FP8="baseline,tf32,bf16,fp16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head"
job() { local name=$1 gpus=$2 lim=$3; shift 3; el "start $name on $gpus"
        CUDA_VISIBLE_DEVICES=$gpus timeout $lim "$@" > $R/$name.log 2>&1; el "end $name rc=$?"; }
( job bench-auto 0 260 $G bench --preset gpt2 --batch-size auto --seq-len 1024 --no-progress --rungs all --last-only --out $R/bench-auto
  TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 job bench-cdt-nograph 0 200 $G bench $B --rungs $UPTO_FP8 --last-only --out $R/bench-cdt-nograph ) &
P0=$!
( job profile 1 440 $G profile $B --rungs all --steps 3 --warmup 3 --out $R/profile ) &
P1=$!
wait $P0 $P1
el "all done"
kill $TAR; snap
cat $R/timeline.txt; tail -n 5 $R/bench-auto.log $R/bench-cdt-nograph.log; grep -A14 "^| rung" $R/profile/profile.md | head -16
