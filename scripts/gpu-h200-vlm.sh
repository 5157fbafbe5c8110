#!/usr/bin/env bash
# Issue 30: real SGLang 0.5.17 serving a random-weight Qwen2.5-VL-7B-shaped VLM on the lent H200, measured with
# `servetune bench` (closed loop, image chat requests as OpenAI image_url data URLs).
#   bash scripts/gpu-h200-vlm.sh CONFIG...          run the configs in this call (each call <= 600 s)
#   bash scripts/gpu-h200-vlm.sh detach CONFIG...   campaign mode: copy the run tree to $RUN (/tmp/vlmrun: servetune
#        from .sgl/servetune.tar.gz, plans/workloads, this script), start the same run there in its own process
#        session (setsid: it outlives the device call while the machine stays warm), then wait as `wait` does
#   bash scripts/gpu-h200-vlm.sh wait SECONDS       wait for a detached run to end, at most SECONDS, then archive
#        what is done into $OUT (the next call, made within the machine's 30 s warm window, waits on)
#   touch $ST/STOP (or STOP=1 ... wait S): the detached run starts no new trial or server
#   CAUTION: on 2026-12-04 a `wait` sent at once after a `detach` call found a fresh machine: the machine was given
#   back between the calls and the campaign was lost with it. Prefer self-contained calls (CONFIG... under 600 s).
# A CONFIG is one server (started once with `servetune serve --engine sglang`) and the trials run against it:
#   on       SGLang's defaults (radix cache on, chunked prefill 8192 on an H200):
#            vlm-radix-r90, vlm-radix-r50, vlm-scenario1, vlm-position-text, vlm-position-system
#   off      --disable-radix-cache:          vlm-radix-r90, vlm-radix-r50
#   mmwN     --mm-processor-worker-num N (radix on; SGLang's auto value for Qwen-VL is 2): vlm-radix-r90, vlm-radix-r50
#   chunk1k  --chunked-prefill-size 1024:    vlm-scenario1
#   tune:NAME=PLAN  `servetune tune PLAN --out $ST/tune-NAME`, paused (--stop-after) before the call's DEADLINE and
#            resumed (--resume) by the next call; on a cold machine a carried .sgl/vlm-st.tar.xz (the last call's
#            archive) restores it; e.g. tune:rate=plans/gpu-h200-vlm-rate.yaml
#   mixed    --chunked-prefill-size 1024 --enable-mixed-chunk: vlm-scenario1
# Every server also gets --attention-backend triton --sampling-backend pytorch --mm-attention-backend triton_attn
# --mm-feature-transport cpu --cuda-graph-max-bs 80 (the overlay has no fa3/flashinfer kernels; graphs up to
# batch 80 cover the closed loop of 64 and start faster than SGLang's 256), --enable-metrics --enable-cache-report.
# Trials: plans/workloads/<name>.yaml, seeds $SEEDS, concurrency $CONC, $REQUESTS measured requests after 16
# warm-up ones, SLA ttft_ms=2000 tpot_ms=40 (per request), servetune's default validity rules (steady window
# >= 20 s, >= 200 and >= 4 per stream completions in it, tokens arrived vs completed within 15%). ORDER=seed runs
# each seed's workloads in turn (an early stop leaves whole repeats); ORDER=workload runs a workload's seeds in
# turn (an early stop leaves the first workloads complete).
# The machine keeps its state in $ST (/tmp/vlmst) while warm: a trial whose JSON exists is not run again, the
# model in $MODEL is reused, the overlay is not unpacked twice. Each call stops before $DEADLINE seconds and
# leaves $OUT/vlm-st.tar.xz (trial JSONs without per-chunk arrays, server log tails, GPU memory samples).
# Needs .sgl/ (git-ignored, carried): sglpkgs.tar.xz, sgl_h200.sh (../shared/recipes/sglang-h200/) and
# vlm_device.sh, make_random_vlm.py, vlmextra.tar.xz (../shared/recipes/sglang-h200-vlm/); for `detach`, also
# servetune.tar.gz (`git archive --format=tar.gz -o .sgl/servetune.tar.gz HEAD servetune`, + .sgl/servetune.commit).
# A tune needs the checklist's packages the image lacks, as wheels in .whl/ (installed into /tmp/site); .sgl/ and
# .whl/ together exceed a call's 64 MiB, so a cold machine takes two calls: SETUP_ONLY=1 with .sgl carried (the
# overlay and the model), then the tune with .whl and .sgl's small files carried.
# Env: NEED_STATE=1 (exit at once on a machine without $ST: a follow-up call that found a cold machine)
# SEEDS ("1 2 3") CONC (64) REQUESTS (640) WARM (32 warm-up requests of each config's first workload)
# ONLY (workload names, in order) ORDER (seed) DEADLINE (560; for detach the whole campaign's) TRIAL_GUARD (80 s:
# no trial starts with less left) MINSTART (240) ST MODEL PY RUN; DRY=1 runs the same steps on a CPU machine
# against `servetune sim serve` (model profile llava-8b) with the .venv python, for testing this script.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/vlm-out}; mkdir -p "$OUT"
ST=${ST:-/tmp/vlmst}
# a cold machine: the last call's archive, if carried, restores the trials and paused campaigns
[ ! -d "$ST" ] && [ -f .sgl/vlm-st.tar.xz ] && mkdir -p "$ST" && tar -C "$ST" -xJf .sgl/vlm-st.tar.xz && echo "restored $ST"
if [ "${NEED_STATE:-0}" = 1 ] && [ ! -d "$ST" ]; then   # a call meant to go on, that found a fresh machine
  echo "NEED_STATE=1: no $ST on this machine and no .sgl/vlm-st.tar.xz: a cold machine; nothing run"; exit 4
