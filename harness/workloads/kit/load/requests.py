"""The requests of a point: prompts (token ids or text), synthetic points, a trace's requests, the trace read and
described."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from ....engines import EngineProfile
from ....engines.client import CompletionRequest
from ....engines.prompts import IdsAsText, load_tokenizer
from ....load.prompts import block_ids, prompt_ids
from ....load.reuse import reuse_stats
from ....load.synth import shape_trace
from ....load.traces import MAX_TRACE_BYTES, Trace, cut, read_trace, scale_time, trace_lines
from ....safeio import read_bytes
from ..base import file_error_text
from .evidence import G2LoadEvidence, TraceInfo
from .spec import G2LoadParams, LoadSpec, MULTI_TURN_PATH, MultiTurnLoad


# ----------------------------------------------------------------------------------------------- prompts


def point_seed(seed: int, label: str, trial: int) -> int:
    """Pure: the seed of a point × trial's prompts (and arrivals): new prompts at every point and trial."""
    return int(hashlib.sha256(f"kvgate-g2-load:{seed}:{label}:{trial}".encode()).hexdigest()[:12], 16)


@dataclass(frozen=True)
class LoadPrompts:
    """How a run's prompts reach the engine: the token ids drawn from a vocabulary of ``vocab_size``, sent as they
    are, or (``text``: the profile's API takes text only) as text the model's tokenizer encodes back to them, so
    prompts sharing ids still share their tokens (harness.engines.prompts.IdsAsText)."""

    vocab_size: int
    text: IdsAsText | None = None

    def finish(self, reqs: list[CompletionRequest]) -> list[CompletionRequest]:
        """The requests as sent (ValueError when the tokenizer cannot carry their ids as text)."""
        if self.text is None:
            return reqs
        t = self.text
        return [dataclasses.replace(r, prompt=t.text(r.prompt), prompt_tokens=t.tokens(r.prompt)) for r in reqs]


def load_prompts(prof: EngineProfile, setup_ev: Any, vocab_size: int,
                 ev: "G2LoadEvidence | None" = None) -> LoadPrompts:
    """The prompts a run sends, from the engine set-up's evidence (its tokenizer, when G2 built text prompts);
    records their kind in ``ev``. ValueError: the API takes text only and no tokenizer is known, or it cannot be
    read or used."""
    if not prof.api.text_only:
        if ev is not None:
            ev.prompt_kind = "token_ids"
        return LoadPrompts(vocab_size)
    tok = getattr(setup_ev, "tokenizer", None)
    if not tok:
        raise ValueError(f"profile {prof.name!r} takes text prompts only: give the model's tokenizer.json (tokenizer:)")
    try:
        text = IdsAsText(load_tokenizer(tok))
    except (OSError, ValueError) as exc:
        raise ValueError(f"tokenizer {tok}: {exc}") from None
    if ev is not None:
        ev.prompt_kind, ev.tokenizer = "text", tok
    return LoadPrompts(vocab_size, text)


def synthetic_requests(p: G2LoadParams, label: str, trial: int, seed: int, vocab_size: int) -> list[CompletionRequest]:
    """Pure: a point × trial's prompts: ``prompt_tokens`` token ids each, the first ``shared_prefix_tokens`` shared
    by the requests of one prefix group (round-robin), the rest the request's own."""
    out = []
    own = p.prompt_tokens - p.shared_prefix_tokens
    for j in range(p.requests_per_point):
        prefix = block_ids(j % p.prefix_groups, p.shared_prefix_tokens, vocab_size, seed)
        ids = prefix + block_ids(1_000_000 + j, own, vocab_size, seed)
        out.append(CompletionRequest(request_id=f"{label}-t{trial}-{j}", prompt=ids, max_tokens=p.max_tokens,
                                     prompt_tokens=len(ids)))
    return out


def trace_requests(p: G2LoadParams, trace: Trace, tokens_per_block: int, label: str, trial: int, seed: int,
                   vocab_size: int) -> tuple[list[CompletionRequest], list[float]]:
    """Pure: a trace's requests (prompts from its hash ids, outputs cut to ``max_tokens``) and send times (s)."""
    reqs, offsets = [], []
    for j, r in enumerate(trace.requests):
        ids = prompt_ids(r, trace.block_tokens, vocab_size, seed, tokens_per_block)
        reqs.append(CompletionRequest(request_id=f"{label}-t{trial}-{j}", prompt=ids,
                                      max_tokens=max(1, min(r.output_tokens, p.max_tokens)), prompt_tokens=len(ids)))
        offsets.append(r.t_ms / 1000.0)
    return reqs, offsets


