"""G2: time to first token, re-compute vs cold read-back of the prompt KV from the tier.

One run on one node (the first of the gate's nodes):
1. Re-compute: prompts the engine has never seen (fresh pool directory, GPU prefix caching off), TTFT
   per request. Serving them is also what populates the tier: each prompt's KV is stored.
2. Populate proof: wait until the pool holds the expected KV bytes (files and bytes recorded).
3. Make cold: stop the engine (whole process group), ``sync`` and drop the page cache (whether the
   kernel allowed it is recorded), start the engine again.
4. Read back: the same prompts; TTFT per request; engine hit counters and the pool device's
   ``/sys/class/block/DEV/stat`` are read before and after.
A read-back phase below ``min_hit_rate`` hit tokens, or with no bytes read from the pool's device, is
INVALID, never PASS. An engine that does not become ready is ERROR with its log in the bundle.

Prompts are drawn deterministically from ``seed`` at the configured lengths: text that the model's
tokenizer encodes to exactly that many tokens when the profile or the gate names a tokenizer (a local
``tokenizer.json``), token-id lists otherwise (the cpu-reference engine has no tokenizer).
"""

from __future__ import annotations

from typing import Any
from pathlib import Path

from .kit.rederive import g2_phases
from ..engines import load_profile
from .kit.g2 import reevaluate_g2
from .kit.base import register_workload
from .kit.g2 import G2Procedure


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-ttft from both phases' raw request records (``requests-recompute.jsonl``, ``requests-readback.jsonl``), the
    read-back's pool-device bytes re-parsed from the run's two probe steps, a launched engine's logs
    (``engine-recompute.log``, ``engine-readback.log``) re-scanned for fall-backs, with the bounds of
    config/gates.yaml, through the workload's own pure functions (harness.workloads.kit.g2.reevaluate_g2)."""
    return reevaluate_g2(*g2_phases(gate_dir, result, params, ctx), params, load_profile(params.engine))


@register_workload("g2-ttft")
class G2Ttft(G2Procedure):
    """G2 as the module's docstring describes it: the procedure of harness/workloads/kit/g2.py, unchanged."""
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
