#!/usr/bin/env bash
# The staged campaign half of scripts/gpu-h200-campaign.sh, bounded so its results always come back.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/run"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
pkill -f "transformers.cli.transformers serve" && sleep 5   # an engine left by an earlier, interrupted call
nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee "$OUT/run/processes-before.txt"
[ -f /tmp/m1b/config.json ] || python3 scripts/make_random_llama.py /tmp/m1b > "$OUT/run/make_model.log" 2>&1
timeout -s INT ${TUNE_TIMEOUT:-400} python3 -m servetune tune plans/gpu-h200-transformers.yaml --out "$OUT/run/tune" \
  > "$OUT/run/tune.log" 2>&1
echo "tune exit $?" >> "$OUT/run/tune.log"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee "$OUT/run/processes-after.txt"
tar -C "$OUT" -czf "$OUT/gpu-h200-tune.tar.gz" run && rm -rf "$OUT/run"
