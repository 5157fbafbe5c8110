#!/usr/bin/env bash
# System packages the tests use as real parts: an sshd for the SSH runner, Chromium for the report.
# Installs only what is missing; needs root (CI runs as root). Without root, the tests needing them skip.
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "system-deps: missing ${need[*]} (not root or no apt-get); dependent tests will skip" >&2
  fi
fi
