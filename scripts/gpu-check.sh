#!/usr/bin/env bash
# A GPU node's first check with kvgate (docs/kv-read.md, "On a GPU node"). On a node with NVIDIA GPUs and torch:
#
#   scripts/gpu-check.sh [--python PY] [--pool DIR] [--wheels DIR] [--run-dir DIR] [--budget-s 480] [--key KEY]
#                        [--gates FILE] [--target-size SIZE]
#   scripts/gpu-check.sh --dry-run             every step and the gate files, nothing run
#   scripts/gpu-check.sh --build-wheels DIR [--python PY] [--for-python X.Y]
#                                              on a machine that reaches a package index (or a local one): the
#                                              wheels --wheels installs from on a node that reaches none; kvgate
#                                              and its dependencies in DIR/kvgate, LMCache 0.5.6 and its
#                                              requirements but torch in DIR/engine, for PY's Python (or X.Y's,
#                                              binary wheels only), DIR/MANIFEST.txt with every file's sha256
#
# 1. probes: nvidia-smi -q, each PCI device's NUMA node, and the engine interpreter PY (torch, its CUDA build,
#    LMCache and whether its compiled CUDA ops load, vLLM): harness/node/gpu_probe.py
# 2. installs what is missing: kvgate's dependencies in $KVGATE_VENV (default .venv), LMCache 0.5.6 in PY, from
#    --wheels DIR (no index) when given (default: ./wheels when it exists), else from the configured index
# 3. the pairing (kvgate gpu-node check): refuses, exit 3, with every problem and what the node needs
# 4. the pool: DIR on the local disk (default /var/tmp/kvgate-gpu-check), the inventory written from the probes
# 5. the H2D copy rate per GPU (pinned host memory), then kvgate run of gates/gpu-node.yaml: fio per GPU, kv-read
#    into GPU memory beside fio over the same chunk files, G2 TTFT re-compute vs read-back with vLLM on CUDA
# 6. kvgate verify of the bundle, and the figures (kvgate gpu-node summary)
# --gates FILE runs another suite instead (a sizing run: more KV, your model); the figures are read by the gate
# ids of gates/gpu-node.yaml (G1, G1C-gpu, G2). --target-size sets the fio file's size (default 8 GiB).
#
# Every step leaves argv, stdout, stderr, rc and status in RUN_DIR/steps/NAME (default runs/gpu-check-UTC);
# steps.log lists them in order. The whole check stops within --budget-s seconds (default 480: 8 minutes).
# Exit: kvgate run's (0 every gate passed, 1 one did not, 3 a gate ERROR, 4 a stop-loss); 1 the bundle did not
# verify; 2 bad usage; 3 refused (the pairing) or a step that must succeed failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

GATES=gates/gpu-node.yaml
TEMPLATE=inventory/gpu-node.example.yaml
LMCACHE_REQ=lmcache==0.5.6
DRY_RUN=0
RUN_DIR=""
POOL=/var/tmp/kvgate-gpu-check
ENGINE_PY=${KVGATE_ENGINE_PYTHON:-python3}
WHEELS=""
BUILD_WHEELS=""
FOR_PY=()
BUDGET_S=480
KEY=""
TARGET_SIZE="8 GiB"
KVGATE_VENV=${KVGATE_VENV:-.venv}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
need() { [ $# -ge 2 ] || { echo "gpu-check: $1 needs a value" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --run-dir) need "$@"; RUN_DIR=$2; shift ;;
    --pool) need "$@"; POOL=$2; shift ;;
    --python) need "$@"; ENGINE_PY=$2; shift ;;
    --wheels) need "$@"; WHEELS=$2; shift ;;
    --build-wheels) need "$@"; BUILD_WHEELS=$2; shift ;;
    --for-python) need "$@"; FOR_PY=(--python-version "$2" --only-binary=:all:); shift ;;
    --budget-s) need "$@"; BUDGET_S=$2; shift ;;
    --key) need "$@"; KEY=$2; shift ;;
    --gates) need "$@"; GATES=$2; shift ;;
    --target-size) need "$@"; TARGET_SIZE=$2; shift ;;
    -h|--help) usage ;;
    *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$BUDGET_S" in ''|*[!0-9]*) echo "gpu-check: --budget-s expects whole seconds, got $BUDGET_S" >&2; exit 2 ;; esac
