"""An engine instance on a node, from its files to its log: the lifecycle G2, g2-gain and R3 share.

- the profile check every engine workload does at validation (:func:`profile_issues`);
- the values a profile's templates are filled with (:func:`engine_values`), a free port for it on its node
  (:func:`engine_port`), and how the orchestrator reaches it (:func:`client_base_url`: directly, or through an
  SSH port forward when the engine binds an SSH node's loopback);
- its files on the node (:func:`stage_engine_files`: run and pool directories, model config, the strictly
  checked LMCache YAML, and the node program a profile runs, e.g. ``cpu_reference.py``);
- :class:`EngineProcess`: spawned in its own process group, a readiness wait that notices a crashed engine,
  its Prometheus metrics, stop (the whole group) and its log's tail;
- what the KV pool holds (:func:`pool_contents`).

HTTP to the engine goes through ``ctx.http`` (an httpx transport; None is the network), the seam tests use.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from ...engines import ArchError, EngineProfile, LMCacheSettings, arch_from_config, load_profile, write_lmcache_yaml
from ...engines.preflight import parse_preflight, preflight_argv, preflight_hint, preflight_problem
from ...engines.profiles import program_file
from ...errors import ConfigError
from ...node import program_path
from ...parsers.engine_log import LogMatch, new_log_lines, scan_fallbacks
from ...parsers.prometheus import Sample, parse_prometheus
from ...transport.local import free_port
from .base import GateContext, PoolSnapshot, write_gate_file

# Prints a free TCP port of the node's loopback (the kernel picks it); run with the engine's interpreter.
FREE_PORT_CODE = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"


def profile_issues(engine: str, nodes: dict[str, Any], workload: str,
                   node_count: int = 1) -> tuple[EngineProfile | None, list[tuple[tuple, str]]]:
    """The engine profile a gate names and the validation issues of an engine workload: the profile loads
    (and its LMCache block checks) and the gate has ``node_count`` nodes. What the workload needs of the
    engine is checked against the profile's declared capabilities, by the workload."""
    try:
        prof = load_profile(engine)
    except ConfigError as exc:
        return None, [(("engine",), str(exc.issues[0]))]
    issues: list[tuple[tuple, str]] = []
    if len(nodes) != node_count:
        what = "one node" if node_count == 1 else f"{node_count} nodes"
        issues.append((("nodes",), f"{workload} runs on exactly {what}, got {len(nodes)}"))
    return prof, issues


def model_config_issues(config: dict[str, Any] | None, key: str, kv_dtype: str | None) -> list[tuple[tuple, str]]:
    """A model config given in the gate must describe a KV shape (KV bytes per token are computed from it):
    the issue names the key of the config that is missing or wrong."""
    if config is None:
        return []
    try:
        arch_from_config(config, kv_dtype=kv_dtype)
    except ArchError as exc:
        return [((key, exc.field), exc.message)]
    return []


def engine_node(ctx: GateContext, engine: str, python: str | None) -> tuple[Any, Any, EngineProfile, str]:
    """A single-node engine gate's node, its transport, the engine profile and the engine's interpreter."""
    node = next(iter(ctx.nodes.values()))
    return node, ctx.transports[node.name], load_profile(engine), node_engine_python(python, node)


def engine_python(python: str | None, node_transport: str, node_engine_python: str | None = None) -> str:
    """The engine's interpreter: as the gate gives it, else the node's ``engine_python`` (its engine
    environment), else this one on a local node (kvgate's venv, where setup installs the CPU engine),
    else ``python3`` on the node's PATH."""
    if python:
        return python
    if node_engine_python:
        return node_engine_python
    return sys.executable if node_transport == "local" else "python3"


def node_engine_python(python: str | None, node: Any) -> str:
    """:func:`engine_python` for an inventory node."""
    return engine_python(python, getattr(node, "transport", "ssh"), getattr(node, "engine_python", None))


