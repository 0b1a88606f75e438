"""One task of a kvgate Slurm job step: start this node's program and leave its output in the job's files.

srun starts this same program once per node (``--ntasks-per-node=1``). It finds its node's entry in the job's
spec (``SPEC.json``: node -> {argv, drop_caches}) by ``SLURMD_NODENAME``, drops the page cache first when asked
(recorded), then runs the argv in the job directory's per-node files:

    NODE.task.json   provenance: node, hostname, job and step id, task rank, PID, start time, cache drop, and
                     the SHA-256 of the spec it ran (kvgate holds it to the spec it wrote)
    NODE.out / .err  the program's stdout and stderr, as they are written (kvgate tails .out)
    NODE.rc          the program's exit status, written last (atomically): the task is over

A file ``NODE.stop`` in the job directory stops this node's program (SIGTERM, then SIGKILL after 5 s): kvgate
stops one node of a running step this way; ``scancel`` stops them all. SIGTERM to this task is passed on.
Stdlib only; imports nothing of kvgate.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def drop_caches() -> dict:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return {"dropped": True, "error": None}
    except OSError as exc:
        return {"dropped": False, "error": str(exc)}


def stop_group(child: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL it if it has not ended 5 s later (the task's own stop, and
    k8s_task.py's on the pod's SIGTERM)."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        child.wait(5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--job-dir", required=True)
    args = ap.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or platform.node()
    with open(args.spec, "rb") as fh:
        spec_bytes = fh.read()
    spec = json.loads(spec_bytes)
    entry = spec.get(node)
    base = os.path.join(args.job_dir, node)
    if entry is None:
        sys.stderr.write(f"slurm_task: no entry for node {node!r} in {args.spec}\n")
        return 3
    prov = {"node": node, "hostname": platform.node(), "job_id": os.environ.get("SLURM_JOB_ID"),
            "step_id": os.environ.get("SLURM_STEP_ID"), "task_rank": os.environ.get("SLURM_PROCID"),
            "pid": os.getpid(), "started_at_s": time.time(), "python": platform.python_version(),
            "spec_sha256": hashlib.sha256(spec_bytes).hexdigest()}
    if entry.get("drop_caches"):
        prov["cache_drop"] = drop_caches()
    with open(f"{base}.out", "wb") as out, open(f"{base}.err", "wb") as err:
        child = subprocess.Popen(entry["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True)
        prov["child_pid"] = child.pid
        write_atomic(f"{base}.task.json", json.dumps(prov))

        def stop(_sig=None, _frame=None) -> None:
            stop_group(child)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while child.poll() is None:
            if os.path.exists(f"{base}.stop"):
                stop()
                break
            time.sleep(0.1)
        rc = child.wait()
    write_atomic(f"{base}.rc", f"{rc}\n")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
