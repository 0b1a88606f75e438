"""Attach mode: G2 against an engine kvgate did not launch (Kubernetes, systemd, Slurm, Docker ...).

The engine already answers at a URL. kvgate never starts or stops it: the operator gives the cold procedure
as commands run on named inventory nodes over the same transport as every step (``kubectl rollout restart
deploy/x && kubectl rollout status deploy/x``, ``systemctl restart x``, ``docker restart x``), each a logged
step (argv, stdout, stderr, rc, duration in the run directory); kvgate then drops the page cache on the pool's
node(s) and waits until the engine answers its health endpoint again. An optional log command prints the
engine's log (``kubectl logs deploy/x``, ``journalctl -u x``) for fall-back detection and hit lines.

Everything here talks to the engine through ``ctx.http`` (an httpx transport; None is the network) and to
nodes through ``ctx.steps``, the seams tests use.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import Field, field_validator

from ...engines import EngineProfile
from ...redact import redact_line, redact_url, register_url
from ...parsers.prometheus import Sample, parse_prometheus
from .base import GateContext, StrictModel
from .engine import LogMark

# prometheus_client's process collector: a new value means a new engine process
START_TIME_METRIC = "process_start_time_seconds"


class NodeCommand(StrictModel):
    """A shell command line (``sh -c``) run on an inventory node of the gate."""

    node: str
    run: str = Field(min_length=1)
    timeout_s: float = Field(default=900.0, gt=0)

    @field_validator("run")
    @classmethod
    def _secrets(cls, v: str) -> str:
        redact_line(v)  # an Authorization header, TOKEN=..., user:password@ in it: redacted wherever kvgate writes
        return v


def engine_url(v: str | None) -> str | None:
    """An attached engine's URL as a gate gives it: http(s) with a host, its user:password@ registered as a secret
    (redacted wherever kvgate writes), without a trailing slash. ValueError otherwise."""
    if v is None:
        return v
    register_url(v)
    u = urlsplit(v)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{redact_url(v)!r} is not an http(s) URL with a host (e.g. http://10.0.0.5:8000)")
    return v.rstrip("/")


class AttachParams(StrictModel):
    url: str  # the engine's base URL as the control host reaches it, e.g. http://10.0.0.5:8000
    metrics_url: str | None = None  # default: url + the profile's metrics_path
    restart: list[NodeCommand] = Field(min_length=1)  # the cold procedure, in order; any failure is ERROR
    log: NodeCommand | None = None  # prints the engine's log (fall-back lines, hit lines)
    drop_caches_on: list[str] | None = None  # nodes whose page cache is dropped; default: the pool's node
    connect_timeout_s: float = Field(default=30.0, gt=0)  # the engine must answer this soon at the start
    ready_timeout_s: float | None = Field(default=None, gt=0)  # after the restart; default: the profile's

    _url = field_validator("url", "metrics_url")(classmethod(lambda cls, v: engine_url(v)))

    def named_nodes(self) -> list[tuple[tuple, str]]:
        """(param path, node name) of every node this attach block names."""
        out = [(("attach", "restart", i, "node"), c.node) for i, c in enumerate(self.restart)]
        if self.log is not None:
            out.append((("attach", "log", "node"), self.log.node))
        out += [(("attach", "drop_caches_on", i), n) for i, n in enumerate(self.drop_caches_on or [])]
        return out


def attach_issues(attach: AttachParams | None, profile: EngineProfile | None, nodes: dict[str, Any],
                  pool_node: str | None, pool_path: str | None, tokenizer: str | None) -> list[tuple[tuple, str]]:
    """Validation of a G2 gate's attach block against its profile and nodes (param path, message)."""
    issues: list[tuple[tuple, str]] = []
    if attach is None:
        if profile is not None and not profile.launches:
            issues.append((("engine",), f"profile {profile.name!r} has no argv (kvgate does not launch it): "
                                        "give attach: with the engine's url and its restart commands"))
        if len(nodes) != 1:
            issues.append((("nodes",), f"g2-ttft runs on exactly one node, got {len(nodes)}"))
        return issues
    if profile is not None and profile.launches:
        issues.append((("attach",), f"profile {profile.name!r} launches its engine (argv); attach: takes a "
                                    "profile without argv, which describes an engine someone else runs"))
    for path, name in attach.named_nodes() + ([(("pool_node",), pool_node)] if pool_node else []):
        if name not in nodes:
            issues.append((path, f"node {name!r} is not one of the gate's nodes ({', '.join(nodes) or 'none'})"))
    if not pool_path:
        issues.append((("pool_path",), "attach: needs pool_path, the directory on the pool's node where the "
                                       "engine stores KV (the populate proof and its device's reads)"))
    if profile is not None and (why := text_prompt_issue(profile, tokenizer, builds_tokenizer=False)):
        issues.append((("tokenizer",), why))
    return issues


def text_prompt_issue(profile: EngineProfile, tokenizer: str | None, builds_tokenizer: bool) -> str | None:
    """Pure: why prompts could not be sent: the profile's API takes text only (``api.prompt_format: text``, or
    chat) and no tokenizer is known to build them with (the gate's, the profile's, or the one kvgate builds with a
    random-weight model)."""
    if not profile.api.text_only or tokenizer or profile.tokenizer or builds_tokenizer:
        return None
    what = "a chat API" if profile.api.kind == "chat" else "api.prompt_format text"
    return (f"profile {profile.name!r} takes text prompts only ({what}): give the model's tokenizer.json "
            "(tokenizer:) to build them with")


