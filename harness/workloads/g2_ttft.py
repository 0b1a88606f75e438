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
import random
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from pydantic import Field, field_validator

from ..engines import (DEFAULT_CPU_REF_MODEL, EngineProfile, kv_bytes_per_token,
                       lmcache_config, load_profile, metric_total, parse_block_stat, parse_prometheus,
                       shell_line, write_lmcache_yaml)
from ..errors import ConfigError, WorkloadError
from ..ttft_client import CompletionRequest, RequestRecord, percentile, run_requests_sync
from ..verdict import WorkloadResult
from .base import GateContext, PlannedStep, StrictModel, Workload, register_workload

DROP_CACHES_ARGV = ("sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches")


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

    @field_validator("prompt_tokens")
    @classmethod
    def _lengths(cls, v: list[int]) -> list[int]:
        if any(n < 2 for n in v):
            raise ValueError("every prompt length must be >= 2 tokens")
        return v


def make_prompts(seed: int, lengths: list[int], per_length: int, vocab_size: int) -> list[CompletionRequest]:
    """Deterministic token-id prompts: same seed, lengths and vocabulary -> same prompts, any machine.
    Ids avoid 0..9 (special tokens in most vocabularies)."""
    out = []
    for length in lengths:
        for i in range(per_length):
            rng = random.Random(f"kvgate-g2:{seed}:{length}:{i}")
            ids = [rng.randrange(10, vocab_size) for _ in range(length)]
            out.append(CompletionRequest(f"s{seed}-n{length}-i{i}", ids, prompt_tokens=length))
    return out


def stage_engine_files(ctx: GateContext, transport, v: dict[str, Any], gate_dir: Path, model_cfg: dict[str, Any],
                       lmcache, step: str) -> tuple[str | None, dict[str, Any] | None]:
    """Create the engine's directories on the node and put its model config and its LMCache YAML (strictly
    checked) there. Returns (error, the LMCache config written or None)."""
    res = ctx.steps.run(transport, step, ["mkdir", "-p", v["run_dir"], v["pool_dir"],
                                          posixpath.join(v["run_dir"], "prometheus")])
    if not res.ok:
        return f"could not create directories: {res.summary()}", None
    (gate_dir / "model-config.json").write_text(json.dumps(model_cfg, indent=1))
    transport.put(gate_dir / "model-config.json", v["model_config"])
    if lmcache is None:
        return None, None
    try:
        cfg = write_lmcache_yaml(lmcache, v, gate_dir / "lmcache.yaml")
    except ConfigError as exc:
        return f"LMCache config rejected: {exc}", None
    transport.put(gate_dir / "lmcache.yaml", v["lmcache_config"])
    return None, cfg


def client_base_url(transport, node, bind_host: str, port: int) -> tuple[str, str]:
    """Where the TTFT client reaches the engine, and how: directly on a local node or on an SSH node's
    routable bind address; through an SSH port forward when the engine binds the node's loopback."""
    if getattr(node, "transport", "local") == "local":
        return f"http://{bind_host}:{port}", "direct"
    if bind_host in ("127.0.0.1", "localhost", "::1"):
        host, fport = transport.forward_port(bind_host, port)
        return f"http://{host}:{fport}", f"ssh-forward to {node.name}:{bind_host}:{port}"
    return f"http://{bind_host if bind_host not in ('0.0.0.0', '::') else node.host}:{port}", "direct"


def engine_python(python: str | None, node_transport: str, node_engine_python: str | None = None) -> str:
    """The engine's interpreter: as the gate gives it, else the node's ``engine_python`` (its engine
    environment), else this one on a local node (kvgate's venv, where setup installs the CPU engine),
    else ``python3`` on the node's PATH."""
    if python:
        return python
    if node_engine_python:
        return node_engine_python
    return sys.executable if node_transport == "local" else "python3"


