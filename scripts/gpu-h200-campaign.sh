#!/usr/bin/env bash
# Issue 9 on a lent H200 (no registry there): servetune bench and a staged tune against a real engine
# (`transformers serve`, continuous batching + CUDA graphs, random 1B Llama) started by servetune's own
# runner, with the NVML curve in every result. Needs the wheels of docs/gpu.md in .whl/. Writes $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/run"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/run/nvidia-smi.txt"
python3 scripts/make_random_llama.py /tmp/m1b 2>&1 | tail -2 | tee "$OUT/run/make_model.log"

# 1) servetune serve (our runner) + servetune bench at concurrency 32
python3 -m servetune serve --engine transformers --model /tmp/m1b --set cb_max_memory_percent=0.3 \
  --port 8000 --gpus 0 > "$OUT/run/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 1 240); do curl -sf -o /dev/null http://127.0.0.1:8000/health && break; sleep 0.5; done
ENGINE_PID=$(grep -o 'pid [0-9]*' "$OUT/run/serve.log" | head -1 | cut -d' ' -f2)
python3 -m servetune bench --server-pid "$ENGINE_PID" --url http://127.0.0.1:8000 --model /tmp/m1b --concurrency 32 --requests 200 \
  --warmup 16 --workload plans/workloads/gpu-chat.yaml --gpus 0 --sla ttft_ms=2000 --sla tpot_ms=60 \
  --out "$OUT/run/bench-c32.json" 2>&1 | tail -30
# SIGTERM, not SIGINT: a background job of a non-interactive shell starts with SIGINT ignored
kill -TERM $SERVE; timeout 120 tail --pid=$SERVE -f /dev/null; tail -5 "$OUT/run/serve.log"

# 2) the staged campaign: correctness -> baseline -> ramp -> ceiling
python3 -m servetune tune plans/gpu-h200-transformers.yaml --out "$OUT/run/tune" 2>&1 | tail -40
nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee "$OUT/run/leftover-processes.txt"
tar -C "$OUT" -czf "$OUT/gpu-h200-run.tar.gz" run && rm -rf "$OUT/run"
