#!/usr/bin/env bash
# The main job on embedded defaults: install, then run the demo campaign end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/servetune demo "$@"
