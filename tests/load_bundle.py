"""A g2-load run kept as a bundle's run directory: made on a scripted node (pool-device probes, the engine's
pre-flight, a spawned engine that leaves its log) with an engine double that serves repeated prefixes from its
tier (tier hit counters), its gate's result.json and verdict written as a run writes them; for the tests of what
`kvgate report` re-derives from such a bundle's raw files."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import httpx
import yaml

import doubles
from harness.config import load_config
from harness.gates.verdict import evaluate, overall_outcome
from harness.transport.doubles import Reply, ScriptedTransport
from harness.workloads import WORKLOADS
from report_fixture import FIXED

ENGINE_LOG = "cpu-reference: listening on 127.0.0.1\ncpu-reference: served\n"
FALLBACK_LINE = "[2026-01-01 10:00:00] LMCache WARNING: System will operate in degraded mode (recompute)\n"
PARAMS = {"engine": "cpu-reference", "python": "/engine/bin/python", "port": 18000, "trials": 6, "ttft_slo_s": 1.0,
          "max_tokens": 2, "load": {"concurrency": [1, 2]}, "requests_per_point": 3, "prompt_tokens": 64,
          "shared_prefix_tokens": 32}


class TierEngine:
    """The cpu-reference engine's HTTP API as a MockTransport handler: a first 32-token block it has seen before
    is a tier hit (``external_hit``), and a streaming completion."""

    def __init__(self):
        self.prompt = self.tier_hit = 0
        self.seen: set[tuple[int, ...]] = set()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/metrics":
            text = "".join(f"kvgate_cpu_ref_{k}_tokens_total {v}\n" for k, v in
                           (("prompt", self.prompt), ("gpu_hit", 0), ("external_hit", self.tier_hit),
                            ("external_query", self.prompt)))
            return httpx.Response(200, text=text)
        ids = json.loads(request.content)["prompt"]
        self.prompt += len(ids)
        head = tuple(ids[:32])
        self.tier_hit += 32 if head in self.seen else 0
        self.seen.add(head)
        body = 'data: {"choices": [{"text": " a"}]}\n\ndata: {"choices": [{"text": " b"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def scripted_node(engine_log: str) -> ScriptedTransport:
    """The node: pool-device probes that read nothing (the pool's device counters never grow), the engine's
    pre-flight, and a spawned engine that leaves ``engine_log`` on the node."""
    files: dict[str, bytes] = {}

    def handler(call):
        if call.spawned:
            files[call.log_path] = engine_log.encode()
            return Reply()
        if call.argv[0] == "mkdir":
            return Reply()
        if "kvgate-pool-blockstat" in call.argv:
            return Reply(stdout="kvgate-pool-device 8:1 /dev/sda1\n1 0 5000 0 1 0 2048 0 0 0 0\n")
        if call.argv[0] == "/engine/bin/python":
            return Reply(stdout=doubles.PREFLIGHT_CPU_REFERENCE)
        return Reply(rc=127, stderr=f"{call.argv[0]}: not expected")
    return ScriptedTransport(handler, name="n1", files=files)


def load_run(tmp: Path, params: dict | None = None, engine_log: str = ENGINE_LOG,
             metric: str = "knee_concurrency", pass_: str = ">= 2") -> tuple[Path, dict]:
    """A g2-load gate ``L`` run into ``tmp/run`` (config/, gates/L/, steps/) and its predicate as the run signs it
    (the fixed predicate's shape, this gate's verdict)."""
    run = Path(tmp) / "run"
    (run / "config").mkdir(parents=True)
    gate = {"id": "L", "title": "load", "workload": "g2-load", "params": {**PARAMS, **(params or {})},
            "metric": metric, "pass": pass_}
    (run / "config" / "gates.yaml").write_text(yaml.safe_dump({"suite": {"name": "t", "version": "1"},
                                                               "gates": [gate]}, sort_keys=False))
    (run / "config" / "inventory.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n1", "transport": "local",
                                                                              "work_dir": "/w"}]}))
    cfg = load_config(run / "config" / "inventory.yaml", run / "config" / "gates.yaml", WORKLOADS,
                      trials_rule=False)  # its device proof off (a scripted device): as a bundle re-read
    ctx = doubles.gate_context(run, cfg, transports={"n1": scripted_node(engine_log)}, http=TierEngine())
    result = WORKLOADS["g2-load"]().run(ctx)
    (ctx.gate_dir / "result.json").write_text(json.dumps(result.as_dict(), indent=1, default=str))
    g = cfg.suite.gates[0]
    v = evaluate(g, result, WORKLOADS["g2-load"].metric_unit(g.metric), WORKLOADS["g2-load"].metric_unit)
    pred = copy.deepcopy(json.loads((FIXED / "predicate.json").read_text()))
    pred["verdicts"] = [json.loads(json.dumps(v.to_dict(), default=str))]
    pred["overall"] = overall_outcome([v]).value
    return run, pred
