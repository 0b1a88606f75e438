#!/usr/bin/env bash
# The main job: boot the NVMe-oF loopback guest (Debian's kernel under qemu, cached after the first build),
# provision the target side inside it (nvmet over NVMe/TCP, and over NVMe/RDMA on soft-RoCE), run
# gates/loopback.yaml on it (kvgate run connects the kind: nvmeof targets itself, and disconnects them), and
# always tear down and stop qemu.
#   scripts/run-loopback-suite.sh [OUT_DIR] [extra kvgate run options, e.g. --key KEY]
# Exit code: kvgate run's (0 PASS, 1 FAIL, 2 config, 3 infrastructure, 4 STOP).
set -euo pipefail
cd "$(dirname "$0")/.."
KV=${KVGATE:-.venv/bin/kvgate}
OUT=${1:-runs}
shift || true

cleanup() {
  $KV loopback down >&2 || echo "loopback down failed (see runs/loopback/)" >&2
  $KV loopback guest-down >&2 || echo "guest-down failed" >&2
}
trap cleanup EXIT

$KV loopback guest-up
$KV loopback up
$KV run --inventory inventory/loopback.yaml --gates gates/loopback.yaml --out "$OUT" "$@"
