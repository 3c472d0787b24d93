# One command on 2 H200s for the rungs beyond the five: the full ladder, a variant, the profile,
# the auto batch size and the CUDA-only tests, as two parallel job chains (one per GPU).
# Results go to /tmp/res and are tarred into $OUT every few seconds (so a cut-off run still returns them).
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
snap() { tar czf $OUT/.r.tgz --exclude=ckpt.pt -C /tmp res 2>/dev/null && mv $OUT/.r.tgz $OUT/results.tgz; }
( while true; do snap; sleep 10; done ) &
TAR=$!
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm --format=csv > $R/nvidia-smi.csv
G="python3 -m gpt2ladder"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
UPTO_GRAPH="baseline,tf32,bf16,fp16,compile,flash,vocab,fused_adamw,fused_loss,fp8_head,cuda_graph"
job() { local name=$1 gpus=$2 lim=$3; shift 3; el "start $name on $gpus"
        CUDA_VISIBLE_DEVICES=$gpus timeout $lim "$@" > $R/$name.log 2>&1; el "end $name rc=$?"; }
( job bench-all 0 400 $G bench $B --rungs all --out $R/bench-all
  job profile 0 170 $G profile $B --rungs all --steps 3 --warmup 3 --out $R/profile ) &
P0=$!
( job test-gpu 1 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
  TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 job bench-cdt 1 150 $G bench $B --rungs $UPTO_GRAPH --last-only --out $R/bench-cdt
  job bench-auto 1 310 $G bench --preset gpt2 --batch-size auto --seq-len 1024 --no-progress --rungs all --last-only --out $R/bench-auto ) &
P1=$!
wait $P0 $P1
el "all done"
kill $TAR; snap
cat $R/timeline.txt; tail -n 16 $R/bench-all.log; tail -n 4 $R/bench-cdt.log $R/bench-auto.log $R/test-gpu.log
