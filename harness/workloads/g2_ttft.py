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

import json
import posixpath
import uuid
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from ..engines import DEFAULT_CPU_REF_MODEL, EngineProfile, kv_bytes_per_token, lmcache_config, load_profile, shell_line
from ..engines.client import RequestRecord, run_requests_sync
from ..engines.prompts import load_tokenizer, make_prompts, make_text_prompts
from ..errors import WorkloadError
from ..node import program_path
from ..parsers.blockdev import parse_block_stat
from ..parsers.prometheus import counter_delta
from ..stats import percentile
from .base import (DROP_CACHES_ARGV, Evidence, GateContext, PlannedStep, StrictModel, Workload, WorkloadResult,
                   drop_caches, register_workload, write_summary)
from .engine import (EngineProcess, client_base_url, engine_node, engine_port, engine_python, engine_values,
                     fallback_reason, model_config_issues, pool_contents, pool_files_argv, profile_issues,
                     random_model_dir, stage_engine_files, start_engine, stored_kv_tokens)


# Warm-up prompts are drawn from seeds this far from the gate's, so they are never among its prompts.
WARMUP_SEED_OFFSET = 1_000_003


class G2Params(StrictModel):
    engine: str = "cpu-reference"
    model: str = "kvgate-cpu-reference"
    served_model_name: str = "kvgate-g2"
    model_config_path: str | None = Field(default=None, alias="model_config")
    model_config_inline: dict[str, Any] | None = Field(default=None, alias="model_config_inline")
    prompt_tokens: list[int] = Field(default_factory=lambda: [2048], min_length=1)
    prompts_per_length: int = Field(default=2, ge=1, le=1000)
    max_tokens: int = Field(default=2, ge=1, le=4096)
    concurrency: int = Field(default=1, ge=1, le=1024)
    seed: int = 0
    pool_dir: str = "kvgate-kv-pool"
    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    drop_caches: bool = True
    min_hit_rate: float = Field(default=0.95, ge=0, le=1)
    populate_timeout_s: float = Field(default=120.0, gt=0)
    request_timeout_s: float = Field(default=1800.0, gt=0)
    # the engine's interpreter; default: this interpreter on a local node, python3 on an SSH node
    python: str | None = None
    engine_values: dict[str, str] = Field(default_factory=dict)
    tokenizer: str | None = None  # local tokenizer.json or directory; overrides the profile's
    # Build the served model on the node from model_config with seeded random weights and a locally
    # trained BPE tokenizer (harness/node/make_model.py, run by the engine's interpreter; nothing from a
    # hub). The model directory is cached on the node by config, seed and dtype; {model} is that directory.
    random_weights: bool = False
    random_weights_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # One unrelated prompt after each engine start (recorded, excluded from the statistics and taken
    # before the counters and device statistics of the phase), so a first-request effect lands on neither.
    warmup: bool = True

    @field_validator("prompt_tokens")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        if any(n < 2 for n in v):
            raise ValueError("every prompt length must be >= 2 tokens")
        return v


def launch_values(p: G2Params, profile: EngineProfile, work_dir: str, gate_id: str, port: int, run_tag: str,
                  node_transport: str = "ssh", node_engine_python: str | None = None) -> dict[str, Any]:
    """Pure: the values an engine profile's argv/env templates are filled with for one G2 run."""
    run_dir = posixpath.join(work_dir, f"kvgate-g2-{gate_id}-{run_tag}")
    pool_root = p.pool_dir if p.pool_dir.startswith("/") else posixpath.join(work_dir, p.pool_dir)
    return engine_values(profile, python=engine_python(p.python, node_transport, node_engine_python), host=p.host,
                         port=port,
                         model=p.model, served_model_name=p.served_model_name, seed=p.seed, run_dir=run_dir,
                         pool_dir=posixpath.join(pool_root, f"run-{run_tag}"),
                         max_model_len=max(p.prompt_tokens) + p.max_tokens + 16, extra=p.engine_values)


