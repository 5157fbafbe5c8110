#!/usr/bin/env bash
# Real SGLang 0.5.17 on the lent H200 (docs/gpu.md), one step per device call, results under $OUT.
#   bash scripts/gpu-h200-sglang.sh study     repeats of one trial at three levels (bench/repeat_study.py)
#   bash scripts/gpu-h200-sglang.sh tune NAME  `servetune tune plans/gpu-h200-sglang.yaml` into $OUT/NAME
#   bash scripts/gpu-h200-sglang.sh catalog    the installed SGLang's flag catalogue (its own parser) into $OUT
# Needs .sgl/ (git-ignored, carried): the recipe's sglpkgs.tar.xz overlay and sgl_h200.sh. Each step
# unpacks the overlay and builds the random 7.2B model only when a cold machine lacks them.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=/opt/torch/.venv/bin/python3
LOG="$OUT/$1${2:+-$2}.log"
{
  [ -d /tmp/sglpkgs/sglang ] || bash .sgl/sgl_h200.sh unpack .sgl/sglpkgs.tar.xz | tail -3
  [ -f /tmp/m8b/config.json ] || env -u PYTHONPATH "$PY" scripts/make_random_llama.py /tmp/m8b --hidden 4096 \
      --layers 32 --heads 32 --kv-heads 8 --inter 14336 | tail -2
  source .sgl/sgl_h200.sh >/dev/null; setup_cuda_home; sgl_env
  export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1
  pkill -f sglang.launch_server && sleep 5   # an engine left by an interrupted call
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  case "$1" in
    study) timeout -s INT "${LIMIT:-520}" "$PY" bench/repeat_study.py plans/gpu-h200-sglang.yaml \
             --levels "${LEVELS:-16,64,128}" --repeats "${REPEATS:-5}" --out "$OUT/study" ;;
    tune)  timeout -s INT "${LIMIT:-540}" "$PY" -m servetune tune plans/gpu-h200-sglang.yaml --out "$OUT/$2" ;;
    catalog) mkdir -p "$OUT/catalog" && "$PY" -m servetune.engines.catalog --python "$PY" --out "$OUT/catalog" ;;
  esac
  echo "exit $?"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} > "$LOG" 2>&1
tail -40 "$LOG"
# trial files without their per-chunk arrays: the summaries, NVML and server samples stay
find "$OUT" -path '*/trials/*.json' -print0 | xargs -0 -r "$PY" -c '
import json, sys
for p in sys.argv[1:]:
    d = json.load(open(p))
    for r in d.get("records") or []:
        r.pop("chunk_offsets_ms", None); r.pop("chunk_tokens", None)
    json.dump(d, open(p, "w"))'
find "$OUT" -name '*.log' -size +2M -exec truncate -s 2M {} \;
# one archive: a call brings back only a few files
NAME="$1${2:+-$2}"; tar -C "$OUT" --exclude='*.tar.gz' -czf "/tmp/$NAME.tar.gz" . && rm -rf "${OUT:?}"/* && mv "/tmp/$NAME.tar.gz" "$OUT/"
