#!/usr/bin/env bash
# Run the jobs of a results folder and keep everything they print and write.
#
#   bash benchmarks/run.sh benchmarks/jobs/NAME.txt [RESULTS_DIR]   (benchmarks/results/ is ignored by git)
#
# From the repository root, on the machine to measure. jobs.txt has one job per line:
#   NAME  GPUS  LIMIT_S  COMMAND...
# (blank lines and lines starting with # are skipped). Each COMMAND runs with CUDA_VISIBLE_DEVICES=GPUS
# under a time limit of LIMIT_S seconds (SIGTERM, then SIGKILL 30 s later), its output in RESULTS_DIR/logs/NAME.log;
# in COMMAND, $R is the results folder and $G is `python3 -m gpt2ladder` from this checkout. Jobs run one after the
# other, so figures of one run are comparable. RESULTS_DIR defaults to a fresh folder under /tmp.
#
# What the machine is gets written first (env.txt: nvidia-smi, Python, torch, CUDA, Triton, git SHA), its clocks
# every 100 ms while the jobs run (clocks.csv),
# a timeline of the jobs as they run (timeline.txt); at the end both are appended to the folder's
# jobs.txt as comments, so that one file says what ran, where and when. Optional, for machines without
# a network or a checkout: wheels in .whl/ are installed into /tmp/site first, .devdata/input.txt
# seeds the Tiny Shakespeare cache, .devdata/GIT_SHA names the commit. If $OUT is set, the results folder is also packed into
# $OUT/<results folder>.tgz every 10 s, so a run cut off by a time limit still returns what it had.
set -u
jobs_file=${1:?usage: bash benchmarks/run.sh JOBS_FILE [RESULTS_DIR]}
R=$(realpath -m "${2:-$(mktemp -d /tmp/gpt2ladder-results.XXXX)}")
# A folder with files in it already (on a machine kept warm between calls, an earlier call's) is refused: its files
# would be packed with these jobs' as if they had made them.
if [ -n "$(ls -A "$R" 2>/dev/null)" ]; then
  echo "run.sh: $R already holds files; give a new or empty results folder" >&2; exit 2
fi
mkdir -p "$R/logs"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
if [ -f .devdata/input.txt ]; then
  export GPT2LADDER_CACHE=${GPT2LADDER_CACHE:-/tmp/gpt2ladder-cache}
  mkdir -p "$GPT2LADDER_CACHE/tinyshakespeare" && cp .devdata/input.txt "$GPT2LADDER_CACHE/tinyshakespeare/"
fi
[ -f .devdata/GIT_SHA ] && export GPT2LADDER_GIT_SHA=$(cat .devdata/GIT_SHA)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor-cache}
export R G="python3 -m gpt2ladder"

{ nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv 2>&1
  python3 -c 'import platform, torch; print("python", platform.python_version(), "torch", torch.__version__,
"cuda", torch.version.cuda); import triton; print("triton", triton.__version__)' 2>&1
  echo "git ${GPT2LADDER_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null)}"; echo "jobs $jobs_file"; } > "$R/env.txt"
cp "$jobs_file" "$R/jobs.txt"

# The GPU's clock, power and temperature every 100 ms while the jobs run (clocks.csv), to read a slow stretch
# of steps against: this script never changes them.
clock_fields=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
if command -v nvidia-smi > /dev/null; then
  for reasons in clocks_event_reasons.active clocks_throttle_reasons.active ""; do
    nvidia-smi --query-gpu=$clock_fields${reasons:+,$reasons} --format=csv > /dev/null 2>&1 && break
  done
  nvidia-smi --query-gpu=$clock_fields${reasons:+,$reasons} --format=csv,nounits -lms 100 > "$R/clocks.csv" 2>&1 &
  clocks=$!
fi

T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $* at $(date -u +%H:%M:%S)" | tee -a "$R/timeline.txt"; }
pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/.r.tgz" --exclude='*.pt' --exclude='*.tmp' --exclude=tb -C "$(dirname "$R")" "$(basename "$R")" 2>/dev/null \
         && mv "$OUT/.r.tgz" "$OUT/$(basename "$R").tgz"; return 0; }
( while true; do pack; sleep 10; done ) & packer=$!
python3 -c "import matplotlib.pyplot" 2>/dev/null &  # matplotlib's font cache, off the clock

while read -r name gpus limit cmd; do
  case "$name" in ''|'#'*) continue ;; esac
  stamp "start $name on GPU $gpus"
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 30 "$limit" bash -c "$cmd" < /dev/null > "$R/logs/$name.log" 2>&1
  stamp "end $name rc=$?"
done < "$jobs_file"

stamp "all done"
{ echo "# ran on:"; sed 's/^/#   /' "$R/env.txt"; echo "# when:"; sed 's/^/#   /' "$R/timeline.txt"; } >> "$R/jobs.txt"
du -ah "$R" | sort -h | tail -5 > "$R/largest-files.txt"
[ -n "${clocks:-}" ] && kill $clocks 2>/dev/null
kill $packer 2>/dev/null; pack
echo "results in $R"
