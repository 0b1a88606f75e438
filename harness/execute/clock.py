"""Clock alignment of nodes: each node's clock offset from ours, estimated NTP-style from round trips of
``date +%s.%N`` through its transport (over one open session per node where the transport allows it), and
the offset actually applied when aligning its times; and the clock a gate's waits run on (:class:`Clock`, with
:class:`ScriptedClock` for tests)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..errors import HarnessError
from ..transport import Transport
from .fanout import GroupResult, fan_out


@dataclass(frozen=True)
class ClockOffset:
    """A node clock's offset from the reference clock, estimated from round trips."""

    offset_s: float
    uncertainty_s: float  # half the round trip of the sample used: the true offset is within +/- this
    rtt_s: float
    samples: int


def estimate_clock_offset(samples: Sequence[tuple[float, float, float]]) -> ClockOffset:
    """NTP-style offset from (t_send_ref, t_node, t_recv_ref) samples: use the smallest round trip.

    The node time was taken somewhere between send and receive, so the offset is within +/- rtt/2
    of `t_node - midpoint`.
    """
    good = [s for s in samples if s[2] >= s[0]]
    if not good:
        raise ValueError("estimate_clock_offset: no usable samples")
    t_send, t_node, t_recv = min(good, key=lambda s: s[2] - s[0])
    rtt = t_recv - t_send
    return ClockOffset(offset_s=t_node - (t_send + t_recv) / 2.0, uncertainty_s=rtt / 2.0, rtt_s=rtt,
                       samples=len(good))


def applied_offset_s(off: ClockOffset, mode: str = "auto") -> float:
    """The offset to apply when aligning a node's times.

    "measured": always the estimate. "assume_synced": always 0 (nodes run NTP/PTP). "auto": the estimate
    only when it is larger than its own uncertainty; an offset inside its error bar is not distinguishable
    from 0, and applying it would add the probe's bias (an SSH exec samples the remote clock late in the
    round trip) instead of removing an offset.
    """
    if mode == "measured":
        return off.offset_s
    if mode == "assume_synced":
        return 0.0
    if mode == "auto":
        return off.offset_s if abs(off.offset_s) > off.uncertainty_s else 0.0
    raise ValueError(f"unknown clock alignment mode {mode!r} (expected auto, measured or assume_synced)")


CLOCK_ARGV = ("date", "+%s.%N")
# One command per node answers every sample: a line in, the node's time out. Only `date` is started per
# sample; no SSH session is opened and no shell started per round trip, so the round trip (and with it the
# offset's uncertainty) is the connection's, not a process launch's.
CLOCK_SESSION_ARGV = ("sh", "-c", "while read -r _; do date +%s.%N; done")
START_TIMEOUT_S = 30.0  # for a probe to start and answer once (node-side process start, all nodes at once)


class ClockSession:
    """A clock probe left running on one node (CLOCK_SESSION_ARGV): each ``ask`` is one round trip."""

    def __init__(self, transport: Transport):
        try:
            self.proc = transport.open_session(list(CLOCK_SESSION_ARGV))
        except (HarnessError, OSError) as exc:
            raise HarnessError(f"clock probe failed to start: {exc}") from None
        self._seen = 0

    def ask(self, clock: Callable[[], float], timeout_s: float) -> tuple[float, str, float]:
        """(t_send, the node's answer, t_recv): a newline in, one line out."""
        proc = self.proc
        t_send = clock()
        proc.send(b"\n")
        need = self._seen + 1
        while True:  # one answer is one line; it may arrive in pieces
            if not proc.wait_stdout_bytes(need, max(0.0, timeout_s - (clock() - t_send))):
                if proc.poll() is not None:
                    raise HarnessError(f"clock probe ended (rc={proc.poll()}) before answering")
                raise HarnessError(f"clock probe timed out after {timeout_s:g} s (node unresponsive)")
            out = proc.stdout_so_far() or b""
            if out.endswith(b"\n"):
                break
            need = len(out) + 1
        t_recv = clock()
        words = out[self._seen:].decode(errors="replace").split()
        self._seen = len(out)
        return t_send, (words[-1] if words else ""), t_recv

    def close(self) -> None:
        """End the probe (EOF on its stdin ends its loop); it is not waited for."""
        self.proc.close_stdin()


