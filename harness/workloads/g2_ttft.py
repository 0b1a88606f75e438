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

from .kit.base import register_workload
from .kit.g2 import G2Procedure


@register_workload("g2-ttft")
class G2Ttft(G2Procedure):
    """G2 as the module's docstring describes it: the procedure of harness/workloads/kit/g2.py, unchanged."""
