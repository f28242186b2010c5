#!/usr/bin/env bash
# The device checks of the statistic path, on a lent GPU (`device` tool; CI never runs this).
# About 5 minutes on one H200: the training-step benchmark on CUDA, then one work item of each
# path (model A, three seeds stacked in train_many, 3000 steps) and one long-context run.
#   bash scripts/gpu_check.sh            # writes its logs under ${OUT:-/tmp/gpu_check}
set -euo pipefail
out="${OUT:-/tmp/gpu_check}"; mkdir -p "$out"
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TQDM_DISABLE=1
nvidia-smi -L | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$out/gpu.txt"
start=$(date +%s)
timeout 240 python3 benchmarks/bench_train.py --device cuda --repeats 10 2>&1 | tee "$out/bench_train_cuda.txt"
echo "benchmark: $(( $(date +%s) - start )) s" | tee -a "$out/gpu.txt"
start=$(date +%s)
timeout 150 python3 scripts/compare_input_paths.py --device cuda --json "$out/paths_cuda.json" 2>&1 | tee "$out/paths_cuda.txt"
echo "work items: $(( $(date +%s) - start )) s" | tee -a "$out/gpu.txt"
start=$(date +%s)
timeout 90 python3 -m fvlib train --model A --depth 8 --budget 8 --n-ctx 4096 --steps 3000 --device cuda \
    --out /tmp/gpu_check_long --no-progress 2>&1 | tee "$out/long_context.txt"
echo "K = 8, N = 4096, 3000 steps: $(( $(date +%s) - start )) s" | tee -a "$out/gpu.txt"
