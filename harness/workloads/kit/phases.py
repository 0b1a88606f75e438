"""The one phase runner every engine workload uses: engines opened, then per phase warm-up -> counters, the pool
device and the engines' log marks before -> the phase's requests -> the same after, then forget / resume / close.

A workload gives what is its own (what a phase sends, how a warm-up prompt looks, which device to count) and gets
back :class:`PhaseRecord` s: plain data its pure evaluator reads together with the profile's declared proofs (hit
counter names, fall-back patterns). The runner talks to engines only through
:class:`~harness.workloads.kit.engine.EngineHandle`, so the same phases run on an engine kvgate launches and on one an
operator runs; it never looks at an engine's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Generic, Mapping, Sequence, TypeVar

import httpx

from ...execute.fanout import fan_out
from ...parsers.engine_log import LogMatch
from ...parsers.pooldev import PoolDeviceStat
from ...parsers.prometheus import Sample, counter_delta
from .base import GateContext
from .engine import EngineHandle, LogMark, fallback_reason, fallbacks_between

T = TypeVar("T")


@dataclass(frozen=True)
class EngineReading:
    """One engine around one phase: its counters (None when not read), and its log where the engine's current
    process began (``since``), before the phase and after it."""

    since: LogMark
    log_before: LogMark
    log_after: LogMark
    metrics_before: list[Sample] | None = None
    metrics_after: list[Sample] | None = None

    def delta(self, names: Sequence[str]) -> float | None:
        """Pure: how much the counters ``names`` grew over the phase (None without both readings)."""
        if self.metrics_before is None or self.metrics_after is None:
            return None
        return counter_delta(self.metrics_before, self.metrics_after, list(names))

    def fallbacks(self, patterns: Sequence[str] = ()) -> list[LogMatch]:
        """Pure: the fall-back lines the engine's log holds from its start up to the phase's end."""
        return fallbacks_between(self.since, self.log_after, patterns)

    def missing(self, required: Sequence[str] = ()) -> str | None:
        """Pure: the first of ``required`` (regular expressions) the engine's current log never matches."""
        return missing_in_text(self.log_after.text, required)


@dataclass(frozen=True)
class PhaseRecord(Generic[T]):
    """What one phase sent and what was read around it: ``output`` is what the workload's phase returned (its
    request records), ``engines`` each engine's reading, ``device_*`` the pool device's counters (when asked)."""

    label: str
    output: T
    engines: dict[str, EngineReading]
    device_before: PoolDeviceStat | None = None
    device_after: PoolDeviceStat | None = None


@dataclass(frozen=True)
class EngineLog:
    """An engine's whole log over the run: from its (last) start to after it was closed."""

    since: LogMark
    end: LogMark

    def fallbacks(self, patterns: Sequence[str] = ()) -> list[LogMatch]:
        return fallbacks_between(self.since, self.end, patterns)

    def missing(self, required: Sequence[str] = ()) -> str | None:
        return missing_in_text(self.end.text, required)


def missing_in_text(text: str | None, required: Sequence[str]) -> str | None:
    """Pure: the first pattern of ``required`` that no line of a log's text matches (None: all there, or none
    asked). An unreadable log (None) misses every line."""
    for pat in required:
        if text is None or re.search(pat, text, re.MULTILINE) is None:
            return pat
    return None


def first_fallback(logs: Mapping[str, EngineReading | EngineLog], patterns: Sequence[str],
                   label: Callable[[str], str], required: Sequence[str] = ()) -> tuple[str | None, list[LogMatch]]:
    """Pure: the INVALID reason of the first engine (in order) whose log says the tier silently did nothing, or
    lacks a line of ``required`` (the profile's ``in_force_log``: what shows the cold regime in force), and every
    fall-back line of all engines. ``label(name)`` names an engine's phase in the reason."""
    reason, found = None, []
    for name, log in logs.items():
        matches = log.fallbacks(patterns)
        found += matches
        reason = reason or fallback_reason(matches, label(name))
        if reason is None:
            reason = not_in_force(log.missing(required), label(name))
    return reason, found


def not_in_force(gone: str | None, label: str) -> str | None:
    """Pure: the INVALID reason when an engine's log lacks the profile's in-force line ``gone`` (None: all there)."""
    return None if gone is None else (f"{label}: the engine's log never says /{gone}/ (the profile's in_force_log): "
                                      "the cold regime it declares is not in force")


