#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install servetune with every extra; idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=.venv/.servetune-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  # ranges in pyproject.toml, held to the tested versions (constraints.txt)
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[all,test]"
  touch "$stamp"
fi
