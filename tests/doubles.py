"""The test doubles engine workloads' tests share, each at a seam the code has (never a patched library class):

- :func:`gate_context`: a gate's context as a run makes it (its step log, its directory, the HTTP seam, a
  scripted clock), for a gate of a loaded configuration or a bare one;
- :class:`Router`: a scripted node's answers by argv (``ScriptedTransport(Router(...))``), with the commands engine
  workloads send ready-made (:func:`preflight`, :func:`pool_files`, :func:`pool_blockstat`);
- :class:`EngineServer`: an engine's HTTP API (an ``httpx.MockTransport`` handler): health, counters under the
  names of the shipped profiles, completions that hit the tier for prompts it stored before a restart;
- :class:`FakeEngine`: an :class:`~harness.workloads.kit.engine.EngineHandle` with scripted counters and log, for the
  phase runner and whatever drives engines through the handle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator

import httpx

from harness.execute.undo import UndoLog
from harness.execute.cancel import Cancellation
from harness.execute.clock import Clock, ScriptedClock
from harness.parsers.prometheus import Sample, parse_prometheus
from harness.transport.doubles import Call, Event, Reply, ScriptedTransport
from harness.transport.steps import StepLog
from harness.workloads.kit.base import DROP_CACHES_ARGV, GateContext
from harness.workloads.kit.engine import LogMark

ROOT = Path(__file__).resolve().parents[1]
PREFLIGHT_CPU_REFERENCE = (ROOT / "tests" / "fixtures" / "preflight" / "cpu-reference.stdout").read_text()


# --------------------------------------------------------------------------------------------- context

def gate_context(run_dir: Path | None, cfg: Any = None, gate_id: str | None = None, *,
                 transports: dict[str, Any] | None = None, http: Any = None, clock: Clock | None = None,
                 timeout_s: float | None = None, gate: Any = None, params: Any = None,
                 nodes: dict[str, Any] | None = None) -> GateContext:
    """A gate's context: the gate ``gate_id`` of ``cfg`` (its first without one), its params and nodes, or the
    ``gate`` / ``params`` / ``nodes`` given. ``run_dir``: steps are logged under it and the gate's directory is
    ``run_dir/gates/ID`` (made); None: a plan's context (no step log, nothing written). ``http``: an httpx
    transport or a handler for one. ``clock``: a :class:`ScriptedClock` unless given, so waits and polls never
    sleep; ``timeout_s``: the gate's deadline on it."""
    if cfg is not None:
        gate = next(g for g in cfg.suite.gates if gate_id is None or g.id == gate_id)
        params = cfg.params[gate.id] if params is None else params
        nodes = {n.name: n for n in cfg.gate_nodes(gate)} if nodes is None else nodes
    gate = gate if gate is not None else SimpleNamespace(id=gate_id or "G", timeout_s=timeout_s)
    clock = clock or ScriptedClock()
    gate_dir, steps = Path("."), None
    if run_dir is not None:
        gate_dir = Path(run_dir) / "gates" / gate.id
        gate_dir.mkdir(parents=True, exist_ok=True)
        steps = StepLog(Path(run_dir))
    if http is not None and not isinstance(http, httpx.BaseTransport):
        http = httpx.MockTransport(http)
    return GateContext(gate=gate, params=params, nodes=nodes or {}, transports=transports or {}, steps=steps,
                       gate_dir=gate_dir, http=http, clock=clock, undo=UndoLog(),
                       cancel=Cancellation(clock, timeout_s=timeout_s, what=f"gate {gate.id}"))


# ------------------------------------------------------------------------------------------- argv router

Match = Callable[[Call], bool]
Answer = Reply | Callable[[Call], Reply]


def argv_is(*argv: str) -> Match:
    return lambda call: call.argv == tuple(argv)


def argv_starts(*prefix: str) -> Match:
    return lambda call: call.argv[:len(prefix)] == tuple(prefix)


def argv_has(word: str) -> Match:
    """Any argument contains ``word`` (a marker in a script given with ``-c``)."""
    return lambda call: any(word in a for a in call.argv)


def spawned(call: Call) -> bool:
    return call.spawned


