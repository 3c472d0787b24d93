# One short command on 2 H200s for the Triton loss kernel: its GPU tests, the top rung with and
# without it (GPT2LADDER_LOSS_KERNEL=0) at B=16, and the top rung at the largest batch that fits.
# Results go to /tmp/res and are tarred into $OUT every few seconds.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
export GPT2LADDER_CACHE=/tmp/cache; mkdir -p $GPT2LADDER_CACHE/tinyshakespeare
cp .devdata/input.txt $GPT2LADDER_CACHE/tinyshakespeare/
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
export GPT2LADDER_GIT_SHA=$(cat .devdata/GIT_SHA)
R=/tmp/res; mkdir -p $R
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $R/timeline.txt; }
snap() { tar czf $OUT/.r.tgz -C /tmp res 2>/dev/null && mv $OUT/.r.tgz $OUT/results.tgz; }
( while true; do snap; sleep 5; done ) &
TAR=$!
python3 -c "import matplotlib.pyplot" &
G="python3 -m gpt2ladder"
B="--preset gpt2 --batch-size 16 --seq-len 1024 --no-progress --rungs all --last-only"
job() { local name=$1 gpus=$2 lim=$3; shift 3; el "start $name on $gpus"
        CUDA_VISIBLE_DEVICES=$gpus timeout $lim "$@" > $R/$name.log 2>&1; el "end $name rc=$?"; }
( job test-kernel 0 40 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k loss_kernel_equals
  job bench-auto 0 90 $G bench --preset gpt2 --batch-size auto --seq-len 1024 --no-progress --rungs all --last-only --out $R/bench-auto
  job test-gpu 0 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "not loss_kernel_equals" ) &
P0=$!
( job bench-kernel 1 85 $G bench $B --out $R/bench-kernel
  GPT2LADDER_LOSS_KERNEL=0 job bench-nokernel 1 85 $G bench $B --out $R/bench-nokernel ) &
P1=$!
wait $P0 $P1
el "all done"
kill $TAR; snap
cat $R/timeline.txt; tail -n 3 $R/test-kernel.log $R/test-gpu.log; grep -h "^  " $R/bench-*.log