def load_trace(spec: LoadSpec) -> Trace:
    """The trace of a ``load:`` block, cut and time-scaled (ConfigError naming file:line: field); multi-turn
    sessions' trace synthesised from their shape (pure)."""
    shape = spec.shape
    if shape is not None:
        return scale_time(cut(shape_trace(*shape), spec.max_requests, spec.max_duration_s),
                          1.0 / (spec.time_scale or 1.0))
    trace = read_trace(spec.path, spec.format or "auto", spec.block_tokens)
    trace = cut(trace, spec.max_requests, spec.max_duration_s)
    if not trace.requests:
        raise ValueError(f"{spec.path}: no requests left after max_requests / max_duration_s")
    return scale_time(trace, 1.0 / (spec.time_scale or 1.0))


def read_load_trace(spec: LoadSpec) -> tuple[Trace, TraceInfo]:
    """The trace of a ``load:`` block, cut and time-scaled, and what the evidence records of it (its sha256, its
    shape, its unbounded-cache hit rate); ConfigError, InputFileError or ValueError when it cannot be read."""
    trace = load_trace(spec)
    shape = spec.shape
    if shape is not None:  # its digest: of the trace as `kvgate trace synth` would write it
        raw = "".join(line + "\n" for line in trace_lines(trace)).encode()
    else:
        raw = read_bytes(spec.path, max_bytes=MAX_TRACE_BYTES, what="trace")
    path = spec.path or (MULTI_TURN_PATH if spec.multi_turn is not None else f"(synthesised: {shape[0]})")
    return trace, TraceInfo(path=path, format=trace.format, block_tokens=trace.block_tokens,
                            tokens_per_block=spec.tokens_per_block or trace.block_tokens,
                            time_scale=spec.time_scale or 1.0, requests=len(trace.requests),
                            duration_s=trace.duration_s, sha256=hashlib.sha256(raw).hexdigest(),
                            unbounded_hit_rate=reuse_stats(trace).unbounded_hit_rate,
                            multi_turn=spec.multi_turn, shape=shape[0] if shape else None,
                            shape_params=dataclasses.asdict(shape[1]) if shape else None, users=spec.users)


def trace_source_text(spec: LoadSpec) -> str:
    """Pure: where a trace load's requests come from, in words (a file and its cuts, or a declared shape)."""
    shape = spec.shape
    if shape is not None:
        if spec.multi_turn is not None:
            return multi_turn_text(spec.multi_turn)
        fields = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in dataclasses.asdict(shape[1]).items())
        return f"the {shape[0]} shape ({fields}; harness/load/synth.py, as `kvgate trace synth --shape {shape[0]}`)"
    cuts = [f"first {spec.max_requests} requests" if spec.max_requests else "",
            f"within {spec.max_duration_s:g} s" if spec.max_duration_s else "",
            f"{spec.tokens_per_block} tokens per hash id" if spec.tokens_per_block else ""]
    return (f"{spec.path} ({spec.format or 'format from its first line'}"
            f"{', ' + ', '.join(c for c in cuts if c) if any(cuts) else ''})")


def trace_error(spec: LoadSpec, exc: Exception) -> str:
    """Pure: why a ``load:`` trace could not be read, on one line naming its path once (the run's ERROR)."""
    return file_error_text("trace", spec.path or "(synthesised)", exc)


def multi_turn_text(m: MultiTurnLoad) -> str:
    """Pure: multi-turn sessions' replay in words (the plan's and the report's)."""
    shape = m.shape()
    return (f"multi-turn sessions: {m.sessions} sessions x {m.turns} turns round-robin ({m.sessions * m.turns} "
            f"requests, {1 / m.rate_rps:g} s apart), turn 1 {m.first_prompt_tokens} tokens, each later turn the "
            f"session's whole history plus a {m.reply_tokens}-token reply and a {m.user_tokens}-token user message "
            f"(turn {m.turns}: {shape.prompt_tokens(m.turns)} tokens)")


def load_fields(p: G2LoadParams) -> dict[str, Any]:
    """Pure: the load and its bounds as g2-load's evidence records them (the fields of :class:`G2LoadEvidence`)."""
    synthetic = p.load.kind != "trace"
    return dict(load_kind=p.load.kind, loads=[load for _, load in p.load.points()] if synthetic else [],
                burstiness=(p.load.burstiness or 1.0) if p.load.kind == "open" else None, trials=p.trials,
                requests_per_point=p.requests_per_point if synthetic else None,
                prompt_tokens=p.prompt_tokens if synthetic else None,
                shared_prefix_tokens=p.shared_prefix_tokens if synthetic else None,
                prefix_groups=p.prefix_groups if synthetic else None, max_tokens=p.max_tokens,
                ttft_slo_s=p.ttft_slo_s, tpot_slo_s=p.tpot_slo_s, knee_percentile=p.knee_percentile,
                knee_figure=f"ttft_p{p.knee_percentile}_s", max_client_lag_p99_s=p.max_client_lag_p99_s,
                max_failed_share=p.max_failed_share, min_read_fraction=p.min_read_fraction,
                repeat_spoiled=p.repeat_spoiled)