fi
mkdir -p "$ST/trials" "$ST/warm"
DRY=${DRY:-0}
if [ "$DRY" = 1 ]; then PY=${PY:-$PWD/.venv/bin/python}; else PY=${PY:-/opt/torch/.venv/bin/python3}; fi
MODEL=${MODEL:-/tmp/vlm7b}
PORT=${PORT:-30777}; SRV=http://127.0.0.1:$PORT
DEADLINE=${DEADLINE:-560}
SEEDS=${SEEDS:-1 2 3}
CONC=${CONC:-64}; REQUESTS=${REQUESTS:-640}
ORDER=${ORDER:-seed}; TRIAL_GUARD=${TRIAL_GUARD:-80}
RUN=${RUN:-/tmp/vlmrun}
CALL=$(date +%H%M%S)
EVENTS=$ST/events.log
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
ev() { echo "$(date +%s.%N | cut -c1-14) +$(( $(date +%s) - T0 ))s $*" | tee -a "$EVENTS"; }
SPID=; SGID=; SLOG=

workloads_of() {
  case "$1" in
    on) echo vlm-radix-r90 vlm-radix-r50 vlm-scenario1 vlm-position-text vlm-position-system ;;
    off|mmw[0-9]*) echo vlm-radix-r90 vlm-radix-r50 ;;
    chunk1k|mixed) echo vlm-scenario1 ;;
    *) return 1 ;;
  esac
}
flags_of() {
  case "$1" in
    on) ;;
    off) echo --set disable-radix-cache=true ;;
    mmw[0-9]*) echo --set mm-processor-worker-num="${1#mmw}" ;;
    chunk1k) echo --set chunked-prefill-size=1024 ;;
    mixed) echo --set chunked-prefill-size=1024 --set enable-mixed-chunk=true ;;
  esac
}

