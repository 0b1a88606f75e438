"""One pod of a kvgate Indexed Job: start this node's program, release all ranks together, keep the output.

``kvgate render k8s`` writes one Indexed Job per gate; every pod runs this program from the gate's ConfigMap
(mounted at ``--config-dir``: ``spec.json``, the node program, ``slurm_task.py`` (whose helpers this imports),
the suite's inventory and gates). It finds its
entry in ``spec.json`` by the Kubernetes node it runs on (``KVGATE_K8S_NODE``, the downward API's
``spec.nodeName``); its rank is the pod's completion index (``JOB_COMPLETION_INDEX``). Under
``--results/GATE/`` (a volume every pod shares) it leaves, as the slurm launcher's tasks do:

    NODE.task.json   provenance: node, rank, pod, hostname, PID, start time, page cache drop
    NODE.out / .err  the program's stdout and stderr
    NODE.rc          the program's exit status, written last (atomically): the task is over

The start barrier (the go file, as under ssh and slurm): the entry marked ``creates_pool`` first lays out the
shared copy unless its manifest matches, then writes ``pool.ready``; the others wait for it before they start
their reader. Each reader arms (``NODE.armed``) and waits for its go file. Rank 0 also coordinates: once every
rank armed (or ``arm_timeout_s`` passed) it writes one start time, ``go_lead_s`` ahead, into every armed rank's
go file and records the release in ``go.json`` (armed and missing ranks). Rank 0 copies the suite's config into
``--results/config/`` so that ``kvgate collect`` finds everything in the volume. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time

# the slurm launcher's task, beside this one in the ConfigMap (and in harness/node/): its file writes, page-cache
# drop and process-group stop, one copy for both launchers
from slurm_task import drop_caches, stop_group, write_atomic  # noqa: E402


def _wait_for(path: str, deadline: float) -> bool:
    while time.time() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def coordinate(spec: dict, gate_dir: str, started_s: float) -> dict:
    """Rank 0's barrier: every rank's armed file, or the arm timeout; then one go time for the armed ranks."""
    nodes = list(spec["entries"])
    deadline = started_s + float(spec["arm_timeout_s"])
    while time.time() < deadline:
        if all(os.path.exists(os.path.join(gate_dir, f"{n}.armed")) for n in nodes):
            break
        time.sleep(0.05)
    armed = [n for n in nodes if os.path.exists(os.path.join(gate_dir, f"{n}.armed"))]
    go_s = time.time() + float(spec["go_lead_s"])
    for n in armed:
        write_atomic(os.path.join(gate_dir, f"{n}.go"), f"{go_s!r}\n")
    record = {"go_s": go_s, "written_at_s": time.time(), "armed": armed,
              "missing": [n for n in nodes if n not in armed]}
    write_atomic(os.path.join(gate_dir, "go.json"), json.dumps(record))
    return record


def _ensure_pool(entry: dict, err) -> int:
    """The creating node: its copy's manifest as wanted, or the copy laid out now (the create command's rc)."""
    want = entry["pool_manifest"]
    try:
        with open(entry["pool_manifest_path"]) as fh:
            have = json.load(fh)
        if all(have.get(k) == v for k, v in want.items()):
            return 0
    except (OSError, ValueError):
        pass
    return subprocess.call(entry["create_argv"], stdin=subprocess.DEVNULL, stdout=err, stderr=err)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--results", required=True)
    args = ap.parse_args(argv)
    started_s = time.time()
    with open(os.path.join(args.config_dir, "spec.json")) as fh:
        spec = json.load(fh)
    node = os.environ.get("KVGATE_K8S_NODE") or platform.node()
    rank = int(os.environ.get("JOB_COMPLETION_INDEX", "-1"))
    gate_dir = os.path.join(args.results, spec["gate"])
    os.makedirs(gate_dir, exist_ok=True)
    if rank == 0:
        cfg_out = os.path.join(args.results, "config")
        os.makedirs(cfg_out, exist_ok=True)
        for name in ("inventory.yaml", "gates.yaml", "render.json"):
            shutil.copyfile(os.path.join(args.config_dir, name), os.path.join(cfg_out, name))
    entry = spec["entries"].get(node)
    if entry is None:
        sys.stderr.write(f"k8s_task: rank {rank} runs on node {node!r}, which has no entry in the spec "
                         f"({', '.join(spec['entries'])})\n")
        return 3
    base = os.path.join(gate_dir, node)
    prov = {"node": node, "rank": rank, "pod": os.environ.get("HOSTNAME"), "hostname": platform.node(),
            "job": os.environ.get("KVGATE_K8S_JOB"), "pid": os.getpid(), "started_at_s": started_s,
            "python": platform.python_version()}
    coordinator = None
    if rank == 0:
        coordinator = threading.Thread(target=coordinate, args=(spec, gate_dir, started_s), daemon=True)
        coordinator.start()
    with open(f"{base}.out", "wb") as out, open(f"{base}.err", "wb") as err:
        ready = os.path.join(gate_dir, "pool.ready")
        if entry.get("creates_pool"):
            rc = _ensure_pool(entry, err)
            prov["pool_create_rc"] = rc
            if rc == 0:
                write_atomic(ready, f"{node}\n")
        elif not _wait_for(ready, started_s + float(spec["arm_timeout_s"])):
            err.write(b"k8s_task: the shared KV copy was not ready before the arm timeout\n")
        if spec.get("drop_caches"):
            prov["cache_drop"] = drop_caches()
        child = subprocess.Popen(entry["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True)
        prov["child_pid"] = child.pid
        write_atomic(f"{base}.task.json", json.dumps(prov))

        def stop(_sig=None, _frame=None) -> None:
            # Kubernetes sends SIGTERM on the Job's deadline or its deletion: pass it on to the reader's group.
            stop_group(child)

        signal.signal(signal.SIGTERM, stop)
        rc = child.wait()
    if coordinator is not None:
        coordinator.join(float(spec["arm_timeout_s"]))
    write_atomic(f"{base}.rc", f"{rc}\n")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
