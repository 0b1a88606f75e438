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
loopback only), by a stdlib Python client run through the node's transport.

The engine code travels to the node as a minimal package (``harness/engines/cpu_reference.py`` under a
run directory on PYTHONPATH), so nodes need an engine environment with torch, transformers and lmcache, not
kvgate: the gate's `python`, else the node's `engine_python`, else python3 on the node.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from ..engines import (DEFAULT_CPU_REF_MODEL, EngineProfile, kv_bytes_per_token, lmcache_config, load_profile,
                       metric_total, parse_prometheus, shell_line, write_lmcache_yaml)
from ..errors import ConfigError
from ..fanout import fan_out
from ..verdict import WorkloadResult
from .base import GateContext, PlannedStep, StrictModel, Workload, register_workload
from .g2_ttft import engine_python, make_prompts

ENGINE_SRC = Path(__file__).resolve().parents[1] / "engines" / "cpu_reference.py"

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

FREE_PORT = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"


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


def evaluate_r3(writer_hit: float | None, writer_query: float | None, reader_hit: float | None,
                reader_query: float | None, failed_requests: list[str], pool_bytes: int,
                expected_kv_bytes: int) -> WorkloadResult:
    """Pure: R3 metrics and validity from both engines' counter deltas and the pool's state."""
    metrics: dict[str, float] = {}
    ev: dict[str, Any] = {"writer_hit_tokens": writer_hit, "writer_query_tokens": writer_query,
                          "reader_hit_tokens": reader_hit, "reader_query_tokens": reader_query,
                          "pool_bytes_before_reader": pool_bytes, "expected_kv_bytes": expected_kv_bytes,
                          "failed_requests": failed_requests}
    if reader_hit is not None and reader_query:
        metrics["hit_rate"] = reader_hit / reader_query
    if failed_requests:
        return WorkloadResult(metrics, ev, error=f"{len(failed_requests)} request(s) failed; first: {failed_requests[0]}")
    if reader_hit is None or not reader_query:
        return WorkloadResult(metrics, ev, error="the reader engine exposed no hit/query counters for its phase")
    if writer_hit is None or writer_query is None:
        return WorkloadResult(metrics, ev, error="the writer engine exposed no hit/query counters")
    if writer_hit > 0:
        return WorkloadResult(metrics, ev, invalid_reason=(
            f"the writer hit {writer_hit:.0f} tokens: the prompts were not new to the pool"))
    if pool_bytes <= 0:
        # Not INVALID: a writer whose KV never reaches the pool is the failure R3 exists to catch.
        ev["note"] = "the pool held no bytes after the writer's phase"
    return WorkloadResult(metrics, ev)