setup() {
  if [ "$DRY" = 1 ]; then
    [ -f "$MODEL/tokenizer.json" ] || "$PY" .sgl/make_random_vlm.py "$MODEL" --preset 7b --parts tokenizer,config | tail -1
    export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
    return 0
  fi
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader
  local wpid=
  if [ -f "$MODEL/model.safetensors.index.json" ] && [ -f "$MODEL/tokenizer.json" ]; then ev "model: reusing $MODEL"
  else
    rm -rf "$MODEL"; mkdir -p "$MODEL"; ev "model: writing random 7b weights into $MODEL (background)"
    env -u PYTHONPATH "$PY" .sgl/make_random_vlm.py "$MODEL" --preset 7b --device cuda --parts weights,verify \
      > "$ST/make_weights.log" 2>&1 &
    wpid=$!
  fi
  if [ -f /tmp/sglpkgs/.sglpkgs.sha256 ] && [ -d /tmp/sglpkgs/sglang ]; then ev "overlay: already in /tmp/sglpkgs"
  else ev "overlay: unpacking"; OUT=$ST bash .sgl/vlm_device.sh unpack | tail -4; fi
  source .sgl/sgl_h200.sh >/dev/null; setup_cuda_home || return 1; sgl_env
  [ -n "$(ls -A /tmp/vlmextra_active 2>/dev/null)" ] && export PYTHONPATH="$PYTHONPATH:/tmp/vlmextra_active"
  if [ -n "$wpid" ]; then
    ev "model: tokenizer and configs (overlay python)"
    "$PY" .sgl/make_random_vlm.py "$MODEL" --preset 7b --parts tokenizer,config > "$ST/make_tok.log" 2>&1 \
      || { tail -5 "$ST/make_tok.log"; return 1; }
    wait "$wpid" || { tail -5 "$ST/make_weights.log"; return 1; }
    tail -2 "$ST/make_weights.log"
  fi
  if ls .whl/*.whl > /dev/null 2>&1; then   # the checklist's packages the image lacks (great_expectations, ...)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && ev "wheels: $(ls .whl | wc -l) installed into /tmp/site" || return 1
  fi
  [ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
  export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 SERVETUNE_LOG_DIR="$ST/logs"
  ev "setup done: $(du -sh "$MODEL" | cut -f1) model"
}

start_server() {  # $1 config; sets SPID (servetune serve), SGID (its process group), SLOG (the engine's log)
  local cfg=$1 d=$ST/server-$1 t=$(date +%s)
  mkdir -p "$d"
  # shellcheck disable=SC2046
  if [ "$DRY" = 1 ]; then
    setsid "$PY" -m servetune serve --engine sim --model llava-8b --gpu-profile H200 --port "$PORT" \
      $(flags_of "$cfg") --log-dir "$d" > "$d/serve.out" 2>&1 &
  else
    setsid "$PY" -m servetune serve --engine sglang --sglang-version 0.5.17 --model "$MODEL" --python "$PY" \
      --port "$PORT" --set attention-backend=triton --set sampling-backend=pytorch \
      --set mm-attention-backend=triton_attn --set mm-feature-transport=cpu --set cuda-graph-max-bs=80 \
      $(flags_of "$cfg") --log-dir "$d" --ready-timeout 400 > "$d/serve.out" 2>&1 &
  fi
  SPID=$!; SGID=$SPID
  ev "server $cfg: starting (servetune serve pid $SPID)"
  while :; do
    grep -q "^ready:" "$d/serve.out" 2>/dev/null && break
    if ! kill -0 "$SPID" 2>/dev/null || [ "$(left)" -lt 120 ]; then
      ev "server $cfg: NOT ready"; tail -40 "$d/serve.out"; L=$(ls -t "$d"/*.log 2>/dev/null | head -1)
      [ -n "$L" ] && { grep -n "Traceback\|Error" "$L" | tail -10; tail -40 "$L"; }
      stop_server; return 1
    fi
    sleep 2
  done
  SLOG=$(ls -t "$d"/*.log 2>/dev/null | head -1)
  ev "server $cfg: ready after $(( $(date +%s) - t ))s: $(grep '^ready:' "$d/serve.out")"
  curl -s "$SRV/get_server_info" > "$d/server_info.json" || true
  if [ "$DRY" != 1 ]; then
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$d/gpu-apps-ready.csv" 2>&1
    cat "$d/gpu-apps-ready.csv"
  fi
}

stop_server() {
  [ -n "$SPID" ] || return 0
  ev "server: stopping (SIGTERM to servetune serve $SPID)"
  kill -TERM "$SPID" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- -"$SGID" 2>/dev/null && ev "server: process group $SGID killed"
  sleep 1
  [ "$DRY" = 1 ] || nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed 's/^/gpu memory after stop: /'
  SPID=; SGID=
}

bench() {  # $1 out file, $2 workload, $3 seed, $4 concurrency, $5 requests, $6 warm-up; then extra args
  local out=$1 w=$2 seed=$3 c=$4 n=$5 wu=$6; shift 6
  local pid; pid=$(grep "^ready:" "$ST/server-$CFG/serve.out" | grep -o "pid [0-9]*" | head -1 | cut -d' ' -f2)
  timeout -s INT "$(( $(left) - 15 ))" "$PY" -m servetune bench --url "$SRV" --concurrency "$c" --requests "$n" \
    --warmup "$wu" --workload "plans/workloads/$w.yaml" --tokenizer "$MODEL" --seed "$seed" --endpoint chat \
    --sla ttft_ms=2000 --sla tpot_ms=40 --server-log "$SLOG" ${pid:+--server-pid "$pid"} --out "$out" "$@"
}

stopped() { [ -f "$ST/STOP" ]; }

run_tune() {  # tune:NAME=PLAN: `servetune tune PLAN --out $ST/tune-NAME`, paused before DEADLINE, resumed next call
  local spec=${1#tune:} name plan d rc resume=()
  name=${spec%%=*}; plan=${spec#*=}; d=$ST/tune-$name
  [ "$name" != "$spec" ] || { echo "tune needs NAME=PLAN"; return 2; }
  [ -f "$d/done" ] && { ev "tune $name: already done"; return 0; }
  stopped && { ev "tune $name: STOP file, not started"; return 75; }
  [ "$(left)" -lt "${MINSTART:-240}" ] && { ev "tune $name: $(left)s left, not enough for a server start"; return 75; }
  if [ "$DRY" = 1 ]; then   # the same campaign against the simulator (the plan's engine swapped for `sim`)
    "$PY" -c 'import sys, yaml
p = yaml.safe_load(open(sys.argv[1])); p["engine"] = {"kind": "sim", "model_profile": "llava-8b", "gpu_profile": "H200"}
p["runner"] = {"kind": "local"}; p["stages"]["refine"]["grid"].pop("mm-processor-worker-num", None); p["workload"]["tokenizer"] = sys.argv[3]; p["model"] = "llava-8b"
yaml.safe_dump(p, open(sys.argv[2], "w"))' "$plan" "$ST/tune-$name.plan.yaml" "$MODEL" || return 2
    plan=$ST/tune-$name.plan.yaml
  fi
  "$PY" -c "import great_expectations, sqlalchemy" 2> /dev/null \
    || { ev "tune $name: the checklist needs great_expectations and sqlalchemy: carry .whl (docs/gpu.md)"; return 2; }
  [ -f "$d/experiment.json" ] && resume=(--resume)
  ev "tune $name: $plan ${resume[*]} (stop after $(( $(left) - 15 ))s)"
  timeout -s INT "$(( $(left) + 30 ))" "$PY" -m servetune tune "$plan" --out "$d" "${resume[@]}" \
    --stop-after "$(( $(left) - 15 ))" >> "$ST/tune-$name.log" 2>&1
  rc=$?
  tail -n 40 "$ST/tune-$name.log"
  [ $rc = 0 ] && touch "$d/done"
  ev "tune $name: exit $rc"
  return $rc
}

run_config() {
  CFG=$1
  local ws todo=() w s f
  ws=$(workloads_of "$CFG") || { echo "unknown config $CFG"; return 2; }
  [ -n "${ONLY:-}" ] && ws=$ONLY   # a subset of the workloads (names), in this order
  if [ "$ORDER" = workload ]; then
    for w in $ws; do for s in $SEEDS; do [ -f "$ST/trials/$CFG/$w-s$s.json" ] || todo+=("$w:$s"); done; done
  else
    for s in $SEEDS; do for w in $ws; do [ -f "$ST/trials/$CFG/$w-s$s.json" ] || todo+=("$w:$s"); done; done
  fi
  [ ${#todo[@]} = 0 ] && { ev "config $CFG: all trials done"; return 0; }
  stopped && { ev "config $CFG: STOP file, not started"; return 75; }
  [ "$(left)" -lt "${MINSTART:-240}" ] && { ev "config $CFG: $(left)s left, not enough for a server start and a trial"; return 75; }
  mkdir -p "$ST/trials/$CFG"
  start_server "$CFG" || return 1
  local ww; ww=${todo[0]%%:*}
  ev "warm-up $CFG: ${WARM:-32} requests of $ww (compiles the vision kernels; results in $ST/warm)"
  bench "$ST/warm/$CFG-$ww.json" "$ww" 99 "$CONC" "${WARM:-32}" 0 --min-window-s 0 --min-completions 1 2>&1 | tail -3
  local rc=0
  for t in "${todo[@]}"; do
    w=${t%%:*}; s=${t##*:}; f=$ST/trials/$CFG/$w-s$s.json
    stopped && { ev "config $CFG: STOP file, stopping before $w seed $s"; rc=75; break; }
    [ "$(left)" -lt "$TRIAL_GUARD" ] && { ev "config $CFG: $(left)s left, stopping before $w seed $s"; rc=75; break; }
    ev "trial $CFG/$w-s$s: start"
    bench "$f.part" "$w" "$s" "$CONC" "$REQUESTS" 16 > "$f.out" 2>&1
    local brc=$?
    grep -E "validity|VALID|requests ok|requests/s|output tokens/s|goodput|hit rate|TTFT|TPOT|GPU memory|Error|rror:" "$f.out" | head -20
    if [ $brc = 130 ] || [ $brc = 124 ]; then ev "trial $CFG/$w-s$s: interrupted (rc $brc), kept as .part"; rc=75; break; fi
    [ -s "$f.part" ] && mv "$f.part" "$f"
    ev "trial $CFG/$w-s$s: end rc=$brc"
  done
  curl -s "$SRV/metrics" > "$ST/server-$CFG/metrics-end.txt" || true
  stop_server
  return $rc
}

archive() {  # trial files without per-chunk arrays (each record keeps its max inter-token gap), logs capped
  local C=/tmp/vlmst-copy
  rm -rf "$C"; mkdir -p "$C"
  cp -r "$ST/trials" "$ST/warm" "$ST"/tune-* "$ST/events.log" "$ST"/gpumem-*.csv "$ST"/call-*.log "$ST"/driver.out "$C"/ 2>/dev/null
  [ -f .sgl/servetune.commit ] && cp .sgl/servetune.commit "$C"/
  for d in "$ST"/server-*; do
    [ -d "$d" ] || continue; mkdir -p "$C/$(basename "$d")"
    cp "$d"/*.json "$d"/*.csv "$d"/serve.out "$C/$(basename "$d")/" 2>/dev/null
    for L in "$d"/sglang-*.log; do
      [ -f "$L" ] || continue
      grep -E "Load weight|KV Cache is allocated|Memory pool|mem usage|avail mem|Capture|cuda graph|max_total_num_tokens|chunked_prefill_size|mem_fraction|ready to roll|WARN|Warn|Error|rror" "$L" \
        | grep -v "UserWarning: Triton" | head -n 400 > "$C/$(basename "$d")/$(basename "$L" .log)-key.log"
      head -n 150 "$L" > "$C/$(basename "$d")/$(basename "$L" .log)-head.log"
      tail -n 3000 "$L" > "$C/$(basename "$d")/$(basename "$L" .log)-tail.log"
    done
  done
  find "$C" -name '*.json' \( -path '*trials*' -o -path '*warm*' \) ! -name state.json ! -name experiment.json | xargs -r "$PY" -c '
import json, sys
for p in sys.argv[1:]:
    try:
        d = json.load(open(p))
    except Exception as e:
        print("archive: cannot read", p, e); continue
    for r in d.get("records") or []:
        offs = r.pop("chunk_offsets_ms", None) or []
        r.pop("chunk_tokens", None)
        gaps = [b - a for a, b in zip(offs, offs[1:])]
        r["max_itl_ms"] = round(max(gaps), 3) if gaps else None
    json.dump(d, open(p, "w"))'
  find "$C" -name '*.log' -size +2M -exec truncate -s 2M {} \;
  tar -C "$C" -cJf "$OUT/vlm-st.tar.xz" . && ls -la "$OUT/vlm-st.tar.xz"
}

driver_alive() { local p; p=$(cat "$ST/driver.pid" 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

wait_driver() {  # $1: seconds at most; then archive into $OUT
  local until=$(( $(date +%s) + $1 ))
  [ "${STOP:-0}" = 1 ] && { touch "$ST/STOP"; echo "STOP file written"; }
  while driver_alive && [ "$(date +%s)" -lt "$until" ]; do sleep 5; done
  if driver_alive; then echo "driver still running (pid $(cat "$ST/driver.pid")); archiving what is done"
  else echo "driver finished"; fi
  tail -n 60 "$ST/events.log"
  [ "$DRY" = 1 ] || PY=${PY:-/opt/torch/.venv/bin/python3}
  archive
  ls "$ST/trials"/* 2>/dev/null
}

if [ "${1:-}" = wait ]; then
  cd "$RUN" 2>/dev/null || true
  wait_driver "${2:-540}"; exit 0
fi
if [ "${1:-}" = detach ]; then
  shift
  driver_alive && { echo "a driver is already running (pid $(cat "$ST/driver.pid"))"; exit 1; }
  [ -f .sgl/servetune.tar.gz ] || { echo "detach needs .sgl/servetune.tar.gz (git archive of servetune)"; exit 2; }
  rm -rf "$RUN"; mkdir -p "$RUN/scripts" "$RUN/plans" "$RUN/.sgl"
  tar -C "$RUN" -xzf .sgl/servetune.tar.gz || exit 2
  cp -r plans/workloads "$RUN/plans/"; cp "$0" "$RUN/scripts/gpu-h200-vlm.sh"
  for x in .sgl/*; do case "$x" in *.tar.xz) ln -s "$PWD/$x" "$RUN/$x" ;; *) cp "$x" "$RUN/.sgl/" ;; esac; done
  [ "$DRY" = 1 ] && ln -s "$PWD/.venv" "$RUN/.venv"
  WAIT_S=$(( ${WAIT:-560} ))
  rm -f "$ST/driver.pid" "$ST/STOP"
  # its own session, no descriptor of this call's (a pipe held open would keep the call from returning)
  (cd "$RUN" && DRIVER=1 DEADLINE=$DEADLINE SEEDS="$SEEDS" REQUESTS=$REQUESTS ORDER=$ORDER ST=$ST OUT=$ST/out \
     "$PY" -c 'import os, sys
if os.fork(): os._exit(0)
os.setsid(); os.closerange(3, 65536); os.execvp(sys.argv[1], sys.argv[1:])' bash scripts/gpu-h200-vlm.sh "$@" \
     > "$ST/driver.out" 2>&1 < /dev/null &)
  for _ in $(seq 1 20); do [ -s "$ST/driver.pid" ] && break; sleep 0.5; done
  echo "driver started: pid $(cat "$ST/driver.pid" 2>/dev/null), configs $*, deadline ${DEADLINE}s, run tree $RUN ($(cat .sgl/servetune.commit 2>/dev/null))"
  cd "$RUN" && wait_driver $(( WAIT_S - ($(date +%s) - T0) )); exit 0
fi

[ "${DRIVER:-0}" = 1 ] && echo $$ > "$ST/driver.pid"
LOG="$ST/call-$CALL.log"
{
  ev "call $CALL: configs $*, seeds $SEEDS, order $ORDER, $REQUESTS requests, deadline ${DEADLINE}s, dry=$DRY"
  if [ "$DRY" != 1 ]; then   # the GPU memory curve over the whole call (0.5 s), beside the events' timestamps
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu,power.draw --format=csv,noheader,nounits -lms 500 \
      > "$ST/gpumem-$CALL.csv" 2>&1 &
    SMI=$!
  fi
  setup || { ev "setup failed"; exit 3; }
  [ "${SETUP_ONLY:-0}" = 1 ] && { ev "SETUP_ONLY: overlay and model ready"; exit 0; }
  final=0
  for cfg in "$@"; do
    case "$cfg" in tune:*) run_tune "$cfg" ;; *) run_config "$cfg" ;; esac; rc=$?
    ev "config $cfg: rc=$rc"
    [ $rc != 0 ] && final=$rc
    [ $rc = 75 ] && break
  done
  stop_server
  [ -n "${SMI:-}" ] && kill "$SMI" 2>/dev/null
  ev "call $CALL done (rc $final)"
  ls -R "$ST/trials"
} > "$LOG" 2>&1
cp "$LOG" "$OUT/" 2>/dev/null
archive
tail -n 120 "$LOG"