class AttachedEngine:
    """An engine someone else runs, at ``base_url``: its health, metrics and (through a command) its log;
    made cold by the operator's commands. An :class:`~harness.workloads.kit.engine.EngineHandle`, as a launched
    engine is: the same phases run on both."""

    persistent = True  # it and its pool were there before the run and stay after it

    def __init__(self, ctx: GateContext, profile: EngineProfile, attach: AttachParams, pool_node: str | None = None):
        self.ctx, self.profile, self.attach, self.pool_node = ctx, profile, attach, pool_node
        self.base_url = attach.url
        self.metrics_url = attach.metrics_url or attach.url + profile.metrics_path
        self.cold_steps: list[dict[str, Any]] = []
        self._logs = 0

    def drop_nodes(self) -> list[str]:
        return list(self.attach.drop_caches_on or ([self.pool_node] if self.pool_node else []))

    def open(self) -> str | None:
        ok, why = self.wait_ready(self.attach.connect_timeout_s)
        return None if ok else f"attach: {why}"

    def log_mark(self) -> LogMark:
        return LogMark(0, self.log_text())

    start_mark = log_mark  # its log holds earlier lines: only what it gains from now counts

    def forget(self) -> str | None:
        err = self.make_cold()
        return None if err is None else f"cold procedure: {err}"

    def resume(self) -> str | None:
        ok, why = self.wait_ready(self.attach.ready_timeout_s or self.profile.ready_timeout_s)
        return None if ok else f"after the cold procedure: {why}"

    def error_context(self) -> str:
        return ""

    def close(self) -> None:
        """Nothing to stop: the engine is the operator's."""

    def _get(self, url: str, timeout_s: float) -> httpx.Response:
        """One GET, not sent once the gate is cancelled and bounded by the gate's deadline (Cancelled)."""
        cancel = self.ctx.cancel
        cancel.check()
        with httpx.Client(transport=self.ctx.http, timeout=cancel.bound_timeout_s(timeout_s)) as client:
            return client.get(url)

    def wait_ready(self, timeout_s: float) -> tuple[bool, str]:
        """Poll the health endpoint until it answers 200 (the last failure is the reason when it never does),
        on the gate's clock; the gate's cancellation ends the wait (Cancelled)."""
        clock = self.ctx.clock
        deadline = clock.now() + timeout_s
        why = "no answer"
        while True:
            try:
                r = self._get(self.base_url + self.profile.health_path, min(10.0, timeout_s))
                if r.status_code == 200:
                    return True, "ready"
                why = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            if clock.now() >= deadline:
                return False, (f"the engine at {redact_url(self.base_url)}{self.profile.health_path} did not "
                               f"answer 200 within {timeout_s:.0f} s: {why}")
            self.ctx.cancel.sleep(1.0)

    def metrics(self) -> list[Sample]:
        r = self._get(self.metrics_url, 30.0)
        r.raise_for_status()
        return parse_prometheus(r.text)

    def log_text(self) -> str | None:
        """The engine's log as the operator's log command prints it (a logged step), None if it failed."""
        cmd = self.attach.log
        if cmd is None:
            return None
        self._logs += 1
        self.ctx.cancel.check()
        res = self.ctx.steps.run(self.ctx.transports[cmd.node], f"g2-attach-log-{self._logs}",
                                 ["sh", "-c", cmd.run], timeout_s=cmd.timeout_s)
        return res.stdout if res.ok else None

    def make_cold(self) -> str | None:
        """Run the operator's restart commands in order, each a logged step; the first that fails (or times
        out) ends the procedure: its output is the error. None when every command succeeded."""
        for i, cmd in enumerate(self.attach.restart):
            self.ctx.cancel.check()
            self.ctx.progress(f"{self.ctx.gate.id}: cold procedure on {cmd.node}: {cmd.run}")
            res = self.ctx.steps.run(self.ctx.transports[cmd.node], f"g2-attach-restart-{i}", ["sh", "-c", cmd.run],
                                     timeout_s=cmd.timeout_s)
            self.cold_steps.append({"node": cmd.node, "run": cmd.run, "rc": res.rc, "timed_out": res.timed_out,
                                    "duration_s": round(res.duration_s, 3), "stdout_tail": res.stdout[-2000:],
                                    "stderr_tail": res.stderr[-2000:]})
            if not res.ok:
                out = (res.stderr.strip() or res.stdout.strip())[-1500:]
                what = f"timed out after {cmd.timeout_s:.0f} s" if res.timed_out else f"exited with rc {res.rc}"
                return f"restart command {i + 1} on {cmd.node} ({cmd.run!r}) {what}: {out or '(no output)'}"
        return None


def start_time(samples: list[Sample] | None) -> float | None:
    """Pure: the engine process's start time from its metrics, when it exposes one."""
    for s in samples or []:
        if s.name == START_TIME_METRIC:
            return s.value
    return None


def restarted(before: list[Sample] | None, after: list[Sample] | None) -> bool | None:
    """Pure: whether the engine answering after the cold procedure is a new process (its start time moved),
    None when the engine does not say."""
    a, b = start_time(before), start_time(after)
    return None if a is None or b is None else b != a