def launch_values(p: G2Params, work_dir: str, gate_id: str, port: int, run_tag: str,
                  node_transport: str = "ssh", node_engine_python: str | None = None) -> dict[str, Any]:
    """Pure: the values an engine profile's argv/env templates are filled with for one G2 run."""
    remote = posixpath.join(work_dir, f"kvgate-g2-{gate_id}-{run_tag}")
    pool_root = p.pool_dir if p.pool_dir.startswith("/") else posixpath.join(work_dir, p.pool_dir)
    values = {"python": engine_python(p.python, node_transport, node_engine_python), "host": p.host, "port": port, "model": p.model,
              "served_model_name": p.served_model_name, "seed": p.seed, "run_dir": remote,
              "pool_dir": posixpath.join(pool_root, f"run-{run_tag}"),
              "lmcache_config": posixpath.join(remote, "lmcache.yaml"),
              "model_config": posixpath.join(remote, "model-config.json"),
              "tensor_parallel_size": 1, "max_model_len": max(p.prompt_tokens) + p.max_tokens + 16,
              "cpu_cache_gb": 4, "disk_cache_gb": 64}
    values.update(p.engine_values)
    return values


def make_text_prompts(seed: int, lengths: list[int], per_length: int, tokenizer) -> list[CompletionRequest]:
    """Deterministic text prompts that the model's tokenizer encodes to exactly the configured lengths."""
    from ..engines.prompts import text_prompt
    return [CompletionRequest(f"s{seed}-n{length}-i{i}", text_prompt(tokenizer, length, f"kvgate-g2:{seed}:{i}"),
                              prompt_tokens=length)
            for length in lengths for i in range(per_length)]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stats(xs: list[float], prefix: str) -> dict[str, float]:
    if not xs:
        return {}
    return {f"{prefix}_p50_s": percentile(xs, 50), f"{prefix}_p90_s": percentile(xs, 90),
            f"{prefix}_p99_s": percentile(xs, 99)}


def evaluate_g2(recompute: list[RequestRecord], readback: list[RequestRecord], hit_tokens: float | None,
                query_tokens: float | None, device_read_bytes: int | None, min_hit_rate: float,
                expected_kv_bytes: int) -> WorkloadResult:
    """Pure: metrics and validity from the two phases' records and the read-back evidence."""
    metrics: dict[str, float] = {}
    evidence: dict[str, Any] = {}
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
    evidence.update(readback_hit_tokens=hit_tokens, readback_query_tokens=query_tokens,
                    readback_device_read_bytes=device_read_bytes, expected_kv_bytes=expected_kv_bytes,
                    failed_requests=len(failed))
    error = None
    if failed:
        error = (f"{len(failed)} of {len(recompute) + len(readback)} requests failed; first: "
                 f"{failed[0].request_id}: {failed[0].error}")
    invalid = None
    if hit_rate is None:
        invalid = "the engine exposed no hit counters for the read-back phase: hits from the tier are unproven"
    elif hit_rate < min_hit_rate:
        invalid = f"read-back hit rate {hit_rate:.3f} is below {min_hit_rate}: TTFT was not measured on the tier"
    elif device_read_bytes is None:
        invalid = "bytes read from the pool's device could not be measured: the read-back is not proven cold"
    elif device_read_bytes <= 0:
        invalid = "no bytes were read from the pool's device during read-back: the KV came from a cache, not the tier"
    return WorkloadResult(metrics=metrics, evidence=evidence, invalid_reason=invalid, error=error)


class _Engine:
    """One engine instance on a node: spawn in its own process group, readiness wait, kill the group."""

    def __init__(self, ctx: GateContext, transport, profile: EngineProfile, argv: list[str], env: dict[str, str],
                 base_url: str, log_path: str, local_log: Path):
        self.ctx, self.transport, self.profile = ctx, transport, profile
        self.argv, self.env, self.base_url = argv, env, base_url
        self.log_path, self.local_log = log_path, local_log
        self.proc = None

    def start(self) -> None:
        d = self.ctx.steps.new_dir(self.transport.name, f"spawn-{self.profile.name}")
        (d / "argv.json").write_text(json.dumps({"node": self.transport.name, "argv": self.argv, "env": self.env,
                                                 "log_path": self.log_path}, indent=1))
        self.proc = self.transport.spawn(self.argv, env=self.env, log_path=self.log_path)
        (d / "status.json").write_text(json.dumps({"status": "spawned", "pid": self.proc.pid}))

    def wait_ready(self, timeout_s: float) -> tuple[bool, str]:
        deadline = time.monotonic() + timeout_s
        url = self.base_url + self.profile.health_path
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                return False, f"engine exited with rc {rc} before it was ready"
            try:
                if httpx.get(url, timeout=5.0).status_code == 200:
                    return True, "ready"
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return False, f"engine not ready after {timeout_s:.0f} s"

    def metrics(self) -> list:
        r = httpx.get(self.base_url + self.profile.metrics_path, timeout=30.0)
        r.raise_for_status()
        return parse_prometheus(r.text)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill_group(grace_s=10.0)
            self.proc.wait(10.0)
        self.fetch_log()

    def fetch_log(self) -> None:
        try:
            self.transport.get(self.log_path, self.local_log)
        except Exception:  # noqa: BLE001 - a missing log is reported by its absence, not a crash
            pass

    def log_tail(self, n: int = 40) -> str:
        self.fetch_log()
        try:
            return "\n".join(self.local_log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no engine log)"


