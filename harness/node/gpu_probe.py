"""Run by a GPU node's engine interpreter (torch, LMCache, vLLM; not kvgate): what that interpreter can do on
this node, as one line ``kvgate-gpu-probe {json}`` on stdout, parsed by ``harness/parsers/gpu.py``.

    python gpu_probe.py            torch and its CUDA build, the devices CUDA sees, LMCache and whether its
                                   compiled CUDA ops load (the exact error when not), vLLM's version
    python gpu_probe.py h2d --bytes N --repeat R
                                   pinned host memory -> each GPU, R timed copies of N bytes after one untimed

Every failure is recorded as the exception's type and text; the probe itself exits 0 unless it cannot print.
Standard library and what it probes only: kvgate's package is not importable here.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
import time

MARK = "kvgate-gpu-probe"
# LMCache's compiled CUDA ops: lmcache.cuda_ops from 0.4 on (0.5.6 binds it in
# lmcache/v1/platform/devices/cuda/device_ops.py), lmcache.c_ops before
OPS_MODULES = ("lmcache.cuda_ops", "lmcache.c_ops")
LIB_RE = re.compile(rb"lib(?:cudart|c10_cuda|torch_cuda|c10|torch|torch_cpu|torch_python)\.so(?:\.\d+)*")


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _linked_libs(path: str | None) -> list[str]:
    """The torch and CUDA runtime libraries a compiled module names (its ELF strings: what it will ask the
    loader for), in the order first seen."""
    if not path or not os.path.isfile(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    return list(dict.fromkeys(m.decode() for m in LIB_RE.findall(data)))


def _torch(doc: dict) -> None:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - recorded
        doc["torch_error"] = _err(exc)
        return
    doc["torch_version"] = torch.__version__
    doc["torch_cuda"] = torch.version.cuda
    try:
        doc["cuda_available"] = bool(torch.cuda.is_available())
        if torch.version.cuda is not None:
            torch.cuda.init()  # raises the driver's own words when CUDA cannot start
        doc["arch_list"] = list(torch.cuda.get_arch_list()) if doc["cuda_available"] else []
        for i in range(torch.cuda.device_count() if doc["cuda_available"] else 0):
            p = torch.cuda.get_device_properties(i)
            doc["devices"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                                   "total_memory_bytes": int(p.total_memory)})
    except Exception as exc:  # noqa: BLE001
        doc["cuda_error"] = _err(exc)


def _lmcache(doc: dict) -> None:
    try:
        import lmcache  # noqa: F401
        from importlib.metadata import version
        doc["lmcache_version"] = version("lmcache")
    except Exception as exc:  # noqa: BLE001
        doc["lmcache_error"] = _err(exc)
        return
    for name in OPS_MODULES:
        try:
            spec = importlib.util.find_spec(name)
        except Exception:  # noqa: BLE001
            spec = None
        if spec is None:
            continue
        doc["ops_module"] = name
        doc["ops_libs"] = _linked_libs(spec.origin)
        try:
            importlib.import_module(name)
            doc["ops_error"] = None
        except Exception as exc:  # noqa: BLE001
            doc["ops_error"] = _err(exc)
        return
    doc["ops_error"] = f"ModuleNotFoundError: none of {', '.join(OPS_MODULES)} is in LMCache's package"


def _vllm(doc: dict) -> None:
    try:
        from importlib.metadata import version
        doc["vllm_version"] = version("vllm")
    except Exception as exc:  # noqa: BLE001
        doc["vllm_error"] = _err(exc)


def probe() -> dict:
    doc: dict = {"python": sys.executable, "torch_version": None, "torch_error": None, "torch_cuda": None,
                 "cuda_available": False, "cuda_error": None, "devices": [], "arch_list": [],
                 "lmcache_version": None, "lmcache_error": None, "ops_module": None, "ops_error": None,
                 "ops_libs": [], "vllm_version": None, "vllm_error": None,
                 "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                 "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER")}
    _torch(doc)
    if doc["torch_error"] is None:
        _lmcache(doc)
    else:
        doc["lmcache_error"] = "not tried: torch does not import"
    _vllm(doc)
    return doc


def h2d(nbytes: int, repeat: int) -> dict:
    doc: dict = {"h2d": [], "error": None}
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA device (torch.version.cuda: "
                               f"{torch.version.cuda})")
        for i in range(torch.cuda.device_count()):
            dev = torch.device("cuda", i)
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            dst.copy_(host, non_blocking=True)  # untimed: first-touch and mapping costs
            torch.cuda.synchronize(dev)
            seconds = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                dst.copy_(host, non_blocking=True)
                torch.cuda.synchronize(dev)
                seconds.append(time.perf_counter() - t0)
            doc["h2d"].append({"index": i, "bytes": nbytes, "seconds": seconds})
            del host, dst
    except Exception as exc:  # noqa: BLE001
        doc["error"] = _err(exc)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    h = sub.add_parser("h2d")
    h.add_argument("--bytes", type=int, default=1 << 30)
    h.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    doc = h2d(args.bytes, args.repeat) if args.cmd == "h2d" else probe()
    sys.stdout.flush()
    print(f"{MARK} {json.dumps(doc, sort_keys=True)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
