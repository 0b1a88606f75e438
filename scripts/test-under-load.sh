#!/usr/bin/env bash
# The README's test command with a CPU hog on every core beside it (stress-ng, from Debian): the suite must
# not depend on timing it does not control. Usage: bash scripts/test-under-load.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
command -v stress-ng >/dev/null || { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng >/dev/null; }
stress-ng --cpu "$(nproc)" --timeout 0 --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null || true' EXIT
echo "test-under-load: stress-ng --cpu $(nproc) (pid $hog) beside pytest" >&2
.venv/bin/python -m pytest -q "$@"