def engine_values(profile: EngineProfile, *, python: str, host: str, port: int, model: str, served_model_name: str,
                  seed: int, run_dir: str, pool_dir: str, max_model_len: int, extra: dict[str, str] | None = None
                  ) -> dict[str, Any]:
    """Pure: the values a profile's argv/env templates are filled with for one engine instance."""
    values: dict[str, Any] = {
        "python": python, "host": host, "port": port, "model": model, "served_model_name": served_model_name,
        "seed": seed, "run_dir": run_dir, "pool_dir": pool_dir,
        "lmcache_config": posixpath.join(run_dir, "lmcache.yaml"),
        "model_config": posixpath.join(run_dir, "model-config.json"),
        "program": posixpath.join(run_dir, profile.program) if profile.program else None,
        "tensor_parallel_size": 1, "max_model_len": max_model_len, "cpu_cache_gb": 4, "disk_cache_gb": 64}
    values.update(extra or {})
    return values


def engine_port(ctx: GateContext, transport: Any, node: Any, requested: int, python: str, step: str) -> int:
    """The port an engine listens on: as requested, else one free now on its node (this machine's kernel
    picks it for a local node; the node's, through its interpreter, for an SSH node)."""
    if requested:
        return requested
    if getattr(node, "transport", "local") == "local":
        return free_port("127.0.0.1")
    r = ctx.steps.run(transport, step, [python, "-c", FREE_PORT_CODE], timeout_s=60)
    if not r.ok or not r.stdout.strip().isdigit():
        raise RuntimeError(f"no free port on {node.name}: {r.summary()}")
    return int(r.stdout.strip())


def client_base_url(transport: Any, node: Any, bind_host: str, port: int) -> tuple[str, str]:
    """Where the orchestrator reaches the engine, and how: directly on a local node or on an SSH node's
    routable bind address; through an SSH port forward when the engine binds the node's loopback."""
    if getattr(node, "transport", "local") == "local":
        return f"http://{bind_host}:{port}", "direct"
    if bind_host in ("127.0.0.1", "localhost", "::1"):
        host, fport = transport.forward_port(bind_host, port)
        return f"http://{host}:{fport}", f"ssh-forward to {node.name}:{bind_host}:{port}"
    return f"http://{bind_host if bind_host not in ('0.0.0.0', '::') else node.host}:{port}", "direct"


def stage_engine_files(ctx: GateContext, transport: Any, profile: EngineProfile, v: dict[str, Any], local_dir: Path,
                       model_cfg: dict[str, Any], lmcache: LMCacheSettings | None,
                       step: str) -> tuple[str | None, dict[str, Any] | None]:
    """Create the engine's directories on the node and put there its model config, its LMCache YAML
    (strictly checked) and the node program the profile runs. Returns (error, the LMCache config written)."""
    res = ctx.steps.run(transport, step, ["mkdir", "-p", v["run_dir"], v["pool_dir"],
                                          posixpath.join(v["run_dir"], "prometheus")], timeout_s=60)
    if not res.ok:
        return f"could not create directories on {transport.name}: {res.summary()}", None
    local_dir.mkdir(parents=True, exist_ok=True)
    write_gate_file(local_dir / "model-config.json", json.dumps(model_cfg, indent=1))
    transport.put(local_dir / "model-config.json", v["model_config"])
    if profile.program:
        transport.put(program_file(profile.program), v["program"])
    if lmcache is None:
        return None, None
    try:
        cfg = write_lmcache_yaml(lmcache, v, local_dir / "lmcache.yaml")
    except ConfigError as exc:
        return f"LMCache config rejected: {exc}", None
    transport.put(local_dir / "lmcache.yaml", v["lmcache_config"])
    return None, cfg


