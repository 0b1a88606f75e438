"""The engine session every engine workload runs in, written once.

A session holds the phase runners of a run (one, or one per arm), opens their engines (in turn or all at once),
runs the workload's body, and closes every engine it opened whatever happened: with their logs when the body
asks for them (the fall-back scan reads them), plainly otherwise. An engine, HTTP, OS or value error on the way
becomes the gate's error with the engines' log tails beside it; a failure is data (:class:`WorkloadResult`), never
a lost exception.

    session = EngineSession({"engine": runner})
    out = session.run(body, failed=lambda why: WorkloadResult(evidence=ev, error=why))

``body()`` returns what the workload evaluates next, or a :class:`WorkloadResult` that ends the gate early;
``failed(why)`` builds the gate's result for an engine that did not start or an error in between.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence, TypeVar

import httpx

from ...errors import WorkloadError
from ...execute.fanout import fan_out
from .base import WorkloadResult
from .phases import EngineLog, EngineReading, PhaseRunner, first_fallback

T = TypeVar("T")

# What a session turns into the gate's error: the engine's HTTP API, a workload's own failure, the node, a reply
# that does not parse. Anything else is a defect of kvgate and is left to raise.
ENGINE_ERRORS = (httpx.HTTPError, WorkloadError, OSError, ValueError)


def error_text(exc: BaseException, context: str) -> str:
    """Pure: the gate's error line for ``exc``, the engines' log tails (``context``) below it."""
    return f"{type(exc).__name__}: {exc}\n{context}".strip()


class EngineSession:
    """The runners of one run, by name (one runner: any name), opened, used and closed as one.

    ``parallel``: engines start (and stop) all at once, on their own threads (two overlap on a node's cores
    instead of one waiting for the other), else in order. ``label(name)``: how a runner's open failure is named
    (``"tier arm"``); without it one runner's failure is its own line, one of several is named by the runner. ``logs``: the engines' logs are read
    at close (:attr:`logs`), also when the body ended early."""

    def __init__(self, runners: Mapping[str, PhaseRunner], *, parallel: bool = False, logs: bool = False,
                 label: Callable[[str], str] | None = None):
        self.runners = dict(runners)
        self.parallel, self.read_logs, self.label = parallel, logs, label
        self.logs: dict[str, dict[str, EngineLog]] = {}
        self._open: list[str] = []

    @property
    def runner(self) -> PhaseRunner:
        """The one runner of a single-runner session."""
        (only,) = self.runners.values()
        return only

    def run(self, body: Callable[[], T], failed: Callable[[str], WorkloadResult], *,
            before: Callable[[], WorkloadResult | None] | None = None,
            after: Callable[[], None] | None = None) -> T | WorkloadResult:
        """``before()`` (what is known before an engine starts: its result ends the gate), open every engine,
        ``body()``, close what is still open, ``after()``; ``failed(why)`` for an engine that did not start or an
        :data:`ENGINE_ERRORS` on the way. Every runner is closed, opened or not: closing releases what the set-up
        made for it (a launched engine's pool device)."""
        try:
            self._open = list(self.runners)  # each is closed whether its engine started or not
            early = before() if before is not None else None
            if early is not None:
                return early
            why = self._start()
            if why:
                return failed(why)
            return body()
        except ENGINE_ERRORS as exc:
            return failed(error_text(exc, "\n".join(self.runners[n].error_context() for n in self._open)))
        finally:
            for name in list(self._open):
                self._close(name, self.read_logs)
            if after is not None:
                after()

    def _start(self) -> str | None:
        name = self.label or (lambda n: n)
        if len(self.runners) == 1:
            why = self.runner.open(parallel=self.parallel)
            return f"{name(next(iter(self.runners)))}: {why}" if why and self.label else why
        if self.parallel:
            res = fan_out(self.runners, lambda _n, r: r.open())
            why = {n: e for n, e in res.succeeded.items() if e} | dict(res.failed)
        else:  # in turn, in the plan's order: every runner's health (and log) checked
            why = {n: e for n in self.runners if (e := self.runners[n].open())}
        return "; ".join(f"{name(n)}: {why[n]}" for n in self.runners if n in why) or None

    def _close(self, name: str, logs: bool) -> dict[str, EngineLog]:
        self._open.remove(name)
        self.logs[name] = self.runners[name].close(parallel=self.parallel, logs=logs)
        return self.logs[name]

    def close(self, name: str | None = None) -> dict[str, EngineLog]:
        """Close one runner's engines now (the only one's when ``name`` is None) and read their logs: the fall-back
        scan of a body that goes on after its engines stopped."""
        return self._close(name if name is not None else next(iter(self.runners)), True)

    @staticmethod
    def fallback(logs: Mapping[str, EngineReading | EngineLog], patterns: Sequence[str],
                 label: str | Callable[[str], str], in_force: Sequence[str] = ()) -> tuple[str | None, list[str]]:
        """The first fall-back (or missing in-force line) in ``logs``, named by ``label`` (or ``label(engine)``), and
        every matched line quoted for the evidence."""
        name = label if callable(label) else (lambda _n: label)
        reason, found = first_fallback(logs, patterns, name, in_force)
        return reason, [m.quote() for m in found]