if [ -z "$WHEELS" ] && [ -d wheels ] && [ -z "$BUILD_WHEELS" ]; then WHEELS=wheels; fi

# torch numbers GPUs fastest first unless told otherwise; nvidia-smi (and the inventory) in PCI bus order
export CUDA_DEVICE_ORDER=PCI_BUS_ID LMCACHE_LOG_LEVEL=WARNING LMCACHE_TRACK_USAGE=false
KVGATE_PY="$KVGATE_VENV/bin/python"
KVGATE=("$KVGATE_PY" -m harness)   # this checkout's kvgate (run from its root), with the venv's dependencies
START=$(date +%s)
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
[ -n "$RUN_DIR" ] || RUN_DIR="runs/gpu-check-$STAMP"

left_s() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
log() { if [ "$DRY_RUN" = 1 ]; then echo "$*"; else echo "$*" | tee -a "$RUN_DIR/steps.log" >&2; fi; }

# step NAME TIMEOUT_S CMD...: run CMD (stdin closed) within TIMEOUT_S and the budget; argv, stdout, stderr, rc
# and status land in RUN_DIR/steps/NAME; returns CMD's rc. Under --dry-run it prints the step and returns 0.
step() {
  local name=$1 t=$2 d rc=0 status left began
  shift 2
  if [ "$DRY_RUN" = 1 ]; then
    printf '  step %-16s (<= %ss): %s\n' "$name" "$t" "$(printf '%q ' "$@")"
    return 0
  fi
  left=$(left_s)
  [ "$t" -le "$left" ] || t=$left
  d="$RUN_DIR/steps/$name"
  mkdir -p "$d"
  printf '%q ' "$@" > "$d/argv"; echo >> "$d/argv"
  if [ "$t" -le 0 ]; then
    echo 124 > "$d/rc"; echo "not run: the ${BUDGET_S}s budget is spent" > "$d/status"; : > "$d/stdout"; : > "$d/stderr"
    log "[$(date -u +%H:%M:%S)] $name: not run, the ${BUDGET_S}s budget is spent"
    return 124
  fi
  log "[$(date -u +%H:%M:%S)] $name (<= ${t}s): $(cat "$d/argv")"
  began=$(date +%s)
  timeout -k 10 "$t" "$@" < /dev/null > "$d/stdout" 2> "$d/stderr" || rc=$?
  echo "$rc" > "$d/rc"
  case $rc in
    0) status=ok ;; 124|137) status="timed out after ${t}s" ;; 126|127) status="not run: command not found or not executable" ;;
    *) status=failed ;;
  esac
  echo "$status ($(( $(date +%s) - began ))s)" > "$d/status"
  log "    -> rc $rc, $(cat "$d/status")"
  return "$rc"
}

# must NAME: a step that must have succeeded; else its stderr's tail and exit 3
must() {
  local d="$RUN_DIR/steps/$1"
  [ "$DRY_RUN" = 1 ] && return 0
  [ "$(cat "$d/rc" 2>/dev/null)" = 0 ] && return 0
  echo "gpu-check: step $1 failed ($(cat "$d/status" 2>/dev/null)); its stderr ends:" >&2
  tail -n 15 "$d/stderr" >&2
  case $1 in *-install) [ -z "$WHEELS" ] || grep '^#' "$WHEELS/MANIFEST.txt" >&2 2>/dev/null || true ;; esac
  echo "every step's files: $RUN_DIR/steps/" >&2
  exit 3
}

