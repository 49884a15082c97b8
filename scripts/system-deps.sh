#!/usr/bin/env bash
# Installs the system packages the test suite runs for real, when they are missing:
# redis-server, PostgreSQL 15, Chromium (browser tests), docker-compose (compose file check), and
# nginx + openssl (the reverse-proxy example, deploy/nginx.conf, tested with a throwaway certificate).
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
{ ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
{ command -v nginx || test -x /usr/sbin/nginx; } >/dev/null 2>&1 || missing+=(nginx)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
fc-list 2>/dev/null | grep -qi dejavu || missing+=(fonts-dejavu-core)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "missing system packages: ${missing[*]} — install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
