"""G2 answer integrity: does a prompt served with its KV read back from the tier give the same answer as the same
prompt computed?

The procedure is g2-ttft's (harness/workloads/g2_ttft.py), with greedy requests that ask for ``logprobs``:
1. Re-compute: prompts the engine has never seen (a fresh pool; the engine's hit counters must not move): each
   answer (output token ids, each token's logprob and the top alternatives) is computed from the prompt alone.
   That is the reference, and serving it stores the prompts' KV on the tier.
2. The engine is stopped, (with ``corrupt:``) kvgate flips one byte in a stored KV file on the node, the page
   cache is dropped, the engine starts again (nothing of the first in its memory).
3. Read back: the same requests; the hits are proven as in G2 (hit counters, the pool device's read bytes).

Why this reference: the two answers come from the same engine build, weights, flags and seed; the only difference
is where the prompt's KV came from (computed, or read from the tier), and the re-compute phase is proven not to
have hit. A re-computed answer is the one the tier must reproduce.

PASS needs every prompt's token sequence equal and every compared logprob (each generated token's, and each top
alternative both answers list) within ``logprob_bound`` (nats), with the hits proven; a prompt that differs is a
FAIL naming it. A read-back request that failed where its re-compute answered is a difference too (the tier's
answer is missing); a failed re-compute request is an ERROR (there is no reference), never dropped.

Corruption (``corrupt:``): the byte flipped is inside a tensor's data (harness/node/kv_flip.py), recorded as a
step with its argv, output and exit status; the pool is the run's own (fresh, removed with the run's pool), so
nothing is undone elsewhere. Such a run is never PASS: a difference is a FAIL naming the prompt and the file (and,
when the engine served the read-back from the tier without an error, saying the connector checks no checksum);
no difference is INVALID ("corruption not detectable"); a flip that could not be made is INVALID.
"""

from __future__ import annotations

from pathlib import Path

import dataclasses
import json
import math
import posixpath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .kit.rederive import g2_phases
from ..engines import EngineProfile, load_profile
from ..engines.client import RequestRecord
from ..node import program_path
from ..parsers.pooldev import read_bytes_between
from .kit.base import PlannedStep, StrictModel, ValidityCheck, WorkloadResult, register_workload, write_gate_file, \
    write_summary
from .kit.engine import engine_python
from .kit.g2 import G2Evidence, G2Params, G2Setup, G2Procedure, evaluate_g2, reevaluate_g2

FLIP_PROGRAM = "kv_flip.py"


class CorruptSpec(StrictModel):
    """Flip one byte in the ``files`` stored KV files written last (the measured prompts', not the warm-up's) between
    the store and the read-back: the byte at ``byte_offset`` of the first tensor's data ("middle": the high byte of its
    middle element), XORed with ``xor`` (0x40: bf16's top exponent bit)."""

    byte_offset: Literal["middle"] | int = "middle"
    files: int = Field(default=1, ge=1, le=1000)
    xor: int = Field(default=0x40, ge=1, le=255)
    # safetensors (vLLM's ExampleConnector: the first tensor's data, header untouched) or raw (a file that is all
    # tensor bytes, e.g. LMCache's naive serde) of item_bytes elements (2: bf16 / fp16, 4: float32)
    format: Literal["safetensors", "raw"] = "safetensors"
    item_bytes: Literal[1, 2, 4, 8] = 2


class G2AnswerParams(G2Params):
    max_tokens: int = Field(default=8, ge=1, le=256)
    logprobs: int = Field(default=5, ge=1, le=20)
    # the largest |logprob difference| (nats) a token's logprob, or a top alternative both answers list, may show
    logprob_bound: float = Field(default=0.05, ge=0)
    # request fields beside logprobs: vLLM's return_tokens_as_token_ids makes each token its id ("token_id:N"),
    # so the sequences compare by id, not by decoded text
    request_extra: dict[str, Any] = Field(default_factory=lambda: {"return_tokens_as_token_ids": True})
    corrupt: CorruptSpec | None = None