build_wheels() {
  local dir=$1 reqs
  mkdir -p "$dir/kvgate" "$dir/engine"
  dir=$(cd "$dir" && pwd)
  RUN_DIR="$dir/build-log"; mkdir -p "$RUN_DIR"
  BUDGET_S=100000
  # the wheel is built from a copy of what git tracks, so the build leaves nothing in the checkout
  BUILD_SRC=$(mktemp -d)
  trap 'rm -rf "$BUILD_SRC"' EXIT
  git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$BUILD_SRC"
  step kvgate-wheel 600 "$KVGATE_PY" -m pip wheel -q --no-deps --no-build-isolation -w "$dir/kvgate" "$BUILD_SRC" || true
  must kvgate-wheel
  step kvgate-deps 900 "$KVGATE_PY" -m pip download -q "${FOR_PY[@]}" -d "$dir/kvgate" "$(ls "$dir"/kvgate/kvgate-*.whl | head -n 1)" || true
  must kvgate-deps
  # LMCache without torch (the node has its own CUDA build): the wheel, then its requirements but torch
  if step lmcache-wheel 900 "$ENGINE_PY" -m pip download -q --no-deps "${FOR_PY[@]}" -d "$dir/engine" "$LMCACHE_REQ"; then
    reqs="$dir/build-log/lmcache-requirements.txt"
    step lmcache-requires 60 "$ENGINE_PY" -c 'import sys, zipfile, glob, re
w = sorted(glob.glob(sys.argv[1] + "/lmcache-*.whl"))[0]
z = zipfile.ZipFile(w)
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist:") and "extra ==" not in line:
        req = line.split(":", 1)[1].strip()
        if re.split(r"[ ;<>=!~\[]", req)[0].lower() != "torch":
            print(req)' "$dir/engine" || true
    must lmcache-requires
    cp "$RUN_DIR/steps/lmcache-requires/stdout" "$reqs"
    step lmcache-deps 1800 "$ENGINE_PY" -m pip download -q "${FOR_PY[@]}" -d "$dir/engine" -r "$reqs" || true
  fi
  step manifest 120 sh -c 'cd "$1" && find kvgate engine -type f -name "*.whl" -o -type f -name "*.tar.gz" | sort | while read -r f; do printf "%s %s %s\n" "$(sha256sum "$f" | cut -c1-64)" "$(stat -c %s "$f")" "$f"; done' sh "$dir"
  {
    echo "# kvgate gpu-check wheel bundle, built $STAMP: sha256, size in bytes, file"
    echo "# for: ${FOR_PY[*]:-the Python versions below}"
    echo "# kvgate: $("$KVGATE_PY" -c 'import sys, platform; print(platform.python_version(), sys.platform, platform.machine())')"
    echo "# engine: $("$ENGINE_PY" -c 'import sys, platform; print(platform.python_version(), sys.platform, platform.machine())' 2>&1)"
    cat "$RUN_DIR/steps/manifest/stdout"
  } > "$dir/MANIFEST.txt"
  echo "wheels: $dir ($(du -sh "$dir" | cut -f1)); kvgate: $(ls "$dir/kvgate" | wc -l) files, engine: $(ls "$dir/engine" | wc -l) files"
  if [ "$(cat "$RUN_DIR/steps/lmcache-wheel/rc")" != 0 ]; then
    echo "LMCache is NOT in the bundle: pip download $LMCACHE_REQ failed: $(grep -v '^\s*$' "$RUN_DIR/steps/lmcache-wheel/stderr" | tail -n 1)" >&2
    echo "(the node then needs LMCache installed, or an index to install it from)" >&2
    exit 1
  fi
  if [ "$(cat "$RUN_DIR/steps/lmcache-deps/rc" 2>/dev/null)" != 0 ]; then
    echo "LMCache's requirements are incomplete in the bundle: $(grep -v '^\s*$' "$RUN_DIR/steps/lmcache-deps/stderr" | tail -n 1)" >&2
    exit 1
  fi
  echo "copy the checkout with $dir to the node and run: scripts/gpu-check.sh --wheels $dir"
}

