"""Programs kvgate ships to nodes and runs there: stdlib only, no import of kvgate (a node needs python3,
not kvgate). ``g3_reader.py`` reads the shared KV copy for G3, ``rig_forward.py`` carries the test rig's
loopback ports into its namespaces, ``make_model.py`` builds a random-weight model and tokenizer for an
engine (it needs torch, transformers and tokenizers there), ``kv_reader.py`` lays KV out and reads it back
through LMCache for kv-read (it needs torch and lmcache there), ``r3_client.py`` sends R3's prompts to an engine
on the node's loopback and reads its counters around them, ``slurm_task.py`` is the one task of a Slurm job
step on each node that starts that node's program (harness/execute/slurm.py), ``k8s_task.py`` the same for
each pod of a rendered Kubernetes Indexed Job, with the start barrier (harness/execute/k8s.py), ``pool_evict.py``
keeps a page-cache connector's pool cold beside its engine (harness/workloads/kit/pool.py).
``kv_flip.py`` flips one byte of a stored KV tensor for g2-answer's corruption run. The CPU reference engine is shipped the same
way but lives with the engines (harness/engines/cpu_reference.py)."""

from __future__ import annotations

from pathlib import Path

PROGRAMS = ("g3_reader.py", "rig_forward.py", "make_model.py", "kv_reader.py", "r3_client.py", "slurm_task.py",
            "k8s_task.py", "pool_evict.py", "kv_flip.py")


def program_path(name: str) -> Path:
    """The file of one of :data:`PROGRAMS`, to put on a node or run with an interpreter."""
    if name not in PROGRAMS:
        raise ValueError(f"no node program {name!r} (known: {', '.join(PROGRAMS)})")
    return Path(__file__).resolve().parent / name
