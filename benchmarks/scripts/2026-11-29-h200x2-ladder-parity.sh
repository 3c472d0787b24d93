# One command on 2 H200s: the whole ladder (to cuda_graph) at B=16 and a 300-step parity run of every
# rung, its units spread as four shards over the two GPUs (merged afterwards with `parity --merge`).
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
python3 -c "import matplotlib.pyplot" &  # build matplotlib's font cache once, off the clock
G="python3 -m gpt2ladder"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress"
P="parity $B --rungs all --steps 300 --eval-every 25 --out $R/parity-shards"
job() { local name=$1 gpus=$2 lim=$3; shift 3; el "start $name on $gpus"
        CUDA_VISIBLE_DEVICES=$gpus timeout $lim "$@" > $R/$name.log 2>&1; el "end $name rc=$?"; }
( job bench-all 0 260 $G bench $B --rungs all --out $R/bench-all
  job parity-2 0 170 $G $P --shard 2/4
  job parity-3 0 130 $G $P --shard 3/4 ) &
P0=$!
( job parity-0 1 275 $G $P --shard 0/4
  job parity-1 1 275 $G $P --shard 1/4 ) &
P1=$!
wait $P0 $P1
el "all done"
kill $TAR; snap
cat $R/timeline.txt; tail -n 14 $R/bench-all.log; grep -h "val\|rc=" $R/parity-*.log | tail -n 20