if [ -n "$BUILD_WHEELS" ]; then
  build_wheels "$BUILD_WHEELS"
  exit 0
fi

if [ "$DRY_RUN" = 1 ]; then
  echo "gpu-check --dry-run: nothing is run. Budget ${BUDGET_S}s. Run directory: $RUN_DIR"
  echo "gate file: $GATES"
  echo "inventory: written to $RUN_DIR/inventory.yaml from the probes, shaped as $TEMPLATE"
  echo "engine interpreter: $ENGINE_PY; pool: $POOL; wheels: ${WHEELS:-none (the configured package index)}"
else
  mkdir -p "$RUN_DIR/steps"
  RUN_DIR=$(cd "$RUN_DIR" && pwd)
  log "gpu-check: run directory $RUN_DIR, budget ${BUDGET_S}s"
fi

# 1. the node
step host 10 uname -a || true
step nvidia-smi-q 30 nvidia-smi -q || true
step pci-numa 10 sh -c 'grep -H . /sys/bus/pci/devices/*/numa_node' || true

# 2. kvgate's dependencies; LMCache in the engine interpreter
deps_ok() { "$KVGATE_PY" -c 'import yaml, pydantic, paramiko, cryptography, httpx, pandas, matplotlib, jinja2' >/dev/null 2>&1; }
[ "$DRY_RUN" = 0 ] || echo "  when $KVGATE_VENV lacks kvgate's dependencies (a venv made first if there is none):"
if [ "$DRY_RUN" = 1 ] || ! deps_ok; then
  if [ "$DRY_RUN" = 1 ] || [ ! -x "$KVGATE_PY" ]; then
    step kvgate-venv 120 python3 -m venv "$KVGATE_VENV" || true
    must kvgate-venv
  fi
  if [ -n "$WHEELS" ]; then
    step kvgate-install 300 "$KVGATE_PY" -m pip install -q --no-index --find-links "$WHEELS/kvgate" kvgate || true
  else
    step kvgate-install 300 "$KVGATE_PY" -m pip install -q . || true
  fi
  must kvgate-install
fi
if ! step lmcache-import 120 "$ENGINE_PY" -c 'import lmcache' || [ "$DRY_RUN" = 1 ]; then
  [ "$DRY_RUN" = 0 ] || echo "  when LMCache does not import:"
  if [ -n "$WHEELS" ]; then
    step lmcache-install 300 "$ENGINE_PY" -m pip install -q --no-index --find-links "$WHEELS/engine" "$LMCACHE_REQ" || true
  else
    step lmcache-install 300 "$ENGINE_PY" -m pip install -q "$LMCACHE_REQ" || true
  fi
  if [ "$DRY_RUN" = 0 ] && [ "$(cat "$RUN_DIR/steps/lmcache-install/rc")" != 0 ]; then
    echo "gpu-check: LMCache could not be installed in $ENGINE_PY; pip's last words:" >&2
    tail -n 3 "$RUN_DIR/steps/lmcache-install/stderr" >&2
    [ -z "$WHEELS" ] || grep '^#' "$WHEELS/MANIFEST.txt" >&2 2>/dev/null || true
  fi
fi
step gpu-probe 180 "$ENGINE_PY" harness/node/gpu_probe.py || true

# 3. the pairing: refused with every reason, or on
if ! step pairing 60 "${KVGATE[@]}" gpu-node check "$RUN_DIR"; then
  if [ -s "$RUN_DIR/steps/pairing/stderr" ]; then cat "$RUN_DIR/steps/pairing/stderr" >&2; fi
  echo "gpu-check: refused; every probe's output is in $RUN_DIR/steps/" >&2
  exit 3