class G2Evidence(Evidence):
    """G2's evidence: the engine and where it ran, the prompts, both phases' proof (hits from the engine's
    counters, bytes read from the pool's device), and the pool as populated."""

    engine_profile: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    base_url: str | None = None
    client_path: str | None = None
    pool_dir: str | None = None
    run_dir_on_node: str | None = None
    prompt_kind: str | None = None
    tokenizer: str | None = None
    kv_bytes_per_token: int | None = None
    expected_kv_bytes: int | None = None
    prompts: int | None = None
    prompt_tokens: list[int] = []
    seed: int | None = None
    lmcache_version_pinned: str | None = None
    lmcache_config: dict[str, Any] | None = None
    versions: dict[str, str] = {}
    recompute_hit_tokens: float | None = None
    pool_after_populate: dict[str, Any] | None = None
    page_cache_dropped: bool | None = None
    page_cache_drop_error: str | None = None
    pool_device: str | None = None
    readback_hit_tokens: float | None = None
    readback_query_tokens: float | None = None
    readback_device_read_bytes: int | None = None
    engine_reported_read_bytes: float | None = None
    failed_requests: int = 0
    model_dir_on_node: str | None = None
    random_model: dict[str, Any] | None = None
    warmup: dict[str, Any] = {}
    fallback_lines: list[str] = []


def _stats(xs: list[float], prefix: str) -> dict[str, float]:
    if not xs:
        return {}
    return {f"{prefix}_p50_s": percentile(xs, 50), f"{prefix}_p90_s": percentile(xs, 90),
            f"{prefix}_p99_s": percentile(xs, 99)}


def evaluate_g2(recompute: list[RequestRecord], readback: list[RequestRecord], hit_tokens: float | None,
                query_tokens: float | None, device_read_bytes: int | None, min_hit_rate: float,
                expected_kv_bytes: int, evidence: G2Evidence | None = None,
                fallback: str | None = None) -> WorkloadResult:
    """Pure: metrics and validity from the two phases' records and the read-back evidence (added to
    ``evidence``, a copy of which the result carries)."""
    metrics: dict[str, float] = {}
    failed = [r for r in recompute + readback if not r.ok]
    rc = [r.ttft_s for r in recompute if r.ok]
    rb = [r.ttft_s for r in readback if r.ok]
    metrics.update(_stats(rc, "ttft_recompute"))
    metrics.update(_stats(rb, "ttft_readback"))
    if rc and rb and metrics["ttft_readback_p50_s"] > 0:
        metrics["readback_speedup_p50"] = metrics["ttft_recompute_p50_s"] / metrics["ttft_readback_p50_s"]
    hit_rate = None
    if hit_tokens is not None and query_tokens:
        hit_rate = hit_tokens / query_tokens
        metrics["hit_rate"] = hit_rate
    if device_read_bytes is not None:
        metrics["readback_device_read_bytes"] = float(device_read_bytes)
    ev = (evidence or G2Evidence()).model_copy(update=dict(
        readback_hit_tokens=hit_tokens, readback_query_tokens=query_tokens,
        readback_device_read_bytes=device_read_bytes, expected_kv_bytes=expected_kv_bytes,
        failed_requests=len(failed)))
    error = None
    if failed:
        error = (f"{len(failed)} of {len(recompute) + len(readback)} requests failed; first: "
                 f"{failed[0].request_id}: {failed[0].error}")
    invalid = fallback  # the engine's own log says the tier was not used: nothing else counts
    if invalid is not None:
        pass
    elif hit_rate is None:
        invalid = "the engine exposed no hit counters for the read-back phase: hits from the tier are unproven"
    elif hit_rate < min_hit_rate:
        invalid = f"read-back hit rate {hit_rate:.3f} is below {min_hit_rate}: TTFT was not measured on the tier"
    elif device_read_bytes is None:
        invalid = "bytes read from the pool's device could not be measured: the read-back is not proven cold"
    elif device_read_bytes <= 0:
        invalid = "no bytes were read from the pool's device during read-back: the KV came from a cache, not the tier"
    if invalid is None and ev.recompute_hit_tokens:
        invalid = f"the re-compute phase hit {ev.recompute_hit_tokens:.0f} tokens: prompts were not new"
    if invalid is None and ev.pool_after_populate is not None and not ev.pool_after_populate.get("bytes"):
        invalid = "the pool holds no bytes after populate"
    return WorkloadResult(metrics=metrics, evidence=ev, invalid_reason=invalid, error=error)