class EngineProcess:
    """One engine instance on a node: spawned in its own process group, waited for, stopped as a group."""

    def __init__(self, ctx: GateContext, transport: Any, profile: EngineProfile, argv: list[str],
                 env: dict[str, str], base_url: str, log_path: str, local_log: Path):
        self.ctx, self.transport, self.profile = ctx, transport, profile
        self.argv, self.env, self.base_url = argv, env, base_url
        self.log_path, self.local_log = log_path, local_log
        self.proc = None
        self._stopped = False

    def _get(self, path: str, timeout_s: float) -> httpx.Response:
        # not sent once the gate is cancelled; bounded by the gate's deadline
        self.ctx.cancel.check()
        with httpx.Client(transport=self.ctx.http, timeout=self.ctx.cancel.bound_timeout_s(timeout_s)) as client:
            return client.get(self.base_url + path)

    def start(self) -> None:
        """Spawn the engine in its own process group, its output to its log on the node (a logged step)."""
        # through the step log, the one writer of step records: the environment's secrets are redacted there
        self.proc, _ = self.ctx.steps.spawn(self.transport, f"spawn-{self.profile.name}", self.argv, env=self.env,
                                            log_path=self.log_path)

    def wait_ready(self, timeout_s: float) -> tuple[bool, str]:
        """Poll the health endpoint until it answers 200; an engine that exits meanwhile ends the wait at once."""
        clock = self.ctx.clock
        deadline = clock.now() + timeout_s
        while clock.now() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                return False, f"engine exited with rc {rc} before it was ready"
            try:
                if self._get(self.profile.health_path, 5.0).status_code == 200:
                    return True, "ready"
            except httpx.HTTPError:
                pass
            self.ctx.cancel.sleep(0.5)  # the gate's end ends the wait (Cancelled)
        return False, f"engine not ready after {timeout_s:.0f} s"

    def metrics(self) -> list[Sample]:
        r = self._get(self.profile.metrics_path, 30.0)
        r.raise_for_status()
        return parse_prometheus(r.text)

    def stop(self) -> None:
        """Kill the engine's process group (once) and fetch its log into the gate directory."""
        if self.proc is not None and not self._stopped:
            self._stopped = True
            self.proc.kill_group(grace_s=10.0)
            self.proc.wait(10.0)
        self.fetch_log()

    def fetch_log(self) -> None:
        try:
            self.transport.get(self.log_path, self.local_log)
        except Exception:  # noqa: BLE001 - a missing log is reported by its absence, not a crash
            pass

    def log_text(self) -> str | None:
        """The engine's log so far (fetched from the node), None when there is none yet."""
        self.fetch_log()
        try:
            return self.local_log.read_text(errors="replace")
        except OSError:
            return None

    def log_tail(self, n: int = 40) -> str:
        text = self.log_text()
        return "(no engine log)" if text is None else "\n".join(text.splitlines()[-n:])


@dataclass(frozen=True)
class LogMark:
    """Where an engine's log stood: which of the handle's processes wrote it, and its text then (None when the
    log could not be read)."""

    process: int
    text: str | None


def fallbacks_between(start: LogMark, end: LogMark, patterns: list[str] | tuple[str, ...] = ()) -> list[LogMatch]:
    """Pure: the fall-back lines an engine's log gained from ``start`` to ``end``: every line of ``end`` when a
    new process wrote it (a fresh process's start-up lines count), none when either read failed."""
    if end.text is None:
        return []
    if start.process != end.process:
        before = ""
    elif start.text is None:
        return []
    else:
        before = start.text
    return scan_fallbacks("\n".join(new_log_lines(before, end.text)[0]), list(patterns))


class EngineHandle(Protocol):
    """An engine a workload measures, whoever runs it: the primitives every engine workload's phases use.
    Implemented by :class:`LaunchedEngine` (kvgate starts and stops it) and ``attach.AttachedEngine`` (someone
    else runs it; kvgate gets its URL and the operator's restart commands)."""

    base_url: str
    persistent: bool           # the engine and its pool outlive the run: prompts need a per-run nonce and the
                               # pool's size before the run is recorded
    cold_steps: list[dict[str, Any]]

    def drop_nodes(self) -> list[str]: ...                  # nodes whose page cache the cold procedure drops
    def open(self) -> str | None: ...                      # ready to serve, or why not (one line)
    def metrics(self) -> list[Sample]: ...                 # its Prometheus samples (raises when unreadable)
    def log_mark(self) -> LogMark: ...                     # its log now (fallbacks_between two marks)
    def start_mark(self) -> LogMark: ...                   # from where a just (re)started engine's fall-backs
                                                           # count: a fresh process's whole log, else now
    def forget(self) -> str | None: ...                    # lose every cached KV: stop / the operator's restart
    def resume(self) -> str | None: ...                    # serve again after forget, or why not
    def error_context(self) -> str: ...                    # what to quote beside an error (a log's tail)
    def close(self) -> None: ...


