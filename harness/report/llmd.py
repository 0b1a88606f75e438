"""A load point in llm-d's Benchmark Report format (v0.2.1), so tools built for that format read kvgate's runs.

The report has ``version``, ``run`` (a unique id, start, end, ISO-8601 duration), ``scenario`` (the stack: one
inference engine component; the load: kvgate as the tool, the rate or concurrency, the prompt and output
lengths) and ``results.request_performance.aggregate`` (request counts and lengths, TTFT / TPOT / ITL / request
latency statistics in seconds, request and token rates). Pure: from a point's records to a dict;
``llmd-benchmark-report`` (PyPI, llm-d's own schema and validators) accepts what this writes (tests).

Output lengths are the streamed chunks that carried text: one token per chunk on vLLM and the engines kvgate
runs, which stream token by token; a server that batches tokens into chunks would be under-counted.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from .. import __version__
from ..engines.load import LoadRecord
from ..stats import percentile

VERSION = "0.2.1"
_PCTS = (("p0p1", 0.1), ("p1", 1), ("p5", 5), ("p10", 10), ("p25", 25), ("p50", 50), ("p75", 75), ("p90", 90),
         ("p95", 95), ("p99", 99), ("p99p9", 99.9))


@dataclass(frozen=True)
class EngineInfo:
    """The engine a load point ran against, as the report's inference_engine component says it."""

    tool: str                       # vllm, sglang, cpu-reference, openai ...
    tool_version: str
    model: str
    accelerator: str = "cpu"        # an accelerator model, or cpu
    accelerator_count: int = 0
    label: str = "engine-0"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadInfo:
    """The load of the point: a request rate (open loop) or a concurrency (closed loop)."""

    rate_rps: float | None = None
    concurrency: int | None = None
    stage: int = 0
    multi_turn: bool = False
    description: str | None = None


def statistics(values: Sequence[float], units: str) -> dict[str, Any] | None:
    """The schema's Statistics of the finite values (None when there are none)."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    out: dict[str, Any] = {"units": units, "mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}
    if len(xs) > 1:
        mean = out["mean"]
        out["stddev"] = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5
    for name, q in _PCTS:
        out[name] = percentile(xs, q)
    return out


def _iso(unix_s: float) -> str:
    return datetime.datetime.fromtimestamp(unix_s, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def _seq_len(values: list[int]) -> dict[str, Any]:
    if values and min(values) == max(values):
        return {"distribution": "fixed", "value": values[0]}
    mean = sum(values) / len(values) if values else 0
    return {"distribution": "other", "value": mean, "min": min(values, default=0), "max": max(values, default=1)}


def _cfg_id(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _load_standardized(load: LoadInfo, inputs: list[int], outputs: list[int]) -> dict[str, Any]:
    """The scenario's standardized load: kvgate as the tool, the rate or concurrency, the sequence lengths."""
    load_std: dict[str, Any] = {"tool": "kvgate", "tool_version": __version__, "source": "random",
                                "stage": load.stage, "input_seq_len": _seq_len(inputs)}
    if outputs:
        load_std["output_seq_len"] = _seq_len(outputs)
    if load.rate_rps is not None:
        load_std["rate_qps"] = load.rate_rps
    if load.concurrency is not None:
        load_std["concurrency"] = load.concurrency
    if load.multi_turn:
        load_std["multi_turn"] = {"enabled": True}
    return load_std


def _engine_component(engine: EngineInfo) -> dict[str, Any]:
    """The stack's one component: the engine, as an inference_engine replica with its args."""
    return {
        "metadata": {"label": engine.label, "cfg_id": _cfg_id([engine.tool, engine.tool_version, engine.args])},
        "standardized": {"kind": "inference_engine", "tool": engine.tool, "tool_version": engine.tool_version,
                         "role": "replica", "replicas": 1, "model": {"name": engine.model},
                         "accelerator": {"model": engine.accelerator, "count": engine.accelerator_count,
                                         "parallelism": {"tp": 1, "dp": 1, "dp_local": 1, "workers": 1, "ep": 1,
                                                         "pp": 1}}},
        "native": {"args": dict(engine.args)},
    }


def benchmark_report(uid: str, records: Sequence[LoadRecord], started_unix_s: float, engine: EngineInfo,
                     load: LoadInfo, description: str | None = None) -> dict[str, Any]:
    """Pure: one load point as a Benchmark Report v0.2.1 (a dict ready for JSON)."""
    if not records:
        raise ValueError("a benchmark report needs at least one request")
    ok = [r for r in records if r.record.ok]
    end_s = max(r.sent_s + (r.record.e2e_s or 0.0) for r in records)
    start_s = min(r.sent_s for r in records)
    duration = max(end_s - start_s, 1e-9)
    inputs = [r.record.prompt_tokens for r in records if r.record.prompt_tokens is not None]
    outputs = [r.record.output_chunks for r in ok]
    tpot = [(r.record.latency_s - r.record.ttft_s) / (r.record.output_chunks - 1) for r in ok
            if r.record.latency_s is not None and r.record.ttft_s is not None and r.record.output_chunks > 1]
    in_tokens = sum(r.record.prompt_tokens or 0 for r in ok)
    out_tokens = sum(outputs)
    latency = {k: v for k, v in {
        "time_to_first_token": statistics([r.record.ttft_s for r in ok], "s"),
        "time_per_output_token": statistics(tpot, "s/token"),
        "inter_token_latency": statistics([x for r in ok for x in r.record.itl_s], "s/token"),
        "request_latency": statistics([r.record.e2e_s for r in ok], "s"),
    }.items() if v is not None}
    requests: dict[str, Any] = {"total": len(records), "failures": len(records) - len(ok)}
    if inputs:
        requests["input_length"] = statistics(inputs, "count")
    if outputs:
        requests["output_length"] = statistics(outputs, "count")
    load_std = _load_standardized(load, inputs, outputs)
    component = _engine_component(engine)
    run: dict[str, Any] = {"uid": uid, "time": {"start": _iso(started_unix_s + start_s),
                                                "end": _iso(started_unix_s + end_s), "duration": f"PT{duration:.6f}S"}}
    if description:
        run["description"] = description
    load_meta: dict[str, Any] = {"cfg_id": _cfg_id(load_std)}
    if load.description:
        load_meta["description"] = load.description
    return {
        "version": VERSION,
        "run": run,
        "scenario": {"stack": [component], "load": {"metadata": load_meta, "standardized": load_std, "native": {}}},
        "results": {"request_performance": {"aggregate": {
            "requests": requests,
            "latency": latency,
            "throughput": {
                "request_rate": {"units": "queries/s", "mean": len(ok) / duration},
                "input_token_rate": {"units": "tokens/s", "mean": in_tokens / duration},
                "output_token_rate": {"units": "tokens/s", "mean": out_tokens / duration},
                "total_token_rate": {"units": "tokens/s", "mean": (in_tokens + out_tokens) / duration},
            },
        }}},
    }
