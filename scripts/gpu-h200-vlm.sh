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
#   With the split kit: call 2 `SETUP_ONLY=1 NEED_STATE=1 ... x && ... detach STEP...` (the kit staged, then the
#   run detached from a copy of the call's tree), later calls `... wait SECONDS` (the campaigns keep their servers
#   across calls: no restart at a call's boundary)
#   tune:NAME=PLAN@RECOMMENDATION  a warm start from that recommendation.json (`servetune tune --previous`)
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
# Needs the kit, git-ignored and carried: the SGLang 0.5.17 overlay sglpkgs.tar.xz with sgl_h200.sh
# (../shared/recipes/sglang-h200/) and vlm_device.sh, make_random_vlm.py, vlmextra.tar.xz (../shared/recipes/
# sglang-h200-vlm/), either whole in .sgl/ or split in two (the overlay, 57.3 MB, no longer fits one call beside the
# tree): .sgl1/ = sglpkgs.tar.xz.00 + the small files + sglpkgs.tar.xz.sha256 + sglpkgs.parts.sha256, .sgl2/ =
# sglpkgs.tar.xz.01 + the same small files. Every call copies what it carries into $SGLKIT (/tmp/sglkit), so a later
# call that carries nothing finds the small files there. A tune also needs the checklist's packages the image lacks,
# as wheels in .whl/ (installed into /tmp/site). A cold machine, two calls within the 30 s warm window:
#   call 1  carry [.sgl1]        `[TEXT_MODEL=1] bash scripts/gpu-h200-vlm.sh STEP...`: part 1 staged, the model
#           writers started in their own sessions (they go on between calls: /tmp/vlm7b, and with TEXT_MODEL=1 the
#           random 7.2B Llama /tmp/m8b of scripts/gpu-h200-sglang.sh), exits in seconds, runs no step
#   call 2  carry [.sgl2, .whl]  `NEED_STATE=1 bash scripts/gpu-h200-vlm.sh STEP...`: part 2 staged, the overlay
#           reassembled and checked against its sha256, unpacked, the writers waited for, the wheels installed, then
#           the steps; later calls carry nothing (the same command: a tune resumes from /tmp/vlmst).
# events.log (in the archive) has a wall-clock line per setup step: each part staged, reassembled, unpacked, each
# model written (by its writer's own start and end), tokenizer, wheels installed.
# For `detach`, .sgl/ also needs servetune.tar.gz (`git archive --format=tar.gz -o .sgl/servetune.tar.gz HEAD
# servetune`, + .sgl/servetune.commit). A campaign state to resume on a cold machine: .sgl/ or .sgl1/vlm-st.tar.xz.
# KCACHE=DIR KCACHE_STEPS="NAME..." (the named tune steps start their engine with its kernel caches in DIR:
# TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, XDG_CACHE_HOME, CUDA_CACHE_PATH; every tune step logs the caches' files and sizes)
# PLAN_SET="runner.gpu_type=h200 estimate.gpu=H200-sglang" (set in every tune step's plan, e.g. on the other GPU)
# Env: NEED_STATE=1 (exit at once on a machine without $ST: a follow-up call that found a cold machine)
# TEXT_MODEL=1 (also write /tmp/m8b, $M8B) SGLKIT (/tmp/sglkit) RESTORE (archives to seed a fresh $ST, instead of
# .sgl/ or .sgl1/vlm-st.tar.xz)
# SEEDS ("1 2 3") CONC (64) REQUESTS (640) WARM (32 warm-up requests of each config's first workload)
# ONLY (workload names, in order) ORDER (seed) DEADLINE (560; for detach the whole campaign's) TRIAL_GUARD (80 s:
# no trial starts with less left) MINSTART (240) ST MODEL PY RUN; DRY=1 runs the same steps on a CPU machine
# against `servetune sim serve` (model profile llava-8b) with the .venv python, for testing this script.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/vlm-out}; mkdir -p "$OUT"
ST=${ST:-/tmp/vlmst}
# a cold machine: the last call's archive, if carried, restores the trials and paused campaigns
# (or RESTORE: archives in the tree, e.g. the kept tests/data/gpu-h200-vlm/2026-12-05-rate/{tune-rate,logs}.tar.xz)
if [ ! -d "$ST" ]; then
  for a in ${RESTORE:-.sgl/vlm-st.tar.xz .sgl1/vlm-st.tar.xz}; do
    [ -f "$a" ] && mkdir -p "$ST" && tar -C "$ST" -xJf "$a" && echo "restored $a into $ST"
  done