@register_workload("g2-ttft")
class G2Ttft(Workload):
    Params = G2Params
    METRICS = {
        "ttft_recompute_p50_s": "s", "ttft_recompute_p90_s": "s", "ttft_recompute_p99_s": "s",
        "ttft_readback_p50_s": "s", "ttft_readback_p90_s": "s", "ttft_readback_p99_s": "s",
        "readback_speedup_p50": "x", "hit_rate": "ratio", "readback_device_read_bytes": "B",
    }

    # -------------------------------------------------------------------------------- preparation

    def validate_against(self, params, nodes):
        issues = []
        try:
            prof = load_profile(params.engine)
        except ConfigError as exc:
            return [(("engine",), str(exc.issues[0]))]
        if prof.engine != "cpu-reference" and (params.model_config_inline is None and params.model_config_path is None):
            issues.append((("model_config",), "needs the model's config.json (for KV bytes per token and vocab size)"))
        if len(nodes) != 1:
            issues.append((("nodes",), f"g2-ttft runs on exactly one node, got {len(nodes)}"))
        return issues

    def _model_config(self, p: G2Params) -> dict[str, Any]:
        if p.model_config_inline is not None:
            return dict(p.model_config_inline)
        if p.model_config_path is not None:
            return json.loads(Path(p.model_config_path).read_text())
        return dict(DEFAULT_CPU_REF_MODEL)

    def _layout(self, ctx: GateContext, node, port: int, run_tag: str) -> dict[str, Any]:
        return launch_values(ctx.params, node.work_dir, ctx.gate.id, port, run_tag, node.transport,
                             node.engine_python)

    def plan(self, ctx: GateContext) -> list[PlannedStep]:
        p: G2Params = ctx.params
        prof = load_profile(p.engine)
        node = next(iter(ctx.nodes.values()))
        v = self._layout(ctx, node, p.port or 8000, "<run>")
        argv, env = prof.render_argv(v), prof.render_env(v)
        files = {}
        if prof.lmcache is not None:
            files[v["lmcache_config"]] = json.dumps(lmcache_config(prof.lmcache, v), indent=1)
        n = len(p.prompt_tokens) * p.prompts_per_length
        return [
            PlannedStep(node.name, f"create {v['run_dir']} and a fresh pool {v['pool_dir']}",
                        ("mkdir", "-p", v["run_dir"], v["pool_dir"]), files=files),
            PlannedStep(node.name, f"start {prof.name} in its own process group: {shell_line(argv, env)}", tuple(argv)),
            PlannedStep(node.name, f"re-compute: {n} never-seen prompts of {p.prompt_tokens} tokens, TTFT each "
                        "(this also stores their KV in the pool)"),
            PlannedStep(node.name, f"wait until {v['pool_dir']} holds the expected KV bytes", ("du", "-sb", v["pool_dir"])),
            PlannedStep(node.name, "stop the engine (kill its process group)"),
            PlannedStep(node.name, "sync and drop the page cache (recorded whether permitted)", DROP_CACHES_ARGV),
            PlannedStep(node.name, "start the engine again", tuple(argv)),
            PlannedStep(node.name, f"read back: the same {n} prompts, TTFT each; hit counters and "
                        "/sys/class/block/DEV/stat of the pool's device before and after"),
        ]

    # ------------------------------------------------------------------------------------------ run

    def run(self, ctx: GateContext) -> WorkloadResult:
        p: G2Params = ctx.params
        node = next(iter(ctx.nodes.values()))
        transport = ctx.transports[node.name]
        prof = load_profile(p.engine)
        is_local = getattr(node, "transport", "local") == "local"
        port = p.port or (free_port(p.host) if is_local else 8000)
        run_tag = uuid.uuid4().hex[:8]
        v = self._layout(ctx, node, port, run_tag)
        base_url, client_path = client_base_url(transport, node, p.host, port)
        gate_dir = ctx.gate_dir
        evidence: dict[str, Any] = {"engine_profile": prof.name, "engine": prof.engine,
                                    "engine_version": prof.engine_version, "base_url": base_url,
                                    "client_path": client_path,
                                    "pool_dir": v["pool_dir"], "run_dir_on_node": v["run_dir"]}
        model_cfg = self._model_config(p)
        bpt = kv_bytes_per_token(model_cfg, "float32" if prof.engine == "cpu-reference" else None)
        vocab = int(model_cfg.get("vocab_size") or model_cfg.get("text_config", {}).get("vocab_size", 32000))
        tok_spec = p.tokenizer or prof.tokenizer
        if tok_spec and prof.engine != "cpu-reference":  # cpu-reference has no tokenizer: token ids there
            from ..engines.prompts import load_tokenizer
            try:
                prompts = make_text_prompts(p.seed, p.prompt_tokens, p.prompts_per_length, load_tokenizer(tok_spec))
            except (OSError, ValueError) as exc:
                return WorkloadResult(evidence=evidence, error=f"tokenizer {tok_spec}: {exc}")
            evidence.update(prompt_kind="text", tokenizer=tok_spec)
        else:
            prompts = make_prompts(p.seed, p.prompt_tokens, p.prompts_per_length, vocab)
            evidence["prompt_kind"] = "token_ids"
        expected_bytes = sum(r.prompt_tokens for r in prompts) * bpt
        evidence.update(kv_bytes_per_token=bpt, expected_kv_bytes=expected_bytes, prompts=len(prompts),
                        prompt_tokens=p.prompt_tokens, seed=p.seed)

        # Files for the node: LMCache YAML (strictly checked), model config.
        err, cfg = stage_engine_files(ctx, transport, v, gate_dir, model_cfg, prof.lmcache, "g2-mkdir")
        if err:
            return WorkloadResult(evidence=evidence, error=err)
        if prof.lmcache is not None:
            evidence["lmcache_version_pinned"] = prof.lmcache.version
            evidence["lmcache_config"] = cfg
        evidence["versions"] = self._versions(ctx, transport, prof, p)

        argv, env = prof.render_argv(v), prof.render_env(v)
        engines: list[_Engine] = []

        def start(label: str) -> tuple[_Engine | None, str | None]:
            eng = _Engine(ctx, transport, prof, argv, env, base_url,
                          posixpath.join(v["run_dir"], f"engine-{label}.log"), gate_dir / f"engine-{label}.log")
            engines.append(eng)
            ctx.progress(f"{ctx.gate.id}: starting {prof.name} ({label})")
            eng.start()
            ok, why = eng.wait_ready(prof.ready_timeout_s)
            if not ok:
                tail = eng.log_tail()
                eng.stop()
                return None, f"{prof.name} ({label}) did not start: {why}; log gate_dir/engine-{label}.log:\n{tail}"
            return eng, None

        try:
            eng, err = start("recompute")
            if err:
                return WorkloadResult(evidence=evidence, error=err)
            m0 = eng.metrics()
            ctx.progress(f"{ctx.gate.id}: re-compute phase, {len(prompts)} prompts")
            recompute = run_requests_sync(base_url, prompts, p.served_model_name, concurrency=p.concurrency,
                                          timeout_s=p.request_timeout_s)
            m1 = eng.metrics()
            evidence["recompute_hit_tokens"] = _delta(m0, m1, prof.hit_metrics.hit_tokens)
            self._save(gate_dir / "requests-recompute.jsonl", recompute)

            pool = self._wait_pool(ctx, transport, v["pool_dir"], expected_bytes, p.populate_timeout_s)
            evidence["pool_after_populate"] = pool
            eng.stop()

            drop = ctx.steps.run(transport, "g2-drop-caches", list(DROP_CACHES_ARGV), timeout_s=300) \
                if p.drop_caches else None
            evidence["page_cache_dropped"] = bool(drop and drop.ok)
            if drop is not None and not drop.ok:
                evidence["page_cache_drop_error"] = drop.summary()

            eng, err = start("readback")
            if err:
                return WorkloadResult(evidence=evidence, error=err)
            dev = self._pool_device(ctx, transport, v["pool_dir"])
            evidence["pool_device"] = dev
            s0 = self._block_stat(ctx, transport, dev)
            m0 = eng.metrics()
            ctx.progress(f"{ctx.gate.id}: cold read-back phase, {len(prompts)} prompts")
            readback = run_requests_sync(base_url, prompts, p.served_model_name, concurrency=p.concurrency,
                                         timeout_s=p.request_timeout_s)
            m1 = eng.metrics()
            s1 = self._block_stat(ctx, transport, dev)
            self._save(gate_dir / "requests-readback.jsonl", readback)
            eng.stop()
        except (httpx.HTTPError, WorkloadError, OSError) as exc:
            tail = engines[-1].log_tail() if engines else ""
            return WorkloadResult(evidence=evidence, error=f"{type(exc).__name__}: {exc}\n{tail}".strip())
        finally:
            for e in engines:
                e.stop()

        hit = _delta(m0, m1, prof.hit_metrics.hit_tokens)
        query = _delta(m0, m1, prof.hit_metrics.query_tokens)
        read_bytes = None if s0 is None or s1 is None else s1.read_bytes - s0.read_bytes
        result = evaluate_g2(recompute, readback, hit, query, read_bytes, p.min_hit_rate, expected_bytes)
        result.evidence = {**evidence, **result.evidence,
                           "engine_reported_read_bytes": _delta(m0, m1, prof.hit_metrics.read_bytes)}
        if evidence.get("recompute_hit_tokens"):
            result.invalid_reason = result.invalid_reason or (
                f"the re-compute phase hit {evidence['recompute_hit_tokens']:.0f} tokens: prompts were not new")
        if not pool.get("bytes"):
            result.invalid_reason = result.invalid_reason or "the pool holds no bytes after populate"
        (gate_dir / "g2-summary.json").write_text(json.dumps({"metrics": result.metrics, "evidence": result.evidence,
                                                              "invalid_reason": result.invalid_reason,
                                                              "error": result.error}, indent=1, default=str))
        return result

    # --------------------------------------------------------------------------------------- helpers

    @staticmethod
    def _save(path: Path, records: list[RequestRecord]) -> None:
        path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))

    def _versions(self, ctx, transport, prof: EngineProfile, p: G2Params) -> dict[str, str | None]:
        code = ("import importlib.metadata as m\nfor d in ('vllm','lmcache','torch','transformers','sglang','kvbm'):\n"
                "    try: print(d, m.version(d))\n    except Exception: pass\n")
        node = ctx.nodes.get(transport.name)
        python = engine_python(p.python, node.transport if node else "ssh", node.engine_python if node else None)
        res = ctx.steps.run(transport, "g2-versions", [python, "-c", code], timeout_s=60)
        out = dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)
        if prof.lmcache is not None and out.get("lmcache") and out["lmcache"] != prof.lmcache.version:
            out["warning"] = f"profile written for LMCache {prof.lmcache.version}, node has {out['lmcache']}"
        return out

    def _wait_pool(self, ctx, transport, pool_dir: str, expected: int, timeout_s: float) -> dict[str, Any]:
        """Poll the pool until it holds the expected bytes (LMCache writes asynchronously) or stops growing."""
        deadline = time.monotonic() + timeout_s
        last = -1
        info: dict[str, Any] = {}
        while True:
            res = transport.run(["sh", "-c", 'du -sb "$1" | cut -f1; find "$1" -type f | wc -l', "sh", pool_dir],
                                timeout_s=60)
            lines = res.stdout.split()
            size = int(lines[0]) if res.ok and lines and lines[0].isdigit() else 0
            files = int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else 0
            info = {"bytes": size, "files": files, "expected_kv_bytes": expected}
            if size >= expected or time.monotonic() > deadline or (size == last and size > 0 and size >= 0.5 * expected):
                break
            last = size
            time.sleep(1.0)
        d = ctx.steps.new_dir(transport.name, "g2-pool-after-populate")
        (d / "status.json").write_text(json.dumps(info))
        return info

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


def _delta(m0: list, m1: list, names: list[str]) -> float | None:
    if not names:
        return None
    a, b = metric_total(m0, names), metric_total(m1, names)
    return None if a is None or b is None else b - a
