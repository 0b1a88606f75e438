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
loopback only), by a stdlib Python client (``harness/node/r3_client.py``, put into the run directory) run
through the node's transport, which also reads the engine's counters right before and after; kvgate waits for
each engine through an SSH port forward to that loopback port. Both engines are handles of the one phase
runner (``workloads/kit/phases.py``): opened together, a phase each, their logs checked for fall-back lines.

The engine is one the profile declares able to build its model from the config kvgate stages and to count its
hits (``capabilities.builds_model``, ``hit_metrics``); its program travels to the node as one file put into the
run directory (the reference engine's ``harness/engines/cpu_reference.py``), so nodes need the engine's
environment (for the reference engine torch, transformers and lmcache), not kvgate: the gate's ``python``, else
the node's ``engine_python``, else python3 on the node.
"""

from __future__ import annotations

from pathlib import Path

import json
import posixpath
import uuid
from typing import Any, Mapping, Sequence

from pydantic import Field, model_validator

from .kit.rederive import raw_text
from ..engines import DEFAULT_CPU_REF_MODEL, kv_bytes_per_token, lmcache_config, load_profile, shell_line
from ..engines.preflight import preflight_argv
from ..engines.profiles import EngineProfile, HitMetrics
from ..engines.prompts import make_prompts
from ..execute.fanout import fan_out
from ..node import program_path
from ..endurance import endurance
from ..parsers.pooldev import pool_blockstat_argv, pool_device_probe, write_bytes_between
from ..parsers.prometheus import counter_delta, metric_total, parse_prometheus
from ..units import format_quantity
from .kit.base import (Evidence, GateContext, PlannedStep, PoolSnapshot, StrictModel, ValidityCheck,
                   Workload, WorkloadResult, drive_rating, pool_drive_of, register_workload, target_path, write_summary,
                   write_gate_file)
from .kit.probes import run_probe
from .kit.engine import (FREE_PORT_CODE, LaunchedEngine, LogMark, client_base_url, engine_port, engine_preflight, engine_values,
                     model_config_issues, node_engine_python, pool_contents, pool_files_argv, profile_issues,
                     stage_engine_files)
from .kit.phases import EngineLog, PhaseRecord, PhaseRunner, first_fallback
from .kit.session import EngineSession

CLIENT = "r3_client.py"  # harness/node/r3_client.py, put into each node's run directory


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
    # the writer's stores on the pool's device (docs/endurance.md): its bytes written from before the writer's
    # phase to after the pool held the KV (synced), and the writer client's time serving
    pool_device: str | None = None
    writer_device_write_bytes: int | None = None
    writer_window_s: float | None = None
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


def r3_validity(ev: "R3Evidence", fallback: str | None, reader_hit: float | None, reader_query: float | None,
                writer_hit: float | None, pool_bytes: int, expected_kv_bytes: int) -> list[ValidityCheck]:
    """Pure: what R3's figure rests on, as :func:`evaluate_r3` judges it: the requests served, neither engine fell
    back, the prompts new to the pool (the writer hit none), the reader fresh (no lookups before its phase), the
    reader's counters measured its phase, and the writer's KV in the pool (not a validity condition: a pool the
    writer never reached is the failure R3 exists to catch, shown here as not holding)."""
    before = ev.reader_query_tokens_before or 0
    return [
        ValidityCheck(name="requests", ok=not ev.failed_requests, claim="every prompt was served on both nodes",
                      how=ev.failed_requests[0] if ev.failed_requests else "each node's client: every request ok",
                      figure="failed requests", value=float(len(ev.failed_requests)), unit="count"),
        ValidityCheck(name="no fall-back", ok=fallback is None,
                      claim="neither engine fell back to re-computing (the tier was in use)",
                      how=fallback or "both engines' whole logs scanned for the built-in and the profile's fall-back "
                                      "patterns: none"),
        ValidityCheck(name="new prompts", ok=writer_hit is not None and writer_hit == 0,
                      claim="the prompts were new to the pool (the writer computed every one)",
                      how="the writer engine's hit counters over its phase", figure="writer hit tokens",
                      value=writer_hit, unit="count"),
        ValidityCheck(name="fresh reader", ok=not before,
                      claim="the reader engine had looked up nothing before its phase (its hits are the writer's KV)",
                      how="the reader engine's lookup counter before its phase", figure="reader lookups before",
                      value=float(before), unit="count"),
        ValidityCheck(name="reader measured", ok=reader_hit is not None and bool(reader_query),
                      claim="the reader's hits and lookups were counted over its phase",
                      how="the reader engine's hit and lookup counters before and after its phase",
                      figure="reader hit rate", value=reader_hit / reader_query if reader_hit is not None
                      and reader_query else None, unit="ratio"),
        ValidityCheck(name="pool populated", ok=pool_bytes >= expected_kv_bytes > 0,
                      claim="the writer's KV reached the shared pool, as the writer's node saw it",
                      how=f"finished chunk files in the pool after the writer's phase, "
                          f"{format_quantity(expected_kv_bytes, 'B')} expected",
                      figure="pool bytes after the writer", value=float(pool_bytes), unit="B"),
    ]


def evaluate_r3(writer: PhaseRecord, reader: PhaseRecord, hit: HitMetrics, pool_bytes: int, expected_kv_bytes: int,
                evidence: R3Evidence | None = None, logs: Mapping[str, EngineLog] | None = None,
                fallback_patterns: Sequence[str] = ()) -> WorkloadResult:
    """Pure: R3 metrics and validity from both phases' records (``output``: what the node client printed, the
    engine's counters before and after as served, and one record per request), the profile's declared proofs
    (``hit``: its hit counters; ``fallback_patterns``: its own "the tier did nothing" lines) and the engines'
    whole logs (``logs`` by role: a fall-back line in either is INVALID), and the pool's state. The result carries
    a copy of ``evidence``."""
    wb, wa = (parse_prometheus(writer.output[k]) for k in ("metrics_before", "metrics_after"))
    rb, ra = (parse_prometheus(reader.output[k]) for k in ("metrics_before", "metrics_after"))
    writer_hit, writer_query = counter_delta(wb, wa, hit.hit_tokens), counter_delta(wb, wa, hit.query_tokens)
    reader_hit, reader_query = counter_delta(rb, ra, hit.hit_tokens), counter_delta(rb, ra, hit.query_tokens)
    failed = [f"{rec.label} {r['id']}: {r.get('error')}" for rec in (writer, reader)
              for r in rec.output["records"] if not r["ok"]]
    before = metric_total(rb, hit.query_tokens)
    metrics: dict[str, float] = {}
    ev = (evidence or R3Evidence()).model_copy(update=dict(
        writer_hit_tokens=writer_hit, writer_query_tokens=writer_query, reader_hit_tokens=reader_hit,
        reader_query_tokens=reader_query, pool_bytes_before_reader=pool_bytes, expected_kv_bytes=expected_kv_bytes,
        failed_requests=failed, reader_read_bytes=counter_delta(rb, ra, hit.read_bytes),
        reader_query_tokens_before=before))
    ev.endurance = endurance(ev.writer_device_write_bytes, expected_kv_bytes / ev.kv_bytes_per_token
                             if ev.kv_bytes_per_token else None, pool_bytes, ev.writer_window_s,
                             drive_rating(ev.pool_drive)).to_dict()
    # an engine that fell back silently: the tier was not used (the first engine's reason)
    invalid, _ = first_fallback(logs or {}, fallback_patterns, lambda role: f"{role} engine's")
    ev.validity = r3_validity(ev, invalid, reader_hit, reader_query, writer_hit, pool_bytes, expected_kv_bytes)
    if invalid is None and before:
        invalid = "the reader engine had looked up prompts before its phase"
    if reader_hit is not None and reader_query:
        metrics["hit_rate"] = reader_hit / reader_query
    if failed:
        return WorkloadResult(metrics, ev, invalid_reason=invalid,
                              error=f"{len(failed)} request(s) failed; first: {failed[0]}")
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


def reevaluate_r3(evidence: dict[str, Any], raw: Mapping[str, Mapping[str, str]], logs: Mapping[str, str],
                  p: "R3Params") -> WorkloadResult:
    """Pure: a bundle's r3-cross-instance result again from its raw files (``raw``: role -> ``records`` (the node
    client's ``requests-ROLE.json``), ``metrics_before`` and ``metrics_after`` (``metrics-ROLE-*.prom``); ``logs``:
    role -> the engine's whole log), the KV the prompts store from the gate's params and the profile, the pool's
    bytes after the writer as recorded. Then :func:`evaluate_r3`, as the run."""
    ev = R3Evidence.model_validate({k: v for k, v in evidence.items() if k != "validity"})
    prof = load_profile(p.engine)
    model_cfg = R3CrossInstance()._model_config(p)
    bpt = kv_bytes_per_token(model_cfg, prof.capabilities.kv_dtype)
    prompts = make_prompts(p.seed, p.prompt_tokens, p.prompts_per_length, int(model_cfg.get("vocab_size", 4096)))
    expected = sum(r.prompt_tokens for r in prompts) * bpt
    phases = {}
    for role in ("writer", "reader"):
        records = json.loads(raw[role]["records"])
        if not isinstance(records, list) or len(records) != len(prompts):
            raise ValueError(f"requests-{role}.json: {len(records) if isinstance(records, list) else 'no'} records "
                             f"for the {len(prompts)} prompts")
        phases[role] = PhaseRecord(role, {"records": records, "metrics_before": raw[role]["metrics_before"],
                                          "metrics_after": raw[role]["metrics_after"]}, {})
    pool = ev.pool_after_writer.bytes if ev.pool_after_writer is not None else 0
    marks = {role: EngineLog(LogMark(1, ""), LogMark(1, text)) for role, text in logs.items()}
    return evaluate_r3(phases["writer"], phases["reader"], prof.hit_metrics, pool, expected, ev, logs=marks,
                       fallback_patterns=prof.fallback_patterns)


def rederive(gate_dir: Path, result: dict[str, Any], params: Any, ctx: dict[str, Any]):
    """r3-cross-instance from each role's raw files (the node client's ``requests-ROLE.json``, the engine counters it
    read, ``metrics-ROLE-before.prom`` and ``metrics-ROLE-after.prom``) and both engines' whole logs
    (``engine-writer.log``, ``engine-reader.log``) re-scanned, the prompts' KV from config/gates.yaml, through the
    workload's own pure functions (harness.workloads.r3_cross_instance.reevaluate_r3); the pool's bytes after the
    writer as recorded."""
    raw = {role: {"records": raw_text(gate_dir, f"requests-{role}.json", f"the {role}'s requests"),
                  "metrics_before": raw_text(gate_dir, f"metrics-{role}-before.prom", f"the {role}'s counters before",
                                             empty_ok=True),
                  "metrics_after": raw_text(gate_dir, f"metrics-{role}-after.prom", f"the {role}'s counters after")}
           for role in ("writer", "reader")}
    logs = {role: raw_text(gate_dir, f"engine-{role}.log", "an engine log") for role in ("writer", "reader")}
    return reevaluate_r3(result.get("evidence") or {}, raw, logs, params)


@register_workload("r3-cross-instance")
class R3CrossInstance(Workload):
    rederive = staticmethod(rederive)  # the gate re-judged from the bundle's raw files
    # what its endurance prices (docs/endurance.md), for `kvgate plan`
    ENDURANCE = ("the writer's stores: the pool device's bytes written from before its phase to the pool holding "
                 "the KV (synced), per million prompt tokens, per byte the pool gained, over the writer's client")
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

    def _client_argv(self, v: dict[str, Any], p: R3Params) -> list[str]:
        """The node client's command: the engine's interpreter runs the client put into the run directory."""
        return [v["python"], posixpath.join(v["run_dir"], CLIENT), f"http://127.0.0.1:{v['port']}",
                p.served_model_name, posixpath.join(v["run_dir"], "prompts.json"), str(p.max_tokens),
                str(p.request_timeout_s)]

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        """Every command the run sends, per node in the run's order (the engine's port is ``<port>`` here, a free one in
        the run; the run's tag is ``<run>``)."""
        p: R3Params = ctx.params
        prof = load_profile(p.engine)
        writer, reader = self._roles(p, ctx.nodes)
        n = len(p.prompt_tokens) * p.prompts_per_length
        out = []
        lay = {}
        for role, name in (("writer", writer), ("reader", reader)):
            node = ctx.nodes[name]
            v = lay[role] = self._layout(ctx, prof, node, "<port>", "<run>")  # type: ignore[arg-type]
            argv, env = prof.render_argv(v), prof.render_env(v)
            out.append(PlannedStep(name, f"{role}: pre-flight: the engine's interpreter imports what the profile "
                                   "declares", tuple(preflight_argv(v["python"], prof))))
            if getattr(node, "transport", "local") != "local":  # a local node's port is found here, not sent
                out.append(PlannedStep(name, f"{role}: a free port on the node's loopback",
                                       (v["python"], "-c", FREE_PORT_CODE)))
            out.append(PlannedStep(name, f"{role}: create {v['run_dir']} and the run's pool directory {v['pool_dir']}; "
                                   f"put there the model config, the engine program, the prompts and {CLIENT}",
                                   ("mkdir", "-p", v["run_dir"], v["pool_dir"], posixpath.join(v["run_dir"], "prometheus")),
                                   files={v["lmcache_config"]: json.dumps(lmcache_config(prof.lmcache, v), indent=1)}
                                   if prof.lmcache else {}))
            out.append(PlannedStep(name, f"{role}: start a fresh {prof.name} engine (both at once): "
                                   f"{shell_line(argv, env)}", tuple(argv)))
        w, r = lay["writer"], lay["reader"]
        out += [
            PlannedStep(writer, "the pool device's write counters before the writer's phase (docs/endurance.md)",
                        pool_blockstat_argv(w["pool_dir"])),
            PlannedStep(writer, f"writer: serve {n} new prompts of {p.prompt_tokens} tokens (stores their KV), its "
                        "counters read before and after on the node; hit counter must stay 0",
                        tuple(self._client_argv(w, p))),
            PlannedStep(writer, "wait until the finished chunk files in the pool hold the expected KV bytes",
                        tuple(pool_files_argv(w["pool_dir"], prof.pool_files))),
            PlannedStep(writer, "sync: the writer's stores reach the device", ("sync",)),
            PlannedStep(writer, "the pool device's write counters after the writer's stores",
                        pool_blockstat_argv(w["pool_dir"])),
            PlannedStep(reader, "what the reader sees in the pool before its phase",
                        tuple(pool_files_argv(r["pool_dir"], prof.pool_files))),
            PlannedStep(reader, f"reader (never saw them): serve the same {n} prompts; hit_rate = hit / looked-up "
                        "tokens from its counters", tuple(self._client_argv(r, p))),
            PlannedStep(reader, "what the reader sees in the pool after its phase",
                        tuple(pool_files_argv(r["pool_dir"], prof.pool_files))),
            PlannedStep(writer, "stop both engines (process groups); fetch their logs (a fall-back line is INVALID)")]
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
                        seed=p.seed, pool_drive=pool_drive_of(ctx, writer))
        write_gate_file(ctx.gate_dir / "prompts.json", json.dumps([{"id": r.request_id, "ids": r.prompt} for r in prompts]))

        # 1. Per node: a free loopback port, directories, model config, LMCache YAML, the engine program, the
        # client, prompts.
        roles = {writer: "writer", reader: "reader"}
        prep = fan_out(roles, lambda name, role: self._prepare(ctx, prof, model_cfg, tag, name, role))
        if prep.failed:
            return WorkloadResult(evidence=ev, error="preparing nodes: " + prep.summary())
        lay = prep.succeeded
        ev.layout = {n: {k: v for k, v in lay[n].items() if k not in ("lmcache", "versions")} for n in lay}
        ev.versions = {n: lay[n]["versions"] for n in lay}
        ev.lmcache_config = lay[writer].get("lmcache")

        # the counters are read by the node client, where the requests are sent (the phase's output)
        runner = PhaseRunner(ctx, self._handles(ctx, prof, roles, lay))
        # 2. Both engines, fresh, started together (their start-up dominates the gate's time), stopped together,
        # their logs read.
        session = EngineSession({"engines": runner}, parallel=True, logs=True)

        def phases() -> tuple[PhaseRecord, PhaseRecord, PoolSnapshot] | WorkloadResult:
            try:
                # 3. Writer phase, its stores counted on the pool's device (what serving costs the drive).
                ctx.progress(f"{ctx.gate.id}: {writer} serves {len(prompts)} new prompts")
                w, pool = self._writer_phase(ctx, prof, runner, writer, lay[writer], expected, ev)
                ev.pool_seen_from_reader_before = pool_contents(
                    ctx, ctx.transports[reader], lay[reader]["pool_dir"], expected, 0, "r3-pool-reader-before",
                    prof.pool_files)

                # 4. Reader phase.
                ctx.progress(f"{ctx.gate.id}: {reader} (never saw them) serves the same prompts")
                r = runner.phase("reader", lambda: self._serve(ctx, reader, lay[reader], "reader", p), on=["reader"])
                ev.pool_seen_from_reader_after = pool_contents(
                    ctx, ctx.transports[reader], lay[reader]["pool_dir"], expected, 0, "r3-pool-reader-after",
                    prof.pool_files)
            except RuntimeError as exc:  # the node client's own failure, in its words
                return WorkloadResult(evidence=ev, error=str(exc))
            return w, r, pool

        out = session.run(phases, lambda why: WorkloadResult(evidence=ev, error=why))
        if isinstance(out, WorkloadResult):
            return out
        w, r, pool = out
        logs = session.logs["engines"]

        res = evaluate_r3(w, r, prof.hit_metrics, pool.bytes, expected, ev, logs=logs,
                          fallback_patterns=prof.fallback_patterns)
        write_summary(ctx.gate_dir, "r3-summary.json", res)
        return res

    def _prepare(self, ctx: GateContext, prof: EngineProfile, model_cfg: dict[str, Any], tag: str, name: str,
                 role: str) -> dict[str, Any]:
        """One node ready to start its engine: pre-flight, a free loopback port, the run's directories, model config,
        LMCache YAML and engine program staged, the prompts and the client put there; its layout, LMCache config
        and versions. RuntimeError when a step failed."""
        p: R3Params = ctx.params
        t, node = ctx.transports[name], ctx.nodes[name]
        python = node_engine_python(p.python, node)
        versions, err = engine_preflight(ctx, t, name, prof, python, f"r3-{role}-preflight")
        if err:
            raise RuntimeError(err)
        v = self._layout(ctx, prof, node, engine_port(ctx, t, node, 0, python, f"r3-{role}-port"), tag)
        err, cfg = stage_engine_files(ctx, t, prof, v, ctx.gate_dir / role, model_cfg, prof.lmcache,
                                      f"r3-{role}-mkdir")
        if err:
            raise RuntimeError(err)
        t.put(ctx.gate_dir / "prompts.json", posixpath.join(v["run_dir"], "prompts.json"))
        t.put(program_path(CLIENT), posixpath.join(v["run_dir"], CLIENT))
        return {**v, "lmcache": cfg, "versions": versions}

    def _handles(self, ctx: GateContext, prof: EngineProfile, roles: dict[str, str], lay: dict[str, dict[str, Any]]
                 ) -> dict[str, LaunchedEngine]:
        """role -> the engine the phase runner starts on that node, reached on the node's loopback."""
        handles = {}
        for name, role in roles.items():
            v = lay[name]
            base_url, _ = client_base_url(ctx.transports[name], ctx.nodes[name], "127.0.0.1", v["port"])
            handles[role] = LaunchedEngine(ctx, ctx.transports[name], prof, prof.render_argv(v), prof.render_env(v),
                                           base_url, v["run_dir"], (role,), [])
        return handles

    def _writer_phase(self, ctx: GateContext, prof: EngineProfile, runner: PhaseRunner, writer: str, v: dict[str, Any],
                      expected: int, ev: R3Evidence) -> tuple[PhaseRecord, PoolSnapshot]:
        """The writer's phase with the pool device's write counters around it: it serves the prompts, the pool
        fills to the expected KV bytes, the stores are synced; returns the phase's record and the pool seen."""
        p: R3Params = ctx.params
        wt, wpool = ctx.transports[writer], v["pool_dir"]
        d0, _ = run_probe(ctx, wt, pool_device_probe(wpool), "r3-pool-blockstat-before")
        w = runner.phase("writer", lambda: self._serve(ctx, writer, v, "writer", p, ev), on=["writer"])
        pool = pool_contents(ctx, wt, wpool, expected, p.populate_timeout_s, "r3-pool-writer", prof.pool_files)
        ev.pool_after_writer = pool
        ctx.steps.run(wt, "r3-sync", ("sync",), timeout_s=300)
        d1, _ = run_probe(ctx, wt, pool_device_probe(wpool), "r3-pool-blockstat-after")
        ev.pool_device = (d0 or d1).source if (d0 or d1) else None
        ev.writer_device_write_bytes = write_bytes_between(d0, d1)
        return w, pool

    # ---------------------------------------------------------------------------------- helpers

    def _serve(self, ctx: GateContext, name: str, v: dict, role: str, p: R3Params,
               ev: R3Evidence | None = None) -> dict:
        """One phase on a node: the node client sends the prompts to its engine; what it printed, kept (and with
        ``ev``, the client's time serving, as the writer's window)."""
        res = ctx.steps.run(ctx.transports[name], f"r3-{role}-serve", self._client_argv(v, p),
                            timeout_s=p.request_timeout_s * (p.prompts_per_length * len(p.prompt_tokens)) + 60)
        if ev is not None:
            ev.writer_window_s = res.duration_s
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
