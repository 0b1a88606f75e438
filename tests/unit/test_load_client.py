"""The load client: open loop on schedule whatever the server does (no coordinated omission), closed loop with
a fixed number of users, and the figures of a load point. The server is an httpx MockTransport; the open
loop's clock and sleep are scripted, so the schedule is checked without timing anything."""

import asyncio
import dataclasses
import statistics

import httpx
import pytest

from harness.engines.client import CompletionRequest, RequestRecord
from harness.engines.load import LoadRecord, arrival_offsets, closed_loop, knee, load_point, open_loop

SSE = b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b"}]}\n\ndata: [DONE]\n\n'


class Server:
    """Answers once ``release_at`` requests are in flight (or at once with None); counts what it saw."""

    def __init__(self, release_at=None):
        self.in_flight = self.max_in_flight = self.seen = 0
        self.release_at = release_at
        self.released = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.release_at is None or self.seen >= self.release_at:
            self.released.set()
        await self.released.wait()
        await asyncio.sleep(0)
        self.in_flight -= 1
        return httpx.Response(200, content=SSE)


def reqs(n):
    return [CompletionRequest(f"r{i}", [11, 12, 13], max_tokens=2) for i in range(n)]


class ScriptedTime:
    def __init__(self, oversleep_s=0.0):
        self.now, self.oversleep_s = 0.0, oversleep_s

    def clock(self):
        return self.now

    async def sleep(self, d):
        self.now += d + self.oversleep_s
        await asyncio.sleep(0)


def test_open_loop_sends_on_schedule_while_the_server_holds_every_answer():
    # the server answers nothing until all 20 requests are in: a client waiting for answers would never finish
    server, t = Server(release_at=20), ScriptedTime()
    offsets = arrival_offsets(20, rate_rps=50, seed=1)
    recs = asyncio.run(asyncio.wait_for(open_loop("http://e", reqs(20), offsets, "m", clock=t.clock, sleep=t.sleep,
                                                  transport=httpx.MockTransport(server)), 30))
    assert server.max_in_flight == 20 and all(r.record.ok for r in recs)
    assert [r.record.request_id for r in recs] == [f"r{i}" for i in range(20)]
    assert [r.due_s for r in recs] == offsets and [r.sent_s for r in recs] == offsets  # on time: lag 0


def test_a_late_client_shows_its_lag():
    t = ScriptedTime(oversleep_s=0.005)
    recs = asyncio.run(open_loop("http://e", reqs(10), [i * 0.1 for i in range(10)], "m", clock=t.clock,
                                 sleep=t.sleep, transport=httpx.MockTransport(Server())))
    assert recs[0].lag_s == 0.0 and all(r.lag_s == pytest.approx(0.005) for r in recs[1:])
    assert load_point(recs).client_lag_p99_s == pytest.approx(0.005)


def test_closed_loop_keeps_exactly_its_users_busy():
    server = Server(release_at=4)  # answers once four are in flight: a closed loop of 4 gets there, no further
    recs = asyncio.run(asyncio.wait_for(closed_loop("http://e", reqs(12), 4, "m",
                                                    transport=httpx.MockTransport(server)), 30))
    assert server.max_in_flight == 4 and server.seen == 12 and all(r.record.ok for r in recs)
    with pytest.raises(ValueError):
        asyncio.run(closed_loop("http://e", reqs(1), 0, "m"))


def rec(i, sent, ttft, chunks=5, latency=None, e2e=None, error=None):
    latency = latency if latency is not None else ttft + 0.01 * (chunks - 1)
    r = RequestRecord(f"r{i}", 100, 0.0, ttft, (0.01,) * (chunks - 1), latency, e2e or latency, chunks, "x" * chunks,
                      200, error)
    return LoadRecord(sent, sent, r)


def test_a_load_points_figures_and_goodput_within_the_slos():
    recs = [rec(i, i * 0.5, ttft) for i, ttft in enumerate([0.1, 0.2, 0.3, 0.4, 2.0])]
    recs.append(rec(5, 2.5, None, chunks=0, latency=0, e2e=0.1, error="HTTP 500: overloaded"))
    p = load_point(recs, ttft_slo_s=0.35)
    assert (p.requests, p.ok, p.failed) == (6, 5, 1)
    assert p.duration_s == pytest.approx(2.0 + 2.04)           # first send to the last stream's end
    # the failed request is an infinite TTFT: the median moves up (0.35, not the 0.3 of the five served) and the
    # p99 falls on it, so it has no finite value (a tier that errors never looks faster)
    assert p.ttft_p50_s == pytest.approx(0.35) and p.ttft_p99_s is None
    served = load_point(recs[:5], ttft_slo_s=0.35)
    assert served.ttft_p50_s == 0.3 and served.ttft_p99_s == pytest.approx(1.936)
    assert p.tpot_p50_s == pytest.approx(0.01)
    assert p.goodput_rps == pytest.approx(3 / 4.04) and p.request_rate_rps == pytest.approx(5 / 4.04)
    assert load_point(recs, tpot_slo_s=0.005).goodput_rps == 0.0
    with pytest.raises(ValueError):
        load_point([])


def test_the_knee_is_the_last_load_within_the_slo_before_the_first_that_is_not():
    def point(p95, failed=0):
        return dataclasses.replace(load_point([rec(0, 0, p95)]), ttft_p95_s=p95, failed=failed)
    pts = [(1, point(0.2)), (2, point(0.4)), (4, point(0.9)), (8, point(3.0)), (16, point(0.5))]
    assert knee(pts, slo_s=1.0) == 4
    assert knee(pts, slo_s=0.1) is None
    assert knee([(1, point(0.2)), (2, point(0.3, failed=1))], slo_s=1.0) == 1  # failures end the ladder


def test_arrivals_are_seeded_at_the_asked_rate_and_burstiness():
    a = arrival_offsets(2000, 20.0, 1.0, seed=3)
    assert a == arrival_offsets(2000, 20.0, 1.0, seed=3) != arrival_offsets(2000, 20.0, 1.0, seed=4)
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert 0.045 < statistics.mean(gaps) < 0.055 and 0.9 < statistics.pstdev(gaps) / statistics.mean(gaps) < 1.1
    b = arrival_offsets(2000, 20.0, 0.25, seed=3)
    gb = [y - x for x, y in zip(b, b[1:])]
    assert statistics.pstdev(gb) / statistics.mean(gb) > 1.7