@register_workload("r3-cross-instance")
class R3CrossInstance(Workload):
    Params = R3Params
    METRICS = {"hit_rate": "ratio"}

    def _roles(self, p: R3Params, nodes: dict) -> tuple[str | None, str | None]:
        names = list(nodes)
        writer = p.writer or (names[0] if names else None)
        reader = p.reader or next((n for n in names if n != writer), None)
        return writer, reader

    def validate_against(self, params, nodes):
        issues = []
        try:
            prof = load_profile(params.engine)
        except ConfigError as exc:
            return [(("engine",), str(exc.issues[0]))]
        if prof.engine != "cpu-reference":
            issues.append((("engine",), f"r3-cross-instance drives the cpu-reference engine on each node; "
                           f"profile {prof.name!r} is {prof.engine}"))
        writer, reader = self._roles(params, nodes)
        if len(nodes) != 2:
            issues.append((("nodes",), f"r3-cross-instance runs on exactly two nodes (writer, reader), got {len(nodes)}"))
        for key, n in (("writer", writer), ("reader", reader)):
            if n is None or n not in nodes:
                issues.append(((key,), f"{key} {n!r} is not among the gate's nodes ({', '.join(nodes)})"))
                continue
            t = nodes[n].target(params.pool_target)
            if t is None or t.kind != "directory":
                issues.append((("pool_target",), f"node {n!r} has no directory target {params.pool_target!r}"))
        return issues

    # ----------------------------------------------------------------------------------- layout

    def _layout(self, ctx: GateContext, node, port: int, tag: str) -> dict[str, Any]:
        p: R3Params = ctx.params
        t = node.target(p.pool_target)
        base = t.path if t.path.startswith("/") else posixpath.join(node.work_dir, t.path)
        run_dir = posixpath.join(node.work_dir, f"kvgate-r3-{ctx.gate.id}-{tag}-{node.name}")
        return {"python": engine_python(p.python, node.transport, node.engine_python), "host": "127.0.0.1", "port": port, "model": p.served_model_name,
                "served_model_name": p.served_model_name, "seed": p.seed, "run_dir": run_dir,
                "pool_dir": posixpath.join(base, p.pool_subdir, f"run-{tag}"),
                "lmcache_config": posixpath.join(run_dir, "lmcache.yaml"),
                "model_config": posixpath.join(run_dir, "model-config.json"),
                "pkg_dir": posixpath.join(run_dir, "pkg")}

    def _model_config(self, p: R3Params) -> dict[str, Any]:
        return dict(p.model_config_inline) if p.model_config_inline is not None else dict(DEFAULT_CPU_REF_MODEL)

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: R3Params = ctx.params
        prof = load_profile(p.engine)
        writer, reader = self._roles(p, ctx.nodes)
        n = len(p.prompt_tokens) * p.prompts_per_length
        out = []
        for role, name in (("writer", writer), ("reader", reader)):
            v = self._layout(ctx, ctx.nodes[name], 8000, "<run>")
            argv, env = prof.render_argv(v), prof.render_env(v) | {"PYTHONPATH": v["pkg_dir"]}
            out.append(PlannedStep(name, f"{role}: create {v['run_dir']} and the run's pool directory {v['pool_dir']}",
                                   ("mkdir", "-p", v["run_dir"], v["pool_dir"]),
                                   files={v["lmcache_config"]: json.dumps(lmcache_config(prof.lmcache, v), indent=1)}
                                   if prof.lmcache else {}))
            out.append(PlannedStep(name, f"{role}: start a fresh {prof.name} engine: {shell_line(argv, env)}", tuple(argv)))
        out.append(PlannedStep(writer, f"writer: serve {n} new prompts of {p.prompt_tokens} tokens (stores their KV); "
                               "hit counter must stay 0", ("python3", "-c", "<client>")))
        out.append(PlannedStep(writer, "wait until the pool holds the expected KV bytes", ("du", "-sb", "<pool>")))
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
        bpt = kv_bytes_per_token(model_cfg, "float32")
        vocab = int(model_cfg.get("vocab_size", 4096))
        prompts = make_prompts(p.seed, p.prompt_tokens, p.prompts_per_length, vocab)
        expected = sum(r.prompt_tokens for r in prompts) * bpt
        ev: dict[str, Any] = {"engine_profile": prof.name, "writer": writer, "reader": reader, "run_tag": tag,
                              "kv_bytes_per_token": bpt, "expected_kv_bytes": expected, "prompts": len(prompts),
                              "prompt_tokens": p.prompt_tokens, "seed": p.seed}
        (ctx.gate_dir / "model-config.json").write_text(json.dumps(model_cfg, indent=1))
        (ctx.gate_dir / "prompts.json").write_text(json.dumps([{"id": r.request_id, "ids": r.prompt} for r in prompts]))

        # 1. Per node: directories, engine package, model config, LMCache YAML, a free loopback port.
        def prepare(name: str, role: str) -> dict[str, Any]:
            t = ctx.transports[name]
            r = ctx.steps.run(t, f"r3-{role}-port", [engine_python(p.python, ctx.nodes[name].transport, ctx.nodes[name].engine_python), "-c", FREE_PORT], timeout_s=60)
            if not r.ok or not r.stdout.strip().isdigit():
                raise RuntimeError(f"no free port on {name}: {r.summary()}")
            v = self._layout(ctx, ctx.nodes[name], int(r.stdout.strip()), tag)
            pkg = posixpath.join(v["pkg_dir"], "harness", "engines")
            r = ctx.steps.run(t, f"r3-{role}-mkdir", ["mkdir", "-p", v["run_dir"], v["pool_dir"], pkg,
                                                     posixpath.join(v["run_dir"], "prometheus")], timeout_s=60)
            if not r.ok:
                raise RuntimeError(f"cannot create directories on {name}: {r.summary()}")
            local = ctx.gate_dir / role
            local.mkdir(exist_ok=True)
            (local / "__init__.py").write_text("")
            for remote in (posixpath.join(v["pkg_dir"], "harness", "__init__.py"), posixpath.join(pkg, "__init__.py")):
                t.put(local / "__init__.py", remote)
            t.put(ENGINE_SRC, posixpath.join(pkg, "cpu_reference.py"))
            t.put(ctx.gate_dir / "model-config.json", v["model_config"])
            t.put(ctx.gate_dir / "prompts.json", posixpath.join(v["run_dir"], "prompts.json"))
            if prof.lmcache is not None:
                cfg = write_lmcache_yaml(prof.lmcache, v, local / "lmcache.yaml")
                t.put(local / "lmcache.yaml", v["lmcache_config"])
                v["lmcache"] = cfg
            return v

        roles = {writer: "writer", reader: "reader"}
        prep = fan_out(roles, prepare)
        if prep.failed:
            return WorkloadResult(evidence=ev, error="preparing nodes: " + prep.summary())
        lay = prep.succeeded
        ev["layout"] = {n: {k: v for k, v in lay[n].items() if k != "lmcache"} for n in lay}
        ev["lmcache_config"] = lay[writer].get("lmcache")

        from .g2_ttft import _Engine
        engines: dict[str, _Engine] = {}
        for name, role in roles.items():
            v = lay[name]
            argv = prof.render_argv(v)
            env = prof.render_env(v) | {"PYTHONPATH": v["pkg_dir"]}
            engines[name] = _Engine(ctx, ctx.transports[name], prof, argv, env, f"http://127.0.0.1:{v['port']}",
                                    posixpath.join(v["run_dir"], "engine.log"), ctx.gate_dir / f"engine-{role}.log")
        try:
            # 2. Both engines, fresh, started together (their start-up dominates the gate's time).
            ctx.progress(f"{ctx.gate.id}: starting {prof.name} on {writer} (writer) and {reader} (reader)")
            for e in engines.values():
                e.start()
            ready = fan_out(engines, lambda _n, e: self._wait_ready(ctx, e, prof))
            if ready.failed:
                return WorkloadResult(evidence=ev, error="engine did not start: " + ready.summary())

            # 3. Writer phase.
            ctx.progress(f"{ctx.gate.id}: {writer} serves {len(prompts)} new prompts")
            w = self._serve(ctx, writer, lay[writer], "writer", p)
            pool = self._pool(ctx, writer, lay[writer]["pool_dir"], expected, p.populate_timeout_s, wait=True)
            seen = self._pool(ctx, reader, lay[reader]["pool_dir"], expected, 0, wait=False)
            ev.update(pool_after_writer=pool, pool_seen_from_reader_before=seen)

            # 4. Reader phase.
            ctx.progress(f"{ctx.gate.id}: {reader} (never saw them) serves the same prompts")
            r = self._serve(ctx, reader, lay[reader], "reader", p)
            ev["pool_seen_from_reader_after"] = self._pool(ctx, reader, lay[reader]["pool_dir"], expected, 0, wait=False)
        except RuntimeError as exc:
            return WorkloadResult(evidence=ev, error=str(exc))
        finally:
            fan_out(engines, lambda _n, e: e.stop())

        hm = prof.hit_metrics

        def delta(out: dict, names: list[str]) -> float | None:
            a = metric_total(parse_prometheus(out["metrics_before"]), names)
            b = metric_total(parse_prometheus(out["metrics_after"]), names)
            return None if a is None or b is None else b - a

        failed = [f"{role} {rec['id']}: {rec.get('error')}" for role, out in (("writer", w), ("reader", r))
                  for rec in out["records"] if not rec["ok"]]
        res = evaluate_r3(delta(w, hm.hit_tokens), delta(w, hm.query_tokens), delta(r, hm.hit_tokens),
                          delta(r, hm.query_tokens), failed, int(pool.get("bytes", 0)), expected)
        res.evidence = {**ev, **res.evidence,
                        "reader_read_bytes": delta(r, hm.read_bytes) if hm.read_bytes else None,
                        "reader_query_tokens_before": metric_total(parse_prometheus(r["metrics_before"]),
                                                                   hm.query_tokens)}
        if res.evidence["reader_query_tokens_before"]:
            res.invalid_reason = res.invalid_reason or "the reader engine had looked up prompts before its phase"
        (ctx.gate_dir / "r3-summary.json").write_text(json.dumps(
            {"metrics": res.metrics, "evidence": res.evidence, "invalid_reason": res.invalid_reason,
             "error": res.error}, indent=1, default=str))
        return res

    # ---------------------------------------------------------------------------------- helpers

    @staticmethod
    def _wait_ready(ctx: GateContext, eng, prof: EngineProfile) -> bool:
        """Readiness probed on the node (the engine listens on the node's loopback only)."""
        import time
        t = eng.transport
        deadline = time.monotonic() + prof.ready_timeout_s
        probe = ["python3", "-c", "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)",
                 eng.base_url + prof.health_path]
        while time.monotonic() < deadline:
            rc = eng.proc.poll()
            if rc is not None:
                raise RuntimeError(f"engine exited with rc {rc} before it was ready; log:\n{eng.log_tail()}")
            if t.run(probe, timeout_s=30).ok:
                return True
            time.sleep(1.0)
        raise RuntimeError(f"engine not ready after {prof.ready_timeout_s:.0f} s; log:\n{eng.log_tail()}")

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
        (ctx.gate_dir / f"requests-{role}.json").write_text(json.dumps(out["records"], indent=1))
        (ctx.gate_dir / f"metrics-{role}-before.prom").write_text(out["metrics_before"])
        (ctx.gate_dir / f"metrics-{role}-after.prom").write_text(out["metrics_after"])
        return out

    def _pool(self, ctx: GateContext, name: str, pool_dir: str, expected: int, timeout_s: float,
              wait: bool) -> dict[str, Any]:
        """Bytes and files in the run's pool directory as one node sees it; with wait, poll until the
        expected bytes are there (LMCache stores asynchronously) or timeout_s passes."""
        import time
        t = ctx.transports[name]
        deadline = time.monotonic() + timeout_s
        while True:
            # Only finished chunk files: LMCache writes NAME.tmp and renames it to NAME.data when complete.
            r = t.run(["find", pool_dir, "-type", "f", "-name", "*.data", "-printf", "%s\n"], timeout_s=60)
            sizes = [int(x) for x in r.stdout.split() if x.isdigit()] if r.ok else []
            info = {"node": name, "dir": pool_dir, "bytes": sum(sizes), "files": len(sizes),
                    "error": None if r.ok else r.summary()}
            if not wait or info["bytes"] >= expected or time.monotonic() > deadline:
                return info
            time.sleep(0.5)
