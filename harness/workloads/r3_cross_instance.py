"""R3: can one engine instance hit the KV copy another instance wrote to the shared pool?

Two nodes, each with a `directory` target where the shared pool is mounted (the same pool seen from both;
on the kvgate rig an sshfs mount through the storage namespace's shaped port):
1. Start the engine on the writer node A and on the reader node B, each a fresh process with its own
   LMCache (its local CPU cache starts empty) and an fs:// pool in the same fresh run directory of the
   shared pool, so every prompt is new to both.
2. A serves the prompts: its hit counter must stay at zero (the prompts were new), and it stores their KV.
3. Wait until the pool holds the expected KV bytes, as seen from A, and record what B sees there.
4. B, which has never seen the prompts, serves the same prompts; `hit_rate` = B's hit tokens / B's looked
   up tokens over this phase, from its own counters. B's engine-reported read bytes are recorded.
Requests are sent from each node to its engine on the node's loopback (the reference engine listens on
loopback only), by a stdlib Python client run through the node's transport; kvgate waits for each engine
through an SSH port forward to that loopback port.

The engine travels to the node as one file (``harness/engines/cpu_reference.py``, put into the run
directory), so nodes need an engine environment with torch, transformers and lmcache, not kvgate: the gate's
``python``, else the node's ``engine_python``, else python3 on the node.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any

from pydantic import Field, model_validator

from ..engines import DEFAULT_CPU_REF_MODEL, kv_bytes_per_token, lmcache_config, load_profile, shell_line
from ..engines.preflight import preflight_argv
from ..engines.prompts import make_prompts
from ..execute.fanout import fan_out
from ..parsers.prometheus import counter_delta, metric_total, parse_prometheus
from .base import (Evidence, GateContext, PlannedStep, PoolSnapshot, StrictModel, Workload, WorkloadResult,
                   register_workload, target_path, write_summary, write_gate_file)
from .engine import (FREE_PORT_CODE, EngineProcess, client_base_url, engine_port, engine_preflight, engine_values,
                     fallback_reason, model_config_issues, node_engine_python, pool_contents, pool_files_argv,
                     profile_issues, stage_engine_files, start_engine)

# Runs on the node: POST every prompt to the engine on the node's loopback, then GET /metrics.
# argv: URL MODEL PROMPTS_JSON MAX_TOKENS TIMEOUT_S; prints one JSON object.
NODE_CLIENT = r"""
import json, sys, time, urllib.request
url, model, prompts_path, max_tokens, timeout_s = sys.argv[1:6]
def metrics():
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        return r.read().decode()
before = metrics()
records = []
for p in json.load(open(prompts_path)):
    body = json.dumps({"model": model, "prompt": p["ids"], "max_tokens": int(max_tokens), "stream": False}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=float(timeout_s)) as r:
            out = json.loads(r.read())
        records.append({"id": p["id"], "ok": True, "elapsed_s": time.time() - t0, "usage": out.get("usage")})
    except Exception as exc:
        records.append({"id": p["id"], "ok": False, "elapsed_s": time.time() - t0, "error": repr(exc)[:300]})
