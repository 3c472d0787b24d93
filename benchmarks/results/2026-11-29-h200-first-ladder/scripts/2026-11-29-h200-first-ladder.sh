set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
export GPT2LADDER_CACHE=/tmp/cache; mkdir -p $GPT2LADDER_CACHE/tinyshakespeare; cp .devdata/input.txt $GPT2LADDER_CACHE/tinyshakespeare/
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
python3 -c "import torch,triton;print(torch.__version__, torch.version.cuda, triton.__version__, torch.backends.cudnn.version())"
T0=$(date +%s)
timeout 330 python3 -m gpt2ladder bench --preset gpt2 --rungs all --steps 10 --warmup 3 --out $OUT/all --no-progress 2>&1 | grep -v Warning
echo "bench took $(( $(date +%s) - T0 )) s"
timeout 90 python3 .devdata/kernels.py vocab,fused_adamw,fused_loss,fp8_head > $OUT/kernels_fp8.txt 2>&1; head -60 $OUT/kernels_fp8.txt
echo "profile done at $(( $(date +%s) - T0 )) s"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15
echo "all done at $(( $(date +%s) - T0 )) s"