fi
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
K=${SGLKIT:-/tmp/sglkit}          # the kit on the machine: small files, overlay parts, wheels, model writers' records
M8B=${M8B:-/tmp/m8b}
PARTIAL=; CARRIED_PARTS=
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

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

stage_kit() {  # copy what this call carries (.sgl, .sgl1, .sgl2, .whl) into $K; check each overlay part's sha256
  local d f p b t want got
  mkdir -p "$K"
  for d in .sgl .sgl1 .sgl2; do
    [ -d "$d" ] || continue
    for f in sgl_h200.sh vlm_device.sh make_random_vlm.py vlmextra.tar.xz sglpkgs.tar.xz.sha256 sglpkgs.parts.sha256; do
      [ -f "$d/$f" ] && cp "$d/$f" "$K/"
    done
  done
  cp scripts/make_random_llama.py "$K/" 2>/dev/null   # writers run from $K: the tree may change between calls
  for p in .sgl1/sglpkgs.tar.xz.[0-9]* .sgl2/sglpkgs.tar.xz.[0-9]* .sgl/sglpkgs.tar.xz.[0-9]*; do
    [ -f "$p" ] || continue
    b=$(basename "$p"); t=$(date +%s.%N)
    cp "$p" "$K/$b.tmp" || { ev "overlay: part $b: copy failed"; return 3; }
    want=$(grep " $b\$" "$K/sglpkgs.parts.sha256" 2>/dev/null | cut -d' ' -f1); got=$(sha256sum "$K/$b.tmp" | cut -d' ' -f1)
    if [ -z "$want" ] || [ "$want" != "$got" ]; then
      ev "overlay: part $b: sha256 ${got:0:12} is not the listed ${want:-(none)}: not staged"; rm -f "$K/$b.tmp"; return 3
    fi
    mv "$K/$b.tmp" "$K/$b"; CARRIED_PARTS="$CARRIED_PARTS $b"
    ev "overlay: part $b staged in $K ($(( $(stat -c %s "$K/$b") / 1000000 )) MB, sha256 ok) in $(since "$t")s"
  done
  if ls .whl/*.whl > /dev/null 2>&1; then rm -rf "$K/whl"; mkdir -p "$K/whl"; cp .whl/*.whl "$K/whl/"; fi
  for f in make_random_vlm.py sgl_h200.sh vlm_device.sh; do
    [ -f "$K/$f" ] && continue
    ev "kit: $f is neither carried (.sgl1, .sgl2 or .sgl) nor staged in $K by an earlier call on this machine"; return 3
  done
}

detached() {  # NAME CMD...: CMD in its own session, holding no descriptor of this call's, so that it goes on between
  # device calls while the machine stays warm; $K/NAME.pid, $K/NAME.log, and at its end $K/NAME.rc: "rc start end"
  local name=$1; shift
  rm -f "$K/$name.rc" "$K/$name.pid" "$K/$name.reported"
  "$PY" -c 'import os, sys
if os.fork(): os._exit(0)
os.setsid()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.dup2(fd, 1); os.dup2(fd, 2); os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.closerange(3, 65536); os.chdir(os.path.dirname(sys.argv[2]))
script = "echo $$ > \"$0.pid\"; s=$(date +%s.%N); \"$@\"; rc=$?; echo \"$rc $s $(date +%s.%N)\" > \"$0.rc.tmp\"; mv \"$0.rc.tmp\" \"$0.rc\""
os.execvp("bash", ["bash", "-c", script, sys.argv[2]] + sys.argv[3:])' "$K/$name.log" "$K/$name" "$@"
  for _ in $(seq 1 50); do [ -s "$K/$name.pid" ] && break; sleep 0.1; done
  ev "model $name: writer started in its own session (pid $(cat "$K/$name.pid" 2>/dev/null), log $K/$name.log)"
}

writer_state() {  # NAME: none | running | done | failed
  local rc _ p
  if [ -f "$K/$1.rc" ]; then read -r rc _ < "$K/$1.rc"; [ "$rc" = 0 ] && echo done || echo failed
  elif p=$(cat "$K/$1.pid" 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then echo running
  else echo none; fi
}

start_writers() {  # the random models, written in the background; reused while the machine stays warm
  local st
  st=$(writer_state vlm7b)
  if [ "$st" = none ] && [ -f "$MODEL/model.safetensors.index.json" ] && [ -f "$MODEL/tokenizer.json" ]; then
    ev "model vlm7b: reusing $MODEL"
  elif [ "$st" = none ] || [ "$st" = failed ]; then
    [ "$st" = failed ] && { ev "model vlm7b: the last write failed (rc $(cut -d' ' -f1 "$K/vlm7b.rc")); writing again"; tail -3 "$K/vlm7b.log"; }
    rm -rf "$MODEL"; mkdir -p "$MODEL"
    if [ "$DRY" = 1 ]; then   # no GPU: the configs stand in for the weights (the tokenizer comes with the overlay's python)
      detached vlm7b "$PY" "$K/make_random_vlm.py" "$MODEL" --preset 7b --parts config
    else
      detached vlm7b env -u PYTHONPATH "$PY" "$K/make_random_vlm.py" "$MODEL" --preset 7b --device cuda --parts weights,verify
    fi
  fi
  [ "${TEXT_MODEL:-0}" = 1 ] || return 0
  st=$(writer_state m8b)
  if [ "$st" = none ] && [ -f "$M8B/config.json" ] && ls "$M8B"/*.safetensors > /dev/null 2>&1; then ev "model m8b: reusing $M8B"
  elif [ "$st" = none ] || [ "$st" = failed ]; then
    [ "$st" = failed ] && { ev "model m8b: the last write failed; writing again"; tail -3 "$K/m8b.log"; }
    rm -rf "$M8B"
    if [ "$DRY" != 1 ]; then   # as scripts/gpu-h200-sglang.sh: 8B-shaped, GQA 32/8, its own BPE tokenizer (vocab 32k)
      detached m8b env -u PYTHONPATH "$PY" "$K/make_random_llama.py" "$M8B" --hidden 4096 --layers 32 --heads 32 \
        --kv-heads 8 --inter 14336
    elif "$PY" -c "import torch, transformers" 2> /dev/null; then   # DRY: a tiny one on the CPU
      detached m8b "$PY" "$K/make_random_llama.py" "$M8B" --hidden 64 --layers 2 --heads 2 --kv-heads 1 --inter 128 \
        --vocab 2000 --files 40 --device cpu --dtype float32
    else
      detached m8b bash -c "echo 'DRY: no torch here: a stand-in for the text model writer'; sleep ${DRY_TEXT_S:-15}"
    fi
  fi
}

wait_writer() {  # NAME: wait for its writer (if one was started) and say how long it took
  local name=$1 st rc s e
  st=$(writer_state "$name")
  [ "$st" = none ] && return 0
  if [ "$st" = running ]; then
    ev "model $name: waiting for its writer (pid $(cat "$K/$name.pid"))"
    while [ "$(writer_state "$name")" = running ]; do
      [ "$(left)" -lt 60 ] && { ev "model $name: still being written with $(left)s left"; return 75; }
      sleep 2
    done
    sleep 0.5
  fi
  [ -f "$K/$name.rc" ] || { ev "model $name: its writer ended without a result"; tail -5 "$K/$name.log"; return 1; }
  read -r rc s e < "$K/$name.rc"
  if [ "$rc" != 0 ]; then ev "model $name: its writer failed (rc $rc)"; tail -8 "$K/$name.log"; return 1; fi
  [ -f "$K/$name.reported" ] && return 0
  tail -n 2 "$K/$name.log"
  ev "model $name: written in $(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.1f", b - a }')s (its writer ran $(date -d "@${s%.*}" +%T)-$(date -d "@${e%.*}" +%T))"
  touch "$K/$name.reported"
}

assemble() {  # the overlay from the parts staged in $K, checked against its sha256; PARTIAL=1 while a part is missing
  local p missing= t got want
  [ -f "$K/sglpkgs.tar.xz.ok" ] && [ -f "$K/sglpkgs.tar.xz" ] && return 0
  [ -f "$K/sglpkgs.parts.sha256" ] && [ -f "$K/sglpkgs.tar.xz.sha256" ] \
    || { ev "overlay: no overlay here: carry .sgl1 (then .sgl2 and .whl in the next call) or .sgl"; return 3; }
  for p in $(awk '{ print $2 }' "$K/sglpkgs.parts.sha256"); do [ -f "$K/$p" ] || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    PARTIAL=1; ev "overlay: staged so far: $(cd "$K" && ls sglpkgs.tar.xz.[0-9]* 2>/dev/null | xargs); missing:$missing"; return 0
  fi
  t=$(date +%s.%N)
  (cd "$K" && cat $(awk '{ print $2 }' sglpkgs.parts.sha256) > sglpkgs.tar.xz.tmp) || { ev "overlay: reassembly failed"; return 3; }
  got=$(sha256sum "$K/sglpkgs.tar.xz.tmp" | cut -d' ' -f1); want=$(cut -d' ' -f1 "$K/sglpkgs.tar.xz.sha256")
  if [ "$got" != "$want" ]; then ev "overlay: reassembled sha256 ${got:0:12} != ${want:0:12}: not used"; rm -f "$K/sglpkgs.tar.xz.tmp"; return 3; fi
  mv "$K/sglpkgs.tar.xz.tmp" "$K/sglpkgs.tar.xz" && touch "$K/sglpkgs.tar.xz.ok"
  (cd "$K" && rm -f $(awk '{ print $2 }' sglpkgs.parts.sha256))
  ev "overlay: reassembled from $(wc -l < "$K/sglpkgs.parts.sha256") parts, $(( $(stat -c %s "$K/sglpkgs.tar.xz") / 1000000 )) MB, sha256 ${got:0:12} ok, in $(since "$t")s"
}

overlay() {  # the SGLang overlay in /tmp/sglpkgs: unpacked already, or from .sgl/sglpkgs.tar.xz, or from the parts in $K
  local vd t rc n
  if [ "$DRY" != 1 ] && [ -f /tmp/sglpkgs/.sglpkgs.sha256 ] && [ -d /tmp/sglpkgs/sglang ]; then ev "overlay: already in /tmp/sglpkgs"; return 0; fi
  if [ -f .sgl/sglpkgs.tar.xz ]; then vd=.sgl/vlm_device.sh
  else
    assemble || return $?
    [ -n "$PARTIAL" ] && return 0
    vd=$K/vlm_device.sh
  fi
  if [ "$DRY" = 1 ]; then   # no unpack on a CPU machine (the extras probe wants torchvision): the archive is read through
    [ -f "$K/dry-overlay-listed" ] && return 0
    t=$(date +%s.%N); n=$(tar -tJf "$(dirname "$vd")/sglpkgs.tar.xz" | wc -l) || return 3
    ev "overlay: DRY: not unpacked; $(dirname "$vd")/sglpkgs.tar.xz reads through, $n entries, in $(since "$t")s"; touch "$K/dry-overlay-listed"
    return 0
  fi
  t=$(date +%s.%N); ev "overlay: unpacking ($vd unpack)"
  OUT=$ST bash "$vd" unpack | tail -4; rc=${PIPESTATUS[0]}
  [ -f /tmp/sglpkgs/.sglpkgs.sha256 ] && [ -d /tmp/sglpkgs/sglang ] || { ev "overlay: unpack failed (rc $rc)"; return 3; }
  [ "$rc" = 0 ] || ev "overlay: WARN: vlm_device.sh unpack exit $rc (the extras probe; see $ST/vlm-probe.txt)"
  ev "overlay: unpacked into /tmp/sglpkgs ($(du -sh /tmp/sglpkgs | cut -f1)) in $(since "$t")s"
}

install_wheels() {  # the checklist's packages the image lacks (great_expectations, ...): $K/whl into /tmp/site
  local site=/tmp/site t extra=()
  ls "$K"/whl/*.whl > /dev/null 2>&1 || return 0
  # DRY: the venv has these packages; the cp312 wheels go to a folder of their own, not on PYTHONPATH
  [ "$DRY" = 1 ] && { site=$ST/site-dry; extra=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux2014_x86_64); }
  if [ -f "$site/.kit-wheels" ] && [ "$(cat "$site/.kit-wheels")" = "$(ls "$K/whl")" ]; then ev "wheels: already in $site"; return 0; fi
  t=$(date +%s.%N)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${extra[@]}" \
    "$K"/whl/*.whl || { ev "wheels: pip install failed"; return 1; }
  ls "$K/whl" > "$site/.kit-wheels"
  ev "wheels: $(ls "$K/whl" | wc -l) installed into $site ($(du -sh "$site" | cut -f1)) in $(since "$t")s"
}

setup() {  # rc 0 with PARTIAL=1: a part of the overlay is still to come (call 1 of a cold machine)
  local rc
  stage_kit || return $?
  if [ "$DRY" != 1 ]; then
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader
    ev "disk /tmp: $(df -h /tmp | awk 'NR == 2 { print $4 " free of " $2 }') (vlm7b 16.6 GB, m8b 14.5 GB, overlay 0.4 GB)"
  fi
  start_writers || return 1
  overlay || return $?
  [ -n "$PARTIAL" ] && return 0
  if [ "$DRY" = 1 ]; then
    export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
  else
    source "$K/sgl_h200.sh" >/dev/null; setup_cuda_home || return 1; sgl_env
    [ -n "$(ls -A /tmp/vlmextra_active 2>/dev/null)" ] && export PYTHONPATH="$PYTHONPATH:/tmp/vlmextra_active"
  fi
  if [ ! -f "$MODEL/tokenizer.json" ]; then   # with the overlay's transformers 5.12.1 and tokenizers 0.22.2
    local t; t=$(date +%s.%N)
    "$PY" "$K/make_random_vlm.py" "$MODEL" --preset 7b --parts tokenizer,config > "$ST/make_tok.log" 2>&1 \
      || { tail -5 "$ST/make_tok.log"; return 1; }
    ev "model vlm7b: tokenizer and configs (overlay python) in $(since "$t")s"
  fi
  install_wheels || return 1
  wait_writer vlm7b; rc=$?; [ $rc = 0 ] || return $rc
  wait_writer m8b; rc=$?; [ $rc = 0 ] || return $rc
  if [ "$DRY" != 1 ]; then
    [ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 SERVETUNE_LOG_DIR="$ST/logs"
  fi
  local tm=; [ "$(writer_state m8b)" = done ] && [ -d "$M8B" ] && tm=", text model $(du -sh "$M8B" | cut -f1) in $M8B"
  ev "setup done: $(du -sh "$MODEL" | cut -f1) model in $MODEL$tm"
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
kcache_sizes() {  # [DIR]: files and MB of the engine's kernel caches, in DIR (as KCACHE lays them out) or the defaults
  local d out=
  if [ -n "${1:-}" ]; then set -- "$1/triton" "$1/inductor" "$1/xdg" "$1/nv"
  else set -- "$HOME/.triton/cache" "/tmp/torchinductor_$(id -un)" "$HOME/.cache" "$HOME/.nv/ComputeCache"; fi
  for d in "$@"; do
    [ -d "$d" ] && out="$out $d=$(find "$d" -type f | wc -l)f/$(du -sm "$d" | cut -f1)MB" || out="$out $d=none"
  done
  echo "${out# }"
}

run_tune() {  # tune:NAME=PLAN: `servetune tune PLAN --out $ST/tune-NAME`, paused before DEADLINE, resumed next call
  local spec=${1#tune:} name plan d rc resume=() prev=()
  name=${spec%%=*}; plan=${spec#*=}; d=$ST/tune-$name
  [ "$name" != "$spec" ] || { echo "tune needs NAME=PLAN"; return 2; }
  case "$plan" in *@*) prev=(--previous "${plan#*@}"); plan=${plan%%@*} ;; esac   # PLAN@RECOMMENDATION: a warm start
  [ -f "$d/done" ] && { ev "tune $name: already done"; return 0; }
  stopped && { ev "tune $name: STOP file, not started"; return 75; }
  [ "$(left)" -lt "${MINSTART:-240}" ] && { ev "tune $name: $(left)s left, not enough for a server start"; return 75; }
  if [ "$DRY" = 1 ]; then   # the same campaign against the simulator (the plan's engine swapped for `sim`)
    "$PY" -c 'import sys, yaml
p = yaml.safe_load(open(sys.argv[1])); p["engine"] = {"kind": "sim", "model_profile": "llava-8b", "gpu_profile": "H200"}
p["runner"] = {"kind": "local"}; p["stages"]["refine"].get("grid", {}).pop("mm-processor-worker-num", None); p["workload"]["tokenizer"] = sys.argv[3]; p["model"] = "llava-8b"
yaml.safe_dump(p, open(sys.argv[2], "w"))' "$plan" "$ST/tune-$name.plan.yaml" "$MODEL" || return 2
    plan=$ST/tune-$name.plan.yaml
  fi
  local kc=
  [ -n "${KCACHE:-}" ] && [[ " ${KCACHE_STEPS:-} " == *" $name "* ]] && kc=$KCACHE
  if [ -n "$kc" ] || [ -n "${PLAN_SET:-}" ]; then   # the engine's kernel caches in $KCACHE; PLAN_SET's KEY.PATH=VALUE
    "$PY" -c 'import sys, yaml
p = yaml.safe_load(open(sys.argv[1])); k = sys.argv[3]
if k:
    p["engine"]["env"] = {**p["engine"].get("env", {}), "TRITON_CACHE_DIR": k + "/triton",
                          "TORCHINDUCTOR_CACHE_DIR": k + "/inductor", "XDG_CACHE_HOME": k + "/xdg",
                          "CUDA_CACHE_PATH": k + "/nv"}
for item in sys.argv[4].split():
    path, value = item.split("=", 1); *parents, leaf = path.split(".")
    node = p
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = yaml.safe_load(value)
yaml.safe_dump(p, open(sys.argv[2], "w"))' "$plan" "$ST/tune-$name.set.yaml" "$kc" "${PLAN_SET:-}" || return 2
    plan=$ST/tune-$name.set.yaml; ev "tune $name: plan set: ${PLAN_SET:-}${kc:+; kernel caches in $kc before the start: $(kcache_sizes "$kc")}"
  fi
  "$PY" -c "import great_expectations, sqlalchemy" 2> /dev/null \
    || { ev "tune $name: the checklist needs great_expectations and sqlalchemy: carry .whl (docs/gpu.md)"; return 2; }
  [ -f "$d/experiment.json" ] && resume=(--resume)
  ev "tune $name: $plan ${resume[*]} (stop after $(( $(left) - 15 ))s)"
  timeout -s INT "$(( $(left) + 30 ))" "$PY" -m servetune tune "$plan" --out "$d" "${resume[@]}" "${prev[@]}" \
    --stop-after "$(( $(left) - 15 ))" >> "$ST/tune-$name.log" 2>&1
  rc=$?
  tail -n 40 "$ST/tune-$name.log"
  [ $rc = 0 ] && touch "$d/done"
  ev "tune $name: exit $rc; kernel caches after it: ${KCACHE:+$KCACHE: $(kcache_sizes "$KCACHE"); }defaults: $(kcache_sizes)"
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
  for d in "$ST"/server-* "$ST/logs"; do   # logs: the engine logs of a tune's servers (SERVETUNE_LOG_DIR)
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
  for f in "$ST"/tune-*.log; do [ -f "$f" ] && { echo "== $f"; grep -E "^#[0-9]+ |GPU budget|recommend|error|Error" "$f" | tail -n 30; }; done
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
  rm -rf "$RUN"; mkdir -p "$RUN/scripts" "$RUN/.sgl"
  if [ -f .sgl/servetune.tar.gz ]; then tar -C "$RUN" -xzf .sgl/servetune.tar.gz || exit 2
  else   # the split kit (.sgl1, .sgl2: staged in $K by the call before): the call's own tree is the run's
    cp -r servetune "$RUN/" || exit 2; git rev-parse HEAD > "$RUN/.sgl/servetune.commit" 2>/dev/null
  fi
  cp -r plans "$RUN/"; cp "$0" "$RUN/scripts/gpu-h200-vlm.sh"; cp scripts/make_random_llama.py "$RUN/scripts/"
  for x in .sgl/*; do [ -e "$x" ] || continue; case "$x" in *.tar.xz) ln -s "$PWD/$x" "$RUN/$x" ;; *) cp "$x" "$RUN/.sgl/" ;; esac; done
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
  ev "call $CALL: configs $*, seeds $SEEDS, order $ORDER, $REQUESTS requests, deadline ${DEADLINE}s, dry=$DRY, carried: $(ls -d .sgl .sgl1 .sgl2 .whl 2>/dev/null | tr '\n' ' ')"
  if [ "$DRY" != 1 ]; then   # the GPU memory curve over the whole call (0.5 s), beside the events' timestamps
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu,power.draw --format=csv,noheader,nounits -lms 500 \
      > "$ST/gpumem-$CALL.csv" 2>&1 &
    SMI=$!
  fi
  setup; src=$?
  final=0
  if [ $src != 0 ]; then   # 75: a model writer still runs near the deadline (the next call goes on)
    final=$src; [ $src = 75 ] && EXIT_RC=75 || EXIT_RC=3
    ev "setup failed (rc $src): no step run"
  elif [ -n "$PARTIAL" ]; then   # call 1 of a cold machine: part 1 staged, the writers go on between calls
    [ -f "$K/sglpkgs.tar.xz.00" ] && [ -n "$CARRIED_PARTS" ] || { EXIT_RC=4; final=4; }
    if [ "${EXIT_RC:-0}" = 4 ]; then ev "overlay incomplete and part 1 is not on this machine (a fresh one?): send the call with .sgl1 again, then this one"
    else ev "part 1 staged, writers running: next, within the 30 s warm window, the same steps with .sgl2 and .whl carried (NEED_STATE=1)"; fi
  elif [ "${SETUP_ONLY:-0}" = 1 ]; then ev "SETUP_ONLY: overlay and model ready"
  else
    for cfg in "$@"; do
      case "$cfg" in tune:*) run_tune "$cfg" ;; *) run_config "$cfg" ;; esac; rc=$?
      ev "config $cfg: rc=$rc"
      [ $rc != 0 ] && final=$rc
      [ $rc = 75 ] && break
    done
  fi
  stop_server
  [ -n "${SMI:-}" ] && kill "$SMI" 2>/dev/null
  ev "call $CALL done (rc $final)"
  ls -R "$ST/trials"
} > "$LOG" 2>&1
cp "$LOG" "$OUT/" 2>/dev/null
archive
tail -n 120 "$LOG"
exit "${EXIT_RC:-0}"