print(json.dumps({"metrics_before": before, "records": records, "metrics_after": metrics()}))
"""


class R3Params(StrictModel):
    engine: str = "cpu-reference"
    writer: str | None = None  # node A (default: the gate's first node)
    reader: str | None = None  # node B (default: the gate's second node)
    pool_target: str = "kvpool"  # a directory target on both nodes: the shared pool's mount
    pool_subdir: str = "kvgate-r3"
    served_model_name: str = "kvgate-r3"
    model_config_inline: dict[str, Any] | None = None
    prompt_tokens: list[int] = Field(default_factory=lambda: [1536], min_length=1)
    prompts_per_length: int = Field(default=2, ge=1, le=1000)
    max_tokens: int = Field(default=2, ge=1, le=4096)
    seed: int = 0
    python: str | None = None  # default: the node's engine_python, else python3 on the node
    populate_timeout_s: float = Field(default=120.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _two(self):
        if self.writer and self.reader and self.writer == self.reader:
            raise ValueError("writer and reader must be different nodes")
        if any(n < 2 for n in self.prompt_tokens):
            raise ValueError("every prompt length must be >= 2 tokens")
        return self


class R3Evidence(Evidence):
    """R3's evidence: both roles and their layout, both engines' counter deltas, the pool as each node saw it."""

    engine_profile: str | None = None
    versions: dict[str, dict[str, str]] = {}  # node -> the engine's distributions, read by the pre-flight
    writer: str | None = None
    reader: str | None = None
    run_tag: str | None = None
    kv_bytes_per_token: int | None = None
    expected_kv_bytes: int | None = None
    prompts: int | None = None
    prompt_tokens: list[int] = []
    seed: int | None = None
    layout: dict[str, dict[str, Any]] = {}
    lmcache_config: dict[str, Any] | None = None
    pool_after_writer: PoolSnapshot | None = None
    pool_seen_from_reader_before: PoolSnapshot | None = None
    pool_seen_from_reader_after: PoolSnapshot | None = None
    writer_hit_tokens: float | None = None
    writer_query_tokens: float | None = None
    reader_hit_tokens: float | None = None
    reader_query_tokens: float | None = None
    reader_query_tokens_before: float | None = None
    reader_read_bytes: float | None = None
    pool_bytes_before_reader: int | None = None
    failed_requests: list[str] = []
    note: str | None = None


def evaluate_r3(writer_hit: float | None, writer_query: float | None, reader_hit: float | None,
                reader_query: float | None, failed_requests: list[str], pool_bytes: int,
                expected_kv_bytes: int, evidence: R3Evidence | None = None, fallback: str | None = None,
                reader_looked_up_before: bool = False) -> WorkloadResult:
    """Pure: R3 metrics and validity from both engines' counter deltas, the pool's state, and what the engines'
    logs and counters said before the phases (``fallback``: an engine's log says the tier silently did nothing;
    ``reader_looked_up_before``: the reader was not fresh). The result carries a copy of ``evidence``."""
    metrics: dict[str, float] = {}
    ev = (evidence or R3Evidence()).model_copy(update=dict(
        writer_hit_tokens=writer_hit, writer_query_tokens=writer_query, reader_hit_tokens=reader_hit,
        reader_query_tokens=reader_query, pool_bytes_before_reader=pool_bytes, expected_kv_bytes=expected_kv_bytes,
        failed_requests=failed_requests))
    invalid = fallback or ("the reader engine had looked up prompts before its phase" if reader_looked_up_before
                           else None)
    if reader_hit is not None and reader_query:
        metrics["hit_rate"] = reader_hit / reader_query
    if failed_requests:
        return WorkloadResult(metrics, ev, invalid_reason=invalid,
                              error=f"{len(failed_requests)} request(s) failed; first: {failed_requests[0]}")
    if reader_hit is None or not reader_query:
        return WorkloadResult(metrics, ev, invalid_reason=invalid,
                              error="the reader engine exposed no hit/query counters for its phase")
    if writer_hit is None or writer_query is None:
        return WorkloadResult(metrics, ev, invalid_reason=invalid, error="the writer engine exposed no hit/query counters")
    if writer_hit > 0:
        invalid = invalid or f"the writer hit {writer_hit:.0f} tokens: the prompts were not new to the pool"
    if pool_bytes <= 0:
        # Not INVALID: a writer whose KV never reaches the pool is the failure R3 exists to catch.
        ev.note = "the pool held no bytes after the writer's phase"
    return WorkloadResult(metrics, ev, invalid_reason=invalid)


@register_workload("r3-cross-instance")
class R3CrossInstance(Workload):
    Params = R3Params
    EvidenceModel = R3Evidence
    METRICS = {"hit_rate": "ratio"}

    def _roles(self, p: R3Params, nodes: dict) -> tuple[str | None, str | None]:
        names = list(nodes)
        writer = p.writer or (names[0] if names else None)
        reader = p.reader or next((n for n in names if n != writer), None)
        return writer, reader

    def validate_against(self, params, nodes):
        prof, issues = profile_issues(params.engine, nodes, "r3-cross-instance", node_count=2)
        if prof is None:
            return issues[:1]  # the profile does not load
        if not (prof.capabilities.builds_model and prof.hit_metrics is not None and prof.launches):
            issues.insert(0, (("engine",), f"r3-cross-instance runs engines kvgate launches on each node with a model "
                              f"built from its config and hit counters (profile capabilities.builds_model, "
                              f"hit_metrics); profile {prof.name!r} lacks them"))
        issues += model_config_issues(params.model_config_inline, "model_config_inline", prof.capabilities.kv_dtype)
        writer, reader = self._roles(params, nodes)
        for key, n in (("writer", writer), ("reader", reader)):
            if n is None or n not in nodes:
                issues.append(((key,), f"{key} {n!r} is not among the gate's nodes ({', '.join(nodes)})"))
                continue
            t = nodes[n].target(params.pool_target)
            if t is None or t.kind != "directory":
                issues.append((("pool_target",), f"node {n!r} has no directory target {params.pool_target!r}"))
        return issues

    # ----------------------------------------------------------------------------------- layout

    def _layout(self, ctx: GateContext, prof, node, port: int, tag: str) -> dict[str, Any]:
        p: R3Params = ctx.params
        run_dir = posixpath.join(node.work_dir, f"kvgate-r3-{ctx.gate.id}-{tag}-{node.name}")
        pool = posixpath.join(target_path(node, node.target(p.pool_target)), p.pool_subdir, f"run-{tag}")
        return engine_values(prof, python=node_engine_python(p.python, node), host="127.0.0.1", port=port,
                             model=p.served_model_name,
                             served_model_name=p.served_model_name, seed=p.seed, run_dir=run_dir, pool_dir=pool,
                             max_model_len=max(p.prompt_tokens) + p.max_tokens + 16)

    def _model_config(self, p: R3Params) -> dict[str, Any]:
        return dict(p.model_config_inline) if p.model_config_inline is not None else dict(DEFAULT_CPU_REF_MODEL)

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: R3Params = ctx.params
        prof = load_profile(p.engine)
        writer, reader = self._roles(p, ctx.nodes)
        n = len(p.prompt_tokens) * p.prompts_per_length
        out = []
        for role, name in (("writer", writer), ("reader", reader)):
            v = self._layout(ctx, prof, ctx.nodes[name], 8000, "<run>")
            argv, env = prof.render_argv(v), prof.render_env(v)
            out.append(PlannedStep(name, f"{role}: pre-flight: the engine's interpreter imports what the profile "
                                   "declares", tuple(preflight_argv(node_engine_python(p.python, ctx.nodes[name]), prof))))
            out.append(PlannedStep(name, f"{role}: a free port on the node's loopback",
                                   (node_engine_python(p.python, ctx.nodes[name]), "-c", FREE_PORT_CODE)))
            out.append(PlannedStep(name, f"{role}: create {v['run_dir']} and the run's pool directory {v['pool_dir']}",
                                   ("mkdir", "-p", v["run_dir"], v["pool_dir"], posixpath.join(v["run_dir"], "prometheus")),
                                   files={v["lmcache_config"]: json.dumps(lmcache_config(prof.lmcache, v), indent=1)}
                                   if prof.lmcache else {}))
            out.append(PlannedStep(name, f"{role}: start a fresh {prof.name} engine: {shell_line(argv, env)}", tuple(argv)))
        out.append(PlannedStep(writer, f"writer: serve {n} new prompts of {p.prompt_tokens} tokens (stores their KV); "
                               "hit counter must stay 0", ("python3", "-c", "<client>")))
        out.append(PlannedStep(writer, "wait until the finished chunk files in the pool hold the expected KV bytes",
                               tuple(pool_files_argv("<pool>"))))
        out.append(PlannedStep(reader, f"reader (never saw them): serve the same {n} prompts; hit_rate = hit / looked-up "
                               "tokens from its counters", ("python3", "-c", "<client>")))
        out.append(PlannedStep(writer, "stop both engines (process groups); fetch their logs"))
        return out

    # -------------------------------------------------------------------------------------- run

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: R3Params = ctx.params
        prof = load_profile(p.engine)
        writer, reader = self._roles(p, ctx.nodes)
        tag = uuid.uuid4().hex[:8]
        model_cfg = self._model_config(p)
        bpt = kv_bytes_per_token(model_cfg, prof.capabilities.kv_dtype)
        vocab = int(model_cfg.get("vocab_size", 4096))
        prompts = make_prompts(p.seed, p.prompt_tokens, p.prompts_per_length, vocab)
        expected = sum(r.prompt_tokens for r in prompts) * bpt
        ev = R3Evidence(engine_profile=prof.name, writer=writer, reader=reader, run_tag=tag, kv_bytes_per_token=bpt,
                        expected_kv_bytes=expected, prompts=len(prompts), prompt_tokens=list(p.prompt_tokens),
                        seed=p.seed)
        write_gate_file(ctx.gate_dir / "prompts.json", json.dumps([{"id": r.request_id, "ids": r.prompt} for r in prompts]))

        # 1. Per node: a free loopback port, directories, model config, LMCache YAML, the engine program, prompts.
        def prepare(name: str, role: str) -> dict[str, Any]:
            t, node = ctx.transports[name], ctx.nodes[name]
            versions, err = engine_preflight(ctx, t, name, prof, node_engine_python(p.python, node), f"r3-{role}-preflight")
            if err:
                raise RuntimeError(err)
            v = self._layout(ctx, prof, node, engine_port(ctx, t, node, 0, node_engine_python(p.python, node),
                                                          f"r3-{role}-port"), tag)
            err, cfg = stage_engine_files(ctx, t, prof, v, ctx.gate_dir / role, model_cfg, prof.lmcache,
                                          f"r3-{role}-mkdir")
            if err:
                raise RuntimeError(err)
            t.put(ctx.gate_dir / "prompts.json", posixpath.join(v["run_dir"], "prompts.json"))
            return {**v, "lmcache": cfg, "versions": versions}

        roles = {writer: "writer", reader: "reader"}
        prep = fan_out(roles, prepare)
        if prep.failed:
            return WorkloadResult(evidence=ev, error="preparing nodes: " + prep.summary())
        lay = prep.succeeded
        ev.layout = {n: {k: v for k, v in lay[n].items() if k not in ("lmcache", "versions")} for n in lay}
        ev.versions = {n: lay[n]["versions"] for n in lay}
        ev.lmcache_config = lay[writer].get("lmcache")

        engines: dict[str, EngineProcess] = {}
        for name, role in roles.items():
            v = lay[name]
            base_url, _ = client_base_url(ctx.transports[name], ctx.nodes[name], "127.0.0.1", v["port"])
            engines[name] = EngineProcess(ctx, ctx.transports[name], prof, prof.render_argv(v), prof.render_env(v),
                                          base_url, posixpath.join(v["run_dir"], "engine.log"),
                                          ctx.gate_dir / f"engine-{role}.log")
        try:
            # 2. Both engines, fresh, started together (their start-up dominates the gate's time).
            started = fan_out(engines, lambda n, e: start_engine(e, roles[n]))
            why = [e for e in started.succeeded.values() if e] + list(started.failed.values())
            if why:
                return WorkloadResult(evidence=ev, error="engine did not start: " + "; ".join(why))

            # 3. Writer phase.
            ctx.progress(f"{ctx.gate.id}: {writer} serves {len(prompts)} new prompts")
            w = self._serve(ctx, writer, lay[writer], "writer", p)
            pool = pool_contents(ctx, ctx.transports[writer], lay[writer]["pool_dir"], expected, p.populate_timeout_s,
                                 "r3-pool-writer")
            ev.pool_after_writer = pool
            ev.pool_seen_from_reader_before = pool_contents(ctx, ctx.transports[reader], lay[reader]["pool_dir"],
                                                            expected, 0, "r3-pool-reader-before")

            # 4. Reader phase.
            ctx.progress(f"{ctx.gate.id}: {reader} (never saw them) serves the same prompts")
            r = self._serve(ctx, reader, lay[reader], "reader", p)
            ev.pool_seen_from_reader_after = pool_contents(ctx, ctx.transports[reader], lay[reader]["pool_dir"],
                                                           expected, 0, "r3-pool-reader-after")
        except RuntimeError as exc:
            return WorkloadResult(evidence=ev, error=str(exc))
        finally:
            fan_out(engines, lambda _n, e: e.stop())

        hm = prof.hit_metrics
        wb, wa = parse_prometheus(w["metrics_before"]), parse_prometheus(w["metrics_after"])
        rb, ra = parse_prometheus(r["metrics_before"]), parse_prometheus(r["metrics_after"])
        ev.reader_read_bytes = counter_delta(rb, ra, hm.read_bytes)
        ev.reader_query_tokens_before = metric_total(rb, hm.query_tokens)
        failed = [f"{role} {rec['id']}: {rec.get('error')}" for role, out in (("writer", w), ("reader", r))
                  for rec in out["records"] if not rec["ok"]]
        # an engine that fell back silently: the tier was not used (the first engine's reason)
        fallback = next((r for r in (fallback_reason(e.fallbacks(), f"{role} engine's") for role, e in engines.items())
                         if r), None)
        res = evaluate_r3(counter_delta(wb, wa, hm.hit_tokens), counter_delta(wb, wa, hm.query_tokens),
                          counter_delta(rb, ra, hm.hit_tokens), counter_delta(rb, ra, hm.query_tokens), failed,
                          int(pool.get("bytes", 0)), expected, ev, fallback=fallback,
                          reader_looked_up_before=bool(ev.reader_query_tokens_before))
        write_summary(ctx.gate_dir, "r3-summary.json", res)
        return res

    # ---------------------------------------------------------------------------------- helpers

    def _serve(self, ctx: GateContext, name: str, v: dict, role: str, p: R3Params) -> dict:
        t = ctx.transports[name]
        res = ctx.steps.run(t, f"r3-{role}-serve",
                            [v["python"], "-c", NODE_CLIENT, f"http://127.0.0.1:{v['port']}", p.served_model_name,
                             posixpath.join(v["run_dir"], "prompts.json"), str(p.max_tokens), str(p.request_timeout_s)],
                            timeout_s=p.request_timeout_s * (p.prompts_per_length * len(p.prompt_tokens)) + 60)
        if not res.ok:
            raise RuntimeError(f"{role} client on {name} failed: {res.summary()}")
        try:
            out = json.loads(res.stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError) as exc:
            raise RuntimeError(f"{role} client on {name}: unparseable output ({exc})") from None
        write_gate_file(ctx.gate_dir / f"requests-{role}.json", json.dumps(out["records"], indent=1))
        write_gate_file(ctx.gate_dir / f"metrics-{role}-before.prom", out["metrics_before"])
        write_gate_file(ctx.gate_dir / f"metrics-{role}-after.prom", out["metrics_after"])
        return out