class Router:
    """A scripted node's handler: the first route whose match takes the call answers it; anything else is
    ``rc 127, "not expected"`` (so a command nobody planned for shows up as a failure, not a silent success)."""

    def __init__(self, *routes: tuple[Match, Answer], default: Answer | None = None):
        self.routes: list[tuple[Match, Answer]] = list(routes)
        self.default = default

    def on(self, match: Match, answer: Answer) -> "Router":
        """Add a route ahead of the others (a test's own answer wins over a ready-made one)."""
        self.routes.insert(0, (match, answer))
        return self

    def __call__(self, call: Call) -> Reply:
        for match, answer in self.routes:
            if match(call):
                return answer(call) if callable(answer) else answer
        if self.default is not None:
            return self.default(call) if callable(self.default) else self.default
        return Reply(rc=127, stderr=f"{call.argv[0]}: not expected")


def preflight(stdout: str = PREFLIGHT_CPU_REFERENCE) -> tuple[Match, Answer]:
    """The engine pre-flight (``python -c '...KVGATE-PREFLIGHT...'``), answered as a real interpreter did."""
    return argv_has("KVGATE-PREFLIGHT"), Reply(stdout=stdout)


def pool_files(sizes: Callable[[], Iterable[int]] | Iterable[int]) -> tuple[Match, Answer]:
    """``find POOL -name *.data -printf %s``: the finished chunk files' sizes (a callable: asked each time)."""
    def answer(call: Call) -> Reply:
        got = sizes() if callable(sizes) else sizes
        return Reply(stdout="".join(f"{n}\n" for n in got))
    return argv_starts("find"), answer


def pool_blockstat(device: str = "/dev/nvme1n1", maj_min: str = "259:1",
                   sectors: Iterator[int] | None = None) -> tuple[Match, Answer]:
    """The pool device probe: its MAJ:MIN and source, then its ``stat`` line with ``next(sectors)`` read."""
    sectors = sectors if sectors is not None else iter(range(0, 10 ** 9, 40000))
    return argv_has("kvgate-pool-blockstat"), (
        lambda call: Reply(stdout=f"kvgate-pool-device {maj_min} {device}\n1 0 {next(sectors)} 0 0 0 0 0 0 0 0\n"))


def pool_loop(device: str = "/dev/loop7", maj_min: str = "7:7") -> tuple[Match, Answer]:
    """The loop pool's make (``pool_device: {kind: loop}``), answered as on this machine (and its undo)."""
    return argv_has("kvgate-pool-loop"), Reply(stdout=f"kvgate-pool-loop {device} {maj_min} 1\n")


def ok(*matches: Match) -> list[tuple[Match, Answer]]:
    """Routes that succeed with no output."""
    return [(m, Reply()) for m in matches]


def engine_node(name: str = "n1", *extra: tuple[Match, Answer], events: list[Event] | None = None,
                engine: "EngineServer | None" = None, pool: Iterable[int] | Callable[[], Iterable[int]] = (10 ** 7,) * 2,
                log: str = "") -> ScriptedTransport:
    """A node an engine workload launches its engine on: pre-flight, mkdir, the page-cache drop, the pool's files
    and device answered; a spawn is a fresh engine process (``engine.restart()``) printing ``log``."""
    def spawn(call: Call) -> Reply:
        if any(a.endswith("pool_evict.py") for a in call.argv):  # the cold regime's evictor, not an engine
            return Reply(stdout='{"type": "start"}\n{"type": "summary"}\n')
        if engine is not None:
            engine.restart()
        return Reply(stdout=log)
    router = Router(*extra, preflight(), pool_files(pool), pool_blockstat(), pool_loop(), (spawned, spawn),
                    *ok(argv_starts("mkdir"), argv_is(*DROP_CACHES_ARGV)))
    return ScriptedTransport(router, name=name, events=events)


# ------------------------------------------------------------------------------------------ engine (HTTP)

