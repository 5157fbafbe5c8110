#!/usr/bin/env bash
# Real SGLang 0.5.17 on the lent H200 (docs/gpu.md): a queue of steps that survives the per-call limit.
#   bash scripts/gpu-h200-sglang.sh STEP...      e.g.  catalog tune:tune-b tune:tune-c openloop
# Steps: catalog (the installed SGLang's flag catalogue and a recorded parser check), study (repeats of
# one trial at three levels), tune:NAME (`servetune tune plans/gpu-h200-sglang.yaml`; tune:NAME=PLAN for another
# plan, e.g. tune:rate-a=plans/gpu-h200-sglang-rate.yaml), openloop
# (`servetune bench --rate` at five Poisson rates against one server; SERVE_SET adds --set flags to the
# server, ARRIVAL_ARGS bench arguments, OPENLOOP_DIR names the results folder), benchserving (servetune bench
# and sglang.bench_serving side by side on one server, bench/bench_serving_side_by_side.py), clientbench
# (bench/client_overhead.py on the machine's 16 cores: no GPU, no model; LEVELS, WORKERS, CLIENTS, REPEATS). Each call
# runs the steps not done yet and stops before DEADLINE seconds (default 560): a campaign pauses between trials
# (--stop-after) and the next call resumes it (--resume). Work lives in /tmp/st on the machine; the
# whole of it comes back as one archive in $OUT; on a cold machine .sgl/st.tar.gz (carried) restores it,
# or else the campaigns kept in tests/data/gpu-h200-sglang/ seed it (so `tune:tune-c` resumes tune-c).
# Needs .sgl/ (git-ignored, carried): the prebuilt SGLang 0.5.17 package overlay sglpkgs.tar.xz and its
# helper sgl_h200.sh (unpack, CUDA_HOME, PYTHONPATH), docs/gpu.md.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=/opt/torch/.venv/bin/python3
ST=/tmp/st
DEADLINE=${DEADLINE:-560}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
# one server with the plan's engine and SGLang's default flags, shared by the openloop and benchserving
# steps (port 30777, logs in $ST/server), started on first use; its pid in $spid
SRV=http://127.0.0.1:30777; spid=
serve_default() {
  [ -n "$spid" ] && kill -0 "$spid" 2>/dev/null && return 0
  mkdir -p "$ST/server"
  "$PY" -m servetune serve --engine sglang --sglang-version 0.5.17 --model /tmp/m8b --python "$PY" --port 30777 \
      --set attention-backend=triton --set sampling-backend=pytorch --set mem-fraction-static=0.8 \
      --set cuda-graph-max-bs=160 ${SERVE_SET:-} --log-dir "$ST/server" > "$ST/server/serve.out" 2>&1 &
  spid=$!
  for _ in $(seq 200); do
    grep -q "^ready:" "$ST/server/serve.out" && return 0
    kill -0 "$spid" 2>/dev/null || { tail -5 "$ST/server/serve.out"; return 1; }
    sleep 1
  done
  return 1
}
# a command bounded by the time left before DEADLINE (SIGINT, so a bench keeps its partial result)
bounded() { timeout -s INT "$(( $(left) - 10 ))" "$@"; }
LOG="$OUT/call-$(date +%H%M%S).log"
{
  if [ ! -d "$ST" ]; then   # a cold machine: the last archive if carried, else the campaigns kept in tests/data
    mkdir -p "$ST"
    if [ -f .sgl/st.tar.gz ]; then tar -C "$ST" -xzf .sgl/st.tar.gz && echo "restored $ST"
    else for t in tests/data/gpu-h200-sglang/tune-*.tar.xz; do tar -C "$ST" -xJf "$t" && echo "seeded from $t"; done; fi
  fi
  [ -d /tmp/sglpkgs/sglang ] || bash .sgl/sgl_h200.sh unpack .sgl/sglpkgs.tar.xz | tail -3
  [ -f /tmp/m8b/config.json ] || [ "$*" = clientbench ] || env -u PYTHONPATH "$PY" scripts/make_random_llama.py /tmp/m8b --hidden 4096 \
      --layers 32 --heads 32 --kv-heads 8 --inter 14336 | tail -2
  source .sgl/sgl_h200.sh >/dev/null; setup_cuda_home; sgl_env
  export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 SERVETUNE_LOG_DIR="$ST/logs"
  pkill -f sglang.launch_server && sleep 5   # an engine left by an interrupted call
  echo "setup done at $(( $(date +%s) - T0 )) s"
  for step in "$@"; do
    [ -f "$ST/done/${step%%=*}" ] && continue
    [ "$(left)" -lt 90 ] && { echo "no time left for $step"; break; }
    echo "=== $step ($(left) s left)"
    case "$step" in
      catalog)
        mkdir -p "$ST/catalog"
        "$PY" -m servetune.engines.catalog --python "$PY" --out "$ST/catalog" && rc=0 || rc=$?
        "$PY" servetune/engines/catalog/sglang_probe.py check --model-path /tmp/m8b --attention-backend triton \
            --chunked-prefill-size 16384 --schedule-conservativeness 0.7 > "$ST/catalog/probe-check.json"
        "$PY" servetune/engines/catalog/sglang_probe.py check --model-path /tmp/m8b --cuda-graph-max-bs 8 \
            --no-such-flag 1 > "$ST/catalog/probe-check-refused.json" ;;
      study)
        timeout -s INT "$(( $(left) - 20 ))" "$PY" bench/repeat_study.py plans/gpu-h200-sglang.yaml \
            --levels "${LEVELS:-16,64,128}" --repeats "${REPEATS:-5}" --out "$ST/study" && rc=0 || rc=$? ;;
      tune:*)   # tune:NAME runs plans/gpu-h200-sglang.yaml, tune:NAME=PLAN another plan
        name=${step#tune:}; plan=plans/gpu-h200-sglang.yaml; resume=()
        [[ "$name" == *=* ]] && { plan=${name#*=}; name=${name%%=*}; }
        [ -f "$ST/$name/experiment.json" ] && resume=(--resume)
        timeout -s INT "$(( $(left) + 30 ))" "$PY" -m servetune tune "$plan" \
            --out "$ST/$name" "${resume[@]}" --stop-after "$(( $(left) - 10 ))" 2>&1 | tee -a "$ST/$name.log" | tail -60
        rc=${PIPESTATUS[0]} ;;
      openloop)
        OL=$ST/${OPENLOOP_DIR:-openloop}; mkdir -p "$OL"
        serve_default || { echo "the server did not start"; rc=1; continue; }
        rc=0
        for rate in ${RATES:-6 12 18 24 30}; do
          [ "$(left)" -lt 45 ] && { rc=75; break; }
          [ -f "$OL/r$rate.json" ] && continue
          bounded "$PY" -m servetune bench --url "$SRV" --rate "$rate" --concurrency 512 ${ARRIVAL_ARGS:-} \
              --requests $(( rate * 30 )) --warmup 16 --workload plans/workloads/gpu-chat-shared-prefix.yaml \
              --endpoint chat --sla p99_ttft_ms=1500 --sla p99_tpot_ms=25 --min-window-s 10 --min-completions 100 \
              --server-log "$(ls -t "$ST"/server/sglang-*.log | head -1)" --out "$OL/r$rate.json" \
              2>&1 | tail -4 || rc=1
        done ;;
      benchserving)   # servetune bench and sglang.bench_serving on one server, the same workload shape
        mkdir -p "$ST/benchserving"; B="$ST/benchserving"
        serve_default || { echo "the server did not start"; rc=1; continue; }
        rc=0
        st_run() { bounded "$PY" -m servetune bench --url "$SRV" --concurrency "$1" --requests "$2" \
            --warmup 16 --workload plans/workloads/bench-serving-gsp.yaml --endpoint chat \
            --min-window-s 10 --min-completions 100 --out "$B/servetune-c$1.json" 2>&1 | tail -3; }
        bs_run() { bounded env PYTHONPATH="$PYTHONPATH:$PWD/scripts/offline-shims" "$PY" -m sglang.bench_serving \
            --backend sglang-oai-chat --host 127.0.0.1 --port 30777 --model /tmp/m8b --tokenizer /tmp/m8b \
            --dataset-name generated-shared-prefix --gsp-num-groups 4 --gsp-prompts-per-group $(( $2 / 4 )) \
            --gsp-system-prompt-len 256 --gsp-question-len 512 --gsp-output-len 128 --num-prompts "$2" \
            --max-concurrency "$1" --request-rate inf --warmup-requests 16 --flush-cache --seed 1 \
            --output-file "$B/bench-serving-c$1.jsonl" --output-details --disable-tqdm 2>&1 | tail -25; }
        st_run 16 400 && bs_run 16 400 && bs_run 64 800 && st_run 64 800 || rc=1
        "$PY" bench/bench_serving_side_by_side.py --pair 16 "$B/servetune-c16.json" "$B/bench-serving-c16.jsonl" \
            --pair 64 "$B/servetune-c64.json" "$B/bench-serving-c64.jsonl" | tee "$B/side-by-side.md" ;;
      clientbench)   # the load generator's CPU per chunk and timestamp error, with worker processes
        bounded "$PY" bench/client_overhead.py --levels ${LEVELS:-64 256 1024} --requests-per-stream 3 \
            --clients ${CLIENTS:-servetune servetune-aiohttp plain-aiohttp} --workers ${WORKERS:-1 4 8} \
            --repeats "${REPEATS:-1}" \
            --json "$ST/clientbench.json" 2>&1 | tee "$ST/clientbench.md" | tail -20
        rc=${PIPESTATUS[0]} ;;
      *) echo "unknown step $step"; rc=2 ;;
    esac
    echo "=== $step exit $rc at $(( $(date +%s) - T0 )) s"
    [ "$rc" = 0 ] && mkdir -p "$ST/done" && touch "$ST/done/${step%%=*}"
    [ "$rc" = 75 ] && break   # paused at the deadline: the next call goes on
  done
  [ -n "$spid" ] && { kill -TERM "$spid"; wait "$spid"; }   # a background job ignores SIGINT
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
} > "$LOG" 2>&1
tail -50 "$LOG"
cp "$LOG" "$ST/"
# the archive: trial files without their per-chunk arrays, logs capped; /tmp/st itself stays whole
rm -rf /tmp/st-copy && cp -r "$ST" /tmp/st-copy
find /tmp/st-copy \( -path '*trials*' -o -path '*openloop*' -o -path '*benchserving*' \) -name '*.json' -print0 \
  | xargs -0 -r "$PY" -c '
import json, sys
for p in sys.argv[1:]:
    d = json.load(open(p))
    for r in d.get("records") or []:
        r.pop("chunk_offsets_ms", None); r.pop("chunk_tokens", None)
    json.dump(d, open(p, "w"))'
find /tmp/st-copy -name '*.log' -size +2M -exec truncate -s 2M {} \;
tar -C /tmp/st-copy -czf "$OUT/st.tar.gz" . && ls -la "$OUT"