class LaunchedEngine:
    """An engine kvgate runs: each ``open``/``resume`` spawns a fresh process (its own log, ``engine-LABEL.log``
    on the node and in the gate directory), ``forget`` stops it (its whole process group), ``close`` stops
    whatever still runs."""

    persistent = False

    def __init__(self, ctx: GateContext, transport: Any, profile: EngineProfile, argv: list[str],
                 env: dict[str, str], base_url: str, run_dir: str, labels: tuple[str, ...], drop_on: list[str],
                 pool: Any = None):
        self.ctx, self.transport, self.profile = ctx, transport, profile
        self.argv, self.env, self.base_url, self.run_dir = argv, env, base_url, run_dir
        self.labels, self._drop_on = labels, drop_on
        # the pool made for the run (harness.workloads.kit.pool.PoolHandle): closed after the engine stopped
        self.pool = pool
        self.processes: list[EngineProcess] = []
        self.cold_steps: list[dict[str, Any]] = []

    def drop_nodes(self) -> list[str]:
        return list(self._drop_on)

    def _start(self) -> str | None:
        label = self.labels[min(len(self.processes), len(self.labels) - 1)]
        eng = EngineProcess(self.ctx, self.transport, self.profile, self.argv, self.env, self.base_url,
                            posixpath.join(self.run_dir, f"engine-{label}.log"),
                            self.ctx.gate_dir / f"engine-{label}.log")
        self.processes.append(eng)
        return start_engine(eng, label)

    def open(self) -> str | None:
        return self._start()

    resume = open

    @property
    def current(self) -> EngineProcess:
        return self.processes[-1]

    def metrics(self) -> list[Sample]:
        return self.current.metrics()

    def log_mark(self) -> LogMark:
        return LogMark(len(self.processes), self.current.log_text() if self.processes else "")

    def start_mark(self) -> LogMark:
        return LogMark(len(self.processes), "")  # a fresh process: its start-up lines count too

    def forget(self) -> str | None:
        if self.processes:
            self.current.stop()
        return None

    def error_context(self) -> str:
        return self.current.log_tail() if self.processes else ""

    def close(self) -> None:
        for eng in self.processes:
            eng.stop()
        if self.pool is not None:
            self.pool.close()


def pool_record(engine: Any) -> dict[str, Any] | None:
    """The pool record of a launched engine's pool (after close: with what its cold regime did), else None."""
    pool = getattr(engine, "pool", None)
    return None if pool is None else pool.record.to_dict()


def engine_preflight(ctx: GateContext, transport: Any, node_name: str, prof: EngineProfile, python: str,
                     step: str) -> tuple[dict[str, str], str | None]:
    """Before a launch: the engine's interpreter imports what the profile declares (and vLLM finds a device),
    one logged step. Returns the engine's distribution versions (for the evidence) and, when the interpreter
    cannot run the engine, one line saying so and which ``engine_python`` to set."""
    res = ctx.steps.run(transport, step, preflight_argv(python, prof), timeout_s=300)
    try:
        report = parse_preflight(res.stdout)
    except ValueError:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {}, (f"engine pre-flight on node {node_name}: {python} could not run (rc {res.rc}: {tail}); "
                    f"{preflight_hint(node_name)}")
    versions = dict(report.versions)
    if prof.lmcache is not None and versions.get("lmcache") and versions["lmcache"] != prof.lmcache.version:
        versions["warning"] = f"profile written for LMCache {prof.lmcache.version}, node has {versions['lmcache']}"
    why = preflight_problem(report, prof)
    if why:
        return versions, (f"engine pre-flight on node {node_name}: {python} cannot run {prof.name}: {why}; "
                          f"{preflight_hint(node_name)}")
    return versions, None


def start_engine(engine: EngineProcess, label: str) -> str | None:
    """Start an engine and wait until it is ready; on failure stop it and return why, with its log's tail."""
    engine.ctx.progress(f"{engine.ctx.gate.id}: starting {engine.profile.name} ({label}) on {engine.transport.name}")
    engine.start()
    ok, why = engine.wait_ready(engine.profile.ready_timeout_s)
    if ok:
        return None
    tail = engine.log_tail()
    engine.stop()
    return f"{engine.profile.name} ({label}) did not start: {why}; log {engine.local_log.name}:\n{tail}"