@dataclass
class PhaseRunner:
    """Engines by name, opened together, and the phases run on them.

    ``counters``: each phase reads the engines' metrics before and after (errors raise); without it, an engine
    that outlives the run (``persistent``) is still read best-effort, its process start time being the marker of
    a restart. ``warm_up(name, engine, label)``: one unrelated request to each engine before a phase's readings,
    so a first-request effect lands on none of them."""

    ctx: GateContext
    engines: dict[str, EngineHandle]
    counters: bool = False
    warm_up: Callable[[str, EngineHandle, str], None] | None = None
    _since: dict[str, LogMark] = field(default_factory=dict)

    def open(self, parallel: bool = False) -> str | None:
        """Every engine ready to serve (in order, or all at once), or why not: the first failure's line(s)."""
        return self._each(lambda h: h.open(), parallel, "engine did not start: ", started=True)

    def forget(self) -> str | None:
        """Every engine loses its cached KV (stopped / the operator's restart), in order; the first error."""
        return self._each(lambda h: h.forget(), False, "", started=False)

    def resume(self) -> str | None:
        """Every engine serves again after ``forget``, in order; the first error."""
        return self._each(lambda h: h.resume(), False, "", started=True)

    def _each(self, step: Callable[[EngineHandle], str | None], parallel: bool, prefix: str,
              started: bool) -> str | None:
        if parallel and len(self.engines) > 1:
            res = fan_out(self.engines, lambda _n, h: step(h))
            why = [e for e in res.succeeded.values() if e] + list(res.failed.values())
            if why:
                return prefix + "; ".join(str(w) for w in why)
        else:
            for h in self.engines.values():
                err = step(h)
                if err:
                    return err
        if started:  # where each engine's fall-backs count from: its (re)start
            for name, h in self.engines.items():
                self._since[name] = h.start_mark()
        return None

    def phase(self, label: str, send: Callable[[], T], *, on: Sequence[str] | None = None,
              device: Callable[[], PoolDeviceStat | None] | None = None) -> PhaseRecord[T]:
        """warm-up -> counters, pool device, log marks -> ``send()`` -> counters, pool device, log marks, on the
        engines ``on`` (default: all). Cancellation and HTTP errors raise to the workload."""
        names = list(on) if on is not None else list(self.engines)
        handles = {n: self.engines[n] for n in names}
        if self.warm_up is not None:
            for n, h in handles.items():
                self.warm_up(n, h, label)
        m0 = {n: self._metrics(h) for n, h in handles.items()}
        d0 = device() if device is not None else None
        l0 = {n: h.log_mark() for n, h in handles.items()}
        self.ctx.cancel.check()
        output = send()
        m1 = {n: self._metrics(h) for n, h in handles.items()}
        d1 = device() if device is not None else None
        l1 = {n: h.log_mark() for n, h in handles.items()}
        readings = {n: EngineReading(self._since.get(n, l0[n]), l0[n], l1[n], m0[n], m1[n]) for n in names}
        return PhaseRecord(label, output, readings, d0, d1)

    def _metrics(self, h: EngineHandle) -> list[Sample] | None:
        if self.counters:
            return h.metrics()
        if not h.persistent:
            return None
        try:  # best-effort: the start-time marker of an engine kvgate does not restart itself
            return h.metrics()
        except (httpx.HTTPError, ValueError):
            return None

    def error_context(self) -> str:
        """What to quote beside an error: each engine's log tail, named when there are several."""
        if len(self.engines) == 1:
            return next(iter(self.engines.values())).error_context()
        return "\n".join(f"--- {n}:\n{h.error_context()}" for n, h in self.engines.items())

    def close(self, parallel: bool = False, logs: bool = False) -> dict[str, EngineLog]:
        """Close every engine (all at once when ``parallel``); with ``logs``, each engine's whole log from its last
        start to after its close (a launched engine's shutdown lines included)."""
        if parallel and len(self.engines) > 1:
            fan_out(self.engines, lambda _n, h: h.close())
        else:
            for h in self.engines.values():
                h.close()
        if not logs:
            return {}
        return {n: EngineLog(self._since[n], h.log_mark()) for n, h in self.engines.items() if n in self._since}