class EngineServer:
    """An engine's HTTP API as an httpx MockTransport handler. ``/metrics`` shows the hit counters under the names
    of the shipped profiles (the reference engine's and vLLM's) and the process start time; a completion looks its
    prompt up in the tier: a hit for a prompt stored there earlier. ``restart()`` makes a new process (counters
    from zero, a new start time) that still finds the tier's prompts. ``down``: nothing answers. Every request is an ``http`` event in ``events``.
    ``salt_field``: the request field its tier keys stored prompts by besides the prompt (a tenant-isolating tier);
    None: the prompt alone (a salt-blind tier, as vLLM's ExampleConnector)."""

    def __init__(self, events: list[Event] | None = None, down: bool = False, salt_field: str | None = None):
        self.events = events if events is not None else []
        self.down = down
        self.salt_field = salt_field
        self.stored: set[str] = set()
        self.query = self.hit = 0
        self.start = 1000.0
        self.restarts = 0

    def restart(self) -> None:
        self.start += 1
        self.restarts += 1
        self.query = self.hit = 0

    def metrics_text(self) -> str:
        return (f"kvgate_cpu_ref_external_query_tokens_total {self.query}\n"
                f"kvgate_cpu_ref_external_hit_tokens_total {self.hit}\n"
                f"kvgate_cpu_ref_external_read_bytes_total {self.hit * 10}\n"
                f"vllm:external_prefix_cache_queries_total {self.query}\n"
                f"vllm:external_prefix_cache_hits_total {self.hit}\n"
                f"process_start_time_seconds {self.start}\n")

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.events.append(Event("http", path=request.url.path))
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics_text())
        body = json.loads(request.content)
        prompt = body["prompt"]
        key, n = json.dumps(prompt), len(prompt)
        if self.salt_field:
            key = json.dumps([body.get(self.salt_field), prompt])
        self.query += n
        if key in self.stored:
            self.hit += n
        self.stored.add(key)
        sse = 'data: {"choices": [{"text": " t1"}]}\n\ndata: {"choices": [{"text": " t2"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})


# -------------------------------------------------------------------------------------- engine (handle)

class FakeEngine:
    """An :class:`~harness.workloads.kit.engine.EngineHandle` whose counters and log the test scripts: ``counters()``
    gives the next metrics text (or raises), ``log`` is what its current process has written (``say`` appends),
    ``open``/``resume`` start a new process (``fail``: why they fail instead). Every call is appended to
    ``calls`` so a test checks the order the runner used."""

    def __init__(self, name: str = "e", calls: list[str] | None = None, persistent: bool = False,
                 counters: Callable[[], str] | None = None, fail: str | None = None, log: str = ""):
        self.name, self.persistent = name, persistent
        self.calls = calls if calls is not None else []
        self.base_url = f"http://{name}"
        self.cold_steps: list[dict[str, Any]] = []
        self._counters, self.fail = counters, fail
        self.process, self.log = 0, log
        self.closed = False

    def _call(self, what: str) -> None:
        self.calls.append(f"{self.name}.{what}")

    def say(self, line: str) -> None:
        self.log += line + "\n"

    def drop_nodes(self) -> list[str]:
        return []

    def open(self) -> str | None:
        self._call("open")
        if self.fail:
            return self.fail
        self.process += 1
        return None

    resume = open

    def metrics(self) -> list[Sample]:
        self._call("metrics")
        if self._counters is None:
            raise httpx.HTTPStatusError("404", request=httpx.Request("GET", self.base_url),
                                        response=httpx.Response(404))
        return parse_prometheus(self._counters())

    def log_mark(self) -> LogMark:
        self._call("log")
        return LogMark(self.process, self.log)

    def start_mark(self) -> LogMark:
        self._call("start")
        return LogMark(self.process, "") if not self.persistent else LogMark(self.process, self.log)

    def forget(self) -> str | None:
        self._call("forget")
        return None

    def error_context(self) -> str:
        return f"(log of {self.name})"

    def close(self) -> None:
        self._call("close")
        self.closed = True


def normalized(commands: Iterable[tuple[str, ...]], values: dict[str, str]) -> list[tuple[str, ...]]:
    """Commands with a run's own values (its tag, a free port) replaced by the plan's placeholders."""
    pattern = re.compile("|".join(re.escape(k) for k in sorted(values, key=len, reverse=True)))
    return [tuple(pattern.sub(lambda m: values[m.group(0)], a) for a in argv) for argv in commands]
