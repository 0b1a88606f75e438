#!/usr/bin/env bash
# Set up kvgate on a fresh Debian 12 machine (as root): system packages and a Python venv in .venv.
#   scripts/setup.sh            control host: fio, openssh, kvgate itself
#   scripts/setup.sh --test     plus everything the test suite needs
# Idempotent: rerunning only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_TEST=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TEST=1 ;;
    *) echo "setup.sh: unknown option $arg (expected --test)" >&2; exit 2 ;;
  esac
done

APT_PKGS=(fio openssh-server openssh-client util-linux procps iproute2 python3-venv ca-certificates)

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: apt-get install ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [ "$WITH_TEST" = 1 ]; then
  .venv/bin/python -m pip install -q -e '.[test]'
else
  .venv/bin/python -m pip install -q -e .
fi
echo "setup: done ($(.venv/bin/kvgate --version), $(fio --version))" >&2