def random_model_dir(work_dir: str, model_cfg: dict[str, Any], seed: int, dtype: str) -> str:
    """Pure: where a random-weight model built from this config, seed and dtype lives on a node (one
    directory per distinct model, so a second run finds it built)."""
    key = json.dumps({"config": model_cfg, "seed": seed, "dtype": dtype}, sort_keys=True).encode()
    return posixpath.join(work_dir, "kvgate-models", hashlib.sha256(key).hexdigest()[:16])


def build_random_model(ctx: GateContext, transport: Any, python: str, node: Any, run_dir: str, model_config: str,
                       model_cfg: dict[str, Any], seed: int, dtype: str, step: str) -> tuple[str | None, str, Any]:
    """Build (or find, cached by config, seed and dtype) a random-weight model on a node with
    ``harness/node/make_model.py`` run by the engine's interpreter: (error or None, the model's directory on the
    node, the description make_model printed)."""
    model_dir = random_model_dir(node.work_dir, model_cfg, seed, dtype)
    argv = build_random_model_argv(python, run_dir, model_config, model_dir, seed, dtype)
    transport.put(program_path("make_model.py"), argv[1])
    ctx.progress(f"{ctx.gate.id}: random-weight model in {model_dir} on {node.name}")
    res = ctx.steps.run(transport, step, list(argv), timeout_s=1800)
    if not res.ok:
        return f"could not build the random-weight model on {node.name}: {res.summary()}", model_dir, None
    try:
        return None, model_dir, json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"make_model printed no description: {res.stdout[-300:]!r}", model_dir, None


def build_random_model_argv(python: str, run_dir: str, model_config: str, model_dir: str, seed: int,
                            dtype: str) -> tuple[str, ...]:
    """Pure: the command :func:`build_random_model` sends (for a plan)."""
    return (python, posixpath.join(run_dir, "make_model.py"), "--config", model_config, "--out", model_dir,
            "--seed", str(seed), "--dtype", dtype)


def fallback_reason(matches: list[LogMatch], label: str) -> str | None:
    """Pure: the INVALID reason for an engine whose log says it fell back, quoting the first line."""
    if not matches:
        return None
    m = min(matches, key=lambda x: (x.rank, x.line_no))  # the most telling line, e.g. LMCache's "degraded mode"
    more = f" (and {len(matches) - 1} more such lines)" if len(matches) > 1 else ""
    return (f"the engine fell back in the {label} phase ({m.meaning}): the tier was not used; "
            f"engine log {m.quote()}{more}")


def pool_files_argv(pool_dir: str, pattern: str = "*.data") -> list[str]:
    """Sizes of the finished KV chunk files (``*.data`` by default) in a pool directory, one per line."""
    return ["find", pool_dir, "-type", "f", "-name", pattern, "-printf", "%s\n"]


def stored_kv_tokens(prompt_tokens: int, block_tokens: int | None) -> int:
    """Pure: the prompt tokens a connector stores: all of them, or the whole blocks only."""
    return prompt_tokens if not block_tokens else (prompt_tokens // block_tokens) * block_tokens


def pool_contents(ctx: GateContext, transport: Any, pool_dir: str, expected_bytes: int, timeout_s: float,
                  step: str, pattern: str = "*.data") -> PoolSnapshot:
    """The finished KV chunk files in a pool directory as one node sees them, waiting up to ``timeout_s``
    until they hold ``expected_bytes`` (LMCache stores asynchronously; 0: look once).

    The one rule: only finished chunk files count (``pattern``, the profile's ``pool_files``). LMCache's fs connector writes each chunk to ``NAME.tmp`` and
    renames it ``NAME.data`` when complete, so a half-written chunk is never taken for a stored one. The
    last look is kept as a logged step."""
    argv = pool_files_argv(pool_dir, pattern)
    deadline = ctx.clock.now() + timeout_s
    while True:
        ctx.cancel.check()
        r = transport.run(argv, timeout_s=60)
        sizes = [int(x) for x in r.stdout.split() if x.isdigit()] if r.ok else []
        info = PoolSnapshot(node=transport.name, dir=pool_dir, bytes=sum(sizes), files=len(sizes),
                            expected_kv_bytes=expected_bytes, error=None if r.ok else r.summary())
        if info.bytes >= expected_bytes or ctx.clock.now() >= deadline:
            break
        ctx.cancel.sleep(0.5)  # the gate's end ends the wait (Cancelled)
    ctx.steps.keep(transport.name, step, r)
    return info