def _samples(transport: Transport, samples: int, clock: Callable[[], float], timeout_s: float,
             session: ClockSession | None) -> tuple[list[tuple[float, float, float]], list[str]]:
    got: list[tuple[float, float, float]] = []
    errors: list[str] = []
    for _ in range(samples):
        if session is not None:
            t_send, text, t_recv = session.ask(clock, timeout_s)
        else:
            t_send = clock()
            res = transport.run(list(CLOCK_ARGV), timeout_s=timeout_s)
            t_recv = clock()
            if res.timed_out:
                raise HarnessError(f"clock probe timed out after {timeout_s:g} s (node unresponsive)")
            if res.error:
                raise HarnessError(f"clock probe failed: {res.summary()}")
            if not res.ok:
                errors.append(res.summary())
                continue
            text = res.stdout.strip()
        try:
            got.append((t_send, float(text), t_recv))
        except ValueError:
            errors.append(f"unparseable clock reading {text[:40]!r}")
    return got, errors


def measure_clock_offset(transport: Transport, samples: int = 5, clock: Callable[[], float] = time.time,
                         timeout_s: float = 5.0, session: ClockSession | None = None) -> ClockOffset:
    """Offset of a node's clock from ours, from `samples` round trips to `date +%s.%N` (smallest RTT wins):
    through ``session`` (an open ClockSession) when given, else one command each.

    A probe that times out or cannot reach the node fails the node at once: `date` answers in
    milliseconds on a live node, so one such probe means the node is unreachable or hung, and
    retrying would only hold up every other node's measurement (timeout_s x samples per node)."""
    got, errors = _samples(transport, samples, clock, timeout_s, session)
    if not got:
        raise HarnessError("clock offset: no usable sample: " + "; ".join(errors[:3]))
    return estimate_clock_offset(got)


def measure_clock_offsets(transports: Mapping[str, Transport], samples: int = 5,
                          clock: Callable[[], float] = time.time, parallel: bool = False,
                          timeout_s: float = 5.0) -> GroupResult:
    """Clock offset of every node. Where a node's transport keeps stdin open, a probe is started on every
    node at once and answers once (its start-up is paid in parallel), then the nodes are sampled one at a
    time over their open sessions. Sequential by default: parallel probes compete for the orchestrator's
    CPU and inflate every round trip, and with it the uncertainty. A node whose probe does not start and
    answer within START_TIMEOUT_S (timeout_s if longer), or that then misses one sample's timeout_s, fails
    alone: a dead node costs one such wait, in parallel with the others' start."""
    def start(_n: str, t: Transport) -> ClockSession | None:
        if not getattr(t, "supports_sessions", False):
            return None
        session = ClockSession(t)
        try:
            # The first answer waits for the node's sshd to start the probe's shell, on every node at once:
            # on a busy machine that can take seconds. It is not a sample; the samples get timeout_s each.
            session.ask(clock, max(timeout_s, START_TIMEOUT_S))
        except BaseException:
            session.close()
            raise
        return session

    opened = fan_out(transports, start)
    try:
        def one(n: str, t: Transport) -> ClockOffset:
            if n in opened.failed:
                raise HarnessError(opened.failed[n])
            return measure_clock_offset(t, samples, clock, timeout_s, opened.succeeded[n])
        return fan_out(transports, one, max_workers=None if parallel else 1)
    finally:
        for session in opened.succeeded.values():
            if session is not None:
                session.close()


# ------------------------------------------------------------------------------------ a gate's clock


class Clock:
    """The time a gate's waits and polls run on (``GateContext.clock``): monotonic seconds, and a wait that
    ends early when an event is set (a gate's cancellation), so no wait outlives the gate it belongs to.
    Tests hand in a :class:`ScriptedClock` to run those waits without sleeping."""

    def now(self) -> float:
        """Monotonic seconds (only differences mean anything)."""
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait up to ``seconds`` (at most) for ``event``; True when it is set."""
        return event.wait(max(0.0, seconds))


class ScriptedClock(Clock):
    """A clock for tests: ``now`` starts at ``start`` and moves only when a wait passes (the whole wait at once)
    or the test calls :meth:`advance`; every wait is recorded in ``waits``. ``on_wait(clock, seconds)`` runs
    before a wait passes, so a test can act at a chosen point of a polling loop (set an event, move time)."""

    def __init__(self, start: float = 1000.0,
                 on_wait: Callable[["ScriptedClock", float], None] | None = None):
        self.t = float(start)
        self.waits: list[float] = []
        self.on_wait = on_wait

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        if self.on_wait is not None:
            self.on_wait(self, seconds)
        if not event.is_set():
            self.t += max(0.0, seconds)
        return event.is_set()
