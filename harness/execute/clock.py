"""Clock alignment of nodes: each node's clock offset from ours, estimated NTP-style from round trips of
``date +%s.%N`` through its transport, and the offset actually applied when aligning its times."""

from __future__ import annotations

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


def measure_clock_offset(transport: Transport, samples: int = 5, clock: Callable[[], float] = time.time,
                         timeout_s: float = 5.0) -> ClockOffset:
    """Offset of a node's clock from ours, from `samples` round trips of `date +%s.%N` (smallest RTT wins).

    A probe that times out or cannot reach the node fails the node at once: `date` answers in
    milliseconds on a live node, so one such probe means the node is unreachable or hung, and
    retrying would only hold up every other node's measurement (timeout_s x samples per node)."""
    got = []
    errors = []
    for _ in range(samples):
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
        try:
            got.append((t_send, float(res.stdout.strip()), t_recv))
        except ValueError:
            errors.append(f"unparseable clock reading {res.stdout.strip()[:40]!r}")
    if not got:
        raise HarnessError("clock offset: no usable sample: " + "; ".join(errors[:3]))
    return estimate_clock_offset(got)


def measure_clock_offsets(transports: Mapping[str, Transport], samples: int = 5,
                          clock: Callable[[], float] = time.time, parallel: bool = False,
                          timeout_s: float = 5.0) -> GroupResult:
    """Clock offset of every node. Sequential by default: parallel probes compete for the orchestrator's
    CPU and inflate every round trip, and with it the uncertainty. A dead node costs one timeout_s."""
    def one(_n: str, t: Transport) -> ClockOffset:
        return measure_clock_offset(t, samples, clock, timeout_s)
    return fan_out(transports, one, max_workers=None if parallel else 1)