@register_workload("g2-ttft")
class G2Ttft(Workload):
    Params = G2Params
    EvidenceModel = G2Evidence
    METRICS = {
        "ttft_recompute_p50_s": "s", "ttft_recompute_p90_s": "s", "ttft_recompute_p99_s": "s",
        "ttft_readback_p50_s": "s", "ttft_readback_p90_s": "s", "ttft_readback_p99_s": "s",
        "readback_speedup_p50": "x", "hit_rate": "ratio", "readback_device_read_bytes": "B",
    }

    # -------------------------------------------------------------------------------- preparation

    def validate_against(self, params, nodes):
        prof, issues = profile_issues(params.engine, nodes, "g2-ttft")
        if prof is not None and prof.engine != "cpu-reference" and (
                params.model_config_inline is None and params.model_config_path is None):
            issues.insert(0, (("model_config",), "needs the model's config.json (for KV bytes per token and vocab size)"))
        kv_dtype = "float32" if prof is not None and prof.engine == "cpu-reference" else None
        return model_config_issues(params.model_config_inline, "model_config_inline", kv_dtype) + issues

    def _model_config(self, p: G2Params) -> dict[str, Any]:
        if p.model_config_inline is not None:
            return dict(p.model_config_inline)
        if p.model_config_path is not None:
            return json.loads(Path(p.model_config_path).read_text())
        return dict(DEFAULT_CPU_REF_MODEL)

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: G2Params = ctx.params
        prof = load_profile(p.engine)
        node = next(iter(ctx.nodes.values()))
        v = launch_values(p, prof, node.work_dir, ctx.gate.id, p.port or 8000, "<run>", node.transport,
                          node.engine_python)
        argv, env = prof.render_argv(v), prof.render_env(v)
        files = {}
        if prof.lmcache is not None:
            files[v["lmcache_config"]] = json.dumps(lmcache_config(prof.lmcache, v), indent=1)
        n = len(p.prompt_tokens) * p.prompts_per_length
        steps = [
            PlannedStep(node.name, f"create {v['run_dir']} and a fresh pool {v['pool_dir']}",
                        ("mkdir", "-p", v["run_dir"], v["pool_dir"], posixpath.join(v["run_dir"], "prometheus")),
                        files=files)]
        if p.random_weights:
            try:
                model_dir = random_model_dir(node.work_dir, self._model_config(p), p.seed, p.random_weights_dtype)
            except (OSError, ValueError):
                model_dir = posixpath.join(node.work_dir, "kvgate-models", "<config hash>")
            script = posixpath.join(v["run_dir"], "make_model.py")
            steps.append(PlannedStep(node.name, f"build (or find) the random-weight model and its tokenizer in {model_dir}",
                                     (v["python"], script, "--config", v["model_config"], "--out", model_dir,
                                      "--seed", str(p.seed), "--dtype", p.random_weights_dtype)))
        warm = "; one unrelated warm-up prompt first (recorded, not in the statistics)" if p.warmup else ""
        check = "; its log is checked for fall-back / connector-failure lines (a match is INVALID)"
        steps += [
            PlannedStep(node.name, f"start {prof.name} in its own process group: {shell_line(argv, env)}", tuple(argv)),
            PlannedStep(node.name, f"re-compute: {n} never-seen prompts of {p.prompt_tokens} tokens, TTFT each "
                        f"(this also stores their KV in the pool){warm}"),
            PlannedStep(node.name, f"wait until the finished chunk files in {v['pool_dir']} hold the expected KV bytes",
                        tuple(pool_files_argv(v["pool_dir"], prof.pool_files))),
            PlannedStep(node.name, f"stop the engine (kill its process group){check}"),
            PlannedStep(node.name, "sync and drop the page cache (recorded whether permitted)", DROP_CACHES_ARGV),
            PlannedStep(node.name, "start the engine again", tuple(argv)),
            PlannedStep(node.name, "the pool's device", ("findmnt", "-n", "-o", "SOURCE", "--target", v["pool_dir"])),
            PlannedStep(node.name, f"read back: the same {n} prompts, TTFT each{warm}; hit counters and "
                        f"/sys/class/block/DEV/stat of the pool's device before and after{check}"),
        ]
        return steps

    # ------------------------------------------------------------------------------------------ run

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: G2Params = ctx.params
        node, transport, prof, python = engine_node(ctx, p.engine, p.python)
        port = engine_port(ctx, transport, node, p.port, python, "g2-port")
        run_tag = uuid.uuid4().hex[:8]
        v = launch_values(p, prof, node.work_dir, ctx.gate.id, port, run_tag, node.transport, node.engine_python)
        base_url, client_path = client_base_url(transport, node, p.host, port)
        gate_dir = ctx.gate_dir
        ev = G2Evidence(engine_profile=prof.name, engine=prof.engine, engine_version=prof.engine_version,
                        base_url=base_url, client_path=client_path, pool_dir=v["pool_dir"], run_dir_on_node=v["run_dir"])
        model_cfg = self._model_config(p)
        try:
            bpt = kv_bytes_per_token(model_cfg, "float32" if prof.engine == "cpu-reference" else None)
        except ValueError as exc:  # a model_config file read only now
            return WorkloadResult(evidence=ev, error=f"model config {p.model_config_path or ''}: {exc}")
        vocab = int(model_cfg.get("vocab_size") or model_cfg.get("text_config", {}).get("vocab_size", 32000))

        # Files for the node: LMCache YAML (strictly checked), model config, the engine's program.
        err, cfg = stage_engine_files(ctx, transport, prof, v, gate_dir, model_cfg, prof.lmcache, "g2-mkdir")
        if err:
            return WorkloadResult(evidence=ev, error=err)
        if prof.lmcache is not None:
            ev.lmcache_version_pinned, ev.lmcache_config = prof.lmcache.version, cfg
        ev.versions = self._versions(ctx, transport, prof, python)

        tok_spec = p.tokenizer or prof.tokenizer
        if p.random_weights:
            err, tok_spec = self._build_model(ctx, transport, python, node, v, p, model_cfg, ev)
            if err:
                return WorkloadResult(evidence=ev, error=err)
        if tok_spec and prof.engine != "cpu-reference":  # cpu-reference has no tokenizer: token ids there
            try:
                tokenizer = load_tokenizer(tok_spec)
                prompts = make_text_prompts(p.seed, p.prompt_tokens, p.prompts_per_length, tokenizer)
                warm = [make_text_prompts(p.seed + WARMUP_SEED_OFFSET + i, [min(p.prompt_tokens)], 1, tokenizer)[0]
                        for i in range(2)]
            except (OSError, ValueError) as exc:
                return WorkloadResult(evidence=ev, error=f"tokenizer {tok_spec}: {exc}")
            ev.prompt_kind, ev.tokenizer = "text", tok_spec
        else:
            prompts = make_prompts(p.seed, p.prompt_tokens, p.prompts_per_length, vocab)
            warm = [make_prompts(p.seed + WARMUP_SEED_OFFSET + i, [min(p.prompt_tokens)], 1, vocab)[0]
                    for i in range(2)]
            ev.prompt_kind = "token_ids"
        expected_bytes = sum(stored_kv_tokens(r.prompt_tokens, prof.kv_block_tokens) for r in prompts) * bpt
        ev.kv_bytes_per_token, ev.expected_kv_bytes, ev.prompts = bpt, expected_bytes, len(prompts)
        ev.prompt_tokens, ev.seed = list(p.prompt_tokens), p.seed

        argv, env = prof.render_argv(v), prof.render_env(v)
        engines: list[EngineProcess] = []

        def engine(label: str) -> EngineProcess:
            eng = EngineProcess(ctx, transport, prof, argv, env, base_url,
                                posixpath.join(v["run_dir"], f"engine-{label}.log"), gate_dir / f"engine-{label}.log")
            engines.append(eng)
            return eng

        def warm_up(label: str, request) -> None:
            """One unrelated prompt right after the start: recorded, never in the statistics."""
            if not p.warmup:
                return
            recs = run_requests_sync(base_url, [request], p.served_model_name, timeout_s=p.request_timeout_s,
                                     transport=ctx.http)
            self._save(gate_dir / f"requests-warmup-{label}.jsonl", recs)
            ev.warmup[label] = {"request_id": recs[0].request_id, "ttft_s": recs[0].ttft_s, "error": recs[0].error}

        fallback = None
        readback: list[RequestRecord] = []
        m0 = m1 = s0 = s1 = None
        try:
            eng = engine("recompute")
            err = start_engine(eng, "recompute")
            if err:
                return WorkloadResult(evidence=ev, error=err)
            warm_up("recompute", warm[0])
            m0 = eng.metrics()
            ctx.progress(f"{ctx.gate.id}: re-compute phase, {len(prompts)} prompts")
            recompute = run_requests_sync(base_url, prompts, p.served_model_name, concurrency=p.concurrency,
                                          timeout_s=p.request_timeout_s, transport=ctx.http)
            m1 = eng.metrics()
            ev.recompute_hit_tokens = counter_delta(m0, m1, prof.hit_metrics.hit_tokens)
            self._save(gate_dir / "requests-recompute.jsonl", recompute)

            ev.pool_after_populate = pool_contents(ctx, transport, v["pool_dir"], expected_bytes,
                                                   p.populate_timeout_s, "g2-pool-after-populate", prof.pool_files)
            eng.stop()
            found = eng.fallbacks()
            ev.fallback_lines = [m.quote() for m in found]
            fallback = fallback_reason(found, "re-compute")
            if fallback is None:  # a tier that did nothing in the first phase is not read back
                if p.drop_caches:
                    drop = drop_caches(ctx, transport, "g2-drop-caches")
                    ev.page_cache_dropped, ev.page_cache_drop_error = drop.dropped, drop.error
                else:
                    ev.page_cache_dropped = False

                eng = engine("readback")
                err = start_engine(eng, "readback")
                if err:
                    return WorkloadResult(evidence=ev, error=err)
                warm_up("readback", warm[1])
                dev = self._pool_device(ctx, transport, v["pool_dir"])
                ev.pool_device = dev
                s0 = self._block_stat(ctx, transport, dev)
                m0 = eng.metrics()
                ctx.progress(f"{ctx.gate.id}: cold read-back phase, {len(prompts)} prompts")
                readback = run_requests_sync(base_url, prompts, p.served_model_name, concurrency=p.concurrency,
                                             timeout_s=p.request_timeout_s, transport=ctx.http)
                m1 = eng.metrics()
                s1 = self._block_stat(ctx, transport, dev)
                self._save(gate_dir / "requests-readback.jsonl", readback)
                eng.stop()
                found = eng.fallbacks()
                ev.fallback_lines += [m.quote() for m in found]
                fallback = fallback_reason(found, "read-back")
        except (httpx.HTTPError, WorkloadError, OSError) as exc:
            tail = engines[-1].log_tail() if engines else ""
            return WorkloadResult(evidence=ev, error=f"{type(exc).__name__}: {exc}\n{tail}".strip())
        finally:
            for e in engines:
                e.stop()

        if readback:
            ev.engine_reported_read_bytes = counter_delta(m0, m1, prof.hit_metrics.read_bytes)
            hit = counter_delta(m0, m1, prof.hit_metrics.hit_tokens)
            query = counter_delta(m0, m1, prof.hit_metrics.query_tokens)
        else:
            hit = query = None
        read_bytes = None if s0 is None or s1 is None else s1.read_bytes - s0.read_bytes
        result = evaluate_g2(recompute, readback, hit, query, read_bytes, p.min_hit_rate, expected_bytes, ev,
                             fallback=fallback)
        write_summary(gate_dir, "g2-summary.json", result)
        return result

    def _build_model(self, ctx, transport, python: str, node, v: dict[str, Any], p: G2Params,
                     model_cfg: dict[str, Any], ev: G2Evidence) -> tuple[str | None, str | None]:
        """Build (or find, cached) the random-weight model on the node; fetch its tokenizer. Sets {model}."""
        model_dir = random_model_dir(node.work_dir, model_cfg, p.seed, p.random_weights_dtype)
        script = posixpath.join(v["run_dir"], "make_model.py")
        transport.put(program_path("make_model.py"), script)
        ctx.progress(f"{ctx.gate.id}: random-weight model in {model_dir} on {node.name}")
        res = ctx.steps.run(transport, "g2-make-model",
                            [python, script, "--config", v["model_config"], "--out", model_dir,
                             "--seed", str(p.seed), "--dtype", p.random_weights_dtype], timeout_s=1800)
        if not res.ok:
            return f"could not build the random-weight model on {node.name}: {res.summary()}", None
        try:
            ev.random_model = json.loads(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"make_model printed no description: {res.stdout[-300:]!r}", None
        local_tok = ctx.gate_dir / "tokenizer.json"
        transport.get(posixpath.join(model_dir, "tokenizer.json"), local_tok)
        v["model"] = model_dir
        ev.model_dir_on_node = model_dir
        return None, str(local_tok)

    # --------------------------------------------------------------------------------------- helpers

    @staticmethod
    def _save(path: Path, records: list[RequestRecord]) -> None:
        path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))

    def _versions(self, ctx, transport, prof: EngineProfile, python: str) -> dict[str, str]:
        code = ("import importlib.metadata as m\nfor d in ('vllm','lmcache','torch','transformers','sglang','kvbm'):\n"
                "    try: print(d, m.version(d))\n    except Exception: pass\n")
        res = ctx.steps.run(transport, "g2-versions", [python, "-c", code], timeout_s=60)
        out = dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)
        if prof.lmcache is not None and out.get("lmcache") and out["lmcache"] != prof.lmcache.version:
            out["warning"] = f"profile written for LMCache {prof.lmcache.version}, node has {out['lmcache']}"
        return out

    def _pool_device(self, ctx, transport, pool_dir: str) -> str | None:
        res = ctx.steps.run(transport, "g2-pool-device", ["findmnt", "-n", "-o", "SOURCE", "--target", pool_dir],
                            timeout_s=30)
        src = res.stdout.strip().splitlines()[0] if res.ok and res.stdout.strip() else ""
        if not src.startswith("/dev/"):
            return None
        return posixpath.basename(src.split("[")[0])

    def _block_stat(self, ctx, transport, dev: str | None):
        if dev is None:
            return None
        res = ctx.steps.run(transport, "g2-blockstat", ["cat", f"/sys/class/block/{dev}/stat"], timeout_s=30)
        try:
            return parse_block_stat(res.stdout) if res.ok else None
        except ValueError:
            return None