class AnswerRow(BaseModel):
    """One prompt's two answers as compared: equal tokens, where they first differ, the largest logprob difference
    (None when there was nothing to compare), and why it is not the same (None when it is). The token sequences are
    shown space-joined (a flat row: the report's ``<gate>-answers.csv``); the exact lists, with every logprob, are
    the phases' ``requests-*.jsonl``, which the comparison reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    recompute_tokens: str = ""
    readback_tokens: str = ""
    same_tokens: bool = False
    first_difference_at: int | None = None
    # the answers parted on a near-tie (harness.workloads.g2_answer.near_tie): compared up to it, not a difference
    near_tie: bool = False
    max_abs_logprob_diff: float | None = None
    compared_logprobs: int = 0
    problem: str | None = None


class FlipRecord(BaseModel):
    """One file kvgate corrupted (kv_flip.py's line), or why it could not."""

    model_config = ConfigDict(extra="allow", frozen=True)

    file: str | None = None
    error: str | None = None
    tensor: str | None = None
    offset_in_file: int | None = None
    before: int | None = None
    after: int | None = None


class G2AnswerEvidence(G2Evidence):
    logprob_bound: float | None = None
    answers: list[AnswerRow] = []
    corruption_asked: dict[str, Any] | None = None
    corruption: list[FlipRecord] = []
    corruption_step: dict[str, Any] | None = None


def parse_flip_output(text: str) -> list[FlipRecord]:
    """Pure: kv_flip.py's standard output, one record per JSON line (a line that is not JSON is an error record)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            out.append(FlipRecord(error=f"not JSON: {line[:200]!r}"))
            continue
        out.append(FlipRecord.model_validate(obj) if isinstance(obj, dict)
                   else FlipRecord(error=f"not an object: {line[:200]!r}"))
    return out


def _logprob_diffs(a: RequestRecord, b: RequestRecord) -> list[float]:
    """Pure: |difference| of each generated token's logprob while both sequences agree, and of each top alternative
    both answers list at every position whose context is the same (up to and including the first where they part).
    NaN or inf on one side only is an infinite difference."""
    pairs: list[tuple[float | None, float | None]] = []
    for i in range(min(len(a.tokens), len(b.tokens))):
        ta = a.top_logprobs[i] if i < len(a.top_logprobs) else {}
        tb = b.top_logprobs[i] if i < len(b.top_logprobs) else {}
        pairs += [(ta[k], tb[k]) for k in ta if k in tb]
        if a.tokens[i] != b.tokens[i]:
            break
        pairs.append((a.token_logprobs[i] if i < len(a.token_logprobs) else None,
                      b.token_logprobs[i] if i < len(b.token_logprobs) else None))
    out = []
    for x, y in pairs:
        if x is None or y is None:
            continue
        d = 0.0 if x == y else abs(x - y)  # equal: also -inf on both sides
        out.append(math.inf if math.isnan(d) else d)
    return out


def near_tie(a: RequestRecord, b: RequestRecord, i: int, bound: float) -> bool:
    """Pure: whether two greedy answers part at position ``i`` on a near-tie: each lists the other's token among its
    top alternatives there, within ``bound`` of its own choice. Greedy decoding then picks by a rounding (a bf16
    logit's last bit), not by the KV: the answers are compared up to ``i`` and the prompt is counted as a near tie,
    not as a difference. A corrupted KV that moves a logprob by more than the bound is never a near tie."""
    def close(r: RequestRecord, other: str) -> bool:
        if i >= len(r.top_logprobs) or i >= len(r.token_logprobs) or r.token_logprobs[i] is None:
            return False
        alt = r.top_logprobs[i].get(other)
        return alt is not None and not math.isnan(alt) and abs(r.token_logprobs[i] - alt) <= bound
    return close(a, b.tokens[i]) and close(b, a.tokens[i])


def compare_answer(rc: RequestRecord | None, rb: RequestRecord | None, bound: float) -> AnswerRow:
    """Pure: one prompt's re-computed and read-back answers compared (either may be missing or failed)."""
    rid = (rc or rb).request_id
    if rc is None or not rc.ok:
        return AnswerRow(request_id=rid, problem=f"no re-computed answer: {rc.error if rc else 'not sent'}")
    if rb is None or not rb.ok:
        return AnswerRow(request_id=rid, recompute_tokens=" ".join(rc.tokens),
                         problem=f"no answer from the tier: {rb.error if rb else 'not sent'}")
    ta, tb = list(rc.tokens), list(rb.tokens)
    if not ta or not tb:
        return AnswerRow(request_id=rid, recompute_tokens=" ".join(ta), readback_tokens=" ".join(tb),
                         problem="the engine returned no logprobs (tokens) to compare")
    first = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    if first is None and len(ta) != len(tb):
        first = min(len(ta), len(tb))
    diffs = _logprob_diffs(rc, rb)
    worst = max(diffs) if diffs else None
    tie = first is not None and first < min(len(ta), len(tb)) and near_tie(rc, rb, first, bound)
    problem = None
    if first is not None and not tie:
        problem = f"tokens differ from position {first}: re-compute {ta[first:first + 3]}, tier {tb[first:first + 3]}"
    elif worst is not None and worst > bound:
        problem = f"a logprob differs by {worst:.4g} (bound {bound:g})"
    elif worst is None:
        problem = "no logprob to compare"
    return AnswerRow(request_id=rid, recompute_tokens=" ".join(ta), readback_tokens=" ".join(tb),
                     same_tokens=first is None, first_difference_at=first, near_tie=tie,
                     max_abs_logprob_diff=None if worst is None or math.isinf(worst) else worst,
                     compared_logprobs=len(diffs), problem=problem)


def compare_answers(recompute: list[RequestRecord], readback: list[RequestRecord], bound: float) -> list[AnswerRow]:
    """Pure: every prompt of either phase, in the re-compute's order (a prompt only one phase holds is kept)."""
    rb = {r.request_id: r for r in readback}
    rows = [compare_answer(r, rb.pop(r.request_id, None), bound) for r in recompute]
    return rows + [compare_answer(None, r, bound) for r in rb.values()]


def evaluate_answer(recompute: list[RequestRecord], readback: list[RequestRecord], proofs: WorkloadResult,
                    bound: float, corruption: list[FlipRecord] | None = None) -> WorkloadResult:
    """Pure: g2-answer's verdict from both phases' records and G2's proofs (``proofs``: :func:`evaluate_g2`'s result
    for the same phases: hits, cold reads, fall-back, new prompts, populated). ``corruption``: None for a clean
    run, else what kvgate flipped (an empty list: asked, none made).

    A difference with the tier's hits proven (or with a corruption made) is a failed check naming the prompt(s); a
    difference with the hits unproven is INVALID (the tier may not have served it). A failed re-compute request
    is an ERROR. A corrupted run without a difference is INVALID, never PASS."""
    ev: G2AnswerEvidence = proofs.evidence.model_copy()  # type: ignore[assignment]
    rows = compare_answers(recompute, readback, bound)
    ev.answers, ev.logprob_bound = rows, bound
    ev.corruption = list(corruption or [])
    bad = [r for r in rows if r.problem is not None and not r.problem.startswith("no re-computed answer")]
    no_ref = [r for r in rows if r.problem is not None and r.problem.startswith("no re-computed answer")]
    diffs = [r.max_abs_logprob_diff for r in rows if r.max_abs_logprob_diff is not None]
    metrics = {k: v for k, v in proofs.metrics.items() if k in ("hit_rate", "readback_device_read_bytes",
                                                              "readback_read_fraction", "log_hit_rate")}
    metrics.update(answer_mismatched_prompts=float(len(bad)), answer_prompts_compared=float(len(rows) - len(no_ref)),
                   answer_near_tie_prompts=float(sum(r.near_tie for r in rows)))
    if diffs:
        metrics["answer_max_abs_logprob_diff"] = max(diffs)
    flipped = [f for f in ev.corruption if f.error is None and f.file]
    error = None
    if no_ref:
        error = (f"{len(no_ref)} of {len(rows)} prompts have no re-computed answer (no reference); first: "
                 f"{no_ref[0].request_id}: {no_ref[0].problem}")
    ev.validity = list(proofs.evidence.validity) + _answer_checks(rows, bad, bound, corruption, flipped)
    failed, invalid = _judgement(rows, bad, proofs.invalid_reason, bound, corruption, flipped)
    return WorkloadResult(metrics=metrics, evidence=ev, invalid_reason=invalid, error=error, failed_check=failed)


def _judgement(rows: list[AnswerRow], bad: list[AnswerRow], unproven: str | None, bound: float,
               corruption: list[FlipRecord] | None, flipped: list[FlipRecord]) -> tuple[str | None, str | None]:
    """Pure: (failed check, invalid reason) of :func:`evaluate_answer`; ``unproven``: why G2's proofs of the read-back
    do not hold (None: hits and cold reads proven)."""
    if bad:
        named = "; ".join(f"{r.request_id}: {r.problem}" for r in bad[:5]) + (
            f" (and {len(bad) - 5} more)" if len(bad) > 5 else "")
        text = f"{len(bad)} of {len(rows)} prompts answered differently from the tier than re-computed: {named}"
        if flipped:
            text += f"; kvgate had flipped {_flips_text(flipped)}"
            if unproven is None and not any(r.problem.startswith("no answer from the tier") for r in bad):
                text += (": the engine served the corrupted KV from the tier without noticing (the connector "
                         "checks no checksum)")
            return text, None
        return (text, None) if unproven is None else (None, f"{text}; but {unproven}")
    if corruption is None:
        return None, unproven
    if not flipped:
        why = "; ".join(f.error or "?" for f in corruption) or "kv_flip.py reported nothing"
        return None, f"no byte could be flipped: {why}"
    if unproven is not None:  # e.g. a connector that checks its chunks fell back to re-compute: good
        return None, (f"kvgate flipped {_flips_text(flipped)}; every answer matched, but the read-back is not proven "
                      f"from the tier: {unproven} (a connector that noticed the corruption and re-computed looks like "
                      "this; the gate proves nothing either way)")
    return None, (f"corruption not detectable: kvgate flipped {_flips_text(flipped)} and every answer matched within "
                  f"the bound {bound:g}")


def _flips_text(flipped: list[FlipRecord]) -> str:
    return ", ".join(f"byte {f.offset_in_file} of {f.file} ({f'tensor {f.tensor}' if f.tensor else 'raw data'}: "
                     f"0x{f.before:02x} -> 0x{f.after:02x})"
                     if f.before is not None and f.after is not None else f"a byte of {f.file}" for f in flipped)


def _answer_checks(rows: list[AnswerRow], bad: list[AnswerRow], bound: float, corruption: list[FlipRecord] | None,
                   flipped: list[FlipRecord]) -> list[ValidityCheck]:
    """Pure: the answer check (and, on a corrupted run, whether the flip was made) as validity items."""
    out = [ValidityCheck(name="same answers", ok=not bad,
                         claim="every prompt read back from the tier answered as it did re-computed",
                         how=f"greedy output token ids equal and every compared logprob within {bound:g} nats, "
                             f"{len(rows)} prompt(s)" + (f"; first difference: {bad[0].request_id}: {bad[0].problem}"
                                                        if bad else "") + (
                             f"; {ties} parted on a near-tie (compared up to it)" if (ties := sum(
                                 r.near_tie for r in rows)) else ""),
                         figure="prompts answered differently", value=float(len(bad)), unit="count")]
    if corruption is not None:
        out.append(ValidityCheck(name="corruption made", ok=bool(flipped),
                                 claim="kvgate flipped a byte of stored KV data before the read-back",
                                 how=_flips_text(flipped) if flipped else "; ".join(f.error or "?" for f in corruption)
                                 or "kv_flip.py reported nothing",
                                 figure="files corrupted", value=float(len(flipped)), unit="count"))
    return out


def reevaluate_answer(evidence: dict[str, Any], recompute: list[RequestRecord], readback: list[RequestRecord],
                      device_read_bytes: int | None, fallback: str | None, p: G2AnswerParams,
                      prof: EngineProfile) -> WorkloadResult:
    """Pure: a bundle's g2-answer result again from its raw request records, as the run judged it (G2's proofs
    by :func:`evaluate_g2`, then :func:`evaluate_answer`); the flips as the run's kv_flip step recorded them."""
    proofs = reevaluate_g2(evidence, recompute, readback, device_read_bytes, fallback, p, prof,
                           model=G2AnswerEvidence)
    ev: G2AnswerEvidence = proofs.evidence  # type: ignore[assignment]
    return evaluate_answer(recompute, readback, proofs, p.logprob_bound,
                           ev.corruption if p.corrupt is not None else None)


def flip_argv(python: str, run_dir: str, pool_dir: str, pattern: str, spec: CorruptSpec) -> list[str]:
    """Pure: the corruption step's command on the node."""
    return [python, posixpath.join(run_dir, FLIP_PROGRAM), pool_dir, "--pattern", pattern, "--files",
            str(spec.files), "--offset", str(spec.byte_offset), "--xor", hex(spec.xor), "--format", spec.format,
            "--item-bytes", str(spec.item_bytes)]


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """g2-answer from the same raw files as g2-ttft (both phases' records hold each answer's tokens and logprobs),
    with the bound of config/gates.yaml, through the workload's own pure functions
    (harness.workloads.g2_answer.reevaluate_answer); the flipped bytes of a corrupted run as its step recorded them."""
    return reevaluate_answer(*g2_phases(gate_dir, result, params, ctx), params, load_profile(params.engine))


@register_workload("g2-answer")
class G2Answer(G2Procedure):
    """g2-ttft's procedure with the answers compared (and, with ``corrupt:``, a byte flipped between the phases)."""
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files

    Params = G2AnswerParams
    EvidenceModel = G2AnswerEvidence
    METRICS = {"answer_mismatched_prompts": "count", "answer_prompts_compared": "count",
               "answer_near_tie_prompts": "count",
               "answer_max_abs_logprob_diff": "", "hit_rate": "ratio", "readback_device_read_bytes": "B",
               "readback_read_fraction": "ratio", "log_hit_rate": "ratio"}
    # the corruption is made on a pool kvgate owns: never on an attached engine's
    LAUNCH_ONLY = G2Procedure.LAUNCH_ONLY + ("corrupt",)

    def _prompts(self, p: G2AnswerParams, prof, tok_spec, vocab, seed, ev):
        prompts, warm = super()._prompts(p, prof, tok_spec, vocab, seed, ev)
        extra = {"logprobs": p.logprobs, **p.request_extra}
        prompts = [dataclasses.replace(r, max_tokens=p.max_tokens, extra={**r.extra, **extra}) for r in prompts]
        return prompts, warm

    def _setup(self, p, prof, ev, engine, tok_spec, vocab, bpt, seed, pool_transport, pool_dir):
        ev = G2AnswerEvidence.model_validate(ev.model_dump())
        ev.logprob_bound = p.logprob_bound
        ev.corruption_asked = None if p.corrupt is None else p.corrupt.model_dump()
        return super()._setup(p, prof, ev, engine, tok_spec, vocab, bpt, seed, pool_transport, pool_dir)

    def _between_phases(self, ctx, p: G2AnswerParams, prof: EngineProfile, s: G2Setup) -> None:
        """With ``corrupt:``: flip a byte of stored KV on the node while the engine is stopped (a logged step)."""
        if p.corrupt is None:
            return
        node = next(iter(ctx.nodes.values()))
        python, run_dir = self._flip_python_and_dir(p, node, s)
        s.pool_transport.put(program_path(FLIP_PROGRAM), posixpath.join(run_dir, FLIP_PROGRAM))
        argv = flip_argv(python, run_dir, s.pool_dir, prof.pool_files or "*", p.corrupt)
        res = ctx.steps.run(s.pool_transport, "g2-answer-corrupt", argv, timeout_s=120)
        recs = parse_flip_output(res.stdout)
        if not recs:
            recs = [FlipRecord(error=f"kv_flip.py printed nothing ({res.summary()})")]
        s.ev.corruption = recs
        s.ev.corruption_step = {"argv": argv, "rc": res.rc, "stdout": res.stdout[-4000:]}
        write_gate_file(ctx.gate_dir / "corruption.json", json.dumps(s.ev.corruption_step, indent=1))

    @staticmethod
    def _flip_python_and_dir(p: G2AnswerParams, node: Any, s: G2Setup) -> tuple[str, str]:
        run_dir = s.ev.run_dir_on_node or posixpath.dirname(s.pool_dir)
        return engine_python(p.python, node.transport, node.engine_python), run_dir

    def _finish(self, ctx, p: G2AnswerParams, prof, rc, rb, log, expected_bytes, ev, fallback) -> WorkloadResult:
        recompute = rc.output if rc is not None else []
        readback = rb.output if rb is not None else []
        proofs = self._proofs(p, prof, rc, rb, log, expected_bytes, ev, fallback)
        result = evaluate_answer(recompute, readback, proofs, p.logprob_bound,
                                 ev.corruption if p.corrupt is not None else None)
        write_summary(ctx.gate_dir, "g2-summary.json", result)
        return result

    def _proofs(self, p, prof, rc, rb, log, expected_bytes, ev, fallback) -> WorkloadResult:
        """G2's proofs of the read-back (as g2-ttft judges them) for the answer evaluator."""
        counters = prof.hit_metrics is not None
        readback = rb.output if rb is not None else []
        hit = query = None
        if rb is not None and readback and counters:
            r = rb.engines["engine"]
            ev.engine_reported_read_bytes = r.delta(prof.hit_metrics.read_bytes)
            hit, query = r.delta(prof.hit_metrics.hit_tokens), r.delta(prof.hit_metrics.query_tokens)
        read_bytes = read_bytes_between(rb.device_before, rb.device_after) if rb is not None else None
        return evaluate_g2(rc.output if rc is not None else [], readback, hit, query, read_bytes, p.min_hit_rate,
                           expected_bytes, ev, fallback=fallback, counters=counters, log=log if readback else None,
                           device_reads=prof.device_reads, min_read_fraction=p.min_read_fraction)

    def plan(self, ctx) -> list[PlannedStep]:
        p: G2AnswerParams = ctx.params
        answers = (f"; each answer kept: {p.max_tokens} greedy token ids with their logprobs and top {p.logprobs} "
                   f"alternatives (compared, within {p.logprob_bound:g} nats)")
        steps = [dataclasses.replace(st, description=st.description + answers)
                 if st.description.startswith(("re-compute:", "read back:")) else st for st in super().plan(ctx)]
        if p.attach is not None or p.corrupt is None:
            return steps
        prof = load_profile(p.engine)
        node = next(iter(ctx.nodes.values()))
        _, v, *_ = self._plan_launched(ctx, p, prof)
        at = next(i for i, st in enumerate(steps)
                  if st.argv and st.argv[:2] == ("sh", "-c") and "drop_caches" in st.argv[2])
        c = p.corrupt
        what = "the first tensor's data" if c.format == "safetensors" else f"the {c.item_bytes}-byte elements' data"
        flip = PlannedStep(node.name, f"corrupt: flip byte {c.byte_offset} (xor 0x{c.xor:02x}) of {what} in the "
                           f"{c.files} KV file(s) stored last in {v['pool_dir']} (the run's own pool; no header "
                           "touched); recorded", tuple(flip_argv(v["python"], v["run_dir"], v["pool_dir"],
                                                                 prof.pool_files or "*", c)))
        return steps[:at] + [flip] + steps[at:]