fi
if [ "$DRY_RUN" = 0 ]; then
  cat "$RUN_DIR/steps/pairing/stdout"
  cat "$RUN_DIR/steps/pairing/stderr" >&2   # notes (vLLM missing: G2 will be ERROR)
fi

# 4. the pool on local disk and the node's inventory
step pool 30 sh -c 'mkdir -p "$1" && findmnt -n -o SOURCE,FSTYPE,TARGET --target "$1" && df -B1 --output=avail "$1"' sh "$POOL" || true
must pool
INVENTORY="$RUN_DIR/inventory.yaml"
ENGINE_ABS=$(command -v "$ENGINE_PY" || echo "$ENGINE_PY")
step inventory 60 "${KVGATE[@]}" gpu-node inventory "$RUN_DIR" --work-dir "$POOL" --engine-python "$ENGINE_ABS" \
  --target-size "$TARGET_SIZE" --out "$INVENTORY" || true
must inventory
[ "$DRY_RUN" = 0 ] || INVENTORY=$TEMPLATE
step validate 60 "${KVGATE[@]}" validate -i "$INVENTORY" -g "$GATES" || true
must validate

# 5. H2D, then the gates (kvgate's own deadline: what is left of the budget less verify and summary)
step h2d 60 "$ENGINE_PY" harness/node/gpu_probe.py h2d --bytes 1073741824 --repeat 5 || true
RUN_T=$(( $(left_s) - 45 ))
[ "$DRY_RUN" = 0 ] || RUN_T=$(( BUDGET_S - 150 ))
KEY_ARGS=()
[ -z "$KEY" ] || KEY_ARGS=(--key "$KEY")
run_rc=0
step run "$RUN_T" "${KVGATE[@]}" run -i "$INVENTORY" -g "$GATES" --out "$RUN_DIR/out" "${KEY_ARGS[@]}" || run_rc=$?
if [ "$DRY_RUN" = 1 ]; then
  step verify 60 "${KVGATE[@]}" verify "$RUN_DIR/out/REPORT_ID" --pubkey PUBKEY
  step summary 30 "${KVGATE[@]}" gpu-node summary "$RUN_DIR" --bundle "$RUN_DIR/out/REPORT_ID"
  # the files the run would use, checked now (read only): the gate file on the template's inventory
  echo "kvgate validate -i $TEMPLATE -g $GATES:"
  "${KVGATE[@]}" validate -i "$TEMPLATE" -g "$GATES"
  exit $?
fi
tail -n 8 "$RUN_DIR/steps/run/stdout" >&2 || true

# 6. the bundle, verified, and its figures
BUNDLE=$(sed -n 's/^bundle: \([^ ]*\).*/\1/p' "$RUN_DIR/steps/run/stdout" | tail -n 1)
PUBKEY=$(sed -n 's/^verify with: .* --pubkey \(.*\)$/\1/p' "$RUN_DIR/steps/run/stdout" | tail -n 1)
if [ -z "$BUNDLE" ]; then
  echo "gpu-check: kvgate run wrote no bundle (rc $run_rc, $(cat "$RUN_DIR/steps/run/status")); its stderr ends:" >&2
  tail -n 15 "$RUN_DIR/steps/run/stderr" >&2
  exit 3
fi
if [ -n "$PUBKEY" ]; then
  step verify 60 "${KVGATE[@]}" verify "$BUNDLE" --pubkey "$PUBKEY" || true
else
  step verify 60 "${KVGATE[@]}" verify "$BUNDLE" || true
fi
cat "$RUN_DIR/steps/verify/stdout"
step summary 30 "${KVGATE[@]}" gpu-node summary "$RUN_DIR" --bundle "$BUNDLE" || true
cat "$RUN_DIR/steps/summary/stdout"
echo "gpu-check: $(( $(date +%s) - START ))s; bundle $BUNDLE; steps in $RUN_DIR/steps/"
[ "$(cat "$RUN_DIR/steps/verify/rc")" = 0 ] || exit 1
exit "$run_rc"
